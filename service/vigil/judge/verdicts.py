"""What the judge worker writes for each claimed request: a verdict, a retry or a release; and its counts.

A request is done only when its verdict is stored, in the same transaction, and only by the worker
still holding its lease.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vigil.judge import store
from vigil.judge.engine import JudgeEngine
from vigil.judge.parse import Parsed
from vigil.metrics import Metrics
from vigil.store.db import PERMANENT_DB_ERRORS, storable_text
from vigil.store.models import VerdictRow

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Outcome:
    """What to write for one claimed request: a verdict, a retry or a release."""

    req: store.Claimed
    kind: str  # verdict | retry | release
    parsed: Parsed | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    delay: float = 0.0
    error: str | None = None


def storable(text: str | None) -> str | None:
    """``text`` as every database stores it (a model's reply or a provider's error may hold NUL)."""
    return None if text is None else storable_text(text)


def refused_by_database(exc: BaseException) -> bool:
    """Whether ``exc`` is the database refusing what a row holds (the store's one list of such errors),
    not the database being away or busy: writing the same rows again would fail again."""
    return isinstance(exc, PERMANENT_DB_ERRORS)


def write(
    engine: JudgeEngine, owner: str, listeners: list[Any], batch: list[Outcome]
) -> tuple[list[VerdictRow], set[tuple[str, str]]]:
    """Store the batch's outcomes; returns the new verdicts and the (judge, conversation) pairs among
    them that had a verdict already (a newer revision judged again)."""
    rows: list[VerdictRow] = []
    with engine.sessions.begin() as s:
        now = engine.now(s)
        for o in batch:
            r = o.req
            if o.kind == "verdict" and o.parsed is not None:
                if not store.complete(s, r.id, owner):
                    continue  # our lease ran out and another worker has it: it writes the verdict
                rows.append(_verdict_row(o, o.parsed, now))
            elif o.kind == "retry":
                store.reschedule(s, r.id, owner, engine.next_attempt(o.delay, now), storable(o.error))
            elif o.kind == "release":
                store.reschedule(
                    s, r.id, owner, engine.next_attempt(o.delay, now), storable(o.error), refund_attempt=True
                )
        again: set[tuple[str, str]] = set()
        if rows:
            again = store.judged_before(s, {(v.judge, v.conversation_id) for v in rows})
            s.add_all(rows)
            s.flush()
            for listener in listeners:
                listener(s, rows)
    return rows, again


def write_each(
    engine: JudgeEngine, owner: str, listeners: list[Any], batch: list[Outcome]
) -> tuple[list[VerdictRow], set[tuple[str, str]]]:
    """Write a batch the database refused one outcome at a time, so one row it cannot hold does not
    hold up the others. An outcome refused alone is written once more without what the model or the
    provider sent (a verdict becomes ``unscored`` with reason ``unstorable_reply``, keeping its cost; a
    retry or release loses its error text); refused again, it is left to its lease, which runs out and
    lets the request be claimed again, within the attempt limit."""
    rows: list[VerdictRow] = []
    again: set[tuple[str, str]] = set()
    for o in batch:
        for candidate in (o, _plain(o)):
            try:
                r, a = write(engine, owner, listeners, [candidate])
            except Exception as exc:
                if not refused_by_database(exc):
                    raise
                log.warning("the database refused a judge outcome for %s: %s", o.req.conversation_id, exc)
                continue
            rows += r
            again |= a
            break
        else:
            log.error("judge outcome for %s not stored; its lease will run out", o.req.conversation_id)
    return rows, again


def _plain(o: Outcome) -> Outcome:
    """``o`` without anything that came from outside Vigil."""
    if o.kind != "verdict":
        return Outcome(o.req, o.kind, delay=o.delay)
    keep: dict[str, Any] = {
        k: o.fields[k] for k in ("model", "offline", "prompt_hash", "judge_version", "cost_usd") if k in o.fields
    }
    cost = keep.get("cost_usd")
    if isinstance(cost, float) and not math.isfinite(cost):
        keep.pop("cost_usd")
    return Outcome(o.req, "verdict", Parsed.unscored("unstorable_reply"), keep)


def _verdict_row(o: Outcome, p: Parsed, now: datetime) -> VerdictRow:
    r = o.req
    return VerdictRow(
        request_id=r.id,
        judge=r.judge,
        conversation_id=r.conversation_id,
        revision=r.stored_revision if r.stored_revision is not None else r.revision,
        agent_id=r.agent_id,
        agent_version=r.agent_version,
        verdict=p.verdict,
        score=p.score,
        categories=p.categories,
        rationale=storable(p.rationale),
        unscored_reason=p.unscored_reason,
        attempts=r.attempts,
        reason=r.reason,
        created_at=now,
        **{k: storable(v) if k == "raw_reply" else v for k, v in o.fields.items()},
    )


def count(metrics: Metrics, rows: list[VerdictRow], again: set[tuple[str, str]]) -> None:
    """Verdicts count each; ``judged`` counts conversations, like eligible and sampled."""
    m = metrics
    for v in rows:
        agent, version = m.agent(v.agent_id), m.version(v.agent_version)
        if (v.judge, v.conversation_id) not in again:
            again.add((v.judge, v.conversation_id))
            m.judge_judged.labels(v.judge, v.judge_version, agent, version).inc()
        m.judge_verdicts.labels(
            v.judge, v.judge_version, v.verdict, agent, version, "true" if v.offline else "false"
        ).inc()
        if v.score is not None:
            m.judge_score.labels(v.judge, v.judge_version).observe(v.score)
