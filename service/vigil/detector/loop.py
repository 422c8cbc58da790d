"""The detector: folds newly stored data into hourly counts and per-series CUSUMs, raises detections.

Every replica may run it; the lease lets one fold data at a time (:mod:`vigil.detector.fold`), and
every replica refreshes its gauges from the shared tables (:mod:`vigil.detector.gauges`), so any
replica's ``/metrics`` shows the same state. Runs as a thread loop (``vigil detector``) or as an
asyncio background task of ``vigil serve``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from vigil.detector import alerts, lease
from vigil.detector.baselines import Baseline, baselines
from vigil.detector.cusum import threshold
from vigil.detector.fold import Folder, record_begins
from vigil.detector.gauges import Gauges
from vigil.detector.hourly import rebuild_totals
from vigil.detector.models import DetectorLeaseRow
from vigil.heartbeat import Heartbeat
from vigil.metrics import Metrics
from vigil.settings import Settings
from vigil.store.db import aware, clock
from vigil.store.signals import Key, RulesFor

log = logging.getLogger(__name__)


def parse_ratios(spec: str) -> list[float]:
    ratios = sorted({float(r) for r in spec.split(",") if r.strip()})
    if not ratios or min(ratios) <= 1.0:
        from vigil.errors import ConfigError

        raise ConfigError(f"VIGIL_DETECTOR_SHIFTS must list ratios above 1, not {spec!r}")
    return ratios


class Detector:
    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        metrics: Metrics,
        rules_for: RulesFor,
        bad_outcomes: list[str],
        holder: str | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.settings = settings
        self.heartbeat = heartbeat or Heartbeat()
        self.sessions = sessions
        self.metrics = metrics
        self.rules_for = rules_for
        self.bad_outcomes = bad_outcomes
        self.holder = holder or lease.holder_id()
        self.ratios = parse_ratios(settings.detector_shifts)
        self.h = threshold(settings.detector_arl0, len(self.ratios))
        self.folder = Folder(settings, metrics, rules_for, bad_outcomes, self.ratios, self.h, self.heartbeat.beat)
        self.gauges = Gauges(metrics)
        self.is_leader = self.led_last_pass = False
        self._stopping = threading.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def outcome_settle(self) -> timedelta:
        return self.folder.outcome_settle

    # --- one pass -------------------------------------------------------------------------------

    def tick(self, now: datetime | None = None) -> bool:
        """Fold new data if this process holds the lease, then refresh gauges. Returns leadership.

        ``now`` (tests) defaults to the database's clock, not this host's: a replica whose clock runs ahead
        would take a live lease early and move the fold cursor past conversations not yet stored (never
        folded after), one running behind would let its lease lapse while it still folds."""
        with self.sessions.begin() as s:
            now = now or clock(s)
            before = lease.current(s)
            taken = before is None or before.holder != self.holder
            held = lease.acquire(s, self.holder, self.settings.detector_lease_seconds, now)
            if held is not None:
                self._lead(s, held, now, taken)
        self.is_leader = self.led_last_pass = held is not None
        self.metrics.detector_leader.set(1 if self.is_leader else 0)
        self.metrics.detector_ticks.labels("leader" if self.is_leader else "follower").inc()
        self.refresh(now)
        return self.is_leader

    def _lead(self, s: Session, held: DetectorLeaseRow, now: datetime, taken: bool = False) -> None:
        """Fold what was stored up to the settle time, move the lease's cursor there, retire quiet series.

        ``taken``: another replica held the lease last. Its version may fold counts without keeping their
        totals (a rolling upgrade), so the series' hours are summed again, once.
        """
        if taken:
            rebuild_totals(s)
        until = now - timedelta(seconds=self.settings.detector_settle_seconds)
        cursor = aware(held.cursor) if held.cursor else None
        if cursor is not None and held.fed_since is None:  # the first pass since the record began (an upgrade)
            self.folder.begin_record(s, cursor)
            held.fed_since = cursor
        if self.folder.advance(s, cursor, until, now, aware(held.fed_since)):
            held.cursor = until
            held.fed_since = held.fed_since or record_begins(until)
        alerts.retire(s, now, self.settings.detector_retire_hours)

    def baselines(self, s: Session, now: datetime) -> dict[Key, Baseline]:
        """Each series' baseline (:func:`vigil.detector.baselines.baselines`)."""
        return baselines(s, self.settings, now)

    def refresh(self, now: datetime | None = None) -> None:
        """Set the quality and detector gauges from the shared tables (``now``: the pass's, the database's clock)."""
        if now is None:
            with self.sessions() as s:
                now = clock(s)
        live_since = now - timedelta(hours=self.settings.detector_retire_hours)
        self.gauges.refresh(self.sessions, self.h, live_since, now)

    # --- running ----------------------------------------------------------------------------------

    def release(self) -> None:
        with self.sessions.begin() as s:
            lease.release(s, self.holder, clock(s))
        self.is_leader = False
        self.metrics.detector_leader.set(0)

    def run(self, stop: threading.Event | None = None, once: bool = False) -> None:
        """Standalone loop (``vigil detector``) until ``stop`` is set; each pass beats the heartbeat, and so does
        each hour a long pass folds (``/healthz`` of the metrics port)."""
        stop = stop or self._stopping
        interval = self.settings.detector_interval_seconds
        try:
            with self.heartbeat.loop():
                while True:
                    self._safe_tick()
                    self.heartbeat.beat(idle=interval)  # the wait for the next pass is not a stall
                    if once or stop.wait(interval):
                        return
        finally:
            self.release()

    def _safe_tick(self) -> None:
        try:
            self.tick()
        except Exception:  # a failed pass (database away) is retried on the next one
            self.metrics.detector_ticks.labels("error").inc()
            log.exception("detector pass failed")

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        """The in-process loop of ``vigil serve``: beats as :meth:`run` does, for the API's ``/healthz``."""
        interval = self.settings.detector_interval_seconds
        with self.heartbeat.loop():
            while True:
                await asyncio.to_thread(self._safe_tick)
                self.heartbeat.beat(idle=interval)  # the wait for the next pass is not a stall
                await asyncio.sleep(interval)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        try:
            await asyncio.to_thread(self.release)
        except Exception:  # the lease simply expires if the database is gone
            log.debug("detector lease release failed", exc_info=True)
