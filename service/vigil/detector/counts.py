"""Counts of each signal per agent version over a time range, aggregated by the database.

Signals: ``rule:<id>`` (the conversation has a finding of that rule), ``forbidden_tool`` (any
forbidden-tool finding), ``tool_error`` (a tool call failed), ``outcome:<type>`` (a bad outcome
within the attribution window) over conversations; ``judge:<name>`` (fail) over the scored verdicts
of randomly sampled requests, one per conversation and judge version (:func:`sampled_verdict`).

Conversations count by when they were stored and verdicts by when they were written, so every
replica's writes are counted once, whichever replica wrote them. Outcomes arrive later than their
conversations: :func:`outcome_counts` credits each to the hour its conversation was stored, counting
those joined before that hour's outcomes settle, so a rate is never a late numerator over a fresh
denominator.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import ColumnElement, and_, case, func, select, true
from sqlalchemy.orm import Session

from vigil.store.models import ConversationRow, FindingRow, OutcomeLinkRow, VerdictRow
from vigil.store.signals import (
    AGGREGATE_OF_TYPE,
    JUDGE,
    OUTCOME,
    TOOL_ERROR,
    Key,
    RulesFor,
    conversation_signals,
    finished,
    outcome_signals,
    real_finding,
    sampled_verdict,
)


def _in_range(col, start: datetime | None, end: datetime):  # type: ignore[no-untyped-def]
    return and_(col >= start, col < end) if start is not None else col < end


def range_counts(
    session: Session, start: datetime | None, end: datetime, rules_for: RulesFor
) -> dict[Key, tuple[int, int]]:
    """``(n, x)`` per (agent, version, signal) for conversations and verdicts stored in ``[start, end)``.

    Outcome signals are not among them (see :func:`outcome_counts`). A version's ``rule:<id>``
    signals are those of the rules whose ``applies_to`` matches it.
    """
    return conversation_counts(session, start, end, rules_for) | judge_counts(session, start, end)


def conversation_counts(
    session: Session, start: datetime | None, end: datetime, rules_for: RulesFor
) -> dict[Key, tuple[int, int]]:
    """The conversation signals of :func:`range_counts`."""
    out: dict[Key, tuple[int, int]] = {}
    failures: dict[Key, int] = defaultdict(int)

    def in_range(col):  # type: ignore[no-untyped-def]
        return _in_range(col, start, end)

    conv_q = (
        select(
            ConversationRow.agent_id,
            ConversationRow.agent_version,
            func.count(),
            func.sum(case((ConversationRow.tool_error_count > 0, 1), else_=0)),
        )
        .where(in_range(ConversationRow.received_at), finished())
        .group_by(ConversationRow.agent_id, ConversationRow.agent_version)
    )
    totals: dict[tuple[str, str], int] = {}
    for agent, version, n, errors in session.execute(conv_q):
        totals[(agent, version)] = int(n)
        failures[(agent, version, TOOL_ERROR)] = int(errors or 0)
    joined = and_(in_range(ConversationRow.received_at), finished(), real_finding())
    rule_q = (
        select(
            FindingRow.agent_id,
            FindingRow.agent_version,
            FindingRow.rule_id,
            func.count(func.distinct(FindingRow.conversation_id)),
        )
        .join(ConversationRow, ConversationRow.conversation_id == FindingRow.conversation_id)
        .where(joined)
        .group_by(FindingRow.agent_id, FindingRow.agent_version, FindingRow.rule_id)
    )
    for agent, version, rule, x in session.execute(rule_q):
        failures[(agent, version, f"rule:{rule}")] = int(x)
    aggregate_q = (
        select(
            FindingRow.agent_id,
            FindingRow.agent_version,
            FindingRow.rule_type,
            func.count(func.distinct(FindingRow.conversation_id)),
        )
        .join(ConversationRow, ConversationRow.conversation_id == FindingRow.conversation_id)
        .where(joined, FindingRow.rule_type.in_(AGGREGATE_OF_TYPE))
        .group_by(FindingRow.agent_id, FindingRow.agent_version, FindingRow.rule_type)
    )
    for agent, version, kind, x in session.execute(aggregate_q):
        failures[(agent, version, AGGREGATE_OF_TYPE[kind])] = int(x)
    for (agent, version), n in totals.items():
        for signal in conversation_signals(rules_for(agent, version)):
            out[(agent, version, signal)] = (n, failures.get((agent, version, signal), 0))
    return out


def judge_counts(session: Session, start: datetime | None, end: datetime) -> dict[Key, tuple[int, int]]:
    """The judge signals of :func:`range_counts`: sampled verdicts written in ``[start, end)``."""
    out: dict[Key, tuple[int, int]] = {}
    judge_q = (
        select(
            VerdictRow.agent_id,
            VerdictRow.agent_version,
            VerdictRow.judge,
            func.count(),
            func.sum(case((VerdictRow.verdict == "fail", 1), else_=0)),
        )
        .where(_in_range(VerdictRow.created_at, start, end), sampled_verdict())
        .group_by(VerdictRow.agent_id, VerdictRow.agent_version, VerdictRow.judge)
    )
    for agent, version, judge, n, x in session.execute(judge_q):
        out[(agent, version, f"{JUDGE}{judge}")] = (int(n), int(x or 0))
    return out


def outcome_counts(
    session: Session,
    start: datetime,
    end: datetime,
    bad_outcomes: Iterable[str],
    joined_before: datetime,
    among: ColumnElement[bool] | None = None,
) -> dict[Key, tuple[int, int]]:
    """``(n, x)`` per (agent, version, ``outcome:<type>``) for the conversations stored in ``[start, end)``
    (and ``among``, if given): ``n`` of them finished, ``x`` with that bad outcome (within the attribution
    window) joined before ``joined_before``. Every agent version with conversations gets every bad type,
    so no failure is ever counted without its conversation.
    """
    bad = list(bad_outcomes)
    if not bad:
        return {}
    C, L = ConversationRow, OutcomeLinkRow
    stored = and_(C.received_at >= start, C.received_at < end, finished(), true() if among is None else among)
    totals = session.execute(
        select(C.agent_id, C.agent_version, func.count()).where(stored).group_by(C.agent_id, C.agent_version)
    ).all()
    failures: dict[Key, int] = {}
    q = (
        select(C.agent_id, C.agent_version, L.type, func.count(func.distinct(C.conversation_id)))
        .join(L, L.conversation_id == C.conversation_id)
        .where(stored, L.attributed, L.happened, L.type.in_(bad), L.linked_at < joined_before)
        .group_by(C.agent_id, C.agent_version, L.type)
    )
    for agent, version, kind, x in session.execute(q):
        failures[(agent, version, f"{OUTCOME}{kind}")] = int(x)
    return {
        (agent, version, signal): (int(n), failures.get((agent, version, signal), 0))
        for agent, version, n in totals
        for signal in outcome_signals(bad)
    }
