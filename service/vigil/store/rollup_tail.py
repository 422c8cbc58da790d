"""What a read counts beyond the rollups: rows written after the rollup job's watermark.

Reads never run the rollup job (serve's and the detector's upkeep runs it every
``rollup_interval_seconds``; a catch-up inside the request cost compare much of its time at volume). A read
takes the rollups as they are and looks at the tail instead: conversations, outcome links and verdicts
written since the watermark, at most ``rollup_read_tail_rows`` of each (index ranges, with a limit). It
counts them as the job's next run will:

- a conversation counted nowhere yet (no ``rollup_members`` row) is *added*, from its own rows;
- a conversation stored again has its old hour *recounted* from the base tables (conversation and
  outcome counts) and the new revision added; the hours of verdicts written since (judge counts) are
  recounted likewise. A recounted hour's rollup rows of that kind are left out, so nothing counts twice.
- an outcome link written since to a conversation the job counted changes the outcome counts by the
  types the conversation counts under now and not as counted (``rollup_members.outcomes``), or the
  reverse: a read looks at those conversations, not at their whole hour. A conversation counted before
  members kept that (NULL) has its hour's outcome counts recounted instead.
- pass^k per task changes by what the conversations stored again or given outcome links since add now,
  less what ``rollup_members`` says they added when the job counted them: a read looks at those
  conversations only, never at a task's whole history. A conversation counted before members kept that
  (NULL) has its old task recounted from the base tables instead, that task's rollup rows left out.

So the figures are exact up to the read. A longer tail (the job stopped, or far behind) is not read: the
figures are the rollups' alone, exact up to the watermark, and :meth:`Tail.freshness` says so.

A session carries its tail in ``session.info`` (:func:`attach`); the read functions of
:mod:`vigil.store.rollups` consult it. Nothing here writes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from vigil.store import rollup_job
from vigil.store.db import among, aware, clock
from vigil.store.models import ConversationRow, OutcomeLinkRow, VerdictRow
from vigil.store.rollup_job import Counts
from vigil.store.rollups import (
    CONV_FAMILY,
    JUDGE_FAMILY,
    OUTCOME_FAMILY,
    RETAINED,
    TAIL_KEY,
    RollupMemberRow,
    RollupStateRow,
    day_of,
    hour_of,
)

Version = tuple[str, str]  # agent, version
Hours = dict[datetime, set[str]]  # hour -> families recounted from the base tables


@dataclass(slots=True)
class Tail:
    """What a read counts beyond the rollups, and up to when its figures are exact."""

    watermark: datetime | None  # the rollups' (None: never built)
    as_of: datetime | None  # figures count what was written before this (None: nothing yet)
    current: bool  # the tail was read: the figures are as of the read, not of the watermark
    rows: int = 0
    frozen_before: datetime | None = None  # hours before this may have lost raw rows: the rollups' stand
    added: dict[Version, list[str]] = field(default_factory=lambda: defaultdict(list))  # conversation ids
    recount: dict[Version, Hours] = field(default_factory=lambda: defaultdict(lambda: defaultdict(set)))
    touched: set[str] = field(default_factory=set)  # conversations whose part of the task counts may differ
    linked: dict[Version, dict[str, tuple[datetime, set[str]]]] = field(
        default_factory=lambda: defaultdict(dict)
    )  # counted conversations given outcome links since: their hour and outcome types as counted
    task_parts: dict[Version, tuple[set[str], dict[tuple[str, datetime], tuple[int, int]]]] | None = None
    first_seen: dict[Version, datetime] = field(default_factory=dict)
    counted: dict[Version, Counts] = field(default_factory=dict)  # counts() read so far

    def recounted(self, agent: str, version: str) -> Hours:
        """The version's hours whose families are counted from the base tables instead of the rollups."""
        return {h: f for h, f in self.recount.get((agent, version), {}).items() if not self.frozen(h)}

    def frozen(self, hour: datetime) -> bool:
        return self.frozen_before is not None and hour < self.frozen_before

    def counts(self, session: Session, agent: str, version: str) -> Counts:
        """The tail's counts of the version: its recounted hours' families from the base tables, plus the
        conversations not counted yet (outside the hours whose family is recounted). Read once a version."""
        if (agent, version) not in self.counted:
            self.counted[(agent, version)] = self._counts(session, agent, version, self.recounted(agent, version))
        return self.counted[(agent, version)]

    def _counts(self, session: Session, agent: str, version: str, hours: Hours) -> Counts:
        C, V = ConversationRow, VerdictRow
        mine_c = (C.agent_id == agent, C.agent_version == version)
        out: Counts = {}
        by_family: dict[str, list[datetime]] = defaultdict(list)
        for h, fams in hours.items():
            for f in fams:
                by_family[f].append(h)
        if by_family[CONV_FAMILY]:
            out.update(rollup_job.conv_counts(session, and_(*mine_c, _in_hours(C.received_at, by_family[CONV_FAMILY]))))
        if by_family[OUTCOME_FAMILY]:
            scope = and_(*mine_c, _in_hours(C.received_at, by_family[OUTCOME_FAMILY]))
            out.update(rollup_job.outcome_counts(session, scope))
        if by_family[JUDGE_FAMILY]:
            scope = and_(
                V.agent_id == agent, V.agent_version == version, _in_hours(V.created_at, by_family[JUDGE_FAMILY])
            )
            out.update(rollup_job.judge_counts(session, scope))
        linked = {cid: ht for cid, ht in self.linked.get((agent, version), {}).items() if not self.frozen(ht[0])}
        if linked:  # frozen hours keep their counts, as in the job
            now = rollup_job.outcomes_of(session, among(session, C.conversation_id, sorted(linked)))
            for cid, (hour, before) in linked.items():
                if OUTCOME_FAMILY in hours.get(hour, ()):
                    continue  # that hour's outcome counts are recounted whole above
                after = now.get(cid, set())
                for kind in after ^ before:
                    key = (hour, agent, version, f"outcome:{kind}")
                    had = out.get(key, (OUTCOME_FAMILY, 0, 0))
                    out[key] = (OUTCOME_FAMILY, had[1], had[2] + (1 if kind in after else -1))
        ids = self.added.get((agent, version))
        if ids:
            scope = among(session, C.conversation_id, ids)
            new = rollup_job.conv_counts(session, scope)
            new.update(rollup_job.outcome_counts(session, scope))
            for key, (fam, n, x) in new.items():
                if fam in hours.get(key[0], ()):
                    continue  # that hour's family is recounted whole above
                had = out.get(key, (fam, 0, 0))
                out[key] = (fam, had[1] + n, had[2] + x)
        return out

    def task_days(
        self, session: Session, agent: str, version: str
    ) -> tuple[set[str], datetime | None, dict[tuple[str, datetime], tuple[int, int]]]:
        """The version's tasks the tail touched, the first day counted afresh (later days), and their
        trials and successes per (task, day) from the base tables."""
        if self.task_parts is None:
            self.task_parts = self._task_parts(session)
        recount, changes = self.task_parts.get((agent, version), (set(), {}))
        start = day_of(self.frozen_before) + timedelta(days=1) if self.frozen_before is not None else None
        if not recount:
            return recount, start, changes
        C = ConversationRow
        scope = and_(C.task_id.in_(sorted(recount)), C.agent_id == agent, C.agent_version == version)
        if start is not None:  # days that may have lost raw rows keep their counts, as in the job
            scope = and_(scope, C.received_at >= start)
        fresh = {(t, d): nc for (_a, _v, t, d), nc in rollup_job.task_counts(session, scope).items()}
        for (t, d), nc in changes.items():
            if t not in recount:
                fresh[(t, d)] = nc
        return recount, start, fresh

    def _task_parts(
        self, session: Session
    ) -> dict[Version, tuple[set[str], dict[tuple[str, datetime], tuple[int, int]]]]:
        """Per version: the tasks to recount from the base tables, and what the touched conversations
        change in the other tasks' trials and successes per (task, day), against the rollups."""
        out: dict[Version, tuple[set[str], dict[tuple[str, datetime], list[int]]]] = defaultdict(
            lambda: (set(), defaultdict(lambda: [0, 0]))
        )
        if not self.touched:
            return {}
        C, M = ConversationRow, RollupMemberRow
        ids = sorted(self.touched)
        start = day_of(self.frozen_before) + timedelta(days=1) if self.frozen_before is not None else None
        now = rollup_job.trials_of(session, among(session, C.conversation_id, ids))
        rows = session.execute(
            select(
                C.conversation_id, C.received_at, C.agent_id, C.agent_version, C.task_id,
                M.received_at, M.agent_id, M.agent_version, M.task_id, M.trials, M.successes,
            )
            .outerjoin(M, M.conversation_id == C.conversation_id)
            .where(among(session, C.conversation_id, ids))
        ).all()  # fmt: skip
        for cid, at, a, v, task, old_at, old_a, old_v, old_t, old_n, old_s in rows:
            day = day_of(rollup_job._ts(at))
            counted = old_at is not None and rollup_job._ts(old_at) == at
            if old_at is not None and old_t is not None:
                old_day = day_of(rollup_job._ts(old_at))
                if old_n is None:  # counted before members kept its part: its old task is recounted
                    out[(old_a, old_v)][0].add(old_t)
                elif old_n and (start is None or old_day >= start):
                    acc = out[(old_a, old_v)][1][(old_t, old_day)]
                    acc[0] -= old_n
                    acc[1] -= old_s or 0
            n, s = now.get(cid, (0, 0))
            if n and task is not None and (not counted or start is None or day >= start):
                acc = out[(a, v)][1][(task, day)]
                acc[0] += n
                acc[1] += s
        return {
            key: (recount, {k: (n, s) for k, (n, s) in changes.items() if n or s})
            for key, (recount, changes) in out.items()
        }

    def freshness(self) -> dict[str, Any]:
        """Up to when the figures count, for the answer (``counts_up_to`` None: the rollups are not built yet)."""
        return {
            "counts_up_to": self.as_of,
            "current": self.current,
            "rollups_watermark": self.watermark,
            "tail_rows": self.rows,
        }


def _in_hours(col: Any, hours: Iterable[datetime]) -> Any:
    return or_(*[and_(col >= h, col < h + rollup_job.HOUR) for h in sorted(hours)])


def read(session: Session, max_rows: int, frozen_before: datetime | None = None) -> Tail:
    """The tail after the watermark (at most ``max_rows`` rows of each table, else none: see the module)."""
    now = clock(session)
    state = session.get(RollupStateRow, rollup_job.STATE)
    wm = aware(state.watermark) if state is not None and state.watermark is not None else None
    retained = session.get(RollupStateRow, RETAINED)
    if retained is not None and retained.watermark is not None:
        deleted = aware(retained.watermark)
        frozen_before = deleted if frozen_before is None else max(frozen_before, deleted)
    stale = Tail(watermark=wm, as_of=wm, current=False, frozen_before=frozen_before)
    if max_rows <= 0:
        return stale
    C, M, L, V = ConversationRow, RollupMemberRow, OutcomeLinkRow, VerdictRow
    convs = select(
        C.conversation_id, C.received_at, C.agent_id, C.agent_version, C.task_id,
        M.received_at, M.agent_id, M.agent_version, M.task_id,
    ).outerjoin(M, M.conversation_id == C.conversation_id)  # fmt: skip
    links = select(L.conversation_id, C.received_at, C.agent_id, C.agent_version, L.type).join(
        C, C.conversation_id == L.conversation_id
    )
    verdicts = select(V.created_at, V.agent_id, V.agent_version)
    if wm is not None:  # the job's own bound (it looks from the watermark on, minus its lag)
        convs, links, verdicts = (
            convs.where(C.received_at >= wm),
            links.where(L.linked_at >= wm),
            verdicts.where(V.created_at >= wm),
        )
    found = [session.execute(q.limit(max_rows + 1)).all() for q in (convs, links, verdicts)]
    if any(len(rows) > max_rows for rows in found):
        return stale
    tail = Tail(watermark=wm, as_of=now, current=True, frozen_before=frozen_before)
    tail.rows = sum(len(rows) for rows in found)
    conv_rows, link_rows, verdict_rows = found
    for cid, at, a, v, task, old_at, old_a, old_v, old_t in conv_rows:
        at = rollup_job._ts(at)
        if (a, v) not in tail.first_seen or at < tail.first_seen[(a, v)]:
            tail.first_seen[(a, v)] = at
        if old_at is not None and rollup_job._ts(old_at) == at:
            continue  # counted by the job's last run already
        tail.added[(a, v)].append(cid)
        if old_at is not None:  # stored again: the hour it was counted in is recounted
            tail.recount[(old_a, old_v)][hour_of(rollup_job._ts(old_at))] |= {CONV_FAMILY, OUTCOME_FAMILY}
        if task is not None or old_t is not None:
            tail.touched.add(cid)
    added = {cid for ids in tail.added.values() for cid in ids}
    counted = _outcomes_counted(session, sorted({r[0] for r in link_rows} - added))
    for cid, at, a, v, kind in link_rows:
        at = rollup_job._ts(at)
        if cid in counted and counted[cid][0] == at:
            tail.linked[(a, v)][cid] = (hour_of(at), counted[cid][1])
        elif cid not in added:  # counted before members kept its outcomes (or not at all): the hour is recounted
            tail.recount[(a, v)][hour_of(at)].add(OUTCOME_FAMILY)
        if kind == "task_success":
            tail.touched.add(cid)
    for at, a, v in verdict_rows:  # recounted, not added: a verdict counted already may sit after the watermark
        tail.recount[(a, v)][hour_of(rollup_job._ts(at))].add(JUDGE_FAMILY)
    return tail


def _outcomes_counted(session: Session, ids: list[str]) -> dict[str, tuple[datetime, set[str]]]:
    """The conversations' time and outcome types as the job counted them (those it kept them for)."""
    if not ids:
        return {}
    M = RollupMemberRow
    rows = session.execute(
        select(M.conversation_id, M.received_at, M.outcomes).where(
            among(session, M.conversation_id, ids), M.outcomes.is_not(None)
        )
    )
    return {cid: (rollup_job._ts(at), rollup_job.outcome_types(kinds or "")) for cid, at, kinds in rows}


def attach(session: Session, max_rows: int, frozen_before: datetime | None = None) -> Tail:
    """Read the tail and have the rollup reads of ``session`` count it."""
    tail = read(session, max_rows, frozen_before)
    session.info[TAIL_KEY] = tail
    return tail
