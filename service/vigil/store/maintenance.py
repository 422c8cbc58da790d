"""Periodic upkeep of the store: rollups kept current, old rows rolled off (``serve`` and ``detector``).

Both jobs are safe on every replica at once: the rollup job takes an advisory lock (another replica's
run is skipped), retention deletes in small batches that any replica may repeat.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from functools import partial

from sqlalchemy.orm import Session, sessionmaker

from vigil.metrics import Metrics
from vigil.settings import Settings
from vigil.store import retention, rollup_job

log = logging.getLogger(__name__)


def refresh_rollups(
    settings: Settings, sessions: sessionmaker[Session], only_if_behind: bool = False
) -> rollup_job.RefreshResult:
    """The rollup job with this deployment's lag and retention.

    ``only_if_behind`` is the catch-up of a read: it runs only when something was written since the last
    run and looks no further back than that run (no lag), so a read does at most one interval's work;
    late commits inside the lag are the periodic job's."""
    return rollup_job.refresh(
        sessions,
        0.0 if only_if_behind else settings.rollup_lag_seconds,
        frozen_before=partial(retention.frozen_before, settings),  # on the job's clock, the database's
        only_if_behind=only_if_behind,
    )


class Maintenance:
    """Runs the rollup job every ``rollup_interval_seconds`` and retention every ``retention_interval_seconds``."""

    def __init__(self, settings: Settings, sessions: sessionmaker[Session], metrics: Metrics | None = None) -> None:
        self.settings, self.sessions, self.metrics = settings, sessions, metrics
        self._task: asyncio.Task[None] | None = None
        self._next_retention = 0.0
        self.jobs: list[tuple[str, Callable[[], object]]] = [
            ("rollups", lambda: refresh_rollups(settings, sessions)),
        ]

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

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.tick()
            stop.wait(self.settings.rollup_interval_seconds)

    def thread(self, stop: threading.Event) -> threading.Thread:
        t = threading.Thread(target=self.run, args=(stop,), name="vigil-maintenance", daemon=True)
        t.start()
        return t

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.to_thread(self.tick)
            await asyncio.sleep(self.settings.rollup_interval_seconds)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
