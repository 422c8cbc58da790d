"""The one module that talks to litellm: a narrow async ``complete`` and the one error classifier.

Tests replace :class:`LiteLLMClient` with a scripted client of the same shape, or pass litellm's own
``mock_response`` through ``extra_params``; nothing else in Vigil imports litellm.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Protocol

from vigil.judge.errors import ProviderError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Reply:
    text: str | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_ms: float | None = None
    finish_reason: str | None = None  # why the provider ended the reply: stop, length, content_filter, ...


MAX_TOKENS = 2**31 - 1  # what the verdict's token columns hold; a larger count is no real call's


def _count(value: Any) -> int | None:
    """A token count as reported, or None (unknown) unless it is a whole number from 0 to MAX_TOKENS."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    if not 0 <= value <= MAX_TOKENS or value != int(value):
        return None
    return int(value)


def _money(value: Any) -> float | None:
    """A cost as reported, or None (unknown) unless it is a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def sanitize_usage(reply: Reply) -> list[str]:
    """Make ``reply``'s usage figures unknown (None) where a provider reported impossible ones.

    A negative, fractional or non-finite token count and a negative or non-finite cost (NaN, infinity)
    cannot be charged to a budget or added to a counter: they are dropped, as if the provider had
    reported none; with an impossible token count the whole report is (the other count, and a cost priced
    from them, are no more to be trusted); so are zero prompt tokens and a zero cost without usage (no usage reported).
    Returns what was dropped (empty for a sane reply), for the caller to count and log.
    """
    dropped: list[str] = []
    for name, check in (("prompt_tokens", _count), ("completion_tokens", _count), ("cost_usd", _money)):
        value = getattr(reply, name)
        if value is None:
            continue
        sane = check(value)
        if sane is None:
            dropped.append(f"{name}={value!r}"[:80])
        setattr(reply, name, sane)
    impossible = [d for d in dropped if d.startswith(("prompt_tokens=", "completion_tokens="))]
    if impossible:
        # a usage report with an impossible token count is not to be trusted in part: litellm prices the
        # reply from those very counts (-5 prompt tokens and 10 completion tokens came back as $5.25e-06),
        # and a price from judge.yaml would count the other one alone; the spend is unknown
        if reply.cost_usd is not None:
            dropped.append(f"cost_usd={reply.cost_usd!r} (priced from {impossible[0]})"[:120])
        reply.prompt_tokens = reply.completion_tokens = reply.cost_usd = None
    if reply.prompt_tokens == 0:
        # a judge's prompt is never empty: zero prompt tokens is no usage reported (litellm fills in
        # zeros when a provider sends none, and prices them at $0), so the call's tokens and a zero
        # cost are unknown, not free: a daily cap would otherwise never be reached
        dropped.append("prompt_tokens=0")
        reply.prompt_tokens = None
        if reply.completion_tokens == 0:
            reply.completion_tokens = None
    if reply.cost_usd == 0 and reply.prompt_tokens is None:
        dropped.append("cost_usd=0.0 without usage")
        reply.cost_usd = None
    return dropped


class LLMClient(Protocol):
    """Sends chat messages to ``model``; raises any exception on failure (the caller classifies it)."""

    async def complete(self, model: str, messages: list[dict[str, str]], **params: Any) -> Reply: ...


@dataclass(frozen=True)
class ClientOverride:
    """A client to use instead of litellm, provided on the runtime before wiring (tests, benchmarks)."""

    client: LLMClient


@functools.cache
def _litellm() -> Any:
    # The bundled price list is enough for cost figures; never fetch one over the network at start-up.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


class LiteLLMClient:
    """Calls ``litellm.acompletion``; asks for a JSON object where the model supports ``response_format``."""

    def __init__(self, **defaults: Any) -> None:
        self.defaults = defaults
        _litellm()  # import now: the first import takes seconds and would stall the event loop mid-call

    def missing_credentials(self, model: str, params: dict[str, Any] | None = None) -> str | None:
        """Checked at start-up in live mode (see :func:`missing_credentials`); scripted clients have none."""
        return missing_credentials(model, {**self.defaults, **(params or {})})

    async def complete(self, model: str, messages: list[dict[str, str]], **params: Any) -> Reply:
        lm = _litellm()
        kwargs = {**self.defaults, **params}
        if supports_json_mode(model):
            kwargs.setdefault("response_format", {"type": "json_object"})
        kwargs.setdefault("num_retries", 0)  # Vigil's worker owns retries and their backoff
        t0 = time.perf_counter()
        resp = await lm.acompletion(model=model, messages=messages, **kwargs)
        latency = (time.perf_counter() - t0) * 1000
        usage = getattr(resp, "usage", None)
        cost = (getattr(resp, "_hidden_params", None) or {}).get("response_cost")
        if cost is None:
            try:
                cost = lm.completion_cost(completion_response=resp)
            except Exception:  # no price known for this model: spend is unknown, not zero
                cost = None
        choice = resp.choices[0] if resp.choices else None
        text = choice.message.content if choice is not None else None
        finish = getattr(choice, "finish_reason", None)
        try:
            cost = float(cost) if cost is not None else None
        except (TypeError, ValueError):  # not a number: unknown; the engine checks the figures' range
            cost = None
        return Reply(
            text,
            getattr(usage, "prompt_tokens", None),
            getattr(usage, "completion_tokens", None),
            cost,
            latency,
            finish if isinstance(finish, str) else None,
        )


@functools.cache
def supports_json_mode(model: str) -> bool:
    try:
        return "response_format" in (_litellm().get_supported_openai_params(model=model) or [])
    except Exception:  # unknown provider: send no response_format and rely on the strict parser
        return False


@functools.cache
def has_price(model: str) -> bool:
    """True if litellm's price list knows ``model`` (a price of 0, as for a local Ollama, counts)."""
    try:
        info = _litellm().get_model_info(model=model)
    except Exception:  # not in the price list: a fine-tune, a self-hosted model, an unknown provider
        return False
    return info.get("input_cost_per_token") is not None or info.get("output_cost_per_token") is not None


# The environment variables litellm's ``validate_environment`` looks for, for the providers most judges
# use: when none is set, the answer is "no key" without importing litellm (seconds of start-up for
# every command that builds the judges, such as ``vigil status``). tests/judge check it agrees.
PROVIDER_KEYS: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"),
    "gemini": ("GOOGLE_API_KEY", "GEMINI_API_KEY"),
    "mistral": ("MISTRAL_API_KEY",),
    "groq": ("GROQ_API_KEY",),
    "deepseek": ("DEEPSEEK_API_KEY",),
    "together_ai": ("TOGETHERAI_API_KEY",),
    "openrouter": ("OPENROUTER_API_KEY",),
    "xai": ("XAI_API_KEY",),
    "cohere": ("COHERE_API_KEY",),
    "fireworks_ai": ("FIREWORKS_AI_API_KEY", "FIREWORKS_API_KEY", "FIREWORKSAI_API_KEY", "FIREWORKS_AI_TOKEN"),
}


def surely_keyless(model: str) -> bool:
    """True if ``model`` names a provider of :data:`PROVIDER_KEYS` and none of its variables is set."""
    provider, sep, _ = model.partition("/")
    keys = PROVIDER_KEYS.get(provider) if sep else None
    return keys is not None and not any(k in os.environ for k in keys)


@functools.cache
def has_credentials(model: str) -> bool:
    """True if the environment holds the provider key(s) ``model`` needs (for ``VIGIL_JUDGE_MODE=auto``)."""
    if surely_keyless(model):
        return False
    try:
        env = _litellm().validate_environment(model=model)
    except Exception:  # unknown provider: no key can be configured for it
        return False
    return bool(env.get("keys_in_environment"))


_SECRET_RE = re.compile(r"KEY|TOKEN|SECRET|CREDENTIAL", re.IGNORECASE)


def missing_credentials(model: str, params: dict[str, Any] | None = None) -> str | None:
    """Which secrets ``model``'s provider lacks (environment, or ``api_key`` in ``params``), or None.

    Only missing keys, tokens and secrets count: a missing base URL often has a default (a local
    Ollama), and an unknown provider is reported by the first call as ``unknown_model``.
    """
    p = params or {}
    try:
        env = _litellm().validate_environment(
            model=model, api_key=p.get("api_key"), api_base=p.get("api_base"), api_version=p.get("api_version")
        )
    except Exception:
        return None
    secrets = [k for k in env.get("missing_keys") or [] if _SECRET_RE.search(k)]
    if env.get("keys_in_environment") or not secrets:
        return None
    return f"no provider key for {model}: set {' or '.join(secrets)} in the environment (or api_key in extra_params)"


_CONFIG_STATUS = {400: "bad_request", 401: "auth", 403: "auth", 404: "unknown_model", 422: "bad_request"}
# Providers report a missing key in different shapes (litellm raises OpenAI's as a 500 and Gemini's as
# a connection error); retrying cannot fix any of them.
_CREDENTIALS_RE = re.compile(r"missing credentials|unable to locate credentials|api[ _-]?key", re.IGNORECASE)
# ... and a key sent but refused, in OpenAI's, Anthropic's and Gemini's words: a wrong key, not a missing one
_WRONG_KEY_RE = re.compile(
    r"incorrect api[ _-]?key|invalid[ _-](x-)?api[ _-]?key|api[ _-]?key not valid|invalid authentication",
    re.IGNORECASE,
)


# A provider's content filter refusing one prompt, in the words litellm maps only for its own provider
# names (Azure's, say): behind an OpenAI-compatible endpoint it arrives as a plain 400, which must not
# stop the judge for every conversation (after a resume the same request would stop it again).
_CONTENT_FILTER_RE = re.compile(
    r"content[ _]management[ _]policy|content_policy_violation|content_filter|responsibleaipolicyviolation"
    r"|rejected as a result of (our|the) safety system|flagged as potentially violating",
    re.IGNORECASE,
)


# A 200 whose body litellm could not make a completion of (not JSON, no choices, a message content that is
# not text), in litellm's words: it raises them as a 500 of its own, but the provider answered (and may
# have charged for the reply), so retrying as for an outage (backoff, VIGIL_JUDGE_MAX_ATTEMPTS, the circuit
# breaker) only pays for the same reply again
_UNREADABLE_RE = re.compile(
    r"Invalid response object|Empty or invalid response from LLM endpoint"
    r"|provider returned (a response with no 'choices'|'choices' that is not a list)"
    r"|Expecting [^:]{1,40}: line \d+ column \d+ \(char \d+\)|Unterminated string starting at: line \d+"
)


MAX_RETRY_AFTER = 3600.0  # seconds: a provider's Retry-After beyond this is taken as this


def retry_after(exc: BaseException) -> float | None:
    """Seconds a provider asked to wait before the next call (``Retry-After``, in seconds or as an HTTP
    date, or ``retry-after-ms``), from the error's response headers; None when it did not say."""
    headers: Any = getattr(getattr(exc, "response", None), "headers", None) or getattr(exc, "headers", None)
    if not headers:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return min(MAX_RETRY_AFTER, max(0.0, float(ms) / 1000))
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            seconds = float(value)
        except ValueError:
            from email.utils import parsedate_to_datetime

            seconds = parsedate_to_datetime(str(value)).timestamp() - time.time()
    except (TypeError, ValueError, AttributeError, OverflowError):  # a header that says nothing usable
        return None
    return min(MAX_RETRY_AFTER, max(0.0, seconds)) if math.isfinite(seconds) else None


def classify(exc: BaseException) -> ProviderError:
    """Sort any failure of a model call into retryable / config / rejected / unreadable, once, here."""
    if isinstance(exc, ProviderError):
        return exc
    err = _classify(exc)
    if err.kind == "retryable":
        err.retry_after = retry_after(exc)
    return err


def _classify(exc: BaseException) -> ProviderError:
    detail = f"{type(exc).__name__}: {str(exc)[:500]}"
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return ProviderError("retryable", "timeout", detail, 408)
    lm = _litellm() if "litellm" in type(exc).__module__ else None
    status = getattr(exc, "status_code", None)
    if lm is not None:
        first: list[tuple[type, str, str]] = [
            (lm.ContextWindowExceededError, "rejected", "context_window_exceeded"),
            (lm.ContentPolicyViolationError, "rejected", "content_filtered"),
            (lm.RateLimitError, "retryable", "rate_limited"),
            (lm.Timeout, "retryable", "timeout"),
        ]
        for cls, kind, reason in first:
            if isinstance(exc, cls):
                return ProviderError(kind, reason, detail, status)  # type: ignore[arg-type]
    if status == 400 and _CONTENT_FILTER_RE.search(str(exc)):
        return ProviderError("rejected", "content_filtered", detail, status)
    if _WRONG_KEY_RE.search(str(exc)):  # a key was sent and refused: the key is wrong, not missing
        return ProviderError("config", "auth", detail, status)
    if _CREDENTIALS_RE.search(str(exc)):
        return ProviderError("config", "missing_credentials", detail, status)
    if lm is not None and isinstance(exc, lm.InternalServerError) and _UNREADABLE_RE.search(str(exc)):
        return ProviderError("unreadable", "unreadable_reply", detail, status)
    if lm is not None and isinstance(exc, lm.InternalServerError) and "connection error" in str(exc).lower():
        # litellm reports a refused or dropped connection as a 500: it is the network, not the provider
        return ProviderError("retryable", "connection", detail, status)
    if lm is not None:
        checks: list[tuple[type, str, str]] = [
            (lm.AuthenticationError, "config", "auth"),
            (lm.PermissionDeniedError, "config", "auth"),
            (lm.NotFoundError, "config", "unknown_model"),
            (lm.InternalServerError, "retryable", "server_error"),
            (lm.ServiceUnavailableError, "retryable", "server_error"),
            (lm.BadGatewayError, "retryable", "server_error"),
            (lm.APIConnectionError, "retryable", "connection"),
        ]
        for cls, kind, reason in checks:
            if isinstance(exc, cls):
                return ProviderError(kind, reason, detail, status)  # type: ignore[arg-type]
        if isinstance(exc, lm.BadRequestError) and "LLM Provider NOT provided" in str(exc):
            return ProviderError("config", "unknown_model", detail, status)
    if isinstance(status, int):
        if status == 429 or status == 408 or status >= 500:
            return ProviderError("retryable", "rate_limited" if status == 429 else "server_error", detail, status)
        if status in _CONFIG_STATUS:
            return ProviderError("config", _CONFIG_STATUS[status], detail, status)
    if isinstance(exc, ConnectionError | OSError):
        return ProviderError("retryable", "connection", detail, status)
    # An unknown failure may be transient; it gets the bounded retries, then an unscored verdict (gave_up).
    return ProviderError("retryable", "unknown", detail, status)
