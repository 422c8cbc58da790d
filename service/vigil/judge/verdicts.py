"""What the judge worker writes for each claimed request: a verdict, a retry or a release; and its counts.

A request is done only when its verdict is stored, in the same transaction, and only by the worker
still holding its lease.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from vigil.judge import store
from vigil.judge.engine import JudgeEngine
from vigil.judge.parse import Parsed
from vigil.metrics import Metrics
from vigil.store.models import VerdictRow


@dataclass(slots=True)
class Outcome:
    """What to write for one claimed request: a verdict, a retry or a release."""

    req: store.Claimed
    kind: str  # verdict | retry | release
    parsed: Parsed | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    delay: float = 0.0
    error: str | None = None


def write(
    engine: JudgeEngine, owner: str, listeners: list[Any], batch: list[Outcome]
) -> tuple[list[VerdictRow], set[tuple[str, str]]]:
    """Store the batch's outcomes; returns the new verdicts and the (judge, conversation) pairs among
    them that had a verdict already (a newer revision judged again)."""
    now = engine.clock()
    rows: list[VerdictRow] = []
    with engine.sessions.begin() as s:
        for o in batch:
            r = o.req
            if o.kind == "verdict" and o.parsed is not None:
                if not store.complete(s, r.id, owner):
                    continue  # our lease ran out and another worker has it: it writes the verdict
                rows.append(_verdict_row(o, o.parsed, now))
            elif o.kind == "retry":
                store.reschedule(s, r.id, owner, engine.next_attempt(o.delay), o.error)
            elif o.kind == "release":
                store.reschedule(s, r.id, owner, engine.next_attempt(o.delay), o.error, refund_attempt=True)
        again: set[tuple[str, str]] = set()
        if rows:
            again = store.judged_before(s, {(v.judge, v.conversation_id) for v in rows})
            s.add_all(rows)
            s.flush()
            for listener in listeners:
                listener(s, rows)
    return rows, again


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
        rationale=p.rationale,
        unscored_reason=p.unscored_reason,
        attempts=r.attempts,
        reason=r.reason,
        created_at=now,
        **o.fields,
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
