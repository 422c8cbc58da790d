"""What the write path stamps (a conversation's ``received_at``, its outcomes', their links', reviewers'
comments and choices, the rollups' frozen hours) is the database's clock, whatever the storing replica's
host clock says: the detector's cursor, the rollup watermark and retention compare those times with the
database's clock. A replica's host clock running ahead or behind is simulated by patching the ``datetime``
of the modules that stamp (:func:`tests.support.clocks.skewed`)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.detector.test_detector_hostile import FAST, _counted, store
from tests.ingest.test_otel_finish import replica
from tests.ingest.test_otel_finish_clock import _open_trace
from tests.support.app import make_settings
from tests.support.clocks import skewed
from tests.support.traffic import clean
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.detector.wiring import build_detector
from vigil.ingest.otlp import ingest as otlp_ingest
from vigil.ingest.otlp.models import OtelSpanRow
from vigil.outcomes import ingest as outcomes_ingest
from vigil.outcomes import join
from vigil.outcomes.ingest import OutcomeStore
from vigil.review import side_by_side, triage
from vigil.review.models import ReviewCommentRow, ReviewPairwiseRow
from vigil.store import db, maintenance, retention, rollup_job, writes
from vigil.store.db import aware, clock
from vigil.store.models import ConversationRow, OutcomeLinkRow, OutcomeRow

HOSTS = (db, writes, outcomes_ingest, join, otlp_ingest, retention, rollup_job, triage, side_by_side)
"""Every module of the write path that read the host's clock."""
SKEW = (-3, 3)  # hours: behind, ahead


def host_clock(monkeypatch: pytest.MonkeyPatch, hours: float) -> None:
    for module in HOSTS:
        monkeypatch.setattr(module, "datetime", skewed(hours), raising=False)


def on_database_clock(rt, *stamps: datetime | None) -> None:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        now = clock(s)
    for at in stamps:
        assert at is not None
        assert abs(aware(at) - now) < timedelta(minutes=1), (at, now)


def _runtime(url: str, **overrides: object):  # type: ignore[no-untyped-def]
    return wire(build_runtime(make_settings(url, **overrides), registry=CollectorRegistry()), {"consume"})


@pytest.mark.parametrize("hours", SKEW)
def test_conversations_outcomes_and_links_are_stamped_on_the_database_clock(db_url, monkeypatch, hours) -> None:  # type: ignore[no-untyped-def]
    """A replica 3 h behind stored conversations, their inline outcomes and the outcomes' links 3 h in the
    past (behind the detector's cursor and the rollup watermark, never counted); one 3 h ahead, in the
    future. Outcomes sent on their own (the outcomes API and topic) were stamped the same way."""
    rt = _runtime(db_url)
    try:
        convs = clean(2, "v1", 1)
        convs[0]["outcomes"] = [{"type": "task_success", "value": 1.0}]
        host_clock(monkeypatch, hours)
        store(rt, convs)
        batch = rt.get(OutcomeStore).ingest(
            [{"conversation_id": convs[1]["conversation_id"], "type": "task_success", "idempotency_key": "api-1"}],
            "api",
        )
        assert not batch.errors
        monkeypatch.undo()
        with rt.sessions() as s:
            stamps = [*s.scalars(select(ConversationRow.received_at)), *s.scalars(select(OutcomeRow.received_at))]
            stamps += s.scalars(select(OutcomeLinkRow.linked_at)).all()
        assert len(stamps) == 2 + 2 + 2
        on_database_clock(rt, *stamps)
    finally:
        rt.close()


def test_a_replica_whose_clock_runs_behind_stores_conversations_the_detector_counts(db_url, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The detector's cursor runs on the database's clock: conversations a replica 3 h behind stored after a
    pass were stamped 3 h behind the cursor, so no later pass folded them (a regression in them raised
    nothing)."""
    rt = _runtime(db_url, **FAST)
    try:
        detector = build_detector(rt)
        store(rt, clean(30, "v1", 1))
        assert detector.tick() is True
        host_clock(monkeypatch, -3)
        store(rt, [{**c, "conversation_id": f"behind-{c['conversation_id']}"} for c in clean(20, "v1", 2)])
        monkeypatch.undo()
        assert detector.tick() is True
        assert _counted(rt) == 50
    finally:
        rt.close()


@pytest.mark.parametrize("hours", SKEW)
def test_reviewers_comments_and_choices_are_stamped_on_the_database_clock(db_url, monkeypatch, hours) -> None:  # type: ignore[no-untyped-def]
    """A comment or a side-by-side choice made through a replica 3 h off was stamped on its host's clock,
    beside the audit event that records it on the database's."""
    rt = _runtime(db_url)
    try:
        a, b = clean(1, "v1", 1)[0], clean(1, "v2", 1)[0]
        b = {**b, "conversation_id": f"other-{b['conversation_id']}", "task_id": a["task_id"]}
        store(rt, [a, b])
        host_clock(monkeypatch, hours)
        with rt.sessions.begin() as s:
            triage.add_comment(s, a["conversation_id"], "rita", "the refund went to the wrong card")
            side_by_side.choose(s, "rita", a["conversation_id"], b["conversation_id"], "a")
        monkeypatch.undo()
        with rt.sessions() as s:
            comment = s.scalar(select(ReviewCommentRow.created_at))
            choice = s.scalar(select(ReviewPairwiseRow.created_at))
        on_database_clock(rt, comment, choice)
    finally:
        rt.close()


@pytest.mark.parametrize("hours", SKEW)
def test_the_rollups_freeze_hours_by_the_database_clock(db_url, monkeypatch, hours) -> None:  # type: ignore[no-untyped-def]
    """The hours the rollup job no longer recomputes (before the conversations' retention cutoff) were cut
    on the host's clock while its watermark and retention's deletes run on the database's: a job on a host
    3 h behind recomputed up to 3 h of hours retention had emptied (their counts lost); 3 h ahead froze
    hours whose rows were all still there."""
    rt = _runtime(db_url, retention_conversations_days=1.0)
    try:
        store(rt, clean(3, "v1", 1))
        maintenance.refresh_rollups(rt.settings, rt.sessions)  # the first run rebuilds
        seen: list[datetime | None] = []
        recompute = rollup_job._recompute

        def spy(session, dirty, frozen_before):  # type: ignore[no-untyped-def]
            seen.append(frozen_before)
            return recompute(session, dirty, frozen_before)

        monkeypatch.setattr(rollup_job, "_recompute", spy)
        host_clock(monkeypatch, hours)
        maintenance.refresh_rollups(rt.settings, rt.sessions)
        monkeypatch.undo()
        assert len(seen) == 1 and seen[0] is not None
        on_database_clock(rt, seen[0] + timedelta(days=1))
    finally:
        rt.close()


@pytest.mark.parametrize("hours", SKEW)
def test_buffered_spans_are_stamped_on_the_database_clock(db_url, monkeypatch, hours) -> None:  # type: ignore[no-untyped-def]
    """The purge of stray buffered spans cuts off on the database's clock: spans a replica 3 h behind
    stored were stamped 3 h older, and went that much sooner."""
    rt = replica(db_url)
    try:
        host_clock(monkeypatch, hours)
        _open_trace(rt, 7)
        monkeypatch.undo()
        with rt.sessions() as s:
            spans = s.scalars(select(OtelSpanRow.received_at)).all()
        assert spans
        on_database_clock(rt, *spans)
    finally:
        rt.close()


@pytest.mark.parametrize("hours", SKEW)
def test_a_row_written_without_its_time_takes_the_database_clock(db_url, monkeypatch, hours) -> None:  # type: ignore[no-untyped-def]
    """The column default of ``received_at`` (a conversation or an outcome written through the ORM without
    one: imports, tools, tests) was the host's clock."""
    rt = _runtime(db_url)
    try:
        host_clock(monkeypatch, hours)
        with rt.sessions.begin() as s:
            conv = ConversationRow(
                conversation_id="c-1",
                revision=1,
                agent_id="a",
                agent_version="v1",
                message_count=0,
                tool_call_count=0,
                tool_error_count=0,
                document="{}",
            )
            outcome = OutcomeRow(
                idempotency_key="o-1", conversation_id="c-1", type="task_success", occurred_at=clock(s)
            )
            s.add_all([conv, outcome])
            s.flush()
            stamped = [conv.received_at, outcome.received_at]
        monkeypatch.undo()
        with rt.sessions() as s:
            stored = [s.scalar(select(ConversationRow.received_at)), s.scalar(select(OutcomeRow.received_at))]
        on_database_clock(rt, *stamped, *stored)
    finally:
        rt.close()
