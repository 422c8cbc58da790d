"""Reading one agent version's quality data from the database for the compare table."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from vigil.schema import OutcomeType
from vigil.store.models import ConversationRow, FindingRow, OutcomeLinkRow, VerdictRow
from vigil.store.signals import finished, real_finding, sampled_verdict

OFFLINE_SUFFIX = ":offline"


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
    outcome_scores: dict[str, list[float]] = field(default_factory=dict)
    judge: dict[str, tuple[int, int]] = field(default_factory=dict)  # judge -> (sampled scored, failed)
    steps: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    tasks: dict[str, tuple[int, int]] = field(default_factory=dict)  # task -> (trials, successes)


def _window(q: Any, col: Any, since: datetime | None, until: datetime | None) -> Any:
    if since is not None:
        q = q.where(col >= since)
    if until is not None:
        q = q.where(col < until)
    return q


def versions_of(session: Session, version: str) -> list[str]:
    """Agents that have conversations of ``version``."""
    q = select(ConversationRow.agent_id).where(ConversationRow.agent_version == version).distinct()
    return sorted(session.scalars(q))


def load_version(
    session: Session,
    agent: str,
    version: str,
    types: dict[str, OutcomeType],
    max_sample: int,
    since: datetime | None = None,
    until: datetime | None = None,
) -> VersionData:
    d = VersionData(agent, version)
    C = ConversationRow
    mine = (C.agent_id == agent, C.agent_version == version, finished())
    row = session.execute(
        _window(
            select(func.count(), func.sum(case((C.tool_error_count > 0, 1), else_=0))).where(*mine),
            C.received_at,
            since,
            until,
        )
    ).one()
    d.conversations, d.tool_error_conversations = int(row[0]), int(row[1] or 0)
    if not d.conversations:
        return d
    F = FindingRow
    rules_q = (
        select(F.rule_id, F.rule_type, func.count(func.distinct(F.conversation_id)))
        .join(C, C.conversation_id == F.conversation_id)
        .where(*mine, real_finding())
        .group_by(F.rule_id, F.rule_type)
    )
    for rule, _type, x in session.execute(_window(rules_q, C.received_at, since, until)):
        d.rule_conversations[rule] = int(x)
    forbidden_q = (
        select(func.count(func.distinct(F.conversation_id)))
        .join(C, C.conversation_id == F.conversation_id)
        .where(*mine, real_finding(), F.rule_type == "forbidden_tool")
    )
    d.forbidden_conversations = int(session.scalar(_window(forbidden_q, C.received_at, since, until)) or 0)
    L = OutcomeLinkRow
    links = (
        select(L.type, func.count(func.distinct(L.conversation_id)))
        .join(C, C.conversation_id == L.conversation_id)
        .where(*mine, L.attributed, L.happened)
        .group_by(L.type)
    )
    for kind, x in session.execute(_window(links, C.received_at, since, until)):
        d.outcome_conversations[kind] = int(x)
    scores = [t for t, ot in types.items() if ot.kind == "score"]
    if scores:
        score_q = (
            select(L.type, L.value)
            .join(C, C.conversation_id == L.conversation_id)
            .where(*mine, L.attributed, L.type.in_(scores))
            .order_by(L.outcome_id.desc())
            .limit(max_sample)
        )
        for kind, value in session.execute(_window(score_q, C.received_at, since, until)):
            d.outcome_scores.setdefault(kind, []).append(float(value))
    V = VerdictRow
    judge_q = (
        select(V.judge, V.offline, func.count(), func.sum(case((V.verdict == "fail", 1), else_=0)))
        .where(V.agent_id == agent, V.agent_version == version, sampled_verdict())
        .group_by(V.judge, V.offline)
    )
    for judge, offline, n, x in session.execute(_window(judge_q, V.created_at, since, until)):
        # the offline judge's verdicts are a different instrument: never pooled with the model's
        d.judge[f"{judge}{OFFLINE_SUFFIX if offline else ''}"] = (int(n), int(x or 0))
    sample_q = (
        select(C.message_count, C.cost_usd, C.latency_ms).where(*mine).order_by(C.received_at.desc()).limit(max_sample)
    )
    for steps, cost, latency in session.execute(_window(sample_q, C.received_at, since, until)):
        d.steps.append(float(steps))
        if cost is not None:
            d.cost.append(float(cost))
        if latency is not None:
            d.latency.append(float(latency))
    d.tasks = _tasks(session, agent, version, since, until)
    return d


def _tasks(
    session: Session, agent: str, version: str, since: datetime | None, until: datetime | None
) -> dict[str, tuple[int, int]]:
    """Trials and successes per repeated task: conversations of the task that carry a task_success outcome."""
    C, L = ConversationRow, OutcomeLinkRow
    q = (
        select(C.task_id, C.conversation_id, func.max(case((L.happened, 1), else_=0)))
        .join(L, L.conversation_id == C.conversation_id)
        .where(
            C.agent_id == agent,
            C.agent_version == version,
            C.task_id.is_not(None),
            finished(),
            L.type == "task_success",
            L.attributed,
        )
        .group_by(C.task_id, C.conversation_id)
    )
    trials: dict[str, list[int]] = defaultdict(list)
    for task, _cid, ok in session.execute(_window(q, C.received_at, since, until)):
        trials[task].append(int(ok))
    return {t: (len(v), sum(v)) for t, v in trials.items() if len(v) >= 2}
