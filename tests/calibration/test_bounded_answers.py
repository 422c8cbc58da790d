"""Answers measured on a bounded set of labels say so: reviewer agreement (VIGIL_AGREEMENT_MAX_LABELS) and a
judge's review-queue calibration (VIGIL_CALIBRATION_MAX_PAIRS), in the API and on the pages."""

from __future__ import annotations

import re
from typing import Any

from prometheus_client import CollectorRegistry

from tests.support.app import REVIEWER, make_settings
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.runtime import Runtime
from vigil.store.models import ReviewLabelRow, VerdictRow

JUDGE = "support-generic"
LABELS = 10  # current labels: rita's on c0..c7, raj's on c6 and c7


def _seed(rt: Runtime) -> None:
    with rt.sessions.begin() as s:
        for i in range(8):
            cid = f"c{i}"
            s.add(
                VerdictRow(judge=JUDGE, judge_version="1", conversation_id=cid, revision=1, agent_id="bot",
                           agent_version="v1", verdict="pass", categories=[], model="m", offline=False,
                           prompt_hash="h", reason="sampled")
            )  # fmt: skip
            for reviewer in ("rita", "raj") if i >= 6 else ("rita",):
                s.add(ReviewLabelRow(conversation_id=cid, revision=1, reviewer=reviewer, label="not_a_failure",
                                     version=1, is_current=True))  # fmt: skip
                s.flush()  # ids follow the order written


def _runtime(url: str, **bounds: int) -> Runtime:
    settings = make_settings(url, judge_mode="live", calibration_correction_labels="all", **bounds)
    return wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})


def _answers(rt: Runtime) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str, str]:
    from fastapi.testclient import TestClient

    from vigil.app.server import build_app

    with TestClient(build_app(rt)) as c:
        judge = c.get(f"/v1/judges/{JUDGE}/calibration", headers=REVIEWER).json()
        overview = c.get("/v1/calibration", headers=REVIEWER).json()
        progress = c.get("/v1/review/progress", headers=REVIEWER).json()["agreement"]
        form = c.get("/ui/login").text
        token = re.search(r'name="csrf" value="([^"]+)"', form).group(1)  # type: ignore[union-attr]
        c.post("/ui/login", data={"csrf": token, "api_key": "rita-key"})
        calibration_page, progress_page = c.get("/ui/calibration").text, c.get("/ui/progress").text
    return judge, overview, progress, calibration_page, progress_page


def test_bounded_answers_say_what_they_considered(db_url: str) -> None:
    rt = _runtime(db_url, agreement_max_labels=4, calibration_max_pairs=3)
    try:
        _seed(rt)
        judge, overview, progress, calibration_page, progress_page = _answers(rt)
    finally:
        rt.close()
    window = {"labels_considered": 3, "bounded": True, "max_pairs": 3}
    assert {k: judge[k] for k in window} == window
    assert {k: overview["judges"][0][k] for k in window} == window
    agreement = {"labels_considered": 4, "bounded": True, "max_labels": 4}
    assert {k: overview["inter_reviewer"][k] for k in agreement} == agreement
    assert {k: progress[k] for k in agreement} == agreement
    # the newest 4 labels are raj's and rita's on c7, c6: both items agree
    assert progress["items"] == 2 and progress["rate"] == 1.0
    assert "measured on the conversations of the newest 3 labels" in calibration_page
    assert "VIGIL_CALIBRATION_MAX_PAIRS" in calibration_page and "VIGIL_AGREEMENT_MAX_LABELS" in calibration_page
    assert 'id="agreement-bounded"' in progress_page and "newest 4 labels" in progress_page


def test_answers_within_the_bound_say_they_are_whole(sqlite_url: str) -> None:
    rt = _runtime(sqlite_url, agreement_max_labels=LABELS, calibration_max_pairs=LABELS)
    try:
        _seed(rt)
        judge, overview, progress, calibration_page, progress_page = _answers(rt)
    finally:
        rt.close()
    assert (judge["labels_considered"], judge["bounded"], judge["max_pairs"]) == (LABELS, False, LABELS)
    inter = overview["inter_reviewer"]
    assert (inter["labels_considered"], inter["bounded"], inter["max_labels"]) == (LABELS, False, LABELS)
    assert (progress["labels_considered"], progress["bounded"]) == (LABELS, False)
    assert 'class="muted small bounded"' not in calibration_page + progress_page
