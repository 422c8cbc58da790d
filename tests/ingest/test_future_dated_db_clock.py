"""Times arriving are checked against the database's clock, not this host's: a replica whose clock runs behind
takes fresh data (instead of refusing every conversation as dated ahead), one whose clock runs ahead refuses
data from the future. The offset is measured at start-up and again once a minute, never on a batch's way."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

import vigil.schema
from tests.support.app import INGEST, make_client, make_settings
from tests.support.clocks import skewed
from vigil.app.runtime import build_runtime
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.runtime import Runtime
from vigil.schema import DATABASE_CLOCK, FUTURE_ALLOWANCE, HOST_BOUND, HOST_CLOCK
from vigil.store.clock import DatabaseClock
from vigil.store.db import clock
from vigil.store.models import ConversationRow, OutcomeRow

pytestmark = pytest.mark.postgres

MINUTES_10 = 10 / 60


def conversation(ended_at: datetime) -> dict[str, Any]:
    [conv] = Simulator(parse_versions("v1:0.0"), 7).stream(1, start=ended_at - timedelta(hours=1))
    return dict(conv, ended_at=ended_at.isoformat())


def database_now(rt: Runtime) -> datetime:
    with rt.sessions() as s:
        return clock(s)


@pytest.fixture
def skewed_runtime(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[float], tuple[Runtime, Any]]]:
    """A runtime on Postgres built on a host whose clock runs ``hours`` ahead (behind when negative)."""
    made: list[Runtime] = []
    clients: list[Any] = []

    def build(hours: float) -> tuple[Runtime, Any]:
        monkeypatch.setattr(vigil.schema, "datetime", skewed(hours))
        rt = build_runtime(make_settings(pg_url), registry=CollectorRegistry())
        made.append(rt)
        client = make_client(rt).__enter__()
        clients.append(client)
        return rt, client

    yield build
    for client in clients:
        client.__exit__(None, None, None)
    for rt in made:
        rt.close()


def offset_gauge(rt: Runtime) -> float | None:
    return rt.metrics.registry.get_sample_value("vigil_clock_offset_seconds")


def test_a_host_clock_behind_takes_a_conversation_and_an_outcome_dated_now_by_the_database(skewed_runtime) -> None:
    """Ten minutes behind, the host's clock alone refused every fresh conversation as dated ahead."""
    rt, c = skewed_runtime(-MINUTES_10)
    now = database_now(rt)
    conv = conversation(now)
    r = c.post("/v1/conversations", json=conv, headers=INGEST)
    assert r.status_code == 202, r.text
    outcome = {"conversation_id": conv["conversation_id"], "type": "thumbs_up", "occurred_at": now.isoformat()}
    r = c.post("/v1/outcomes", json=[outcome], headers=INGEST)
    assert r.status_code == 202, r.text
    with rt.sessions() as s:
        assert s.scalars(select(ConversationRow.conversation_id)).all() == [conv["conversation_id"]]
        assert s.scalars(select(OutcomeRow.type)).all() == ["thumbs_up"]
    offset = offset_gauge(rt)  # host minus database: about -600 s, whatever the query took
    assert offset is not None and -660 < offset < -540


def test_a_host_clock_ahead_refuses_a_conversation_eight_minutes_ahead_of_the_database(skewed_runtime) -> None:
    """Ten minutes ahead, the host's clock alone took a conversation dated eight minutes in the future."""
    rt, c = skewed_runtime(MINUTES_10)
    conv = conversation(database_now(rt) + timedelta(minutes=8))
    r = c.post("/v1/conversations", json=conv, headers=INGEST)
    assert r.status_code == 422, r.text
    [error] = r.json()["errors"]
    assert (error["reason"], error["errors"][0]["field"]) == ("occurred_in_future", "ended_at")
    assert "the database's clock reads" in error["errors"][0]["message"]
    outcome = {"conversation_id": conv["conversation_id"], "type": "thumbs_up", "occurred_at": conv["ended_at"]}
    r = c.post("/v1/outcomes", json=[outcome], headers=INGEST)
    assert r.status_code == 422 and r.json()["errors"][0]["reason"] == "occurred_in_future", r.text
    offset = offset_gauge(rt)
    assert offset is not None and 540 < offset < 660


def test_on_sqlite_the_host_clock_is_the_database_clock_and_no_query_is_made(sqlite_url: str) -> None:
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    try:
        assert rt.future_bound is HOST_BOUND and rt.pipeline.bound is HOST_BOUND  # type: ignore[attr-defined]
        assert rt.future_bound.latest_allowed().clock == HOST_CLOCK
        assert offset_gauge(rt) == 0.0
    finally:
        rt.close()


class FakeClocks:
    """A host's wall and monotonic clocks moved by hand, and a database whose clock runs ``offset`` ahead of
    the host's and takes ``query`` seconds to answer (or fails while ``down``)."""

    def __init__(self, offset: timedelta) -> None:
        self.wall = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
        self.mono = 1000.0
        self.offset = offset
        self.query = 0.2
        self.down = False
        self.reads = 0
        self.spawned: list[Callable[[], object]] = []

    def host(self) -> datetime:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)
        self.mono += seconds

    def read(self) -> datetime:
        self.reads += 1
        if self.down:
            raise ConnectionError("database unreachable")
        self.advance(self.query / 2)  # the database reads its clock halfway through the round trip
        at = self.wall + self.offset
        self.advance(self.query / 2)
        return at

    def run_spawned(self) -> None:
        spawned = list(self.spawned)
        self.spawned.clear()
        for measure in spawned:
            measure()


def make_clock(fake: FakeClocks, gauge: Any = None) -> DatabaseClock:
    return DatabaseClock(fake.read, gauge, 60.0, host=fake.host, monotonic=fake.monotonic, spawn=fake.spawned.append)


def test_the_offset_is_measured_from_the_midpoint_and_refreshed_lazily_off_the_batch_path(caplog) -> None:
    from prometheus_client import Gauge

    registry = CollectorRegistry()
    gauge = Gauge("vigil_clock_offset_seconds", "test", registry=registry)
    fake = FakeClocks(timedelta(minutes=10))
    bound = make_clock(fake, gauge)
    assert math.isnan(registry.get_sample_value("vigil_clock_offset_seconds") or 0.0)
    # asked before any measurement: this host's clock meanwhile, and one measurement started, not awaited
    assert bound.latest_allowed().clock == HOST_CLOCK and fake.reads == 0 and len(fake.spawned) == 1
    bound.latest_allowed()
    assert len(fake.spawned) == 1  # one measurement at a time
    fake.run_spawned()
    assert bound.offset == timedelta(minutes=10)  # the query's time split evenly: no error from it
    assert registry.get_sample_value("vigil_clock_offset_seconds") == -600.0
    latest = bound.latest_allowed()
    assert (latest.at, latest.clock) == (fake.wall + timedelta(minutes=10) + FUTURE_ALLOWANCE, DATABASE_CLOCK)
    assert fake.spawned == []  # fresh: no query a batch
    fake.advance(59.5)
    bound.latest_allowed()
    assert fake.spawned == [] and fake.reads == 1
    # the database's clock stepped; a minute on, the next ask measures again (the answer uses the last offset)
    fake.offset = timedelta(minutes=-3)
    fake.advance(1)
    assert bound.latest_allowed().at == fake.wall + timedelta(minutes=10) + FUTURE_ALLOWANCE
    fake.run_spawned()
    assert bound.offset == timedelta(minutes=-3) and registry.get_sample_value("vigil_clock_offset_seconds") == 180.0
    # the database unreachable: the last offset is kept, said once, and not retried before the next minute
    fake.down = True
    with caplog.at_level(logging.WARNING, logger="vigil.store.clock"):
        for _ in range(3):
            fake.advance(60)
            bound.latest_allowed()
            fake.run_spawned()
    assert fake.reads == 5 and bound.offset == timedelta(minutes=-3)
    assert bound.latest_allowed().clock == DATABASE_CLOCK
    warned = [r.getMessage() for r in caplog.records if r.name == "vigil.store.clock"]
    assert len(warned) == 1 and "keeps the last offset" in warned[0]
    fake.down = False
    fake.advance(60)
    bound.latest_allowed()
    fake.run_spawned()
    assert not bound.failing and fake.reads == 6


def test_a_process_no_item_reaches_follows_its_clock_on_each_scrape() -> None:
    # a judge or detector worker measures at start-up and then never asks for the bound: its gauge, and the
    # VigilClockSkew alert on it, must follow a clock fixed (or gone off) later all the same
    from prometheus_client import Gauge

    registry = CollectorRegistry()
    gauge = Gauge("vigil_clock_offset_seconds", "test", registry=registry)
    fake = FakeClocks(timedelta(minutes=10))
    bound = make_clock(fake, gauge)
    bound.measure()  # start-up
    assert registry.get_sample_value("vigil_clock_offset_seconds") == -600.0
    assert fake.spawned == []  # fresh: a scrape queries nothing
    fake.offset = timedelta(0)  # the host's time sync fixed
    fake.advance(60)
    registry.get_sample_value("vigil_clock_offset_seconds")  # a scrape a minute on starts the next measurement
    assert len(fake.spawned) == 1
    fake.run_spawned()
    assert registry.get_sample_value("vigil_clock_offset_seconds") == 0.0


def test_without_any_measurement_the_host_clock_is_the_reference_and_says_so(caplog) -> None:
    fake = FakeClocks(timedelta(minutes=10))
    fake.down = True
    bound = make_clock(fake)
    with caplog.at_level(logging.WARNING, logger="vigil.store.clock"):
        assert bound.measure() is None
    assert "uses this host's clock" in caplog.text
    latest = bound.latest_allowed()
    assert latest.clock == HOST_CLOCK


def test_now_is_the_database_clock_read_from_memory() -> None:
    """What UI sessions and read windows compare other replicas' times with: this host's clock plus the last
    offset (this host's alone before the first measurement), the next measurement started once a minute old."""
    fake = FakeClocks(timedelta(hours=-3))
    database = make_clock(fake)
    assert database.now() == fake.wall and len(fake.spawned) == 1  # not measured yet: not waited for either
    fake.run_spawned()
    assert database.now() == fake.wall - timedelta(hours=3) and fake.reads == 1
    fake.advance(61)
    assert database.now() == fake.wall - timedelta(hours=3) and len(fake.spawned) == 1 and fake.reads == 1
    assert abs(HOST_BOUND.now() - datetime.now(UTC)) < timedelta(seconds=1)


class HangingDatabase(FakeClocks):
    """A database that takes the connection and never answers the first ``hanging`` reads until released, then
    answers every other read as :class:`FakeClocks` does."""

    def __init__(self, offset: timedelta, hanging: int = 1) -> None:
        super().__init__(offset)
        self.hanging = hanging
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.threads: list[threading.Thread] = []

    def read(self) -> datetime:
        if self.hanging > 0:
            self.hanging -= 1
            self.entered.release()
            assert self.release.wait(30), "never released"
            return self.wall + timedelta(hours=5)  # a late answer: to be dropped, not kept
        return super().read()

    def spawn(self, measure: Callable[[], object]) -> None:
        thread = threading.Thread(target=measure, daemon=True)
        self.threads.append(thread)
        thread.start()

    def finish(self, thread: threading.Thread) -> None:
        thread.join(30)
        assert not thread.is_alive()


def hanging_clock(fake: HangingDatabase, gauge: Any = None, age: Any = None, timeout: float = 5.0) -> DatabaseClock:
    return DatabaseClock(
        fake.read, gauge, 60.0, host=fake.host, monotonic=fake.monotonic, spawn=fake.spawn,
        timeout_seconds=timeout, age_gauge=age,
    )  # fmt: skip


def test_a_measurement_the_database_never_answers_is_abandoned_and_the_next_minute_measures_again(caplog) -> None:
    from prometheus_client import Gauge

    registry = CollectorRegistry()
    gauge = Gauge("vigil_clock_offset_seconds", "test", registry=registry)
    age = Gauge("vigil_clock_offset_age_seconds", "test", registry=registry)
    fake = HangingDatabase(timedelta(minutes=10))
    bound = hanging_clock(fake, gauge, age)
    bound.latest_allowed()
    assert fake.entered.acquire(timeout=30)  # the first measurement waits on the database
    fake.advance(4)
    bound.latest_allowed()
    assert len(fake.threads) == 1  # within its 5 s: still awaited, no second one
    with caplog.at_level(logging.WARNING, logger="vigil.store.clock"):
        fake.advance(2)
        assert bound.latest_allowed().clock == HOST_CLOCK  # abandoned: nothing measured yet
    assert bound.failing and "did not answer within 5 s" in caplog.text
    assert len(fake.threads) == 1  # not retried at once: a minute after the one abandoned started
    assert math.isnan(registry.get_sample_value("vigil_clock_offset_age_seconds") or 0.0)
    fake.advance(54)
    bound.latest_allowed()
    assert len(fake.threads) == 2
    fake.finish(fake.threads[1])
    assert bound.offset == timedelta(minutes=10) and not bound.failing
    assert registry.get_sample_value("vigil_clock_offset_seconds") == -600.0
    assert registry.get_sample_value("vigil_clock_offset_age_seconds") == 0.0
    fake.advance(30)
    assert registry.get_sample_value("vigil_clock_offset_age_seconds") == 30.0
    # the abandoned one answers at last: too late to say when the database read its clock, so dropped
    fake.release.set()
    fake.finish(fake.threads[0])
    assert bound.offset == timedelta(minutes=10) and registry.get_sample_value("vigil_clock_offset_seconds") == -600.0


def test_measurements_left_waiting_are_bounded_and_a_database_answering_again_is_measured(caplog) -> None:
    """Each measurement left waiting holds a thread and a connection: three at most, then none is started
    until one of them returns; the age gauge keeps growing meanwhile."""
    from prometheus_client import Gauge

    registry = CollectorRegistry()
    age = Gauge("vigil_clock_offset_age_seconds", "test", registry=registry)
    fake = HangingDatabase(timedelta(minutes=-2), hanging=0)
    bound = hanging_clock(fake, age=age)
    bound.measure()  # start-up, answered
    assert bound.offset == timedelta(minutes=-2)
    fake.hanging = 10
    for minute in range(1, 6):
        fake.advance(60)
        bound.latest_allowed()
        if minute <= 3:
            assert fake.entered.acquire(timeout=30)
    assert len(fake.threads) == 3
    assert registry.get_sample_value("vigil_clock_offset_age_seconds") == 300.0
    assert bound.latest_allowed().clock == DATABASE_CLOCK  # the last offset kept meanwhile
    fake.hanging = 0
    fake.release.set()
    for thread in fake.threads:
        fake.finish(thread)
    bound.latest_allowed()  # the next measurement starts as soon as one of those returned
    assert len(fake.threads) == 4
    fake.finish(fake.threads[3])
    assert not bound.failing and registry.get_sample_value("vigil_clock_offset_age_seconds") == 0.0


def test_start_up_waits_a_bounded_time_on_a_database_that_takes_the_connection_and_never_answers() -> None:
    """A server that accepts connections and answers nothing (a stopped process behind a live socket): the
    process starts with this host's clock instead of waiting on it for ever."""
    import socket

    from vigil.store import db
    from vigil.store.clock import future_bound

    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    taken = threading.Event()

    def accept() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        accepted.append(conn)
        taken.set()

    threading.Thread(target=accept, daemon=True).start()
    port = server.getsockname()[1]
    # connect_timeout 0: libpq waits on the start-up reply for ever, as on a server that answers nothing
    engine = db.make_engine(f"postgresql://vigil@127.0.0.1:{port}/vigil?connect_timeout=0")
    try:
        bound = future_bound(engine, db.make_sessionmaker(engine), timeout_seconds=0.2)
        assert taken.wait(30)
        assert isinstance(bound, DatabaseClock) and bound.offset is None and bound.failing
        assert bound.latest_allowed().clock == HOST_CLOCK
    finally:
        server.close()
        for conn in accepted:
            conn.close()
        engine.dispose()
