"""Counts of each signal per agent version over a time range, aggregated by the database.

Signals: ``rule:<id>`` (the conversation has a finding of that rule), ``forbidden_tool`` (any
forbidden-tool finding), ``tool_error`` (a tool call failed), ``outcome:<type>`` (a bad outcome
within the attribution window) over conversations; ``judge:<name>`` (fail) over the scored verdicts
of randomly sampled requests, one per conversation and judge version (:func:`sampled_verdict`).
Conversations count by when they were stored, outcomes by when they were joined, verdicts by when
they were written, so every replica's writes are counted once, whichever replica wrote them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime

from sqlalchemy import and_, case, exists, func, not_, or_, select
from sqlalchemy.orm import Session, aliased

from ..judge.models import VerdictRow
from ..outcomes.models import OutcomeLinkRow
from ..store.models import ConversationRow, FindingRow

Key = tuple[str, str, str]  # agent, version, signal
RulesFor = Callable[[str, str], Iterable[str]]  # (agent, version) -> ids of the rules that apply to it

FORBIDDEN = "forbidden_tool"
TOOL_ERROR = "tool_error"


def finished():  # type: ignore[no-untyped-def]
    """Growing conversations are counted once finished (or when they never say)."""
    return or_(ConversationRow.status.is_(None), ConversationRow.status != "in_progress")


def real_finding():  # type: ignore[no-untyped-def]
    """A rule that raised leaves an info finding 'rule error: ...'; it is not a failure of the agent."""
    return not_(and_(FindingRow.severity == "info", FindingRow.message.like("rule error:%")))


SCORED = ("pass", "fail")


def sampled_verdict():  # type: ignore[no-untyped-def]
    """The verdicts behind a judge's failure rate: scored, of a randomly sampled request, and the first
    such verdict of its conversation and judge version.

    Flagged, outcome-driven, minimum-per-hour and manual requests pick conversations that are likelier
    to fail, and a conversation judged again (a newer revision) would count twice; either would bias
    the rate. A later revision's verdict is therefore left out.
    """
    earlier = aliased(VerdictRow)
    return and_(
        VerdictRow.reason == "sampled",
        VerdictRow.verdict.in_(SCORED),
        ~exists().where(
            earlier.conversation_id == VerdictRow.conversation_id,
            earlier.judge == VerdictRow.judge,
            earlier.judge_version == VerdictRow.judge_version,
            earlier.reason == "sampled",
            earlier.verdict.in_(SCORED),
            earlier.id < VerdictRow.id,
        ),
    )


def conversation_signals(rule_ids: Iterable[str], bad_outcomes: Iterable[str]) -> list[str]:
    return [f"rule:{r}" for r in rule_ids] + [FORBIDDEN, TOOL_ERROR] + [f"outcome:{t}" for t in bad_outcomes]


def range_counts(
    session: Session,
    start: datetime | None,
    end: datetime,
    rules_for: RulesFor,
    bad_outcomes: Iterable[str],
) -> dict[Key, tuple[int, int]]:
    """``(n, x)`` per (agent, version, signal) for data stored in ``[start, end)``.

    A version's ``rule:<id>`` signals are those of the rules whose ``applies_to`` matches it.
    """
    out: dict[Key, tuple[int, int]] = {}
    failures: dict[Key, int] = defaultdict(int)
    bad = list(bad_outcomes)

    def in_range(col):  # type: ignore[no-untyped-def]
        return and_(col >= start, col < end) if start is not None else col < end

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
    forbidden_q = (
        select(
            FindingRow.agent_id,
            FindingRow.agent_version,
            func.count(func.distinct(FindingRow.conversation_id)),
        )
        .join(ConversationRow, ConversationRow.conversation_id == FindingRow.conversation_id)
        .where(joined, FindingRow.rule_type == "forbidden_tool")
        .group_by(FindingRow.agent_id, FindingRow.agent_version)
    )
    for agent, version, x in session.execute(forbidden_q):
        failures[(agent, version, FORBIDDEN)] = int(x)
    if bad:
        out_q = (
            select(
                OutcomeLinkRow.agent_id,
                OutcomeLinkRow.agent_version,
                OutcomeLinkRow.type,
                func.count(func.distinct(OutcomeLinkRow.conversation_id)),
            )
            .where(
                in_range(OutcomeLinkRow.linked_at),
                OutcomeLinkRow.attributed,
                OutcomeLinkRow.happened,
                OutcomeLinkRow.type.in_(bad),
            )
            .group_by(OutcomeLinkRow.agent_id, OutcomeLinkRow.agent_version, OutcomeLinkRow.type)
        )
        for agent, version, kind, x in session.execute(out_q):
            failures[(agent, version, f"outcome:{kind}")] = int(x)
            totals.setdefault((agent, version), 0)
    for (agent, version), n in totals.items():
        for signal in conversation_signals(rules_for(agent, version), bad):
            out[(agent, version, signal)] = (n, failures.get((agent, version, signal), 0))
    judge_q = (
        select(
            VerdictRow.agent_id,
            VerdictRow.agent_version,
            VerdictRow.judge,
            func.count(),
            func.sum(case((VerdictRow.verdict == "fail", 1), else_=0)),
        )
        .where(in_range(VerdictRow.created_at), sampled_verdict())
        .group_by(VerdictRow.agent_id, VerdictRow.agent_version, VerdictRow.judge)
    )
    for agent, version, judge, n, x in session.execute(judge_q):
        out[(agent, version, f"judge:{judge}")] = (int(n), int(x or 0))
    return out
