"""The detector facing odd version names, revisions and traffic shapes seen in production."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from tests.support.app import REVIEWER, make_client, make_settings
from tests.support.traffic import clean
from vigil.app.runtime import build_runtime
from vigil.detector import loop
from vigil.detector.models import DetectorSeriesRow, QualityCountRow
from vigil.detector.wiring import build_detector
from vigil.schema import Conversation
from vigil.store.signals import TOOL_ERROR, version_key

FAST = {"detector_min_baseline": 200, "detector_settle_seconds": 0.0, "detector_outcome_settle_hours": 1.0}


def store(rt, convs: list[dict]) -> None:  # type: ignore[no-untyped-def]
    rt.pipeline.process([Conversation.model_validate(c) for c in convs], "test")


@pytest.mark.parametrize("odd", ["v1²", "①", "v2.0-٣", "release 1.0 ½"])
def test_version_names_with_non_decimal_digits_are_ordered(odd: str) -> None:
    """``str.isdigit`` holds for superscripts and circled digits that ``int`` cannot read: a version named
    ``v1²`` raised ValueError wherever versions are sorted."""
    assert version_key(odd) == version_key(odd)
    assert sorted(["v1", odd, "v10", "v2"], key=version_key)[0] in {"v1", odd}
    assert version_key("v1.10") > version_key("v1.9")


def test_an_odd_version_name_does_not_stop_the_detector_for_every_agent(sqlite_url) -> None:
    """One agent's conversations with version ``v1²`` made every detector pass fail (baselines sort versions
    by name), so no agent's regressions were detected and the gauges went stale."""
    rt = build_runtime(make_settings(sqlite_url, **FAST), registry=CollectorRegistry())
    try:
        det = build_detector(rt)
        store(rt, clean(30, "v1", 1))
        assert det.tick() is True
        odd = [
            {**c, "conversation_id": f"odd-{c['conversation_id']}", "agent_version": "v1²"} for c in clean(5, "v1", 2)
        ]
        store(rt, odd)
        det.tick()  # the pass that folds them raised ValueError
        with rt.sessions() as s:
            versions = set(s.scalars(select(DetectorSeriesRow.agent_version)))
        assert versions == {"v1", "v1²"}
        with make_client(rt) as c:
            assert c.get("/ui/", headers=REVIEWER).status_code == 200
    finally:
        rt.close()


def test_a_pass_on_a_clock_running_ahead_shows_in_the_cursor_gauge(sqlite_url) -> None:
    """A pass given a time ahead (as a replica whose clock ran 3 h ahead once did) moves the fold cursor
    there and the cursor gauge shows it, so DetectorNotRunning can fire. Replicas read the database's clock
    now (the next test), so only a database whose clock runs ahead does this."""
    rt = build_runtime(make_settings(sqlite_url, **FAST), registry=CollectorRegistry())
    try:
        det = build_detector(rt)
        store(rt, clean(30, "v1", 1))
        start = datetime.now(UTC)
        det.tick(start)
        cursor = rt.metrics.registry.get_sample_value("vigil_detector_cursor_timestamp_seconds")
        assert cursor is not None and abs(cursor - start.timestamp()) < 1
        ahead = start + timedelta(hours=3)
        det.tick(ahead)
        det.tick(start + timedelta(seconds=15))  # the next pass, on a clock that is right
        cursor = rt.metrics.registry.get_sample_value("vigil_detector_cursor_timestamp_seconds")
        assert cursor == ahead.timestamp()
    finally:
        rt.close()


class _ThreeHoursAhead(datetime):
    @classmethod
    def now(cls, tz=None):  # type: ignore[no-untyped-def,override]
        return datetime.now(tz) + timedelta(hours=3)


def _counted(rt) -> int:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return int(
            s.scalar(select(func.coalesce(func.sum(QualityCountRow.n), 0)).where(QualityCountRow.signal == TOOL_ERROR))
        )


def test_a_replica_whose_clock_runs_ahead_folds_by_the_database_clock(db_url, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A replica whose host clock ran 3 h ahead took another replica's live lease (its expiry looked past)
    and moved the fold cursor 3 h ahead: every conversation stored in those 3 h was never folded, so a
    regression in them raised nothing. Replicas now read the database's clock for the lease and the cursor."""
    rt = build_runtime(make_settings(db_url, **FAST), registry=CollectorRegistry())
    try:
        right, skewed = build_detector(rt), build_detector(rt)
        store(rt, clean(30, "v1", 1))
        assert right.tick() is True
        monkeypatch.setattr(loop, "datetime", _ThreeHoursAhead)
        assert skewed.tick() is False  # the other replica's lease is live, whatever this host's clock says
        right.release()
        assert skewed.tick() is True
        cursor = rt.metrics.registry.get_sample_value("vigil_detector_cursor_timestamp_seconds")
        assert cursor is not None and cursor <= datetime.now(UTC).timestamp() + 1
        store(rt, [{**c, "conversation_id": f"later-{c['conversation_id']}"} for c in clean(20, "v1", 2)])
        assert skewed.tick() is True
        assert _counted(rt) == 50
    finally:
        rt.close()
