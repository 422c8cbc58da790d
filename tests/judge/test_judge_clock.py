"""Judge workers whose host clocks disagree share the queue by the database's clock, on SQLite and Postgres.

A replica's host clock running ahead or behind is simulated by patching ``vigil.store.db.datetime`` (what
``utcnow`` reads): every time the process takes from its host then runs ahead or behind."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.judge.test_judge_worker import feed, requests, setup, verdicts
from tests.support.clocks import skewed
from tests.support.judge_fakes import Scripted
from vigil.judge import verdicts as writes
from vigil.judge.attempt import Outcome
from vigil.store import db
from vigil.store.db import aware


def test_a_worker_whose_clock_runs_ahead_takes_no_live_lease(db_url: str, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A worker 3 h ahead saw every other worker's lease (300 s) as run out and took its requests: the
    same conversation judged, and paid for, twice. Then it judges what is due, its own leases holding."""
    rt, right = setup(db_url, tmp_path, Scripted(), n=3)
    rt_b, ahead = setup(db_url, tmp_path, Scripted())
    try:
        held = right.worker._claim("tj", 10)
        assert len(held) == 3
        monkeypatch.setattr(db, "datetime", skewed(3))
        assert ahead.worker._claim("tj", 10) == []  # their leases are live, whatever this host's clock says
        feed(rt_b, 2, seed=2)  # stored by the replica ahead: due now for every worker
        monkeypatch.setattr(db, "datetime", datetime)
        assert len(right.worker._claim("tj", 10)) == 2
    finally:
        rt.close()
        rt_b.close()


def test_a_worker_whose_clock_runs_behind_writes_leases_and_retries_the_others_see(
    db_url: str, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A worker 3 h behind found no request due (they were stored on the others' time), and wrote leases
    already run out for the others (who took its requests while it judged them) and retry times already
    past (a provider outage met a burst of retries)."""
    rt, right = setup(db_url, tmp_path, Scripted(), n=2)
    rt_b, behind = setup(db_url, tmp_path, Scripted())
    try:
        monkeypatch.setattr(db, "datetime", skewed(-3))
        first, second = behind.worker._claim("tj", 10)
        writes.write(behind.engine, behind.worker.owner, [], [Outcome(second, "retry", delay=60.0)])
        monkeypatch.setattr(db, "datetime", datetime)
        assert right.worker._claim("tj", 10) == []  # one lease live, one retry 60 s away
        retry = next(r for r in requests(rt) if r.id == second.id)
        assert aware(retry.next_attempt_at) > datetime.now(UTC) + timedelta(seconds=30)
    finally:
        rt.close()
        rt_b.close()


@pytest.mark.parametrize("hours", [24, -24])
def test_a_worker_on_a_skewed_clock_judges_within_its_leases_and_keeps_the_budget_day(
    tmp_path: Path, monkeypatch, hours: float
) -> None:  # type: ignore[no-untyped-def]
    """The worker's own checks (a call must end within its lease; today's spend) follow the database's
    clock too: a host a day off counted another day's spend against the cap."""
    monkeypatch.setattr(db, "datetime", skewed(hours))
    client = Scripted(cost=0.004)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=3)
    try:
        assert asyncio.run(stage.worker.run_until_idle(20)) == 3
        assert len(client.calls) == 3
        today = datetime.now(UTC).date()  # the real clock's: what the database's reads
        assert stage.engine.lanes["tj"].budget.day == today
        assert all(aware(v.created_at).date() == today for v in verdicts(rt))
    finally:
        rt.close()


def test_a_worker_started_on_a_clock_running_ahead_sees_a_resume_asked_after_it_stopped(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A judge stopped at start (no provider key) by a worker 3 h ahead ignored a resume asked through a
    replica on the right time for 3 h: the request looked older than the stop."""
    from vigil.judge import store
    from vigil.judge.client import LiteLLMClient

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)
    monkeypatch.setattr(db, "datetime", skewed(3))
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, LiteLLMClient())
    try:
        lane = stage.engine.lanes["tj"]
        assert lane.state == "stopped_config_error"
        stage.worker._housekeeping()
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fixed")
        with rt.sessions.begin() as s:  # asked through a replica whose clock is right
            store.request_resume(s, "tj", datetime.now(UTC) + timedelta(seconds=1))
        stage.worker._housekeeping()
        assert lane.state == "running"
    finally:
        rt.close()
