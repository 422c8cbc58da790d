"""The console's read windows ("the last hour", the read window, outcome rates' settle time) end at now on the
database's clock, which stamps what they count, not at the serving replica's host clock: an API replica on a
host 3 h ahead or behind (:func:`tests.support.clocks.host_clock`) shows what the others show."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import update

from tests.support.app import ADMIN, make_client, make_settings
from tests.support.clocks import host_clock
from tests.support.review import simulated, store
from vigil.app.runtime import build_runtime
from vigil.compare.api import outcomes_before, window
from vigil.runtime import Runtime
from vigil.store.db import clock
from vigil.store.models import ConversationRow

pytestmark = pytest.mark.postgres


@pytest.fixture
def replica(pg_url: str) -> Iterator[Any]:
    """``replica(hours)``: a runtime and its API client, built and answering on a host clock ``hours`` off."""
    made: list[tuple[Runtime, Any]] = []

    def make(hours: float) -> tuple[Runtime, Any]:
        with host_clock(hours):
            rt = build_runtime(make_settings(pg_url), registry=CollectorRegistry())
            made.append((rt, make_client(rt)))
        return made[-1]

    yield make
    for rt, client in made:
        client.close()
        rt.close()


def last_hour(client: Any, hours: float) -> dict[str, int]:
    with host_clock(hours):
        r = client.get("/v1/overview", headers=ADMIN)
    assert r.status_code == 200, r.text
    return {t["version"]: t["conversations"]["hour"] for t in r.json()["traffic"]}


def database_now(rt: Runtime) -> datetime:
    with rt.sessions() as s:
        return clock(s)


def test_the_last_hour_on_a_replica_ahead_holds_the_conversations_stored_a_moment_ago(replica) -> None:  # type: ignore[no-untyped-def]
    """3 h ahead, the home page's last hour began 2 h after the newest conversation: none in it."""
    rt, client = replica(3)
    sent = simulated(5, "v1:0.5", seed=3)  # by agents on time
    with host_clock(3):
        store(rt, sent)
    assert last_hour(client, 3) == {"v1": 5}


def test_the_last_hour_on_a_replica_behind_leaves_out_conversations_stored_two_hours_ago(replica) -> None:  # type: ignore[no-untyped-def]
    """3 h behind, the home page's last hour began 4 h ago: it counted conversations stored 2 h before."""
    rt, client = replica(-3)
    earlier, later = simulated(4, "v1:0.5", seed=3), simulated(2, "v2:0.5", seed=4)
    with host_clock(-3):
        store(rt, earlier)
    with rt.sessions.begin() as s:
        s.execute(update(ConversationRow).values(received_at=database_now(rt) - timedelta(hours=2)))
    with host_clock(-3):
        store(rt, later)
    assert last_hour(client, -3) == {"v2": 2}


@pytest.mark.parametrize("hours", [3, -3])
def test_the_read_window_and_the_outcome_settle_time_end_at_the_database_clock(replica, hours: float) -> None:  # type: ignore[no-untyped-def]
    rt, _client = replica(hours)
    with host_clock(hours):
        settled, (since, _until) = outcomes_before(rt), window(rt, None, None)
    now = database_now(rt)
    assert settled is not None and abs(settled - (now - timedelta(hours=6))) < timedelta(minutes=1)
    days = timedelta(days=rt.settings.read_window_days)
    assert since is not None and timedelta(0) <= (now - days) - since < timedelta(hours=1, minutes=1)
