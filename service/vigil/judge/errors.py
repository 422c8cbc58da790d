"""Errors of the judge stage."""

from __future__ import annotations

from typing import Any, Literal

from vigil.errors import ConfigError, VigilError

ErrorClass = Literal["retryable", "config", "rejected", "unreadable"]


class JudgeError(VigilError):
    """Base class of the judge stage's errors."""


class JudgeDefinitionError(JudgeError, ConfigError):
    """A judge definition (``judges/<name>/``) is invalid; the message names the file and field."""


class ProviderError(JudgeError):
    """A model call failed, classified once (see :func:`vigil.judge.client.classify`).

    ``retryable``: 429, 5xx, timeouts, connection errors. ``config``: bad key, unknown model, bad
    request shape: the judge stops until an operator acts (a plain 400, ``bad_request``, only once the
    judge's check request shows it is not that one request's own: see ``JudgeEngine.call``).
    ``rejected``: the provider refused this one request (context too long, content filter, a 400 the
    check request was spared): the verdict is ``unscored`` with that reason. ``unreadable``: the provider
    answered (HTTP 200, and may have charged for it) but the client could not read the reply: asked again
    at most ``VIGIL_JUDGE_REASKS`` times, then ``unscored``, never retried as if the provider were down.
    """

    def __init__(
        self, kind: ErrorClass, reason: str, detail: str, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(f"{kind} ({reason}): {detail}")
        self.kind: ErrorClass = kind
        self.reason = reason
        self.detail = detail
        self.status = status
        self.retry_after = retry_after  # seconds the provider asked to wait (Retry-After), if it said
        # what the judge's check request that told this 400 apart spent (prompt_tokens, completion_tokens,
        # cost_usd), for the one caller that sent it: that spend is stored with its request's outcome
        self.spent: dict[str, Any] = {}
