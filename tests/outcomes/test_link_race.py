"""Two writers link the same outcomes at once (two replicas joining one conversation's outcomes): both
find the links absent, both COPY; the one that meets the other's rows falls back to the conflict-tolerant
insert. Every link is stored and counted exactly once, and neither writer sees an error."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from sqlalchemy import func, insert, select

from tests.support.app import make_settings
from tests.support.waiting import scaled
from vigil.app.runtime import build_runtime
from vigil.outcomes import join
from vigil.outcomes.join import link_outcomes
from vigil.runtime import Envelope, Runtime
from vigil.schema import outcome_types
from vigil.store import writes
from vigil.store.models import OutcomeLinkRow, OutcomeRow

ROUNDS = 6


def _conversation(rt: Runtime, cid: str) -> None:
    conv = {
        "conversation_id": cid,
        "agent_id": "a",
        "agent_version": "v1",
        "ended_at": datetime.now(UTC).isoformat(),
        "messages": [{"role": "user", "content": "hello"}],
    }
    assert len(rt.pipeline.process_raw([Envelope(orjson.dumps(conv), "test")]).stored) == 1


def _outcomes(rt: Runtime, cid: str, n: int) -> list[int]:
    now = datetime.now(UTC)
    rows = [
        {"idempotency_key": f"{cid}-{i}", "conversation_id": cid, "type": "escalation", "value": 1.0,
         "occurred_at": now + timedelta(minutes=i), "source": "api"}
        for i in range(n)
    ]  # fmt: skip
    with rt.sessions.begin() as s:
        return list(s.scalars(insert(OutcomeRow).returning(OutcomeRow.id), rows))


def _counted(rt: Runtime) -> float:
    total = 0.0
    for metric in rt.metrics.registry.collect():
        if metric.name in ("vigil_outcomes", "vigil_outcomes_outside_window"):
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


def test_two_writers_link_the_same_outcomes_once(pg_url, monkeypatch) -> None:
    rt = build_runtime(make_settings(pg_url, outcome_attribution_window_hours=24), registry=CollectorRegistry())
    types = outcome_types(rt.settings.outcome_types)
    copy = writes._pg_copy
    at_copy = threading.Barrier(2, timeout=scaled(30))
    copies: list[str] = []

    def copy_together(session: Any, table: Any, rows: Any, into: Any = None) -> None:
        if table.name == "outcome_links":
            at_copy.wait()  # both writers have found the links absent before either COPYs
            copies.append(table.name)
        copy(session, table, rows, into)

    copied: list[bool] = []

    def copy_new_rows(session: Any, table: Any, rows: Any) -> bool:
        done = writes.copy_new_rows(session, table, rows)
        copied.append(done)
        return done

    monkeypatch.setattr(writes, "_pg_copy", copy_together)
    monkeypatch.setattr(join, "copy_new_rows", copy_new_rows)
    try:
        for round_ in range(ROUNDS):
            cid = f"c{round_}"
            _conversation(rt, cid)
            ids = _outcomes(rt, cid, 4)
            # overlapping sets: each writer has one outcome of its own and shares two with the other
            shares = [ids[:3], ids[1:]] if round_ % 2 else [ids[1:], ids[:3]]
            linked: list[list[int]] = [[], []]
            errors: list[BaseException] = []

            def writer(k: int, mine: list[int], out: list[list[int]], errs: list[BaseException]) -> None:
                try:
                    with rt.sessions.begin() as s:
                        outcomes = list(s.scalars(select(OutcomeRow).where(OutcomeRow.id.in_(mine))))
                        out[k] = [o.id for o in link_outcomes(s, outcomes, types, 24, rt.metrics)]
                except BaseException as exc:  # noqa: BLE001 - any failure is what this test counts
                    errs.append(exc)
                    at_copy.abort()

            before = _counted(rt)
            threads = [threading.Thread(target=writer, args=(k, shares[k], linked, errors)) for k in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            assert len(copies) == 2 * (round_ + 1)  # both writers reached the COPY: the race happened
            assert sorted(copied[-2:]) == [False, True]  # one COPY met the other's rows and fell back
            assert sorted(linked[0] + linked[1]) == sorted(ids)  # each new link reported by one writer
            with rt.sessions() as s:
                stored = s.execute(
                    select(OutcomeLinkRow.outcome_id, func.count())
                    .where(OutcomeLinkRow.conversation_id == cid)
                    .group_by(OutcomeLinkRow.outcome_id)
                ).all()
            assert sorted(stored) == [(i, 1) for i in sorted(ids)]
            assert _counted(rt) - before == len(ids)  # the metric counts each link once
    finally:
        rt.close()
