"""Per-judge run state (mode, limits, state machine) shared by the worker, pairwise mode and the API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from vigil.errors import without_frames
from vigil.judge.client import LLMClient, Reply, classify, has_credentials, has_price, sanitize_usage
from vigil.judge.definitions import Judge
from vigil.judge.errors import JudgeError, ProviderError
from vigil.judge.limits import Budget, CircuitBreaker, Decision, RateLimiter, decide, utc_day
from vigil.judge.offline import OFFLINE_LABEL, OFFLINE_MODEL
from vigil.metrics import Metrics
from vigil.money import usd
from vigil.settings import Settings
from vigil.store.db import clock as database_clock
from vigil.store.db import utcnow

log = logging.getLogger(__name__)

STATES = ("running", "budget_unknown", "paused_budget", "stopped_config_error", "circuit_open")
# States in which a judge takes requests. budget_unknown: judging goes on, but no price is known for the
# model, so the spend (and the daily cap) cannot be counted.
ACTIVE = ("running", "budget_unknown")
# States in which the judge's check request may tell a plain 400 apart (see JudgeEngine.call); stopped or
# paused, it does not call
TELLING = (*ACTIVE, "circuit_open")


# Interactive calls (pairwise over HTTP) hold a request open: one retry after a short wait, then the error.
INTERACTIVE_ATTEMPTS = 2
INTERACTIVE_MAX_DELAY_SECONDS = 2.0
INTERACTIVE_TIMEOUT_SECONDS = 30.0


class JudgeUnavailable(JudgeError):
    """The judge cannot take a call now (stopped by a configuration error, paused by its budget, or its
    circuit is open); ``retry_after`` is the seconds until it may, when known."""

    def __init__(self, judge: str, state: str, detail: str | None, retry_after: float | None = None) -> None:
        super().__init__(f"judge {judge!r} is {state}" + (f": {detail}" if detail else ""))
        self.state = state
        self.retry_after = retry_after


class LeaseRunningOut(JudgeError):
    """A claimed request waited for a call slot until too little of its lease is left for the call: sent
    now, it could still be in flight when another worker takes the request over and pays for it again."""


class _Unsettled(Exception):
    """A plain 400 whose fault the judge's check request is to tell (raised inside the engine only)."""

    def __init__(self, error: ProviderError) -> None:
        super().__init__(str(error))
        self.error = error


# what the judge's check request got: its reply, or the error that came instead
Checked = tuple[Reply | None, ProviderError | JudgeError | None]


@dataclass
class Lane:
    """One judge's live state in this process."""

    judge: Judge
    offline: bool
    limiter: RateLimiter
    breaker: CircuitBreaker
    budget: Budget
    state: str = "running"
    detail: str | None = None
    changed_at: datetime = field(default_factory=utcnow)
    in_flight: int = 0
    # calls sent and not answered, and how many may be: 1 until calls succeed, doubled by each success up to
    # the judge's concurrency, back to 1 on a retryable failure; so a provider's outage costs a few calls
    calling: int = 0
    window: int = 1
    dirty: bool = True
    price_source: str | None = None  # litellm | judge.yaml | unknown (None: the offline judge costs nothing)
    unpriced: bool = False
    # the cost the provider reported for the last reply, when it was impossible (negative, NaN, infinite)
    # and no judge.yaml price could stand in: why the spend is unknown although the model has a price
    bad_cost: str | None = None
    # the judge's check request in flight, telling whose fault a plain 400 is (see JudgeEngine.call): 400s
    # that come back meanwhile wait for its answer instead of sending another
    checking: asyncio.Future[Checked] | None = None

    @property
    def name(self) -> str:
        return self.judge.name

    @property
    def active_state(self) -> str:
        return "budget_unknown" if self.unpriced else "running"

    @property
    def model(self) -> str:
        return OFFLINE_MODEL if self.offline else self.judge.spec.model

    @property
    def free(self) -> int:
        return self.judge.spec.limits.concurrency - self.in_flight


class JudgeEngine:
    """Holds the judges, the model client and each judge's :class:`Lane`; one per process."""

    def __init__(
        self,
        settings: Settings,
        judges: dict[str, Judge],
        metrics: Metrics,
        sessions: sessionmaker[Session],
        client: LLMClient | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.settings = settings
        self.judges = judges
        self.metrics = metrics
        self.sessions = sessions
        # The database's clock, not this host's: leases, retry times and the budget's day are compared by
        # every worker, so all must read one clock. ``clock`` (tests) is a time of their own instead.
        self._offset = timedelta(0)
        self._measured = False
        self.clock: Callable[[], datetime] = clock or self._database_time
        self._client = client
        self._gates: dict[str, asyncio.Semaphore] = {}
        self._gate_loop: asyncio.AbstractEventLoop | None = None
        self._windows: asyncio.Condition | None = None
        self.lanes: dict[str, Lane] = {}
        for name, judge in judges.items():
            lane = Lane(
                judge,
                self._offline(judge),
                RateLimiter(judge.spec.limits.rpm),
                CircuitBreaker(settings.judge_circuit_failures, settings.judge_circuit_cooldown_seconds),
                Budget(judge.daily_budget_usd),
            )
            lane.changed_at = self.clock()
            if lane.offline:
                lane.detail = self._offline_detail(lane)
            else:
                lane.price_source = (
                    "judge.yaml" if judge.spec.price else "litellm" if has_price(judge.spec.model) else "unknown"
                )
                lane.unpriced = lane.price_source == "unknown"
            self.lanes[name] = lane
            metrics.judge_budget_usd.labels(name).set(judge.daily_budget_usd)
            self._publish(lane)
        if self._client is None and any(not lane.offline for lane in self.lanes.values()):
            from vigil.judge.client import LiteLLMClient

            self._client = LiteLLMClient()
        for lane in self.lanes.values():
            if self._check_credentials(lane):
                self.refresh(lane)

    @property
    def client(self) -> LLMClient:
        if self._client is None:
            from vigil.judge.client import LiteLLMClient

            self._client = LiteLLMClient()
        return self._client

    def _offline(self, judge: Judge) -> bool:
        mode = self.settings.judge_mode
        if mode != "auto":
            return mode == "offline"
        live = has_credentials(judge.spec.model)
        if not live:
            log.warning("judge %s: no provider key for %s; using the offline judge", judge.name, judge.spec.model)
        return not live

    def _offline_detail(self, lane: Lane) -> str:
        """The state detail of an offline judge: stored with its state, so an API process configured
        differently from the worker still labels it "offline judge" (see :func:`is_offline_detail`)."""
        why = (
            "VIGIL_JUDGE_MODE=offline"
            if self.settings.judge_mode == "offline"
            else f"no provider key for {lane.judge.spec.model}"
        )
        return f"{OFFLINE_LABEL}: {why}; deterministic verdicts from rule findings, no model calls"

    def _check_credentials(self, lane: Lane) -> bool:
        """A live judge whose provider key is missing stops at once, instead of failing call after call."""
        check = getattr(self._client, "missing_credentials", None)
        problem = check(lane.judge.spec.model, lane.judge.spec.extra_params) if check and not lane.offline else None
        if problem:
            self.set_state(lane, "stopped_config_error", f"missing_credentials: {problem}")
        return problem is None

    # --- state machine -------------------------------------------------------------------------

    def set_state(self, lane: Lane, state: str, detail: str | None = None) -> None:
        if lane.state == state and lane.detail == detail:
            return
        if state != lane.state:
            log.warning("judge %s: %s -> %s%s", lane.name, lane.state, state, f" ({detail})" if detail else "")
        lane.state, lane.detail, lane.changed_at, lane.dirty = state, detail, self.clock(), True
        self._publish(lane)

    def _publish(self, lane: Lane) -> None:
        for s in STATES:
            self.metrics.judge_state.labels(lane.name, s).set(1 if s == lane.state else 0)

    def refresh(self, lane: Lane) -> None:
        """Time-driven transitions: a new UTC day ends a budget pause; a cooled circuit allows a probe.

        Also moves an active judge between ``running`` and ``budget_unknown`` as its price becomes known.
        """
        today = utc_day(self.clock())
        lane.budget.roll(today)
        self.metrics.judge_budget_used_usd.labels(lane.name).set(lane.budget.spent)
        if lane.state == "paused_budget" and not lane.budget.exhausted:
            self.set_state(lane, lane.active_state, self._active_detail(lane))
        elif lane.state in ACTIVE and not lane.offline and lane.budget.exhausted:
            self.set_state(lane, "paused_budget", f"spent {usd(lane.budget.spent)} of {usd(lane.budget.cap)} today")
        elif lane.state in ACTIVE and lane.state != lane.active_state:
            self.set_state(lane, lane.active_state, self._active_detail(lane))

    def _active_detail(self, lane: Lane) -> str | None:
        if lane.offline:
            return self._offline_detail(lane)
        if not lane.unpriced:
            return None
        if lane.bad_cost:
            return (
                f"{lane.judge.spec.model} reported an impossible cost ({lane.bad_cost}) and judge.yaml sets "
                f"no price:, so the daily cap of {usd(lane.budget.cap)} cannot be enforced; spend is unknown, not $0"
            )
        return (
            f"no price for {lane.judge.spec.model} (litellm has none, judge.yaml sets no price:), so the "
            f"daily cap of {usd(lane.budget.cap)} cannot be enforced; spend is unknown, not $0"
        )

    def accepting(self, lane: Lane) -> bool:
        return lane.state in ACTIVE

    def check_available(self, lane: Lane) -> None:
        """Raise :class:`JudgeUnavailable` unless a call may start now (an open circuit past its cooldown
        lets this call through as its probe)."""
        self.refresh(lane)
        if lane.state in ACTIVE or (lane.state == "circuit_open" and lane.breaker.allow()):
            return
        wait = lane.breaker.remaining() if lane.state == "circuit_open" else None
        raise JudgeUnavailable(lane.name, lane.state, lane.detail, wait)

    def gate(self, name: str, size: int) -> asyncio.Semaphore:
        """Bounds model calls in flight in this process: per judge (its name), and "" for all judges.

        The worker and interactive calls (pairwise, calibration) share these, so together they stay
        within the judge's ``concurrency`` and ``VIGIL_JUDGE_CONCURRENCY``.
        """
        loop = asyncio.get_running_loop()
        if self._gate_loop is not loop:  # a semaphore is bound to one event loop; CLI runs may start several
            self._gates, self._gate_loop, self._windows = {}, loop, None
        gate = self._gates.get(name)
        if gate is None:
            gate = self._gates[name] = asyncio.Semaphore(size)
        return gate

    def _condition(self) -> asyncio.Condition:
        self.gate("", self.settings.judge_concurrency)  # binds the gates (and this condition) to this loop
        if self._windows is None:
            self._windows = asyncio.Condition()
        return self._windows

    @contextlib.asynccontextmanager
    async def calling(self, lane: Lane, probe: bool = False) -> AsyncIterator[None]:
        """Hold one of the judge's call slots (:attr:`Lane.window`) for one call.

        Waits while the window is full; a judge that stops taking calls meanwhile (circuit open, budget
        paused, stopped) raises :class:`JudgeUnavailable` instead, so requests already claimed are not sent
        into an outage. ``probe``: this call is the one let through an open circuit.
        """
        cond = self._condition()
        async with cond:
            while True:
                if not (probe or lane.state in ACTIVE):
                    raise JudgeUnavailable(lane.name, lane.state, lane.detail, lane.breaker.remaining() or None)
                if lane.calling < lane.window:
                    break
                await cond.wait()
            lane.calling += 1
        try:
            yield
        finally:
            async with cond:
                lane.calling -= 1
                cond.notify_all()

    def may_claim(self, lane: Lane) -> bool:
        self.refresh(lane)
        if lane.state in ACTIVE:
            return True
        if lane.state == "circuit_open":
            return lane.in_flight == 0 and lane.breaker.allow()
        return False

    def resume(self, lane: Lane) -> None:
        lane.breaker.success()
        lane.window = 1
        if self._check_credentials(lane):
            self.set_state(lane, lane.active_state, self._active_detail(lane))

    def _database_time(self) -> datetime:
        """The database's clock as last read by :meth:`now`, moved on by this host's clock since."""
        return utcnow() + self._offset

    def now(self, session: Session) -> datetime:
        """The database's clock, read in ``session``'s transaction (once per transaction that compares or
        writes leases, retry times or the budget's day); :attr:`clock` follows it between reads. A worker
        whose host clock ran ahead took requests other workers were still running (judged and paid twice);
        one running behind wrote leases and retry times already past for the others."""
        if self.clock != self._database_time:  # a clock of the tests' own
            return self.clock()
        host = utcnow()
        now = database_clock(session)
        self._offset = now - host
        if not self._measured:  # what was stamped on the host's clock before the first reading moves with it
            self._measured = True
            for lane in self.lanes.values():
                lane.changed_at += self._offset
        return now

    def day_start(self, now: datetime | None = None) -> datetime:
        """Midnight UTC of the budget's day, on the database's clock (``now``, read in the transaction)."""
        now = (now or self.clock()).astimezone(UTC)
        return now.replace(hour=0, minute=0, second=0, microsecond=0)

    def observe_spend(self, stored: dict[str, tuple[float, int]], now: datetime | None = None) -> None:
        """Fold in spend stored by every worker today; a fresh worker also learns the cost of a call."""
        today = utc_day(now or self.clock())
        for name, lane in self.lanes.items():
            total, calls = stored.get(name, (0.0, 0))
            lane.budget.observe(today, total)
            if lane.budget.estimate == 0 and calls and math.isfinite(total) and total >= 0:
                lane.budget.estimate = total / calls

    # --- one model call, under the judge's limits -----------------------------------------------

    async def call(
        self,
        lane: Lane,
        messages: list[dict[str, str]],
        timeout: float | None = None,
        probe: bool = False,
        lease_until: datetime | None = None,
        check: list[dict[str, str]] | None = None,
    ) -> tuple[Reply, float]:
        """One attempt: call slot, budget, rate limit, timeout. Raises :class:`ProviderError` (classified),
        or :class:`LeaseRunningOut` when the call could outlive ``lease_until`` (a claimed request's lease).

        ``check``: the judge's check request for this kind of call (:func:`~vigil.judge.prompt.check_messages`).
        A call given one that gets a plain 400 (``bad_request``) does not stop the judge at once: the check
        request tells whose fault the 400 is (see :meth:`_tell_apart`)."""
        async with self.calling(lane, probe):
            try:
                return await self._call(lane, messages, timeout, lease_until, defer_400=check is not None)
            except _Unsettled as exc:
                assert check is not None
                raise await self._tell_apart(lane, exc.error, check, timeout, lease_until) from exc

    async def _call(
        self,
        lane: Lane,
        messages: list[dict[str, str]],
        timeout: float | None,
        lease_until: datetime | None = None,
        defer_400: bool = False,
    ) -> tuple[Reply, float]:
        reserved = lane.budget.reserve()
        if reserved is None:  # the cap, or calls in flight that may reach it
            lane.breaker.cancel_probe()
            self.refresh(lane)
            raise JudgeUnavailable(lane.name, "paused_budget", lane.detail or "in-flight calls may reach the cap")
        spec = lane.judge.spec
        timeout = timeout or spec.timeout_seconds
        await lane.limiter.acquire()
        # the waits for a call slot and a rate token are unbounded: past them, the call (and the outer
        # second below) must end within the lease, or another worker may take the request and call again
        if lease_until is not None and self.clock() + timedelta(seconds=timeout + 1.0) > lease_until:
            lane.budget.release(reserved)
            raise LeaseRunningOut(f"waited for a call slot until less than {timeout:g} s of its lease was left")
        t0 = time.perf_counter()
        try:
            params: dict[str, Any] = {
                "temperature": spec.temperature,
                "max_tokens": spec.max_tokens,
                "timeout": timeout,
                **spec.extra_params,
            }
            # the outer bound guards against a client that ignores its own timeout
            async with asyncio.timeout(timeout + 1.0):
                reply = await self.client.complete(spec.model, messages, **params)
        except asyncio.CancelledError:  # the caller went away (an HTTP client hung up): no verdict on the model
            lane.budget.release(reserved)
            lane.breaker.cancel_probe()
            raise
        except Exception as exc:
            lane.budget.release(reserved)
            err = classify(exc)
            if defer_400 and err.reason == "bad_request" and lane.state in TELLING:
                raise _Unsettled(err) from exc  # counted once told apart
            # a reply that cannot be read is no sign of an outage: the provider answered
            self.metrics.judge_errors.labels(lane.name, "parse" if err.kind == "unreadable" else err.kind).inc()
            if err.kind == "retryable":
                lane.window = 1
                lane.breaker.failure(err.retry_after)
                if lane.breaker.is_open:
                    self.set_state(lane, "circuit_open", f"{lane.breaker.failures} failures in a row: {err.reason}")
            elif err.kind == "config":
                self.set_state(lane, "stopped_config_error", f"{err.reason}: {err.detail}")
            raise err from exc
        finally:
            elapsed = time.perf_counter() - t0
            self.metrics.judge_latency_seconds.labels(lane.name).observe(elapsed)
        lane.breaker.success()
        lane.window = min(max(1, spec.limits.concurrency), lane.window * 2)
        dropped = self._check_usage(lane, reply)
        if reply.cost_usd is None and spec.price is not None:
            reply.cost_usd = spec.price.cost(reply.prompt_tokens, reply.completion_tokens)
        lane.unpriced = reply.cost_usd is None
        lane.bad_cost = next((d for d in dropped if d.startswith("cost_usd=")), None) if lane.unpriced else None
        if lane.state == "circuit_open":
            self.set_state(lane, lane.active_state, self._active_detail(lane))
        lane.budget.settle(reserved, reply.cost_usd)
        self._account(lane, reply)
        self.refresh(lane)
        return reply, elapsed * 1000

    async def _tell_apart(
        self,
        lane: Lane,
        err: ProviderError,
        check: list[dict[str, str]],
        timeout: float | None,
        lease_until: datetime | None,
    ) -> JudgeError:
        """Whose fault a plain 400 is, told by the judge's check request (a built-in two-message
        conversation, with the judge's own prompt, model and parameters, that any working configuration
        answers); returns the error the call raises.

        Answered: the 400 is the request's own, a ``rejected`` error (reason ``bad_request``) that carries
        what the check request spent (``spent``, for the caller that sent it: it is stored with that
        request's outcome). A 400 again: the configuration is at fault, the judge stops and the 400 is
        returned as the configuration error it is. The check failing otherwise (a timeout, a 5xx) tells
        nothing: a ``retryable`` error, so the request is tried again later under the retry policy. One
        check request at a time per judge: 400s that come back while it is in flight share its answer."""
        lane.window = 1  # no more calls into what may be a wrong configuration until this is told
        running = lane.checking
        mine = running is None or running.done() or running.get_loop() is not asyncio.get_running_loop()
        if mine:
            log.warning("judge %s: %s; sending the judge's check request to tell whose fault it is", lane.name, err)
            lane.checking = asyncio.ensure_future(self._check(lane, check, timeout, lease_until))
        checking = lane.checking
        assert checking is not None
        left = None if lease_until is None else (lease_until - self.clock()).total_seconds() - 1.0
        try:
            reply, failure = await asyncio.wait_for(asyncio.shield(checking), left)
        except TimeoutError:
            return LeaseRunningOut("the lease ran short while the judge's check request told a 400 apart")
        if failure is None or (isinstance(failure, ProviderError) and failure.kind == "rejected"):
            self.metrics.judge_errors.labels(lane.name, "bad_request").inc()
            own = ProviderError(
                "rejected",
                "bad_request",
                f"the provider refused this request; the judge's check request, with the same model and "
                f"parameters, was answered: {err.detail}",
                err.status,
            )
            if mine and reply is not None:
                own.spent = {
                    "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens,
                    "cost_usd": reply.cost_usd,
                }
            return own
        # not told: the request is put back, uncounted
        if isinstance(failure, LeaseRunningOut):
            return LeaseRunningOut(f"{err.reason} not told apart: {failure}")
        if isinstance(failure, JudgeUnavailable):
            return JudgeUnavailable(lane.name, failure.state, lane.detail, failure.retry_after)
        if isinstance(failure, ProviderError) and failure.kind == "config":
            self.metrics.judge_errors.labels(lane.name, "config").inc()
            return err
        return ProviderError(
            "retryable",
            err.reason,
            f"{err.detail} (not told apart from a configuration error: the judge's check request failed: {failure})",
            err.status,
        )

    async def _check(
        self, lane: Lane, check: list[dict[str, str]], timeout: float | None, lease_until: datetime | None
    ) -> Checked:
        """Send the judge's check request: its reply, or why it got none."""
        try:
            reply, _ms = await self._call(lane, check, timeout, lease_until, defer_400=True)
        except _Unsettled as exc:  # a 400 for the check request as well: the configuration is at fault
            self.metrics.judge_errors.labels(lane.name, "config").inc()
            why = "the judge's check request got this 400 too, so the configuration is at fault, not one request"
            self.set_state(lane, "stopped_config_error", f"{exc.error.reason}: {exc.error.detail}; {why}")
            return None, exc.error
        except (ProviderError, JudgeUnavailable, LeaseRunningOut) as exc:
            return None, exc
        return reply, None

    def _check_usage(self, lane: Lane, reply: Reply) -> list[str]:
        """Impossible usage figures (negative, NaN, infinite) become unknown; counted and logged once per
        reply as a provider anomaly (``vigil_judge_errors_total{class="usage_anomaly"}``)."""
        dropped = sanitize_usage(reply)
        if dropped:
            self.metrics.judge_errors.labels(lane.name, "usage_anomaly").inc()
            log.warning(
                "judge %s: %s reported impossible usage (%s); counted as unknown",
                lane.name,
                lane.judge.spec.model,
                ", ".join(dropped),
            )
        return dropped

    def _account(self, lane: Lane, reply: Reply) -> None:
        m = self.metrics
        _add(m.judge_cost_usd.labels(lane.name, m.label(lane.judge.spec.model)), reply.cost_usd)
        _add(m.judge_tokens.labels(lane.name, "prompt"), reply.prompt_tokens)
        _add(m.judge_tokens.labels(lane.name, "completion"), reply.completion_tokens)
        m.judge_budget_used_usd.labels(lane.name).set(lane.budget.spent)

    def policy(self, err: ProviderError, attempts: int, max_attempts: int | None = None) -> Decision:
        s = self.settings
        return decide(
            err,
            attempts,
            max_attempts or s.judge_max_attempts,
            s.judge_retry_base_seconds,
            s.judge_retry_max_seconds,
        )

    async def call_with_retries(
        self,
        lane: Lane,
        messages: list[dict[str, str]],
        max_attempts: int | None = None,
        max_delay: float | None = None,
        timeout: float | None = None,
        check: list[dict[str, str]] | None = None,
    ) -> tuple[Reply, float, int]:
        """A call outside the worker (pairwise, calibration), retried inline under the same policy,
        bounded by ``max_attempts`` / ``max_delay`` / ``timeout`` when given. It takes a slot of the
        judge's concurrency like the worker's calls, and an open circuit refuses it
        (:class:`JudgeUnavailable`) instead of calling the provider. ``check``: as for :meth:`call`, the
        judge's check request that tells a plain 400 apart (one request's own: a ``rejected`` error)."""
        attempts = 0
        spec = lane.judge.spec
        while True:
            attempts += 1
            async with (
                self.gate(lane.name, spec.limits.concurrency),
                self.gate("", self.settings.judge_concurrency),
            ):
                probe = lane.state == "circuit_open"
                self.check_available(lane)  # after the wait for a slot: the state may have changed
                try:
                    reply, ms = await self.call(lane, messages, timeout, probe=probe, check=check)
                    return reply, ms, attempts
                except ProviderError as err:
                    d = self.policy(err, attempts, max_attempts)
                    if d.action != "retry":
                        raise
                    without_frames(err)  # tried again: its frames hold the prompt, in a cycle through the client's
            await asyncio.sleep(min(d.delay, max_delay) if max_delay is not None else d.delay)

    def next_attempt(self, delay: float, now: datetime | None = None) -> datetime:
        return (now or self.clock()) + timedelta(seconds=delay)


def _add(counter: Any, amount: float | None) -> None:
    """Add a provider's figure to a counter; anything but a finite positive number is skipped, so a
    provider's numbers can never make an increment raise (or turn a counter into NaN)."""
    if isinstance(amount, int | float) and math.isfinite(amount) and amount > 0:
        counter.inc(amount)


def is_offline_detail(detail: str | None) -> bool:
    """Whether a stored state detail is an offline judge's (written by ``JudgeEngine._offline_detail``)."""
    return detail is not None and detail.startswith(f"{OFFLINE_LABEL}: ")
