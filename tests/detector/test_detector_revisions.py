"""A conversation stored again as a newer revision counts once, in the statistics and in the stored counts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import delete, func, select, update

from tests.support.app import make_settings
from tests.support.traffic import clean, mixed
from vigil.app.runtime import build_runtime
from vigil.detector.cusum import Cusum
from vigil.detector.hourly import floor_hour
from vigil.detector.loop import Detector
from vigil.detector.models import (
    DetectionRow,
    DetectorFeedRow,
    DetectorLeaseRow,
    DetectorSeriesRow,
    QualityCountRow,
)
from vigil.detector.wiring import build_detector
from vigil.schema import Conversation
from vigil.store.db import aware
from vigil.store.models import ConversationRow

FAST = {"detector_min_baseline": 200, "detector_settle_seconds": 0.0, "detector_outcome_settle_hours": 1.0}
TOOL_ERROR = "tool_error"
ESCALATION = "outcome:escalation"
FAILED_CALL = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "late", "type": "function", "function": {"name": "get_order_details", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "late", "content": "Error: upstream timeout", "is_error": True},
]


def follow_up(k: int) -> list[dict]:
    return [{"role": "user", "content": f"And item {k}?"}, {"role": "assistant", "content": "Done."}]


@pytest.fixture
def rt(db_url):  # type: ignore[no-untyped-def]
    runtime = build_runtime(make_settings(db_url, **FAST), registry=CollectorRegistry())
    yield runtime
    runtime.close()


def store(rt, convs: list[dict]) -> None:  # type: ignore[no-untyped-def]
    rt.pipeline.process([Conversation.model_validate(c) for c in convs], "test")


def revised(conv: dict, revision: int, *turns: list[dict]) -> dict:
    return {**conv, "revision": revision, "messages": [*conv["messages"], *(m for t in turns for m in t)]}


def received(rt, convs: list[dict], at: datetime) -> None:  # type: ignore[no-untyped-def]
    """Say ``convs`` were stored at ``at`` (the store stamps them with the clock)."""
    ids = [c["conversation_id"] for c in convs]
    with rt.sessions.begin() as s:
        s.execute(update(ConversationRow).where(ConversationRow.conversation_id.in_(ids)).values(received_at=at))


def series(rt, version: str, signal: str) -> DetectorSeriesRow:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        row = s.get(DetectorSeriesRow, ("support-bot", version, signal))
        assert row is not None
        return row


def stored(rt, version: str, signal: str) -> dict[datetime, tuple[int, int]]:  # type: ignore[no-untyped-def]
    q = QualityCountRow
    with rt.sessions() as s:
        rows = s.execute(select(q.hour, q.n, q.x).where(q.agent_version == version, q.signal == signal, q.n > 0)).all()
    return {h.replace(tzinfo=UTC) if h.tzinfo is None else h: (n, x) for h, n, x in rows}


def recorded(rt) -> int:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return s.scalar(select(func.count()).select_from(DetectorFeedRow)) or 0


def statistic(det: Detector, row: DetectorSeriesRow, n: int, x: int) -> list[float]:
    """What the statistics are after ``n`` conversations with ``x`` failures fed from zero in one batch."""
    cfg = det.settings
    assert row.baseline_rate is not None
    cusum = Cusum.design(row.baseline_rate, det.ratios, cfg.detector_min_abs_shift, cfg.detector_arl0)
    return cusum.update([0.0] * len(det.ratios), n, x)


def test_a_correction_leaves_the_statistics_of_the_corrected_outcomes() -> None:
    c = Cusum.design(0.02, [1.5, 2.0], 0.005, 1e5)
    fed = c.update([0.0, 0.0], 50, 4)
    assert c.update(fed, 0, 0, flips=2) == pytest.approx(c.update([0.0, 0.0], 50, 6))
    assert c.update(fed, 0, 0, flips=-1) == pytest.approx(c.update([0.0, 0.0], 50, 3))
    assert c.update(fed, 10, 1, flips=1) == pytest.approx(c.update([0.0, 0.0], 60, 6))


def test_a_conversation_revised_hours_later_counts_once_with_its_latest_outcome(rt) -> None:
    """20 conversations (2 with a tool error) fed in one hour, then all stored again two hours later, 2 more now
    with a tool error: the statistics had 40 observations with 6 failures, the stored counts 40 and 6."""
    det = build_detector(rt)
    now = floor_hour(datetime.now(UTC))
    v1 = clean(600, "v1", 1)
    store(rt, v1)
    received(rt, v1, now - timedelta(hours=4))
    det.tick(now - timedelta(hours=3))  # the first pass counts the history: v1 is v2's baseline
    v2 = clean(20, "v2", 5)
    first = [revised(c, 1, FAILED_CALL if i < 2 else []) for i, c in enumerate(v2)]
    store(rt, first)
    fed_at = now - timedelta(hours=3) + timedelta(minutes=10)
    received(rt, first, fed_at)
    det.tick(now - timedelta(hours=1))  # feeds them; their hour closes and is recounted
    row = series(rt, "v2", TOOL_ERROR)
    assert row.statistics == pytest.approx(statistic(det, row, 20, 2))
    assert stored(rt, "v2", TOOL_ERROR) == {floor_hour(fed_at): (20, 2)}

    store(rt, [revised(c, 2, FAILED_CALL if 2 <= i < 4 else [], follow_up(1)) for i, c in enumerate(first)])
    det.tick(now + timedelta(hours=2))
    row = series(rt, "v2", TOOL_ERROR)
    # each conversation once, with its newest revision's outcome: 20 of which 4 failed
    assert row.statistics == pytest.approx(statistic(det, row, 20, 4))
    counts = stored(rt, "v2", TOOL_ERROR)
    assert sum(n for n, _ in counts.values()) == 20 and sum(x for _, x in counts.values()) == 4, counts
    assert floor_hour(fed_at) not in counts  # the conversations moved to their newest revision's hour


def test_a_failing_conversation_sent_as_it_grows_raises_no_alarm(rt) -> None:
    """Both versions fail 5% of conversations with a tool error; v2's failing conversations go on (retries) and
    are sent again with each new turn, ten times, one pass apart. Each pass fed them again: ten times the
    failures, and a regression raised on v2 that has none."""
    det = build_detector(rt)
    store(rt, mixed(600, "v1", "tool_errors", 0.05, 1))
    det.tick()
    v2 = [{k: v for k, v in c.items() if k != "status"} for c in mixed(200, "v2", "tool_errors", 0.05, 20)]
    failing = [c for c in v2 if any(m.get("is_error") for m in c["messages"])]
    assert 4 <= len(failing) <= 20
    store(rt, v2)
    det.tick()
    for revision in range(2, 11):
        store(rt, [revised(c, revision, *map(follow_up, range(1, revision))) for c in failing])
        det.tick()
    with rt.sessions() as s:
        raised = s.scalars(select(DetectionRow.signal).where(DetectionRow.agent_version == "v2")).all()
        stored_n = s.scalar(
            select(func.sum(QualityCountRow.n)).where(
                QualityCountRow.agent_version == "v2", QualityCountRow.signal == TOOL_ERROR
            )
        )
    assert TOOL_ERROR not in raised
    assert stored_n == 200
    row = series(rt, "v2", TOOL_ERROR)
    assert row.statistics == pytest.approx(statistic(det, row, 200, len(failing)))


def test_outcomes_count_a_conversation_in_the_first_hour_that_settled_with_it(rt) -> None:
    """A conversation whose hour's outcome signals had settled (and reached the statistics), stored again later,
    counted again when the later hour settled: 20 conversations made 40 in the outcome counts."""
    det = build_detector(rt)
    now = floor_hour(datetime.now(UTC))
    det.tick(now - timedelta(hours=6))
    convs = clean(20, "v2", 5)
    store(rt, convs)
    first = now - timedelta(hours=5)
    received(rt, convs, first + timedelta(minutes=10))
    det.tick(now - timedelta(hours=3))  # the hour's outcomes settle an hour after it closes
    assert stored(rt, "v2", ESCALATION) == {first: (20, 0)}
    store(rt, [revised(c, 2, follow_up(1)) for c in convs])
    det.tick(now + timedelta(hours=3))  # the newer revisions' hour has settled too
    assert stored(rt, "v2", ESCALATION) == {first: (20, 0)}
    assert sum(n for n, _ in stored(rt, "v2", TOOL_ERROR).values()) == 20


def test_the_record_of_what_was_fed_keeps_to_conversation_retention(sqlite_url) -> None:
    rt = build_runtime(
        make_settings(sqlite_url, retention_conversations_days=3 / 24, **FAST), registry=CollectorRegistry()
    )
    try:
        det = build_detector(rt)
        now = floor_hour(datetime.now(UTC))
        det.tick(now - timedelta(hours=6))
        convs = clean(10, "v1", 1)
        store(rt, convs)
        received(rt, convs, now - timedelta(hours=5) + timedelta(minutes=10))
        det.tick(now - timedelta(hours=4))
        assert recorded(rt) == 10
        det.tick(now)  # their hour is now more than three hours old
        assert recorded(rt) == 0
    finally:
        rt.close()


def test_the_first_pass_after_the_upgrade_recounts_its_hour_and_feeds_nothing_twice(sqlite_url) -> None:
    """The release before recorded nothing and counted an hour pass by pass (a conversation once per revision
    read) until it closed; the first pass that records recounts the hour up to its cursor."""
    rt = build_runtime(make_settings(sqlite_url, **FAST), registry=CollectorRegistry())
    try:
        det = build_detector(rt)
        now = floor_hour(datetime.now(UTC))
        convs = clean(30, "v1", 1)
        store(rt, convs)
        hour = now - timedelta(hours=2)
        received(rt, convs, hour + timedelta(minutes=10))
        det.tick(hour + timedelta(minutes=20))
        with rt.sessions.begin() as s:  # as that release left it: no record, 5 revisions counted again
            s.execute(delete(DetectorFeedRow))
            s.execute(update(DetectorLeaseRow).values(fed_since=None))
            q = QualityCountRow
            s.execute(update(q).where(q.signal == TOOL_ERROR).values(n=q.n + 5))
        det.tick(now)
        assert stored(rt, "v1", TOOL_ERROR) == {hour: (30, 0)}
        assert recorded(rt) == 0  # stored before the record began: not fed again when the hour closed
        with rt.sessions() as s:
            lease = s.scalars(select(DetectorLeaseRow)).one()
            assert lease.fed_since is not None and aware(lease.fed_since) == hour + timedelta(minutes=20)
    finally:
        rt.close()


def test_rows_committed_after_the_first_pass_but_stamped_before_its_cursor_count_when_the_hour_closes(rt) -> None:
    """A writer's transaction may commit rows stamped before the first pass's cursor (a slow commit, a settle
    time shorter than it): the pass that closes the hour counts them, as it does after any other pass."""
    det = build_detector(rt)
    hour = floor_hour(datetime.now(UTC)) - timedelta(hours=3)
    first, late = clean(30, "v1", 1), clean(20, "v1", 2)
    assert not {c["conversation_id"] for c in first} & {c["conversation_id"] for c in late}
    store(rt, first)
    received(rt, first, hour + timedelta(minutes=10))
    det.tick(hour + timedelta(minutes=20))  # the first pass: no cursor yet
    assert stored(rt, "v1", TOOL_ERROR) == {hour: (30, 0)}
    store(rt, late)
    received(rt, late, hour + timedelta(minutes=15))  # committed now, stamped before the cursor
    det.tick(hour + timedelta(hours=2))
    assert stored(rt, "v1", TOOL_ERROR) == {hour: (50, 0)}
    assert recorded(rt) == 50
    det.tick(hour + timedelta(hours=2, minutes=30))  # and never again
    assert stored(rt, "v1", TOOL_ERROR) == {hour: (50, 0)}
