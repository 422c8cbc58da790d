"""The database's clock on this host, without a query per batch: the offset between the two clocks, measured
at start-up and again once a minute while it is asked or scraped (see :class:`DatabaseClock`)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from prometheus_client import Gauge
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from vigil.schema import DATABASE_CLOCK, FUTURE_ALLOWANCE, HOST_BOUND, FutureBound, LatestAllowed, host_now
from vigil.store.db import clock

log = logging.getLogger(__name__)

# Clocks drift by milliseconds an hour; a minute between measurements follows a clock stepped by NTP (or an
# operator) within a minute, at one cheap query a minute.
REFRESH_SECONDS = 60.0
# A measurement takes milliseconds. One still unanswered after 15 s (longer than libpq's 10 s connect timeout,
# so a connection being made fails on its own first) waits on a database that took the connection and answers
# nothing (a stopped server behind a live socket): it is abandoned, and the next is started a minute after it.
TIMEOUT_SECONDS = 15.0
# Each abandoned measurement still holds its thread and a pooled connection until the database answers or the
# connection breaks: past this many at once, none is started until one of them returns.
MAX_WAITING = 3


def _in_thread(measure: Callable[[], object]) -> None:
    threading.Thread(target=measure, name="vigil-clock-offset", daemon=True).start()


class DatabaseClock:
    """The latest time an arriving item may carry on the database's clock: this host's clock plus the offset
    last measured (``database − host``), plus :data:`~vigil.schema.FUTURE_ALLOWANCE`. Every time stored is
    stamped on the database's clock (``received_at``, the detector's hours), so a replica whose clock runs
    behind must not refuse fresh data as dated ahead, nor one running ahead take data from the future.

    One measurement reads the database's clock (``read``) between two reads of this host's monotonic clock,
    and takes the offset from the midpoint. :meth:`latest_allowed` never waits on the database: once the last
    measurement is older than ``refresh_seconds`` it starts the next one (``spawn``: on a thread) and answers
    with the last offset meanwhile; a scrape of ``gauge`` does the same, so a process no item reaches follows
    its clock too. A failed measurement keeps the last offset; with none yet, the host's clock is the
    reference (and errors name it). Either is logged once, until a measurement succeeds again. A measurement
    unanswered after ``timeout_seconds`` counts as failed and is abandoned: its answer, if one comes, is
    dropped (the midpoint of so long a wait says little of when the database read its clock), and the next
    starts ``refresh_seconds`` after it did, as after any failure; at most :data:`MAX_WAITING` are left
    waiting at once. ``age_gauge`` exports the seconds since the offset in use was measured."""

    def __init__(
        self,
        read: Callable[[], datetime],
        gauge: Gauge | None = None,
        refresh_seconds: float = REFRESH_SECONDS,
        *,
        host: Callable[[], datetime] = host_now,
        monotonic: Callable[[], float] = time.monotonic,
        spawn: Callable[[Callable[[], object]], None] = _in_thread,
        timeout_seconds: float = TIMEOUT_SECONDS,
        age_gauge: Gauge | None = None,
    ) -> None:
        self.read = read
        self.gauge = gauge
        self.refresh_seconds = refresh_seconds
        self.timeout_seconds = timeout_seconds
        self.host = host
        self.monotonic = monotonic
        self.spawn = spawn
        self.offset: timedelta | None = None  # database − host; None until a measurement succeeded
        self.measured_at: float | None = None  # monotonic, of the last attempt (failed ones too: not retried per batch)
        self.succeeded_at: float | None = None  # monotonic, of the measurement ``offset`` comes from
        self.failing = False
        self._lock = threading.Lock()
        self._attempt = 0  # the latest measurement started; an answer to an earlier one is dropped
        self._started: float | None = None  # monotonic start of the latest, while it is awaited
        self._waiting = 0  # measurements inside ``read``, abandoned ones included
        self._reading = math.nan  # host − database in seconds, as the gauge exports it
        if gauge is not None:
            # read on each scrape, which also starts the next measurement once the last is a minute old: a
            # process no item reaches (a judge or detector worker, an idle replica) follows its clock too,
            # instead of exporting its start-up offset for ever
            gauge.set_function(self._scraped)
        if age_gauge is not None:
            age_gauge.set_function(self._age)

    def measure(self) -> timedelta | None:
        """Read the database's clock once on this thread and keep the offset; on failure keep the last one
        (logged once)."""
        with self._lock:
            attempt = self._begin()
        return self._measure(attempt)

    def measure_at_start(self) -> timedelta | None:
        """The start-up measurement, awaited at most ``timeout_seconds``: a database that never answers leaves
        the process started on the host's clock (abandoned, as :meth:`latest_allowed` abandons one)."""
        done = threading.Event()
        with self._lock:
            attempt = self._begin()

        def run() -> None:
            try:
                self._measure(attempt)
            finally:
                done.set()

        self.spawn(run)
        if not done.wait(self.timeout_seconds):
            with self._lock:
                self._abandon_overdue()
        return self.offset

    def _begin(self) -> int:
        """Count a measurement started (under the lock) and return its number."""
        self._attempt += 1
        self._started = self.monotonic()
        self._waiting += 1
        return self._attempt

    def _measure(self, attempt: int) -> timedelta | None:
        try:
            host, start = self.host(), self.monotonic()
            database = self.read()
            elapsed = self.monotonic() - start
        except Exception as exc:  # a database down or slow: ingest goes on with what it has
            with self._lock:
                self._waiting -= 1
                if not self._awaited(attempt):
                    return self.offset
                self.measured_at, self._started = self.monotonic(), None
                first, self.failing = not self.failing, True
            if first:
                log.warning("could not read the database's clock (%s): the future-dated check %s", exc, self._kept())
            return self.offset
        offset = database - (host + timedelta(seconds=elapsed / 2))
        with self._lock:
            self._waiting -= 1
            if not self._awaited(attempt):
                return self.offset
            now = self.monotonic()
            self.offset, self.measured_at, self.succeeded_at, self._started = offset, now, now, None
            recovered, self.failing = self.failing, False
        if recovered:
            log.info("the database's clock reads again: %+.3f s from this host's", offset.total_seconds())
        self._reading = -offset.total_seconds()
        return offset

    def _awaited(self, attempt: int) -> bool:
        """Whether ``attempt``'s answer is still awaited: the latest started, not abandoned (under the lock)."""
        return attempt == self._attempt and self._started is not None

    def _kept(self) -> str:
        return "keeps the last offset" if self.offset is not None else "uses this host's clock"

    def _abandon_overdue(self) -> None:
        """Abandon the measurement awaited once it is ``timeout_seconds`` old (under the lock): a failed attempt
        made when it started, so the next starts ``refresh_seconds`` after it."""
        started = self._started
        if started is None or self.monotonic() - started < self.timeout_seconds:
            return
        self.measured_at, self._started = started, None
        first, self.failing = not self.failing, True
        if first:
            log.warning(
                "the database's clock did not answer within %g s: the measurement is abandoned and the "
                "future-dated check %s",
                self.timeout_seconds,
                self._kept(),
            )

    def _scraped(self) -> float:
        self._refresh()
        return self._reading

    def _age(self) -> float:
        succeeded = self.succeeded_at
        return math.nan if succeeded is None else self.monotonic() - succeeded

    def _refresh(self) -> None:
        """Start the next measurement (``spawn``) once the last is ``refresh_seconds`` old, one awaited at a
        time, abandoning one awaited past ``timeout_seconds``."""
        with self._lock:
            self._abandon_overdue()
            stale = self.measured_at is None or self.monotonic() - self.measured_at >= self.refresh_seconds
            start = stale and self._started is None and self._waiting < MAX_WAITING
            attempt = self._begin() if start else 0
        if start:
            self.spawn(lambda: self._measure(attempt))

    def latest_allowed(self) -> LatestAllowed:
        self._refresh()
        offset = self.offset
        if offset is None:
            return HOST_BOUND.latest_allowed()
        return LatestAllowed(self.host() + offset + FUTURE_ALLOWANCE, DATABASE_CLOCK)

    def now(self) -> datetime:
        """The database's clock without a query: this host's plus the offset last measured (this host's alone
        before any measurement succeeded). What a time another replica wrote is compared with where a query
        per use is too many (a cookie's signature, a UI session's expiry on every request)."""
        self._refresh()
        offset = self.offset
        return self.host() if offset is None else self.host() + offset


def future_bound(
    engine: Engine,
    sessions: sessionmaker[Session],
    gauge: Gauge | None = None,
    age_gauge: Gauge | None = None,
    *,
    timeout_seconds: float = TIMEOUT_SECONDS,
) -> FutureBound:
    """The bound the stages of a process check arriving times against: on Postgres the database's clock
    (:class:`DatabaseClock`, measured once here, waiting at most ``timeout_seconds``); on SQLite this host's,
    which is SQLite's own (no query)."""
    if engine.dialect.name == "sqlite":
        for g in (gauge, age_gauge):
            if g is not None:
                g.set(0.0)
        return HOST_BOUND

    def read() -> datetime:
        with sessions() as session:
            return clock(session)

    bound = DatabaseClock(read, gauge, timeout_seconds=timeout_seconds, age_gauge=age_gauge)
    bound.measure_at_start()
    return bound
