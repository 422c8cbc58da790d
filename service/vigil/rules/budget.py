"""A time budget per rule and conversation, enforced by one watchdog thread.

Rules are pure Python over texts whose regular expressions run on RE2 (linear time), so a rule that
runs long is a rule with a bug or an input far out of the ordinary. Either way it must not stall the
stream: when a rule passes its deadline the watchdog raises :class:`RuleTimeout` inside the thread
running it (``PyThreadState_SetAsyncExc``: delivered at the next Python bytecode, so a long call into C
finishes first), and the engine records a ``rule_timeout`` error finding instead of its hits.

The budget counts the CPU time of the thread running the rule, not the wall clock: on a busy machine a
thread that waits for a core (or for the interpreter lock) has not spent its budget, and a cheap rule
must never be stopped because the host was loaded. The watchdog wakes at the wall-clock deadline,
reads the thread's CPU clock, and moves the deadline on by the budget not yet spent.

Arming and disarming take one uncontended lock (well under a microsecond) and a read of the monotonic
clock; the watchdog sleeps until the nearest deadline it knows of, and not at all while no rule runs.
The thread's CPU clock is a system call (1.5 µs on a small VM, as much as a cheap rule), so arming
reads it only when the last reading is older than a twentieth of the budget by the wall clock: a
thread cannot spend more CPU time than wall time passes, so that reading plus the wall time since is
an upper bound of the CPU clock at the rule's start. Measured from that bound, the CPU a rule has
spent is never overstated, and a rule is stopped once it has spent at least its budget and at most a
twentieth more.
"""

from __future__ import annotations

import ctypes
import threading
import time

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
_set_async_exc.restype = ctypes.c_int


class RuleTimeout(Exception):  # noqa: N818  (raised into a rule, like TimeoutError; not a VigilError)
    """A rule ran past its budget on one conversation."""


class Guard:
    """One thread's running rule: its deadline, and whether the watchdog already fired on it."""

    __slots__ = ("tid", "deadline", "fired", "budget", "cpu_start", "clock", "_watchdog", "_read_cpu", "_read_at")

    def __init__(self, watchdog: Watchdog) -> None:
        self.tid = threading.get_ident()
        self.deadline: float | None = None
        self.fired = False
        self.budget = 0.0
        self.cpu_start = 0.0
        self.clock = _cpu_clock(self.tid)
        self._watchdog = watchdog
        self._read_cpu = 0.0  # the thread's CPU clock at its last reading, and the monotonic clock then
        self._read_at = float("-inf")

    def start(self, budget_seconds: float) -> None:
        wd = self._watchdog
        with wd.lock:
            now = time.monotonic()
            if now - self._read_at > budget_seconds * 0.05:
                self._read_cpu, self._read_at = self.cpu(), now
            self.deadline = deadline = now + budget_seconds
            self.budget = budget_seconds
            self.cpu_start = self._read_cpu + (now - self._read_at)
            self.fired = False
            wd.guards[self.tid] = self
            if wd.wake_at is None or wd.wake_at > deadline:
                wd.cond.notify()

    def stop(self) -> bool:
        """Disarm; returns whether the budget ran out. No exception of this guard is left pending after."""
        with self._watchdog.lock:
            self.deadline = None
            fired, self.fired = self.fired, False
            if fired:
                _set_async_exc(self.tid, ctypes.py_object())  # clears one not yet delivered
            return fired

    def cpu(self) -> float:
        """CPU seconds this guard's thread has used (the wall clock where the platform has no thread clock)."""
        return time.clock_gettime(self.clock) if self.clock is not None else time.monotonic()

    def spent(self) -> float:
        """A lower bound of the CPU time the running rule has used (see the module's docstring)."""
        return self.cpu() - self.cpu_start

    def close(self) -> None:
        with self._watchdog.cond:
            self._watchdog.guards.pop(self.tid, None)


class Watchdog:
    """Raises RuleTimeout in threads whose guard passed its deadline."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # arming takes it directly: Condition's own __enter__ is a Python call
        self.cond = threading.Condition(self.lock)
        self.guards: dict[int, Guard] = {}
        # When the watchdog wakes next on its own (None: not until notified). A rule armed with a later
        # deadline does not wake it: it reads that deadline when it wakes, so a thread running rule after
        # rule costs it one wake-up per budget, not two thread switches per rule.
        self.wake_at: float | None = None
        self._thread: threading.Thread | None = None

    def guard(self) -> Guard:
        if self._thread is None:
            with self.cond:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="vigil-rule-watchdog", daemon=True)
                    self._thread.start()
        return Guard(self)

    def _run(self) -> None:
        with self.cond:
            while True:
                now = time.monotonic()
                nearest: float | None = None
                for g in self.guards.values():
                    if g.deadline is None or g.fired:
                        continue
                    if g.deadline <= now:
                        left = g.budget - g.spent()
                        if left > 0:  # the thread waited for a core: its budget is not spent yet
                            g.deadline = now + max(left, 0.001)
                        else:
                            g.fired = True
                            _set_async_exc(g.tid, ctypes.py_object(RuleTimeout))
                            continue
                    if nearest is None or g.deadline < nearest:
                        nearest = g.deadline
                self.wake_at = nearest
                self.cond.wait(None if nearest is None else nearest - now)
                self.wake_at = None


def _cpu_clock(tid: int) -> int | None:
    try:
        return time.pthread_getcpuclockid(tid)
    except (AttributeError, OSError):  # not every platform has per-thread CPU clocks
        return None


WATCHDOG = Watchdog()
