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
    its clock too. A failed measurement keeps the last offset; with none yet, the host's clock
    is the reference (and errors name it). Either is logged once, until a measurement succeeds again."""

    def __init__(
        self,
        read: Callable[[], datetime],
        gauge: Gauge | None = None,
        refresh_seconds: float = REFRESH_SECONDS,
        *,
        host: Callable[[], datetime] = host_now,
        monotonic: Callable[[], float] = time.monotonic,
        spawn: Callable[[Callable[[], object]], None] = _in_thread,
    ) -> None:
        self.read = read
        self.gauge = gauge
        self.refresh_seconds = refresh_seconds
        self.host = host
        self.monotonic = monotonic
        self.spawn = spawn
        self.offset: timedelta | None = None  # database − host; None until a measurement succeeded
        self.measured_at: float | None = None  # monotonic, of the last attempt (failed ones too: not retried per batch)
        self.failing = False
        self._lock = threading.Lock()
        self._measuring = False
        self._reading = math.nan  # host − database in seconds, as the gauge exports it
        if gauge is not None:
            # read on each scrape, which also starts the next measurement once the last is a minute old: a
            # process no item reaches (a judge or detector worker, an idle replica) follows its clock too,
            # instead of exporting its start-up offset for ever
            gauge.set_function(self._scraped)

    def measure(self) -> timedelta | None:
        """Read the database's clock once and keep the offset; on failure keep the last one (logged once)."""
        try:
            host, start = self.host(), self.monotonic()
            database = self.read()
            elapsed = self.monotonic() - start
        except Exception as exc:  # a database down or slow: ingest goes on with what it has
            with self._lock:
                self.measured_at, self._measuring = self.monotonic(), False
                first, self.failing = not self.failing, True
            if first:
                kept = "keeps the last offset" if self.offset is not None else "uses this host's clock"
                log.warning("could not read the database's clock (%s): the future-dated check %s", exc, kept)
            return self.offset
        offset = database - (host + timedelta(seconds=elapsed / 2))
        with self._lock:
            self.offset, self.measured_at, self._measuring = offset, self.monotonic(), False
            recovered, self.failing = self.failing, False
        if recovered:
            log.info("the database's clock reads again: %+.3f s from this host's", offset.total_seconds())
        self._reading = -offset.total_seconds()
        return offset

    def _scraped(self) -> float:
        self._refresh()
        return self._reading

    def _refresh(self) -> None:
        """Start the next measurement (``spawn``) once the last is ``refresh_seconds`` old, one at a time."""
        with self._lock:
            stale = self.measured_at is None or self.monotonic() - self.measured_at >= self.refresh_seconds
            start = stale and not self._measuring
            if start:
                self._measuring = True
        if start:
            self.spawn(self.measure)

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


def future_bound(engine: Engine, sessions: sessionmaker[Session], gauge: Gauge | None = None) -> FutureBound:
    """The bound the stages of a process check arriving times against: on Postgres the database's clock
    (:class:`DatabaseClock`, measured once here); on SQLite this host's, which is SQLite's own (no query)."""
    if engine.dialect.name == "sqlite":
        if gauge is not None:
            gauge.set(0.0)
        return HOST_BOUND

    def read() -> datetime:
        with sessions() as session:
            return clock(session)

    bound = DatabaseClock(read, gauge)
    bound.measure()
    return bound
