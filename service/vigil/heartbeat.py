"""A worker loop's heartbeat: what ``/healthz`` answers from.

Each long-running loop (the consumer of ``vigil consume``, the judge worker, the detector, the idle-trace
finisher, the rollup and retention upkeep, the OTLP/gRPC receiver's watch) has a heartbeat of its own, named
after it (:meth:`vigil.runtime.Runtime.heartbeat`), runs inside :meth:`Heartbeat.loop` and calls
:meth:`Heartbeat.beat` at the end of every iteration, idle ones included, and within long work (a detector
pass folds many hours, a batch waits on a database that is away). A worker's metrics server runs in a thread
of its own, so it answers while the loop is wedged; :meth:`Heartbeat.problem` is what lets it say so, and
Kubernetes' liveness probe then restarts the process. ``vigil serve`` runs its judge worker, detector and the
others in-process: its API's ``/healthz`` answers from theirs (:func:`check`). One heartbeat per loop: a
loop that beats must not hide another's stall.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any


class Heartbeat:
    """The monotonic time a loop last finished an iteration, the wait it announced, and the thread it runs on."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, name: str = "worker") -> None:
        self._clock = clock
        self.name = name  # the loop's, in what :meth:`problem` says
        # one tuple, replaced whole: the metrics server's thread reads it while the loop writes it
        self._last: tuple[float, float] = (clock(), 0.0)
        self._thread: threading.Thread | None = None
        self._ended: str | None = None
        self._returned = False

    def beat(self, idle: float = 0.0) -> None:
        """An iteration finished (or long work moved on); the next beat may be ``idle`` seconds away on top of
        the stall bound: the loop's own wait between passes, which is not a stall."""
        self._last = (self._clock(), max(0.0, idle))

    def age(self) -> float:
        """Seconds since the last beat (the ``vigil_worker_heartbeat_age_seconds`` gauge). It keeps growing once
        the loop has ended: nothing beats any more."""
        return max(0.0, self._clock() - self._last[0])

    def bound(self, stall_seconds: float) -> float:
        """The age past which the loop is stalled: ``stall_seconds`` plus the wait its last beat announced (the
        ``vigil_worker_heartbeat_bound_seconds`` gauge)."""
        return stall_seconds + self._last[1]

    @contextmanager
    def loop(self) -> Iterator[None]:
        """Run a loop under watch: its thread must stay alive, and once it ends, however, it is not alive."""
        self._thread, self._ended, self._returned = threading.current_thread(), None, False
        self.beat()
        try:
            yield
        except BaseException as exc:
            self._ended = f"the {self.name} loop ended: {type(exc).__name__}: {exc}"[:300]
            raise
        else:
            self._ended = f"the {self.name} loop has ended"
            self._returned = True

    def up(self, stall_seconds: float) -> bool:
        """What ``vigil_worker_loop_up`` exports: alive as :meth:`problem` judges it, or returned. A loop returns
        only once its process stops it (a shutdown, a batch run's end), and the metrics port answers until the
        process exits: counted down, every rolling deploy scraped in that window paged VigilLoopStalled."""
        return self._returned or self.problem(stall_seconds) is None

    def problem(self, stall_seconds: float) -> str | None:
        """Why the loop is not alive (one short line), or None while it is."""
        if self._ended is not None:
            return self._ended
        thread = self._thread
        if thread is not None and not thread.is_alive():
            return f"the {self.name} loop's thread {thread.name} is no longer running"
        at, idle = self._last
        age = self._clock() - at
        if age > stall_seconds + idle:
            waits = f" beyond its own wait of {idle:g} s" if idle else ""
            return (
                f"the {self.name} loop is stalled: no iteration finished for {age:.0f} s "
                f"(VIGIL_LIVENESS_STALL_SECONDS={stall_seconds:g}{waits})"
            )
        return None


def check(beats: Mapping[str, Heartbeat], stall_seconds: float) -> tuple[dict[str, str], dict[str, Any]]:
    """Each loop's problem (only those not alive, by name) and every loop's age: what ``/healthz`` says.
    Cheap (a clock read and a look at a thread per loop): probes ask often, and while the database is away."""
    problems = {name: p for name, beat in beats.items() if (p := beat.problem(stall_seconds)) is not None}
    loops: dict[str, Any] = {name: {"age_seconds": round(beat.age(), 3)} for name, beat in sorted(beats.items())}
    for name, p in problems.items():
        loops[name]["problem"] = p
    return problems, loops
