"""Finishes traced conversations whose root span never ends: a thread in ``vigil serve`` and ``vigil consume``.

Every ``VIGIL_OTLP_FINISH_INTERVAL_SECONDS`` it asks :meth:`TraceIngest.finish_idle` for the
conversations idle for ``VIGIL_OTLP_TRACE_IDLE_SECONDS``; each is claimed by one replica, assembled as
``finished`` and sent through the pipeline, so rules, sampling and the judge see it. Each sweep beats the
``trace_finisher`` heartbeat (``/healthz``): a sweep stuck past ``VIGIL_LIVENESS_STALL_SECONDS``, or a
thread that ended, fails it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import uuid

from vigil.heartbeat import Heartbeat
from vigil.ingest.otlp.ingest import TraceIngest
from vigil.store.db import db_detail

log = logging.getLogger(__name__)


class TraceFinisher:
    def __init__(self, ingest: TraceIngest, interval: float, heartbeat: Heartbeat | None = None) -> None:
        self.ingest = ingest
        self.interval = interval
        self.heartbeat = heartbeat or Heartbeat(name="trace_finisher")
        self.owner = f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0

    def run_once(self) -> list[str]:
        """Finish what is idle now; returns the conversation ids processed."""
        return self.ingest.finish_idle(self.owner)

    def _run(self) -> None:
        with self.heartbeat.loop():
            self.heartbeat.beat(idle=self.interval)  # the wait for the first sweep is not a stall
            while not self._stop.wait(self.interval):
                self._sweep()
                self.heartbeat.beat(idle=self.interval)

    def _sweep(self) -> None:
        try:
            done = self.run_once()
        except Exception as exc:  # a database hiccup must not end the loop; the next round tries again
            self._failures += 1
            # the traceback once; each round after it one line (an outage is a round every few seconds)
            log.error(
                "finishing idle traced conversations failed (round %d): %s",
                self._failures,
                db_detail(exc),
                exc_info=self._failures == 1,
            )
            return
        if self._failures:
            log.info("finishing idle traced conversations works again after %d failed round(s)", self._failures)
            self._failures = 0
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
