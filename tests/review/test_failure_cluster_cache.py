"""Failure clusters are kept per newest label for a short time: a new label shows at once, findings
written under traffic do not recompute them, and the TTL bounds how late anything else shows."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from tests.support.app import REVIEWER
from tests.support.review import review_client, review_runtime, simulated, store
from vigil.review import failures
from vigil.review.stage import ReviewStage
from vigil.store.models import FindingRow, ReviewLabelRow


def _confirm(rt: Any, cid: str) -> None:
    with rt.sessions.begin() as s:
        s.add(ReviewLabelRow(conversation_id=cid, revision=1, reviewer="rita", label="confirmed_failure",
                             category="wrong_action", version=1, is_current=True))  # fmt: skip


def test_a_new_label_recomputes_the_clusters_and_traffic_does_not(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = review_runtime(db_url)
    computed: list[int] = []
    compute = failures.clusters

    def counting(*args: Any) -> dict[str, Any]:
        computed.append(1)
        return compute(*args)

    monkeypatch.setattr(failures, "clusters", counting)
    now = [1000.0]
    try:
        rt.get(ReviewStage).failure_clusters.clock = lambda: now[0]
        store(rt, simulated(12))
        with rt.sessions() as s:
            flagged = sorted(set(s.scalars(select(FindingRow.conversation_id))))
        assert len(flagged) >= 2
        _confirm(rt, flagged[0])
        with review_client(rt) as c:

            def total() -> int:
                r = c.get("/v1/review/clusters", headers=REVIEWER)
                assert r.status_code == 200, r.text
                return int(r.json()["total"])

            assert (total(), total(), len(computed)) == (1, 1, 1)  # the second answer is the kept one
            _confirm(rt, flagged[1])
            assert (total(), len(computed)) == (2, 2)  # a new label: recomputed at once
            store(rt, [dict(simulated(1, seed=99)[0], conversation_id="late-finding")])
            with rt.sessions() as s:
                assert s.scalar(select(FindingRow.id).where(FindingRow.conversation_id == "late-finding"))
            assert (total(), len(computed)) == (2, 2)  # traffic's findings: the kept answer
            now[0] += failures.CLUSTERS_TTL_SECONDS - 1
            assert (total(), len(computed)) == (2, 2)
            now[0] += 2  # past the TTL: recomputed though no label changed
            assert (total(), len(computed)) == (2, 3)
    finally:
        rt.close()
