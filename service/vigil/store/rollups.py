"""Hourly rollups: what every aggregate read (compare, quality, version lists, pass^k) answers from.

``rollup_hourly`` holds per (hour, agent, version, signal) counts: ``conversations`` (finished ones, n),
``tool_error``, ``rule:<id>``, ``forbidden_tool``, ``outcome:<type>`` (x: conversations with it) keyed by
the conversation's ``received_at`` hour, and ``judge:<name>[:offline]`` (n sampled scored verdicts, x
failures) keyed by the verdict's hour. ``rollup_tasks`` holds trials and successes per (day, agent,
version, task) for pass^k, ``rollup_versions`` when each version was first and last seen.

The job (:mod:`vigil.store.rollup_job`) keeps them equal to a from-scratch aggregation of the base tables
(:func:`vigil.store.rollup_job.rebuild`), including when a conversation is stored again. Reads never run
it: a session with a tail attached (:mod:`vigil.store.rollup_tail`) counts the hours and tasks written
since its last run from the base tables instead.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import BigInteger, DateTime, Index, Integer, SmallInteger, String, Text, and_, func, not_, or_, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from vigil.store.db import aware
from vigil.store.models import Base

CONVERSATIONS = "conversations"
CONV_FAMILY = "conv"
OUTCOME_FAMILY = "outcome"
JUDGE_FAMILY = "judge"


class RollupHourRow(Base):
    __tablename__ = "rollup_hourly"

    hour: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    agent_version: Mapped[str] = mapped_column(String(128), primary_key=True)
    signal: Mapped[str] = mapped_column(String(200), primary_key=True)
    family: Mapped[str] = mapped_column(String(16))
    n: Mapped[int] = mapped_column(BigInteger, default=0)
    x: Mapped[int] = mapped_column(BigInteger, default=0)

    __table_args__ = (Index("ix_rollup_hourly_version", "agent_id", "agent_version", "hour"),)


class RollupTaskRow(Base):
    __tablename__ = "rollup_tasks"

    agent_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    agent_version: Mapped[str] = mapped_column(String(128), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    day: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    trials: Mapped[int] = mapped_column(Integer, default=0)
    successes: Mapped[int] = mapped_column(Integer, default=0)


class RollupVersionRow(Base):
    __tablename__ = "rollup_versions"

    agent_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    agent_version: Mapped[str] = mapped_column(String(128), primary_key=True)
    first_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index("ix_rollup_versions_version", "agent_version"),)


class RollupMemberRow(Base):
    """Where each conversation was counted: a newer revision moves it, and its old hour is recomputed.

    ``trials`` and ``successes`` (0 or 1) are what it added to its task's day when last counted, ``outcomes``
    the outcome types it counted under (one a line); NULL on rows written before they were kept."""

    __tablename__ = "rollup_members"

    conversation_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    agent_id: Mapped[str] = mapped_column(String(256))
    agent_version: Mapped[str] = mapped_column(String(128))
    task_id: Mapped[str | None] = mapped_column(String(256))
    trials: Mapped[int | None] = mapped_column(SmallInteger)
    successes: Mapped[int | None] = mapped_column(SmallInteger)
    outcomes: Mapped[str | None] = mapped_column(Text)


TAIL_KEY = "vigil.rollup_tail"
"""Where a read session keeps its :class:`vigil.store.rollup_tail.Tail` (``session.info``)."""


class Tail(Protocol):
    """What :class:`vigil.store.rollup_tail.Tail` gives the reads below."""

    first_seen: dict[tuple[str, str], datetime]

    def recounted(self, agent: str, version: str) -> dict[datetime, set[str]]: ...

    def counts(
        self, session: Session, agent: str, version: str
    ) -> dict[tuple[datetime, str, str, str], tuple[str, int, int]]: ...

    def task_days(
        self, session: Session, agent: str, version: str
    ) -> tuple[set[str], datetime | None, dict[tuple[str, datetime], tuple[int, int]]]: ...


def tail_of(session: Session) -> Tail | None:
    return session.info.get(TAIL_KEY)


RETAINED = "retention"
"""The ``rollup_state`` row whose watermark is the newest cutoff a retention run deleted conversations
before: hours that began before it may have lost raw rows, so the rollup job keeps their counts."""


class RollupStateRow(Base):
    __tablename__ = "rollup_state"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    watermark: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def hour_of(ts: datetime) -> datetime:
    return aware(ts).replace(minute=0, second=0, microsecond=0)


def day_of(ts: datetime) -> datetime:
    return aware(ts).replace(hour=0, minute=0, second=0, microsecond=0)


def default_since(window_days: float, now: datetime) -> datetime | None:
    """Start of the default read window (None: all time); ``now`` on the database's clock, which stamps what
    the window holds (:meth:`vigil.runtime.Runtime.now`)."""
    if window_days <= 0:
        return None
    return hour_of(now - timedelta(days=window_days))


@dataclass(slots=True)
class VersionCounts:
    """Counts of one agent version over a window, read from the rollups."""

    conversations: int = 0
    tool_error: int = 0
    forbidden: int = 0
    rules: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    judges: dict[str, tuple[int, int]] = field(default_factory=dict)  # judge[:offline] -> (n, failures)


def _window(q: Any, col: Any, since: datetime | None, until: datetime | None) -> Any:
    """Hours overlapping [since, until): a window edge inside an hour counts that whole hour."""
    if since is not None:
        q = q.where(col >= hour_of(since))
    if until is not None:
        q = q.where(col < aware(until))
    return q


def version_counts(
    session: Session, agent: str, version: str, since: datetime | None = None, until: datetime | None = None
) -> VersionCounts:
    R = RollupHourRow
    q = (
        select(R.signal, func.sum(R.n), func.sum(R.x))
        .where(R.agent_id == agent, R.agent_version == version)
        .group_by(R.signal)
    )
    tail = tail_of(session)
    recounted = tail.recounted(agent, version) if tail is not None else {}
    if recounted:  # these hours' families are counted from the base tables below instead
        q = q.where(not_(or_(*[and_(R.hour == h, R.family.in_(sorted(f))) for h, f in sorted(recounted.items())])))
    sums: dict[str, tuple[int, int]] = defaultdict(lambda: (0, 0))
    for signal, n, x in session.execute(_window(q, R.hour, since, until)):
        sums[signal] = (int(n or 0), int(x or 0))
    if tail is not None:
        lo, hi = (hour_of(since) if since else None), (aware(until) if until else None)
        for (h, _a, _v, signal), (_f, n, x) in tail.counts(session, agent, version).items():
            if (lo is None or h >= lo) and (hi is None or h < hi):
                had = sums[signal]
                sums[signal] = (had[0] + n, had[1] + x)
    out = VersionCounts()
    for signal, (n, x) in sums.items():
        if signal == CONVERSATIONS:
            out.conversations = n
        elif signal == "tool_error":
            out.tool_error = x
        elif signal == "forbidden_tool":
            out.forbidden = x
        elif signal.startswith("rule:"):
            out.rules[signal[5:]] = x
        elif signal.startswith("outcome:"):
            out.outcomes[signal[8:]] = x
        elif signal.startswith("judge:"):
            out.judges[signal[6:]] = (n, x)
    return out


def task_counts(
    session: Session,
    agent: str,
    version: str,
    since: datetime | None = None,
    until: datetime | None = None,
    min_trials: int = 2,
) -> dict[str, tuple[int, int]]:
    """Trials and successes per task of the version in the window (the rollups, by day), for tasks with
    at least ``min_trials`` trials (the default 2: pass^k needs repeats)."""
    T = RollupTaskRow
    q = (
        select(T.task_id, func.sum(T.trials), func.sum(T.successes))
        .where(T.agent_id == agent, T.agent_version == version)
        .group_by(T.task_id)
    )
    lo = day_of(since) if since is not None else None
    hi = aware(until) if until is not None else None
    if lo is not None:
        q = q.where(T.day >= lo)
    if hi is not None:
        q = q.where(T.day < hi)
    tail = tail_of(session)
    tasks, start, fresh = tail.task_days(session, agent, version) if tail is not None else (set(), None, {})
    if tasks:  # tasks written since the job's last run: counted from the base tables below instead
        redone = T.task_id.in_(sorted(tasks))
        q = q.where(not_(and_(redone, T.day >= start)) if start is not None else not_(redone))
    sums: dict[str, tuple[int, int]] = {t: (int(n or 0), int(s or 0)) for t, n, s in session.execute(q)}
    for (t, day), (n, s) in fresh.items():
        if (lo is None or day >= lo) and (hi is None or day < hi):
            had = sums.get(t, (0, 0))
            sums[t] = (had[0] + n, had[1] + s)
    return {t: (n, s) for t, (n, s) in sums.items() if n and n >= min_trials}


def agents_of(session: Session, version: str) -> list[str]:
    """Agents that have conversations of ``version``."""
    q = select(RollupVersionRow.agent_id).where(RollupVersionRow.agent_version == version)
    tail = tail_of(session)
    new = {a for a, v in tail.first_seen if v == version} if tail is not None else set()
    return sorted(set(session.scalars(q)) | new)


def versions_seen(session: Session) -> list[tuple[str, str, datetime]]:
    """(agent, version, first seen) of every version."""
    V = RollupVersionRow
    seen = {(a, v): aware(t) for a, v, t in session.execute(select(V.agent_id, V.agent_version, V.first_seen))}
    tail = tail_of(session)
    for key, at in (tail.first_seen if tail is not None else {}).items():
        seen[key] = min(seen.get(key, at), at)
    return [(a, v, t) for (a, v), t in seen.items()]


def hourly_series(
    session: Session, agent: str, version: str, signal: str, since: datetime | None, until: datetime | None = None
) -> dict[datetime, tuple[int, int]]:
    """(n, x) per hour of one signal (charts, the detector's rates)."""
    R = RollupHourRow
    q = select(R.hour, R.n, R.x).where(R.agent_id == agent, R.agent_version == version, R.signal == signal)
    out: dict[datetime, tuple[int, int]] = defaultdict(lambda: (0, 0))
    for h, n, x in session.execute(_window(q, R.hour, since, until)):
        out[aware(h)] = (int(n), int(x))
    return dict(out)
