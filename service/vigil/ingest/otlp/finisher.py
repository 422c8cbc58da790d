"""Finishes traced conversations whose root span never ends: a thread in ``vigil serve`` and ``vigil consume``.

Every ``VIGIL_OTLP_FINISH_INTERVAL_SECONDS`` it asks :meth:`TraceIngest.finish_idle` for the
conversations idle for ``VIGIL_OTLP_TRACE_IDLE_SECONDS``; each is claimed by one replica, assembled as
``finished`` and sent through the pipeline, so rules, sampling and the judge see it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import uuid

from vigil.ingest.otlp.ingest import TraceIngest
from vigil.store.db import db_detail

log = logging.getLogger(__name__)


class TraceFinisher:
    def __init__(self, ingest: TraceIngest, interval: float) -> None:
        self.ingest = ingest
        self.interval = interval
        self.owner = f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_once(self) -> list[str]:
        """Finish what is idle now; returns the conversation ids processed."""
        return self.ingest.finish_idle(self.owner)

    def _run(self) -> None:
        failures = 0
        while not self._stop.wait(self.interval):
            try:
                done = self.run_once()
            except Exception as exc:  # a database hiccup must not end the loop; the next round tries again
                failures += 1
                # the traceback once; each round after it one line (an outage is a round every few seconds)
                log.error(
                    "finishing idle traced conversations failed (round %d): %s",
                    failures,
                    db_detail(exc),
                    exc_info=failures == 1,
                )
                continue
            if failures:
                log.info("finishing idle traced conversations works again after %d failed round(s)", failures)
                failures = 0
            if done:
                log.info("finished %d idle traced conversations", len(done))

    def start_thread(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="vigil-otlp-finisher", daemon=True)
        self._thread.start()

    def stop_thread(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # the ``background`` protocol of ``vigil serve``
    async def start(self) -> None:
        self.start_thread()

    async def stop(self) -> None:
        await asyncio.to_thread(self.stop_thread)
