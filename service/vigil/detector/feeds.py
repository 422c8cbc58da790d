"""What each conversation was fed as, so that a newer revision of it corrects it instead of counting again.

A growing conversation is stored again under its id with each newer revision, stamped with the time that
revision arrived. Counted by when conversations were stored, it counted once per revision read: one more
observation in the statistics for each pass that read one, and one in the stored counts of every hour it
was stored in. ``detector_feeds`` records, per conversation, the revision, agent version, hour and failed
signals it was counted with. The first revision read is a new observation; a newer one moves the
conversation's count to the newer revision's hour and feeds the statistics only the change of its outcome
(``flips``: a success turned failure adds the difference of the two log-likelihood ratios, see
:meth:`vigil.detector.cusum.Cusum.update`), so each conversation counts once, with its newest outcome.
Outcome signals count a conversation in the first hour whose outcomes settled with it in it.

The work is the detector pass's, in bulk: the write path of conversations does none of it. Rows go once
their hour is past conversation retention (a conversation revised later than that counts again).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import ColumnElement, and_, delete, exists, or_, select, update
from sqlalchemy.orm import Session

from vigil.detector.hourly import HOUR, Changes, Counts, floor_hour
from vigil.detector.models import DetectorFeedRow
from vigil.store.db import among, aware
from vigil.store.models import ConversationRow, FindingRow
from vigil.store.signals import (
    AGGREGATE_OF_TYPE,
    TOOL_ERROR,
    Key,
    RulesFor,
    conversation_signals,
    finished,
    real_finding,
)
from vigil.store.writes import upsert_rows

PAGE = 5_000  # conversations read, and their rows written, per statement


@dataclass(slots=True)
class Fed:
    """What a batch of conversations changes: the statistics' new observations (``counts``) and corrections
    (``flips`` per series: successes turned failures, less the reverse), and the stored counts (``changes``)."""

    counts: Counts = field(default_factory=dict)
    flips: dict[Key, int] = field(default_factory=dict)
    changes: Changes = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.counts or self.flips or self.changes)


def feed(s: Session, start: datetime, end: datetime, rules_for: RulesFor) -> Fed:
    """Record the finished conversations stored in ``[start, end)`` (within one hour) that were not fed at
    the revision stored: a conversation new to the record, or one a newer revision changed."""
    C, F = ConversationRow, DetectorFeedRow
    hour = floor_hour(start)
    tally = _Tally(rules_for)
    q = (
        select(C.received_at, C.conversation_id, C.agent_id, C.agent_version, C.revision, C.tool_error_count)
        .add_columns(F.agent_id, F.agent_version, F.hour, F.failed)
        .outerjoin(F, F.conversation_id == C.conversation_id)
        .where(C.received_at < end, finished(), or_(F.revision.is_(None), F.revision != C.revision))
        .order_by(C.received_at, C.conversation_id)
        .limit(PAGE)
    )
    after: ColumnElement[bool] = C.received_at >= start
    while rows := s.execute(q.where(after)).all():
        failing = _failing_rules(s, [r[1] for r in rows])
        records = []
        for _at, cid, agent, version, revision, errors, was_agent, was_version, was_hour, was_failed in rows:
            now = (agent, version)
            failed = (failing.get(cid, set()) | ({TOOL_ERROR} if errors else set())) & tally.signals(now)
            tally.count(hour, now, failed)
            if was_hour is None:
                tally.observe(now, failed)
            else:
                was = (was_agent, was_version)
                tally.count(aware(was_hour), was, set(was_failed or ()), -1)
                if was == now:
                    tally.correct(now, set(was_failed or ()), failed)
                else:  # stored again under another version: a new observation of that one
                    tally.observe(now, failed)
            records.append(
                {
                    "conversation_id": cid,
                    "agent_id": agent,
                    "agent_version": version,
                    "revision": revision,
                    "hour": hour,
                    "failed": sorted(failed) or None,
                }
            )
        upsert_rows(s, DetectorFeedRow.__table__, records, ["conversation_id"])
        last_at, last_id = rows[-1][0], rows[-1][1]
        after = and_(C.received_at >= last_at, or_(C.received_at > last_at, C.conversation_id > last_id))
    return tally.fed()


Version = tuple[str, str]  # agent, version


@dataclass(slots=True)
class _Counted:
    n: int = 0
    x: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, failed: set[str], sign: int = 1) -> None:
        self.n += sign
        for sig in failed:
            self.x[sig] += sign


class _Tally:
    """A batch's conversations and failures per agent version (and hour), spread over the version's signals
    once at the end: a conversation fails few of them."""

    def __init__(self, rules_for: RulesFor) -> None:
        self.rules_for = rules_for
        self.known: dict[Version, frozenset[str]] = {}
        self.observed: dict[Version, _Counted] = defaultdict(_Counted)
        self.stored: dict[tuple[datetime, Version], _Counted] = defaultdict(_Counted)
        self.flips: dict[Key, int] = defaultdict(int)

    def signals(self, version: Version) -> frozenset[str]:
        """The version's conversation signals: its rules' and the built-in ones."""
        got = self.known.get(version)
        if got is None:
            got = self.known[version] = frozenset(conversation_signals(self.rules_for(*version)))
        return got

    def observe(self, version: Version, failed: set[str]) -> None:
        """A new observation of the version's signals."""
        self.observed[version].add(failed)

    def correct(self, version: Version, was: set[str], failed: set[str]) -> None:
        """An observation fed before with ``was`` failing, now ``failed``."""
        for sig in failed - was:
            self.flips[(*version, sig)] += 1
        for sig in was - failed:
            self.flips[(*version, sig)] -= 1

    def count(self, hour: datetime, version: Version, failed: set[str], sign: int = 1) -> None:
        """A conversation counted in (``sign`` -1: taken out of) the stored counts of ``hour``."""
        self.stored[(hour, version)].add(failed, sign)

    def fed(self) -> Fed:
        out = Fed(flips={k: f for k, f in self.flips.items() if f})
        for version, c in self.observed.items():
            for sig in self.signals(version):
                out.counts[(*version, sig)] = (c.n, c.x.get(sig, 0))
        for (hour, version), c in self.stored.items():
            for sig in self.signals(version):
                if c.n or c.x.get(sig, 0):
                    out.changes[(hour, (*version, sig))] = (c.n, c.x.get(sig, 0))
        return out


def _failing_rules(s: Session, ids: list[str]) -> dict[str, set[str]]:
    """The rule signals (and the aggregates counted from findings: ``forbidden_tool``) each of these
    conversations fails, from its findings."""
    q = (
        select(FindingRow.conversation_id, FindingRow.rule_id, FindingRow.rule_type)
        .where(among(s, FindingRow.conversation_id, ids), real_finding())
        .distinct()
    )
    out: dict[str, set[str]] = defaultdict(set)
    for cid, rule, kind in s.execute(q):
        out[cid].add(f"rule:{rule}")
        if kind in AGGREGATE_OF_TYPE:
            out[cid].add(AGGREGATE_OF_TYPE[kind])
    return out


def outcomes_unfed(hour: datetime) -> ColumnElement[bool]:
    """The conversation's outcome signals were not counted in an hour other than ``hour``."""
    F = DetectorFeedRow
    return ~exists().where(
        F.conversation_id == ConversationRow.conversation_id, F.outcome_hour.is_not(None), F.outcome_hour != hour
    )


def mark_outcomes_fed(s: Session, hour: datetime) -> None:
    """Record that the outcome signals of the finished conversations stored in ``hour`` count there."""
    C, F = ConversationRow, DetectorFeedRow.__table__
    in_hour = select(C.conversation_id).where(C.received_at >= hour, C.received_at < hour + HOUR, finished())
    s.execute(update(F).where(F.c.outcome_hour.is_(None), F.c.conversation_id.in_(in_hour)).values(outcome_hour=hour))


def prune(s: Session, before: datetime) -> None:
    """Forget the conversations last counted in an hour before ``before``."""
    s.execute(delete(DetectorFeedRow).where(DetectorFeedRow.hour < before))
