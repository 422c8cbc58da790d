"""Waiting in tests: on a condition, never a fixed sleep, with deadlines scaled for a busy machine.

``VIGIL_TEST_TIME_SCALE`` (default 1) multiplies every deadline the tests give: CI runs the suite while
other work keeps every core busy and sets it to 3, so a test waits longer before it fails, never longer
when things go well (every wait returns as soon as its condition holds).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def time_scale() -> float:
    """The factor ``VIGIL_TEST_TIME_SCALE`` sets (at least 1)."""
    try:
        return max(1.0, float(os.environ.get("VIGIL_TEST_TIME_SCALE", "1") or 1))
    except ValueError:
        return 1.0


def scaled(seconds: float) -> float:
    """A deadline of ``seconds`` on an idle machine, stretched by ``VIGIL_TEST_TIME_SCALE``."""
    return seconds * time_scale()


def wait_for(check: Callable[[], T], timeout: float = 30.0, interval: float = 0.05, what: str = "") -> T:
    """Poll ``check`` until it returns something truthy and return that; fail after ``scaled(timeout)``.

    Raises AssertionError naming ``what`` (or the check) and the last value seen.
    """
    deadline = time.monotonic() + scaled(timeout)
    last: T = check()
    while not last:
        if time.monotonic() >= deadline:
            name = what or getattr(check, "__name__", "condition")
            raise AssertionError(f"waited {scaled(timeout):.0f} s for {name}; last value {last!r}")
        time.sleep(interval)
        last = check()
    return last


async def async_wait_for(check: Callable[[], T], timeout: float = 30.0, interval: float = 0.02, what: str = "") -> T:
    """:func:`wait_for` inside an event loop (yields to it between polls)."""
    import asyncio

    deadline = time.monotonic() + scaled(timeout)
    last: T = check()
    while not last:
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {scaled(timeout):.0f} s for {what or 'condition'}; last value {last!r}")
        await asyncio.sleep(interval)
        last = check()
    return last
