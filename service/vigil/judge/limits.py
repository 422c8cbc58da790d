"""What keeps the judge within bounds: the retry policy, the rate limiter, the circuit breaker, the budget."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Literal

from vigil.judge.errors import ProviderError

Action = Literal["retry", "give_up", "stop_judge", "unscored"]


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    delay: float = 0.0


def decide(
    err: ProviderError,
    attempts: int,
    max_attempts: int,
    base: float,
    cap: float,
    rng: random.Random | None = None,
) -> Decision:
    """The retry policy, in one place.

    Retryable errors wait ``base * 2**(attempts-1)`` capped at ``cap``, with equal jitter (half fixed,
    half random, so replicas hitting the same 429 spread out but the wait still grows), until
    ``max_attempts``. Configuration errors stop the judge; rejected requests and replies that cannot be
    read become ``unscored``.
    """
    if err.kind == "config":
        return Decision("stop_judge")
    if err.kind in ("rejected", "unreadable"):
        return Decision("unscored")
    if attempts >= max_attempts:
        return Decision("give_up")
    step = min(cap, base * 2 ** max(0, attempts - 1))
    delay = step / 2 + (rng or random).uniform(0, step / 2)
    # a provider that says when to come back (Retry-After) is not asked again before that
    return Decision("retry", max(delay, err.retry_after or 0.0))


class RateLimiter:
    """Requests-per-minute token bucket; ``acquire`` waits for a token."""

    def __init__(self, rpm: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rpm / 60.0
        self.capacity = max(1.0, min(float(rpm), self.rate * 5))  # bursts of up to ~5 s of budget
        self.tokens = self.capacity
        self.clock = clock
        self.stamp = clock()
        self._lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def calls_within(self, seconds: float) -> int:
        """How many calls the bucket lets start within ``seconds`` from now."""
        self._refill()
        return int(self.tokens + self.rate * max(0.0, seconds))

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a lock is bound to one event loop; CLI runs may start several
            self._lock, self._loop = asyncio.Lock(), loop
        async with self._lock:
            while True:
                self._refill()
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                await asyncio.sleep((1 - self.tokens) / self.rate)


class CircuitBreaker:
    """Opens after ``threshold`` consecutive retryable failures; after ``cooldown`` lets one probe through."""

    def __init__(self, threshold: int, cooldown: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.clock = clock
        self.failures = 0
        self.opened_at: float | None = None
        self.probing = False

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def allow(self) -> bool:
        """May a call start now? In the half-open state only one probe is allowed at a time."""
        if self.opened_at is None:
            return True
        if self.probing or self.clock() - self.opened_at < self.cooldown:
            return False
        self.probing = True
        return True

    def remaining(self) -> float:
        """Seconds until the open circuit lets a probe through (0 when it may now)."""
        if self.opened_at is None:
            return 0.0
        return max(0.0, self.cooldown - (self.clock() - self.opened_at))

    def cancel_probe(self) -> None:
        """The probe allowed by :meth:`allow` made no call (nothing was due): let the next one through."""
        self.probing = False

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self.probing = False

    def failure(self, retry_after: float | None = None) -> None:
        """A retryable failure; ``retry_after``: the provider asked for that long (the probe waits for it)."""
        self.failures += 1
        if self.probing or self.failures >= self.threshold:
            # opened so that the probe comes after the cooldown and after what the provider asked for
            self.opened_at = self.clock() + max(0.0, (retry_after or 0.0) - self.cooldown)
        self.probing = False


def utc_day(now: datetime) -> date:
    return now.astimezone(UTC).date()


class Budget:
    """Daily (UTC) spend cap. ``reserve`` before a call, ``settle`` after; spend of other workers is
    folded in with :meth:`observe` from the database."""

    def __init__(self, cap_usd: float) -> None:
        self.cap = cap_usd
        self.day: date | None = None
        self.spent = 0.0  # settled spend this day: stored total at last observe + own spend since
        self.reserved = 0.0
        self.estimate = 0.0  # expected cost of one call, learned from replies

    def roll(self, today: date) -> None:
        if self.day != today:
            self.day, self.spent = today, 0.0

    def observe(self, today: date, stored_total: float, own_since: float = 0.0) -> None:
        self.roll(today)
        total = stored_total + own_since
        if math.isfinite(total):  # a stored NaN or infinity must not poison the day's spend
            self.spent = max(self.spent, total)

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.cap or self.spent + self.estimate > self.cap

    def reserve(self) -> float | None:
        """Hold the expected cost of one call; None when the cap does not allow another call today."""
        amount = self.estimate
        if self.exhausted or self.spent + self.reserved + amount > self.cap:
            return None
        self.reserved += amount
        return amount

    def settle(self, reserved: float, cost: float | None) -> None:
        """Release the reservation and charge ``cost``. A cost that is not a finite number >= 0 (negative,
        NaN, infinity) is unknown, like None: nothing is charged, so the spend never goes down or turns
        NaN, and the estimate of a call is left as it was."""
        self.reserved = max(0.0, self.reserved - reserved)
        if cost is not None and math.isfinite(cost) and cost >= 0:
            self.spent += cost
            self.estimate = cost if self.estimate == 0 else 0.8 * self.estimate + 0.2 * cost

    def release(self, reserved: float) -> None:
        self.reserved = max(0.0, self.reserved - reserved)
