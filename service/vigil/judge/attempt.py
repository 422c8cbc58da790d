"""One attempt at judging one claimed request: offline from its findings, or a model call through the engine.

Every way it can end is an :class:`~vigil.judge.verdicts.Outcome`: a verdict (scored or unscored, with
the reason), a retry after a delay, or a release back to the queue.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import ValidationError

from vigil.judge import store
from vigil.judge.engine import JudgeEngine, JudgeUnavailable, Lane, LeaseRunningOut
from vigil.judge.errors import ProviderError
from vigil.judge.offline import findings_of, offline_prompt_hash, offline_raw, offline_verdict
from vigil.judge.parse import MAX_RATIONALE, Parsed, cut_short, parse_verdict
from vigil.judge.prompt import build_messages, check_messages
from vigil.judge.verdicts import Outcome
from vigil.schema import Conversation

MAX_RAW_REPLY = 64 * 1024  # characters of the model's reply stored as ``raw_reply``; the rest is cut


async def attempt(engine: JudgeEngine, lane: Lane, req: store.Claimed, probes: set[int]) -> Outcome:
    """Judge ``req`` with ``lane``'s judge; ``probes`` are the requests let through an open circuit."""
    judge = lane.judge
    if req.document is None:
        return Outcome(req, "verdict", Parsed.unscored("conversation_missing"), base_fields(lane, judge.prompt_hash))
    try:
        conv = Conversation.model_validate_json(req.document)
    except ValidationError:
        return Outcome(req, "verdict", Parsed.unscored("bad_document"), base_fields(lane, judge.prompt_hash))
    if lane.offline:
        return await _offline(engine, lane, req, conv)
    messages = build_messages(judge, conv)
    settings = engine.settings
    try:
        # claimed requests beyond the limits wait here, so a freed slot starts the next call at once
        async with (
            engine.gate(lane.name, judge.spec.limits.concurrency),
            engine.gate("", settings.judge_concurrency),
        ):
            # the judge may have stopped or paused while this request waited for a slot
            if not engine.accepting(lane) and req.id not in probes:
                raise JudgeUnavailable(lane.name, lane.state, lane.detail)
            reply, latency_ms = await engine.call(
                lane, messages, probe=req.id in probes, lease_until=req.lease_until, check=check_messages(judge)
            )
    except JudgeUnavailable as exc:
        return Outcome(req, "release", delay=settings.judge_poll_interval_seconds, error=str(exc))
    except LeaseRunningOut as exc:  # back to the queue, to be claimed again with a fresh lease; no call made
        return Outcome(req, "release", error=str(exc))
    except ProviderError as err:
        return _failed(engine, lane, req, err)
    parsed = parse_verdict(reply.text, judge.spec.categories)
    cut = cut_short(parsed.unscored_reason, reply.finish_reason)
    if cut is not None:
        why = f"max_tokens ({judge.spec.max_tokens})" if cut == "truncated" else "the provider's content filter"
        parsed = Parsed.unscored(cut, f"the reply was cut short by {why} (finish_reason {reply.finish_reason})")
        engine.metrics.judge_errors.labels(lane.name, "rejected" if cut == "content_filtered" else "parse").inc()
    elif parsed.verdict == "unscored" and parsed.unscored_reason != "judge_abstained":
        engine.metrics.judge_errors.labels(lane.name, "parse").inc()
    fields = base_fields(lane, judge.prompt_hash)
    fields.update(
        raw_reply=capped_reply(reply.text),
        prompt_tokens=reply.prompt_tokens,
        completion_tokens=reply.completion_tokens,
        cost_usd=reply.cost_usd,
        latency_ms=latency_ms,
    )
    return Outcome(req, "verdict", parsed, fields)


async def _offline(engine: JudgeEngine, lane: Lane, req: store.Claimed, conv: Conversation) -> Outcome:
    findings = await asyncio.to_thread(_findings, engine, req.conversation_id)
    parsed = offline_verdict(lane.judge, conv, findings)
    fields = base_fields(lane, offline_prompt_hash(lane.judge))
    fields.update(
        raw_reply=offline_raw(parsed),
        prompt_tokens=0,
        completion_tokens=0,
        cost_usd=0.0,
        latency_ms=0.0,
    )
    return Outcome(req, "verdict", parsed, fields)


def _failed(engine: JudgeEngine, lane: Lane, req: store.Claimed, err: ProviderError) -> Outcome:
    """The outcome of a failed call, as the engine's retry policy decides."""
    judge = lane.judge
    decision = engine.policy(err, req.attempts)
    if decision.action == "retry":
        return Outcome(req, "retry", delay=decision.delay, error=str(err))
    if decision.action == "give_up":
        # a verdict, not a silent failure: the request is done and every verdict reader sees why
        engine.metrics.judge_errors.labels(lane.name, "gave_up").inc()
        why = f"gave up after {req.attempts} attempts: {err}"[:2000]
        return Outcome(req, "verdict", Parsed.unscored("gave_up", why), base_fields(lane, judge.prompt_hash))
    if decision.action == "stop_judge":
        return Outcome(req, "release", error=str(err))
    fields = base_fields(lane, judge.prompt_hash)
    fields.update(err.spent)  # a 400 the judge's check request told apart: the check request's spend
    return Outcome(req, "verdict", Parsed.unscored(err.reason, err.detail[:MAX_RATIONALE]), fields)


def failed_unexpectedly(engine: JudgeEngine, lane: Lane, req: store.Claimed, exc: Exception) -> Outcome:
    """The outcome of an attempt that raised something unexpected (a bug, a broken reply object).

    Retried under the engine's policy like a retryable provider error, so at most
    ``VIGIL_JUDGE_MAX_ATTEMPTS`` attempts in all, then an ``unscored`` verdict with reason ``gave_up``:
    the attempt may have made a paid call, and a request must not be retried without end.
    """
    err = ProviderError("retryable", "internal_error", f"{type(exc).__name__}: {str(exc)[:500]}")
    return _failed(engine, lane, req, err)


def capped_reply(text: str | None) -> str | None:
    """The reply as stored: its first :data:`MAX_RAW_REPLY` characters, and a note of the cut if longer
    (the verdict is parsed from the whole reply)."""
    if text is None or len(text) <= MAX_RAW_REPLY:
        return text
    return f"{text[:MAX_RAW_REPLY]}\n[truncated: first {MAX_RAW_REPLY} of {len(text)} characters stored]"


def base_fields(lane: Lane, prompt_hash: str) -> dict[str, Any]:
    """The verdict fields every outcome of ``lane`` carries."""
    return {
        "model": lane.model,
        "offline": lane.offline,
        "prompt_hash": prompt_hash,
        "judge_version": lane.judge.version,
    }


def _findings(engine: JudgeEngine, conversation_id: str) -> list[tuple[str, str, str, str]]:
    with engine.sessions() as s:
        return findings_of(s, conversation_id)
