"""What Vigil's quality signals count, shared by the detector, compare and every read of rates.

Signals: ``rule:<id>`` (the conversation has a finding of that rule), ``forbidden_tool`` (any
forbidden-tool finding), ``tool_error`` (a tool call failed), ``outcome:<type>`` (a bad outcome
within the attribution window) over conversations; ``judge:<name>`` (fail) over the scored verdicts
of randomly sampled requests, one per conversation and judge version (:func:`sampled_verdict`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlalchemy import and_, exists, not_, or_
from sqlalchemy.orm import aliased

from vigil.store.db import aware
from vigil.store.models import ConversationRow, FindingRow, OutcomeRow, VerdictRow

Key = tuple[str, str, str]  # agent, version, signal
RulesFor = Callable[[str, str], Iterable[str]]  # (agent, version) -> ids of the rules that apply to it

FORBIDDEN = "forbidden_tool"
TOOL_ERROR = "tool_error"
OUTCOME = "outcome:"
JUDGE = "judge:"
OFFLINE_SUFFIX = ":offline"  # a judge's offline verdicts: their own signal, never pooled with the model's

# The aggregate signals counted from findings, each with the rule type whose findings it counts: a
# conversation fails it with a finding of any rule of that type. Each such rule's ``rule:<id>`` counts a
# subset of the aggregate's conversations (the alerts fold on that: ``vigil.detector.twins``).
# ``tool_error`` is not one: it counts conversations with a failed tool result (``is_error``), whatever the
# rules find; the ``tool_error_rate`` rule flags a different set (a share of failed calls over a minimum).
FINDING_AGGREGATES: dict[str, str] = {FORBIDDEN: "forbidden_tool"}
# the same table by rule type; one aggregate per type, so no entry of the table above is lost
AGGREGATE_OF_TYPE: dict[str, str] = {kind: signal for signal, kind in FINDING_AGGREGATES.items()}
assert len(AGGREGATE_OF_TYPE) == len(FINDING_AGGREGATES), "two aggregates count the same rule type"


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


def conversation_signals(rule_ids: Iterable[str]) -> list[str]:
    """The signals whose failures are known when the conversation is stored."""
    return [f"rule:{r}" for r in rule_ids] + [*FINDING_AGGREGATES, TOOL_ERROR]


def outcome_signals(bad_outcomes: Iterable[str]) -> list[str]:
    return [f"{OUTCOME}{t}" for t in bad_outcomes]


def is_outcome(signal: str) -> bool:
    return signal.startswith(OUTCOME)


def version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Natural order of version names (v1.10 after v1.9): breaks ties of versions first seen together."""
    # isdecimal, not isdigit: superscripts and circled digits are digits int() cannot read (a version "v1²")
    return tuple((0, int(p)) if p.isdecimal() else (1, p) for p in re.split(r"(\d+)", version) if p)


# Clients' clocks drift; an outcome stamped slightly before its conversation started still belongs to it.
CLOCK_SKEW = timedelta(hours=1)


class StoredConversation(Protocol):
    """What joins of a signal to its conversation read: a stored row, or the batch item just stored."""

    @property
    def conversation_id(self) -> str: ...
    @property
    def agent_id(self) -> str: ...
    @property
    def agent_version(self) -> str: ...
    @property
    def started_at(self) -> datetime | None: ...
    @property
    def ended_at(self) -> datetime | None: ...
    @property
    def received_at(self) -> datetime | None: ...


# the columns of ConversationRow a StoredConversation reads (to load only those)
STORED_FIELDS = ("conversation_id", "agent_id", "agent_version", "started_at", "ended_at", "received_at")


def attributed(outcome: OutcomeRow, conv: StoredConversation, window_hours: float) -> bool:
    latest = conv.ended_at or conv.started_at or conv.received_at
    if latest is None:  # a stored conversation always has received_at
        raise ValueError(f"conversation {conv.conversation_id} has no time to attribute outcomes to")
    end = aware(latest)
    start = aware(conv.started_at) if conv.started_at else end
    when = aware(outcome.occurred_at)
    skew = CLOCK_SKEW / timedelta(hours=1)
    return _shifted(start, -skew) <= when <= _shifted(end, window_hours)


_EARLIEST = datetime.min.replace(tzinfo=UTC)
_LATEST = datetime.max.replace(tzinfo=UTC)


def _shifted(t: datetime, hours: float) -> datetime:
    """``t`` moved by ``hours``, held at the first or last representable instant rather than raising
    OverflowError: a conversation ending in the last days of year 9999 (or starting on 0001-01-01) is
    valid, and its window simply reaches the end (or the start) of time."""
    try:
        return t + timedelta(hours=hours)
    except OverflowError:
        return _LATEST if hours > 0 else _EARLIEST
