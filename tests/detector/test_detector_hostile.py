"""The detector facing odd version names, revisions and traffic shapes seen in production."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import REVIEWER, make_client, make_settings
from tests.support.traffic import clean
from vigil.app.runtime import build_runtime
from vigil.detector.models import DetectorSeriesRow
from vigil.detector.wiring import build_detector
from vigil.schema import Conversation
from vigil.store.signals import version_key

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
    """One pass by a replica whose clock ran 3 h ahead moved the fold cursor there: later passes folded
    nothing stored before it (600 regressed conversations were never counted) while last_run stayed fresh,
    so DetectorNotRunning kept quiet. The cursor is exported for the alert to see."""
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
