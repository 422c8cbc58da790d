"""Pairwise mode: which of two answers better meets a judge's rubric, asked in both orders.

When the two orders disagree (the judge preferred whichever answer came first, or second) the result
is ``position_bias`` with no winner: a property of the judge, not a verdict on the answers. Every
comparison is stored so calibration can report position-bias rates.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from datetime import datetime
from typing import Any

from vigil.judge.attempt import capped_reply
from vigil.judge.engine import (
    INTERACTIVE_ATTEMPTS,
    INTERACTIVE_MAX_DELAY_SECONDS,
    INTERACTIVE_TIMEOUT_SECONDS,
    JudgeEngine,
    Lane,
)
from vigil.judge.errors import ProviderError
from vigil.judge.offline import OFFLINE_LABEL, offline_pairwise, offline_prompt_hash
from vigil.judge.parse import PairChoice, cut_short, parse_pairwise
from vigil.judge.prompt import build_pairwise_messages, check_pairwise_messages
from vigil.store.db import aware, storable_text
from vigil.store.models import PairwiseRow

_BACK = {"1": "b", "2": "a", "tie": "tie"}  # second order shows B first
_FORWARD = {"1": "a", "2": "b", "tie": "tie"}


def _input_hash(input_text: str, a: str, b: str) -> str:
    return hashlib.sha256("\x1f".join((input_text, a, b)).encode()).hexdigest()


async def _ask(engine: JudgeEngine, lane: Lane, input_text: str, first: str, second: str) -> dict[str, Any]:
    if lane.offline:
        choice = offline_pairwise(input_text, first, second)
        return {
            "choice": PairChoice(choice, f"{OFFLINE_LABEL}: word overlap with the input, then length"),
            "raw": choice,
            "pt": 0,
            "ct": 0,
            "cost": 0.0,
        }
    messages = build_pairwise_messages(lane.judge, input_text, first, second)
    try:
        reply, _ms, _attempts = await engine.call_with_retries(
            lane,
            messages,
            max_attempts=INTERACTIVE_ATTEMPTS,
            max_delay=INTERACTIVE_MAX_DELAY_SECONDS,
            timeout=min(lane.judge.spec.timeout_seconds, INTERACTIVE_TIMEOUT_SECONDS),
            check=check_pairwise_messages(lane.judge),
        )
    except ProviderError as err:
        if err.kind not in ("rejected", "unreadable"):  # a refused request, or a reply that cannot be read
            raise
        spent = err.spent  # a 400 the judge's check request told apart: what the check request cost
        return {
            "choice": PairChoice(None, None, err.reason),
            "raw": None,
            "pt": spent.get("prompt_tokens"),
            "ct": spent.get("completion_tokens"),
            "cost": spent.get("cost_usd"),
        }
    parsed = parse_pairwise(reply.text)
    cut = cut_short(parsed.unscored_reason, reply.finish_reason)
    return {
        "choice": PairChoice(None, None, cut) if cut else parsed,
        "raw": reply.text,
        "pt": reply.prompt_tokens,
        "ct": reply.completion_tokens,
        "cost": reply.cost_usd,
    }


def _storable(text: str | None) -> str | None:
    return None if text is None else storable_text(text)


def _sum(values: list[Any]) -> Any:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


async def compare(
    engine: JudgeEngine,
    judge_name: str,
    input_text: str,
    answer_a: str,
    answer_b: str,
    label_a: str | None = None,
    label_b: str | None = None,
) -> dict[str, Any]:
    """Judge A against B in both orders, store the comparison, and return it as a dict."""
    lane = engine.lanes[judge_name]
    t0 = time.perf_counter()
    outcomes: list[Any]
    if lane.state == "circuit_open":
        # one call goes through an open circuit, the probe: asked together, the first order was the probe
        # (answered, and paid for) while the second was refused, and the caller got a 503 for a call that
        # had closed the circuit. The second order waits for the first's answer instead.
        outcomes = [await _ask(engine, lane, input_text, answer_a, answer_b)]
        outcomes.append(await _ask(engine, lane, input_text, answer_b, answer_a))
    else:
        # both orders run to their end before an error is raised: a failed order never leaves the other
        # calling the model (and spending) after the caller has its answer
        outcomes = await asyncio.gather(
            _ask(engine, lane, input_text, answer_a, answer_b),
            _ask(engine, lane, input_text, answer_b, answer_a),
            return_exceptions=True,
        )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    first, second = [o for o in outcomes if not isinstance(o, BaseException)]
    latency = (time.perf_counter() - t0) * 1000
    c1, c2 = first["choice"], second["choice"]
    one = _FORWARD[c1.choice] if c1.choice else None
    two = _BACK[c2.choice] if c2.choice else None
    unscored = c1.unscored_reason or c2.unscored_reason
    bias = not unscored and one != two
    winner = one if not unscored and not bias else None
    result = "unscored" if unscored else ("position_bias" if bias else str(winner))
    judge = lane.judge
    row = PairwiseRow(
        judge=judge.name,
        judge_version=judge.version,
        model=lane.model,
        offline=lane.offline,
        prompt_hash=offline_prompt_hash(judge) if lane.offline else judge.prompt_hash,
        input_hash=_input_hash(input_text, answer_a, answer_b),
        label_a=label_a,
        label_b=label_b,
        winner=winner,
        position_bias=bias,
        first_choice=one,
        second_choice=two,
        unscored_reason=unscored,
        # what the model sent, as every database holds it (Postgres' jsonb refuses NUL) and capped like a
        # verdict's raw reply: a row refused here lost the answer and the spend of two paid calls
        rationales=[_storable(c1.rationale), _storable(c2.rationale)],
        raw_replies=[_storable(capped_reply(first["raw"])), _storable(capped_reply(second["raw"]))],
        prompt_tokens=_sum([first["pt"], second["pt"]]),
        completion_tokens=_sum([first["ct"], second["ct"]]),
        cost_usd=_sum([first["cost"], second["cost"]]),
        latency_ms=latency,
        created_at=engine.clock(),
    )
    with engine.sessions.begin() as s:
        s.add(row)
        s.flush()
        out = pairwise_dict(row)
    engine.metrics.judge_pairwise.labels(judge.name, result).inc()
    return out


def pairwise_dict(row: PairwiseRow) -> dict[str, Any]:
    result = "unscored" if row.unscored_reason else ("position_bias" if row.position_bias else row.winner)
    created: datetime = aware(row.created_at)  # SQLite hands stored UTC back naive
    return {
        "id": row.id,
        "judge": row.judge,
        "judge_version": row.judge_version,
        "model": row.model,
        "offline": row.offline,
        "judge_label": OFFLINE_LABEL if row.offline else row.model,
        "label_a": row.label_a,
        "label_b": row.label_b,
        "result": result,
        "winner": row.winner,
        "position_bias": row.position_bias,
        "first_order_choice": row.first_choice,
        "second_order_choice": row.second_choice,
        "unscored_reason": row.unscored_reason,
        "rationales": row.rationales,
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "cost_usd": row.cost_usd,
        "latency_ms": row.latency_ms,
        "created_at": created,
    }
