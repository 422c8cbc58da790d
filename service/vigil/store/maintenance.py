"""Periodic upkeep of the store: rollups kept current, old rows rolled off (``serve`` and ``detector``).

Both jobs are safe on every replica at once: the rollup job takes an advisory lock (another replica's
run is skipped), retention deletes in small batches that any replica may repeat.

The loop beats the ``maintenance`` heartbeat (``/healthz``) as each statement of its jobs begins and as each
pass ends, every beat allowing ``rollup_interval_seconds`` (the wait between passes) on top of the liveness
bound. A rebuild or a retention backlog that runs for an hour keeps beating as long as it moves on; a
statement (or the work between two) that takes longer than that, or a loop that ended, fails it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from functools import partial

from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session, sessionmaker

from vigil.heartbeat import Heartbeat
from vigil.metrics import Metrics
from vigil.settings import Settings
from vigil.store import retention, rollup_job

log = logging.getLogger(__name__)

POLL = 0.25  # how often a waiting pass looks for a read's wake-up
MIN_SPACING = 1.0  # seconds between the starts of two passes, however often reads wake it


def refresh_rollups(
    settings: Settings, sessions: sessionmaker[Session], only_if_behind: bool = False
) -> rollup_job.RefreshResult:
    """The rollup job with this deployment's lag and retention.

    ``only_if_behind`` is the catch-up of a one-off command (``vigil compare``): it runs only when something
    was written since the last run and looks no further back than that run (no lag); late commits inside
    the lag are the periodic job's. Requests never run it: they count the tail (:mod:`vigil.store.rollup_tail`)."""
    return rollup_job.refresh(
        sessions,
        0.0 if only_if_behind else settings.rollup_lag_seconds,
        frozen_before=partial(retention.frozen_before, settings),  # on the job's clock, the database's
        only_if_behind=only_if_behind,
    )


def beating(sessions: sessionmaker[Session], progress: Callable[[], None]) -> sessionmaker[Session]:
    """Sessions like ``sessions``' that call ``progress`` as each statement begins: the jobs' progress points
    (a batch of retention, a step of a rebuild, an hour recomputed), without a hook in each. Sessions of their
    own: statements elsewhere in the process (requests, the consumer's stores) do not beat."""
    made: sessionmaker[Session] = sessionmaker(class_=sessions.class_, **sessions.kw)

    def began(_state: ORMExecuteState) -> None:
        progress()

    event.listen(made, "do_orm_execute", began)
    return made


class Maintenance:
    """Runs the rollup job every ``rollup_interval_seconds`` and retention every ``retention_interval_seconds``."""

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        metrics: Metrics | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.settings, self.metrics = settings, metrics
        self.heartbeat = heartbeat or Heartbeat(name="maintenance")
        self.sessions = beating(sessions, self._progress)
        self._task: asyncio.Task[None] | None = None
        self._next_retention = 0.0
        self._wake = threading.Event()
        self.jobs: list[tuple[str, Callable[[], object]]] = [
            ("rollups", lambda: refresh_rollups(settings, self.sessions)),
        ]

    def _progress(self) -> None:
        """The jobs moved on, or a pass ended: the next beat may be the wait between passes away."""
        self.heartbeat.beat(idle=self.settings.rollup_interval_seconds)

    def tick(self) -> None:
        """One pass: the rollups, and retention when its interval has come round."""
        for name, job in self.jobs:
            try:
                job()
            except Exception:  # the next pass tries again (database away, a lock timeout)
                log.exception("%s pass failed", name)
        if time.monotonic() >= self._next_retention:
            self._next_retention = time.monotonic() + self.settings.retention_interval_seconds
            try:
                retention.run(self.sessions, self.settings, metrics=self.metrics)
            except Exception:
                log.exception("retention pass failed")

    def wake(self) -> None:
        """A read counted rows the rollups do not hold yet: run the job soon rather than at the next interval,
        so the next read's tail is short (the read does not wait; wakes between two runs make one run)."""
        self._wake.set()

    def _due(self, started: float) -> bool:
        """Whether the next pass is due: the interval is up, or a read woke it and a second has passed."""
        since = time.monotonic() - started
        return since >= self.settings.rollup_interval_seconds or (self._wake.is_set() and since >= MIN_SPACING)

    def run(self, stop: threading.Event) -> None:
        with self.heartbeat.loop():
            while not stop.is_set():
                started = time.monotonic()
                self._wake.clear()
                self.tick()
                self._progress()
                while not stop.is_set() and not self._due(started):
                    stop.wait(POLL)

    def thread(self, stop: threading.Event) -> threading.Thread:
        t = threading.Thread(target=self.run, args=(stop,), name="vigil-maintenance", daemon=True)
        t.start()
        return t

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        with self.heartbeat.loop():
            while True:
                started = time.monotonic()
                self._wake.clear()
                await asyncio.to_thread(self.tick)
                self._progress()
                while not self._due(started):
                    await asyncio.sleep(POLL)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
