"""One attempt at judging one claimed request: offline from its findings, or a model call through the engine.

Every way it can end is an :class:`~vigil.judge.verdicts.Outcome`: a verdict (scored or unscored, with
the reason), a retry after a delay, or a release back to the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from vigil.errors import without_frames
from vigil.judge import store
from vigil.judge.client import Reply
from vigil.judge.engine import JudgeEngine, JudgeUnavailable, Lane, LeaseRunningOut
from vigil.judge.errors import ProviderError
from vigil.judge.offline import findings_of, offline_prompt_hash, offline_raw, offline_verdict
from vigil.judge.parse import MALFORMED, MAX_RATIONALE, Parsed, cut_short, parse_verdict
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

    async def send() -> tuple[Reply, float]:
        return await engine.call(
            lane, messages, probe=req.id in probes, lease_until=req.lease_until, check=check_messages(judge)
        )

    try:
        # claimed requests beyond the limits wait here, so a freed slot starts the next call at once
        async with (
            engine.gate(lane.name, judge.spec.limits.concurrency),
            engine.gate("", settings.judge_concurrency),
        ):
            # the judge may have stopped or paused while this request waited for a slot
            if not engine.accepting(lane) and req.id not in probes:
                raise JudgeUnavailable(lane.name, lane.state, lane.detail)
            answer = await ask(engine, lane, send)
    except JudgeUnavailable as exc:
        return Outcome(req, "release", delay=settings.judge_poll_interval_seconds, error=str(exc))
    except LeaseRunningOut as exc:  # back to the queue, to be claimed again with a fresh lease; no call made
        return Outcome(req, "release", error=str(exc))
    except ProviderError as err:
        # its frames (and the provider's error it wraps) hold the prompt, the conversation and its document, in a
        # cycle through the client's: freed now rather than at the collector's next run (see without_frames)
        without_frames(err)
        return _failed(engine, lane, req, err)
    fields = base_fields(lane, judge.prompt_hash)
    fields.update(
        raw_reply=capped_reply(answer.text),
        prompt_tokens=answer.prompt_tokens,
        completion_tokens=answer.completion_tokens,
        cost_usd=answer.cost_usd,
        latency_ms=answer.latency_ms,
    )
    return Outcome(req, "verdict", answer.parsed, fields)


@dataclass(slots=True)
class Answer:
    """One judgement of a request: the verdict read from the last reply, that reply's text, and what all the
    calls it took spent (the figures known; a reply the client could not read reports none)."""

    parsed: Parsed
    text: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_ms: float = 0.0

    def add(self, reply: Reply, latency_ms: float) -> None:
        self.text = reply.text
        self.prompt_tokens = _plus(self.prompt_tokens, reply.prompt_tokens)
        self.completion_tokens = _plus(self.completion_tokens, reply.completion_tokens)
        self.cost_usd = _plus(self.cost_usd, reply.cost_usd)
        self.latency_ms += latency_ms


def _plus(a: Any, b: Any) -> Any:
    return a if b is None else b if a is None else a + b


async def ask(engine: JudgeEngine, lane: Lane, send: Callable[[], Awaitable[tuple[Reply, float]]]) -> Answer:
    """Send the judge's request (``send``) and read the verdict from the reply.

    A reply that is not the verdict object asked for (:data:`~vigil.judge.parse.MALFORMED`), or that the
    client could not read at all (``unreadable_reply``), is asked again, the same request, at most
    ``VIGIL_JUDGE_REASKS`` times; then the verdict is ``unscored`` with the last reason, the last reply kept
    and the rationale saying what each reply was. Every reply's spend counts. The request is sent as it
    is, never with the bad reply and a request to fix it: that would ask the model to pick a verdict-shaped
    object out of its own text, which the strict parser refuses to do. A re-ask that cannot be sent or fails
    (the judge paused, the lease short, a provider error) ends the re-asks with what the replies so far gave.
    """
    answer = Answer(Parsed.unscored("empty_reply"))
    unread: list[str] = []
    for n in range(engine.settings.judge_reasks + 1):
        try:
            reply, latency_ms = await send()
        except ProviderError as err:
            if err.kind != "unreadable":
                if n:  # a re-ask that failed: the replies so far stand
                    without_frames(err)
                    break
                raise
            answer.parsed = Parsed.unscored(err.reason, err.detail[:MAX_RATIONALE])
            without_frames(err)  # asked again: its frames hold the prompt (see attempt)
        except (JudgeUnavailable, LeaseRunningOut):
            if not n:
                raise
            break
        else:
            answer.add(reply, latency_ms)
            answer.parsed = _read(engine, lane, reply)
        reason = answer.parsed.unscored_reason
        if reason != "unreadable_reply" and reason not in MALFORMED:
            return answer
        unread.append(str(reason))
    if len(unread) > 1:
        last = answer.parsed.rationale
        why = f"asked {len(unread)} times, no reply was the JSON verdict object ({', '.join(unread)})"
        answer.parsed.rationale = (why + (f"; the last: {last}" if last else ""))[:MAX_RATIONALE]
    return answer


def _read(engine: JudgeEngine, lane: Lane, reply: Reply) -> Parsed:
    """The verdict a reply gives, strictly parsed; each reply that gives none counts as a parse error."""
    parsed = parse_verdict(reply.text, lane.judge.spec.categories)
    cut = cut_short(parsed.unscored_reason, reply.finish_reason)
    if cut is not None:
        why = f"max_tokens ({lane.judge.spec.max_tokens})" if cut == "truncated" else "the provider's content filter"
        parsed = Parsed.unscored(cut, f"the reply was cut short by {why} (finish_reason {reply.finish_reason})")
        engine.metrics.judge_errors.labels(lane.name, "rejected" if cut == "content_filtered" else "parse").inc()
    elif parsed.verdict == "unscored" and parsed.unscored_reason != "judge_abstained":
        engine.metrics.judge_errors.labels(lane.name, "parse").inc()
    return parsed


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
