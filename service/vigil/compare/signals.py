"""Reading one agent version's quality data from the database for the compare table."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from vigil.schema import OutcomeType
from vigil.store import rollups
from vigil.store.db import aware
from vigil.store.models import ConversationRow, OutcomeLinkRow
from vigil.store.reads import newest_received
from vigil.store.signals import finished


@dataclass(slots=True)
class VersionData:
    """Counts and bounded samples of one agent version."""

    agent_id: str
    version: str
    conversations: int = 0
    tool_error_conversations: int = 0
    rule_conversations: dict[str, int] = field(default_factory=dict)
    forbidden_conversations: int = 0
    outcome_conversations: dict[str, int] = field(default_factory=dict)
    # conversations old enough for their outcomes to be in (the outcome rates' denominator); None: all
    outcome_n: int | None = None
    outcome_scores: dict[str, list[float]] = field(default_factory=dict)
    judge: dict[str, tuple[int, int]] = field(default_factory=dict)  # judge -> (sampled scored, failed)
    steps: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    tasks: dict[str, tuple[int, int]] = field(default_factory=dict)  # task -> (trials, successes), 2+ trials
    every_task: dict[str, tuple[int, int]] = field(default_factory=dict)  # the same with single-trial tasks


def _window(q: Any, col: Any, since: datetime | None, until: datetime | None) -> Any:
    if since is not None:
        q = q.where(col >= since)
    if until is not None:
        q = q.where(col < until)
    return q


def versions_of(session: Session, version: str) -> list[str]:
    """Agents that have conversations of ``version`` (from the rollups)."""
    return rollups.agents_of(session, version)


def load_version(
    session: Session,
    agent: str,
    version: str,
    types: dict[str, OutcomeType],
    max_sample: int,
    since: datetime | None = None,
    until: datetime | None = None,
    outcomes_before: datetime | None = None,
) -> VersionData:
    """Counts from the hourly rollups (hours overlapping the window); means and p95 from a bounded sample
    of the newest conversations, read along an index. Outcome rates count only the conversations received
    in whole hours before ``outcomes_before`` (those whose outcomes had time to arrive), when it is given."""
    d = VersionData(agent, version)
    counts = rollups.version_counts(session, agent, version, since, until)
    d.conversations, d.tool_error_conversations = counts.conversations, counts.tool_error
    if not d.conversations:
        return d
    d.rule_conversations = dict(counts.rules)
    d.forbidden_conversations = counts.forbidden
    d.outcome_conversations = dict(counts.outcomes)
    if outcomes_before is not None:
        cut = rollups.hour_of(outcomes_before)
        if until is None or cut < aware(until):
            matured = rollups.version_counts(session, agent, version, since, cut)
            d.outcome_n, d.outcome_conversations = matured.conversations, dict(matured.outcomes)
    # the offline judge's verdicts are a different instrument: never pooled with the model's
    d.judge = dict(counts.judges)  # keys: judge, or judge + OFFLINE_SUFFIX
    C, L = ConversationRow, OutcomeLinkRow
    mine = (C.agent_id == agent, C.agent_version == version, finished())
    scores = [t for t, ot in types.items() if ot.kind == "score"]
    if scores:
        score_q = (
            select(L.type, L.value)
            .join(C, C.conversation_id == L.conversation_id)
            .where(L.agent_id == agent, L.agent_version == version, *mine, L.attributed, L.type.in_(scores))
            .order_by(L.outcome_id.desc())
            .limit(max_sample)
        )
        for kind, value in session.execute(_window(score_q, C.received_at, since, until)):
            d.outcome_scores.setdefault(kind, []).append(float(value))
    newest = newest_received(session, agent, version, since, until)
    if newest is not None:
        sample_q = (
            select(C.message_count, C.cost_usd, C.latency_ms)
            .where(*mine, C.received_at <= newest)
            .order_by(C.received_at.desc())
            .limit(max_sample)
        )
        for steps, cost, latency in session.execute(_window(sample_q, C.received_at, since, None)):
            d.steps.append(float(steps))
            if cost is not None:
                d.cost.append(float(cost))
            if latency is not None:
                d.latency.append(float(latency))
    # every task once: pass^k keeps the repeated ones, the paired per-task rows take them all
    d.every_task = rollups.task_counts(session, agent, version, since, until, min_trials=1)
    d.tasks = {t: nc for t, nc in d.every_task.items() if nc[0] >= 2}
    return d
