"""The rollup job: brings :mod:`vigil.store.rollups` up to date from the base tables.

Incremental and exact. Each run looks at rows written since the watermark (minus a lag for writes that
committed late):

- a conversation counted nowhere yet (no ``rollup_members`` row) is *added* to its hour;
- a conversation stored again (a newer revision: new ``received_at``, replaced findings) is added to its
  new hour and its old hour (from ``rollup_members``) is *recomputed* from the base tables;
- an outcome link or a verdict written since the watermark has its hour's outcome or judge counts
  recomputed; pass^k per task is recomputed for every task touched.

Additions come first and recomputations last, in one transaction on one snapshot, so a recomputed hour
is always the base tables' truth. :func:`rebuild` computes everything from scratch (the first run, and
the yardstick the tests hold the incremental job to).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, case, delete, func, insert, or_, select, text, true
from sqlalchemy.orm import Session, sessionmaker

from vigil.store.db import aware, clock, upsert
from vigil.store.models import ConversationRow, FindingRow, OutcomeLinkRow, VerdictRow
from vigil.store.rollups import (
    CONV_FAMILY,
    CONVERSATIONS,
    JUDGE_FAMILY,
    OUTCOME_FAMILY,
    RETAINED,
    RollupHourRow,
    RollupMemberRow,
    RollupStateRow,
    RollupTaskRow,
    RollupVersionRow,
    day_of,
    hour_of,
)
from vigil.store.signals import OFFLINE_SUFFIX, finished, real_finding, sampled_verdict

log = logging.getLogger(__name__)

STATE = "hourly"
LOCK_KEY = 0x76_69_67_69_6C_01  # pg advisory lock: one rollup job at a time across replicas
CHUNK = 5000
HOUR = timedelta(hours=1)

HourKey = tuple[datetime, str, str, str]  # hour, agent, version, signal
Counts = dict[HourKey, tuple[str, int, int]]  # -> (family, n, x)
TaskKey = tuple[str, str, str, datetime]  # agent, version, task, day


@dataclass(slots=True)
class RefreshResult:
    ran: bool = True
    rebuilt: bool = False
    added: int = 0  # conversations added to their hour
    recomputed: int = 0  # (hour, agent, version) keys recomputed
    tasks: int = 0
    watermark: datetime | None = None
    details: dict[str, int] = field(default_factory=dict)


def _pg(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _trunc(session: Session, unit: str, col: Any) -> Any:
    """The hour (or day) of a UTC timestamp column, in the form the dialect stores it."""
    if _pg(session):
        return func.timezone("UTC", func.date_trunc(unit, func.timezone("UTC", col)))
    fmt = "%Y-%m-%d %H:00:00.000000" if unit == "hour" else "%Y-%m-%d 00:00:00.000000"
    return func.strftime(fmt, col)


def _ts(value: Any) -> datetime:
    if isinstance(value, str):
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    return aware(value)


# --- aggregations of the base tables over a scope ------------------------------------------------------


def conv_counts(session: Session, scope: ColumnElement[bool]) -> Counts:
    """Conversation and finding signals of the finished conversations in ``scope``."""
    C, F = ConversationRow, FindingRow
    h = _trunc(session, "hour", C.received_at)
    out: Counts = {}
    q = (
        select(h, C.agent_id, C.agent_version, func.count(), func.sum(case((C.tool_error_count > 0, 1), else_=0)))
        .where(scope, finished())
        .group_by(h, C.agent_id, C.agent_version)
    )
    for hour, a, v, n, te in session.execute(q):
        key = (_ts(hour), a, v)
        out[(*key, CONVERSATIONS)] = (CONV_FAMILY, int(n), 0)
        out[(*key, "tool_error")] = (CONV_FAMILY, 0, int(te or 0))
        out[(*key, "forbidden_tool")] = (CONV_FAMILY, 0, 0)
    distinct = func.count(func.distinct(C.conversation_id))
    rules = (
        select(h, C.agent_id, C.agent_version, F.rule_id, distinct)
        .join(F, F.conversation_id == C.conversation_id)
        .where(scope, finished(), real_finding())
        .group_by(h, C.agent_id, C.agent_version, F.rule_id)
    )
    for hour, a, v, rule, x in session.execute(rules):
        out[(_ts(hour), a, v, f"rule:{rule}")] = (CONV_FAMILY, 0, int(x))
    forbidden = (
        select(h, C.agent_id, C.agent_version, distinct)
        .join(F, F.conversation_id == C.conversation_id)
        .where(scope, finished(), real_finding(), F.rule_type == "forbidden_tool")
        .group_by(h, C.agent_id, C.agent_version)
    )
    for hour, a, v, x in session.execute(forbidden):
        out[(_ts(hour), a, v, "forbidden_tool")] = (CONV_FAMILY, 0, int(x))
    return out


def outcome_counts(session: Session, scope: ColumnElement[bool]) -> Counts:
    """Finished conversations in ``scope`` with an attributed outcome that happened, per type."""
    C, L = ConversationRow, OutcomeLinkRow
    h = _trunc(session, "hour", C.received_at)
    q = (
        select(h, C.agent_id, C.agent_version, L.type, func.count(func.distinct(C.conversation_id)))
        .join(L, L.conversation_id == C.conversation_id)
        .where(scope, finished(), L.attributed, L.happened)
        .group_by(h, C.agent_id, C.agent_version, L.type)
    )
    return {(_ts(hour), a, v, f"outcome:{t}"): (OUTCOME_FAMILY, 0, int(x)) for hour, a, v, t, x in session.execute(q)}


def judge_counts(session: Session, scope: ColumnElement[bool]) -> Counts:
    """Sampled scored verdicts in ``scope`` and their failures, per judge (offline apart)."""
    V = VerdictRow
    h = _trunc(session, "hour", V.created_at)
    q = (
        select(
            h,
            V.agent_id,
            V.agent_version,
            V.judge,
            V.offline,
            func.count(),
            func.sum(case((V.verdict == "fail", 1), else_=0)),
        )
        .where(scope, sampled_verdict())
        .group_by(h, V.agent_id, V.agent_version, V.judge, V.offline)
    )
    return {
        (_ts(hour), a, v, f"judge:{j}{OFFLINE_SUFFIX if off else ''}"): (JUDGE_FAMILY, int(n), int(x or 0))
        for hour, a, v, j, off, n, x in session.execute(q)
    }


def task_counts(session: Session, scope: ColumnElement[bool]) -> dict[TaskKey, tuple[int, int]]:
    """Trials (finished conversations with an attributed task_success outcome) and successes per task and day."""
    C, L = ConversationRow, OutcomeLinkRow
    d = _trunc(session, "day", C.received_at)
    q = (
        select(d, C.agent_id, C.agent_version, C.task_id, C.conversation_id, func.max(case((L.happened, 1), else_=0)))
        .join(L, L.conversation_id == C.conversation_id)
        .where(scope, C.task_id.is_not(None), finished(), L.type == "task_success", L.attributed)
        .group_by(d, C.agent_id, C.agent_version, C.task_id, C.conversation_id)
    )
    out: dict[TaskKey, list[int]] = defaultdict(lambda: [0, 0])
    for day, a, v, t, _cid, ok in session.execute(q):
        acc = out[(a, v, t, _ts(day))]
        acc[0] += 1
        acc[1] += int(ok)
    return {k: (n, s) for k, (n, s) in out.items()}


def trials_of(session: Session, scope: ColumnElement[bool]) -> dict[str, tuple[int, int]]:
    """Each conversation's own part of :func:`task_counts`: (1, 1 if it succeeded) for a trial; conversations
    in ``scope`` that are no trial are left out (they add nothing)."""
    C, L = ConversationRow, OutcomeLinkRow
    q = (
        select(C.conversation_id, func.max(case((L.happened, 1), else_=0)))
        .join(L, L.conversation_id == C.conversation_id)
        .where(scope, C.task_id.is_not(None), finished(), L.type == "task_success", L.attributed)
        .group_by(C.conversation_id)
    )
    return {cid: (1, int(ok)) for cid, ok in session.execute(q)}


def outcomes_of(session: Session, scope: ColumnElement[bool]) -> dict[str, set[str]]:
    """Each conversation's own part of :func:`outcome_counts`: the outcome types it counts under;
    conversations in ``scope`` that count under none are left out."""
    C, L = ConversationRow, OutcomeLinkRow
    q = (
        select(C.conversation_id, L.type)
        .join(L, L.conversation_id == C.conversation_id)
        .where(scope, finished(), L.attributed, L.happened)
        .distinct()
    )
    out: dict[str, set[str]] = defaultdict(set)
    for cid, kind in session.execute(q):
        out[cid].add(kind)
    return out


def outcome_types(stored: str) -> set[str]:
    """The outcome types a ``rollup_members.outcomes`` value names."""
    return set(stored.split("\n")) if stored else set()


def _stored_types(types: set[str] | None) -> str:
    return "\n".join(sorted(types or ()))


def version_spans(session: Session, scope: ColumnElement[bool]) -> list[tuple[str, str, datetime, datetime]]:
    C = ConversationRow
    q = (
        select(C.agent_id, C.agent_version, func.min(C.received_at), func.max(C.received_at))
        .where(scope)
        .group_by(C.agent_id, C.agent_version)
    )
    return [(a, v, _ts(lo), _ts(hi)) for a, v, lo, hi in session.execute(q)]


def from_scratch(session: Session) -> tuple[Counts, dict[TaskKey, tuple[int, int]]]:
    """Every hourly count and task count, aggregated from the base tables."""
    counts = conv_counts(session, true())
    counts.update(outcome_counts(session, true()))
    counts.update(judge_counts(session, true()))
    return counts, task_counts(session, true())


# --- writing ------------------------------------------------------------------------------------------


def _add_counts(session: Session, counts: Counts) -> None:
    if not counts:
        return
    table = RollupHourRow.__table__
    rows = [
        {"hour": k[0], "agent_id": k[1], "agent_version": k[2], "signal": k[3], "family": f, "n": n, "x": x}
        for k, (f, n, x) in sorted(counts.items())
    ]
    ins = upsert(session, table)
    stmt = ins.on_conflict_do_update(
        index_elements=["hour", "agent_id", "agent_version", "signal"],
        set_={"n": table.c.n + ins.excluded.n, "x": table.c.x + ins.excluded.x},
    )
    for i in range(0, len(rows), CHUNK):
        session.execute(stmt, rows[i : i + CHUNK])


def _add_tasks(session: Session, tasks: dict[TaskKey, tuple[int, int]]) -> None:
    if not tasks:
        return
    table = RollupTaskRow.__table__
    rows = [
        {"agent_id": a, "agent_version": v, "task_id": t, "day": d, "trials": n, "successes": s}
        for (a, v, t, d), (n, s) in sorted(tasks.items())
    ]
    ins = upsert(session, table)
    stmt = ins.on_conflict_do_update(
        index_elements=["agent_id", "agent_version", "task_id", "day"],
        set_={"trials": table.c.trials + ins.excluded.trials, "successes": table.c.successes + ins.excluded.successes},
    )
    for i in range(0, len(rows), CHUNK):
        session.execute(stmt, rows[i : i + CHUNK])


def _add_versions(session: Session, spans: Iterable[tuple[str, str, datetime, datetime]]) -> None:
    rows = [{"agent_id": a, "agent_version": v, "first_seen": lo, "last_seen": hi} for a, v, lo, hi in spans]
    if not rows:
        return
    table = RollupVersionRow.__table__
    ins = upsert(session, table)
    least, greatest = (func.least, func.greatest) if _pg(session) else (func.min, func.max)
    stmt = ins.on_conflict_do_update(
        index_elements=["agent_id", "agent_version"],
        set_={
            "first_seen": least(table.c.first_seen, ins.excluded.first_seen),
            "last_seen": greatest(table.c.last_seen, ins.excluded.last_seen),
        },
    )
    session.execute(stmt, sorted(rows, key=lambda r: (r["agent_id"], r["agent_version"])))


def _set_state(session: Session, watermark: datetime | None, now: datetime) -> None:
    ins = upsert(session, RollupStateRow.__table__)
    session.execute(
        ins.on_conflict_do_update(
            index_elements=["name"], set_={"watermark": ins.excluded.watermark, "updated_at": now}
        ),
        [{"name": STATE, "watermark": watermark, "updated_at": now}],
    )


# --- the job ------------------------------------------------------------------------------------------


def rebuild(session: Session, now: datetime | None = None) -> RefreshResult:
    """Empty the rollups and aggregate every base row again (in the caller's transaction)."""
    now = now or clock(session)  # on SQLite a read of no table: the write below still begins the transaction
    _set_state(session, None, now)  # first statement a write: SQLite then holds the write lock throughout
    for model in (RollupHourRow, RollupTaskRow, RollupVersionRow, RollupMemberRow):
        session.execute(delete(model))
    counts, tasks = from_scratch(session)
    _add_counts(session, counts)
    _add_tasks(session, tasks)
    _add_versions(session, version_spans(session, true()))
    C, L = ConversationRow, OutcomeLinkRow
    trial = (
        select(L.conversation_id, func.max(case((L.happened, 1), else_=0)).label("ok"))
        .where(L.type == "task_success", L.attributed)
        .group_by(L.conversation_id)
        .subquery()
    )
    counted = and_(trial.c.conversation_id.is_not(None), C.task_id.is_not(None), finished())
    kinds = select(L.conversation_id, L.type).where(L.attributed, L.happened).distinct().subquery()
    joined = func.string_agg if _pg(session) else func.group_concat
    happened = (
        select(kinds.c.conversation_id, joined(kinds.c.type, "\n").label("types"))
        .group_by(kinds.c.conversation_id)
        .subquery()
    )
    cols = ["conversation_id", "received_at", "agent_id", "agent_version", "task_id", "trials", "successes", "outcomes"]
    session.execute(
        insert(RollupMemberRow).from_select(
            cols,
            select(
                C.conversation_id, C.received_at, C.agent_id, C.agent_version, C.task_id,
                case((counted, 1), else_=0), case((counted, trial.c.ok), else_=0),
                case((finished(), func.coalesce(happened.c.types, "")), else_=""),
            )
            .outerjoin(trial, trial.c.conversation_id == C.conversation_id)
            .outerjoin(happened, happened.c.conversation_id == C.conversation_id),
        )
    )  # fmt: skip
    _set_state(session, now, now)
    return RefreshResult(
        rebuilt=True,
        added=sum(n for (_h, _a, _v, s), (_f, n, _x) in counts.items() if s == CONVERSATIONS),
        watermark=now,
    )


def _in_hour(col: Any, hour: datetime) -> ColumnElement[bool]:
    return and_(col >= hour, col < hour + HOUR)


def _recompute(
    session: Session, dirty: dict[tuple[datetime, str, str], set[str]], frozen_before: datetime | None
) -> None:
    """Replace the named families of each (hour, agent, version) by a fresh aggregation.

    Hours that began before ``frozen_before`` may have lost raw rows to retention (the cutoff's own hour
    too); they keep their counts."""
    C, V, R = ConversationRow, VerdictRow, RollupHourRow
    for (hour, agent, version), families in sorted(dirty.items()):
        if frozen_before is not None and hour < frozen_before:
            continue
        session.execute(
            delete(R).where(R.hour == hour, R.agent_id == agent, R.agent_version == version, R.family.in_(families))
        )
        conv_scope = and_(_in_hour(C.received_at, hour), C.agent_id == agent, C.agent_version == version)
        fresh: Counts = {}
        if CONV_FAMILY in families:
            fresh.update(conv_counts(session, conv_scope))
        if OUTCOME_FAMILY in families:
            fresh.update(outcome_counts(session, conv_scope))
        if JUDGE_FAMILY in families:
            v_scope = and_(_in_hour(V.created_at, hour), V.agent_id == agent, V.agent_version == version)
            fresh.update(judge_counts(session, v_scope))
        _add_counts(session, fresh)


def _recompute_tasks(session: Session, dirty: set[tuple[str, str, str]], frozen_before: datetime | None) -> None:
    C, T = ConversationRow, RollupTaskRow
    for agent, version, task in sorted(dirty):
        mine = and_(T.agent_id == agent, T.agent_version == version, T.task_id == task)
        scope = and_(C.task_id == task, C.agent_id == agent, C.agent_version == version)
        if frozen_before is not None:  # days that may have lost raw rows keep their counts
            start = day_of(frozen_before) + timedelta(days=1)
            mine, scope = and_(mine, T.day >= start), and_(scope, C.received_at >= start)
        session.execute(delete(T).where(mine))
        _add_tasks(session, task_counts(session, scope))


MEMBER_COLUMNS = ("received_at", "agent_id", "agent_version", "task_id", "trials", "successes", "outcomes")


def _count_links(
    session: Session,
    start: datetime,
    added: set[str],
    dirty: dict[tuple[datetime, str, str], set[str]],
    dirty_tasks: set[tuple[str, str, str]],
    frozen_before: datetime | None,
) -> None:
    """Count the outcome links written since ``start``: a conversation counted before with its parts on
    record changes its hour's outcome counts and its task's day by its parts now less its parts as counted
    (idempotent: the lag's second look finds them equal); one without (counted before they were kept)
    has its hour and task recomputed. Its parts are then recorded as counted now. Conversations added in
    this run were counted from their own rows already. Hours and days that may have lost raw rows keep
    their counts, as in :func:`_recompute`."""
    C, L, M = ConversationRow, OutcomeLinkRow, RollupMemberRow
    rows = session.execute(
        select(
            L.conversation_id, C.received_at, C.agent_id, C.agent_version, C.task_id,
            M.received_at, M.trials, M.successes, M.outcomes,
        )
        .join(C, C.conversation_id == L.conversation_id)
        .outerjoin(M, M.conversation_id == C.conversation_id)
        .where(L.linked_at >= start)
        .distinct()
    ).all()  # fmt: skip
    rows = sorted({r[0]: r for r in rows if r[0] not in added}.values(), key=lambda r: r[0])
    first_day = day_of(frozen_before) + timedelta(days=1) if frozen_before is not None else None
    counts: dict[HourKey, list[int]] = defaultdict(lambda: [0])
    tasks: dict[TaskKey, list[int]] = defaultdict(lambda: [0, 0])
    table = M.__table__
    stmt = (
        table.update()
        .where(table.c.conversation_id == bindparam("cid"))
        .values(trials=bindparam("t"), successes=bindparam("s"), outcomes=bindparam("o"))
    )
    for i in range(0, len(rows), CHUNK):
        part = rows[i : i + CHUNK]
        scope = C.conversation_id.in_([r[0] for r in part])
        trials, kinds = trials_of(session, scope), outcomes_of(session, scope)
        for cid, at, a, v, task, old_at, old_n, old_s, old_kinds in part:
            at = _ts(at)
            if old_at is None or _ts(old_at) != at or old_n is None or old_kinds is None:
                dirty[(hour_of(at), a, v)].add(OUTCOME_FAMILY)
                if task is not None:
                    dirty_tasks.add((a, v, task))
                continue
            before, after = outcome_types(old_kinds), kinds.get(cid, set())
            if frozen_before is not None and hour_of(at) < frozen_before:
                before = after
            for kind in after ^ before:
                counts[(hour_of(at), a, v, f"outcome:{kind}")][0] += 1 if kind in after else -1
            n, ok = trials.get(cid, (0, 0))
            frozen = first_day is not None and day_of(at) < first_day
            if task is not None and not frozen and (n, ok) != (old_n, old_s or 0):
                acc = tasks[(a, v, task, day_of(at))]
                acc[0] += n - old_n
                acc[1] += ok - (old_s or 0)
        rows_now = [
            {"cid": c, "t": trials.get(c, (0, 0))[0], "s": trials.get(c, (0, 0))[1], "o": _stored_types(kinds.get(c))}
            for c in (r[0] for r in part)
        ]
        session.execute(stmt, rows_now)
    _add_counts(session, {k: (OUTCOME_FAMILY, 0, x) for k, (x,) in counts.items() if x})
    _add_tasks(session, {k: (n, ok) for k, (n, ok) in tasks.items() if n or ok})


Frozen = datetime | Callable[[datetime], datetime | None] | None
"""Hours before it are no longer recomputed: a time, or one computed from the job's clock."""


def refresh_in(
    session: Session, lag: timedelta, now: datetime | None = None, frozen_before: Frozen = None
) -> RefreshResult:
    """One incremental run in the caller's transaction (a rebuild when the rollups were never built).

    ``now`` (tests) defaults to the database's clock: a run on a host whose clock ran ahead moved the
    watermark as far, and conversations stored before the real time caught up were never counted.
    ``frozen_before`` given as a function of that clock (the conversations' retention cutoff) is read on it
    too: on the host's, a run on a host running behind recomputed hours retention had emptied."""
    now = now or clock(session)
    if callable(frozen_before):
        frozen_before = frozen_before(now)
    state = session.get(RollupStateRow, STATE)
    if state is None or state.watermark is None:
        return rebuild(session, now)
    start = aware(state.watermark) - lag
    _set_state(session, now, now)
    retained = session.get(RollupStateRow, RETAINED)
    if retained is not None and retained.watermark is not None:  # what a retention run did delete before
        deleted_before = aware(retained.watermark)
        frozen_before = deleted_before if frozen_before is None else max(frozen_before, deleted_before)
    C, M, V = ConversationRow, RollupMemberRow, VerdictRow
    changed = session.execute(
        select(
            C.conversation_id, C.received_at, C.agent_id, C.agent_version, C.task_id,
            M.received_at, M.agent_id, M.agent_version, M.task_id,
        )
        .outerjoin(M, M.conversation_id == C.conversation_id)
        .where(C.received_at >= start, or_(M.conversation_id.is_(None), M.received_at != C.received_at))
    ).all()  # fmt: skip
    dirty: dict[tuple[datetime, str, str], set[str]] = defaultdict(set)
    dirty_tasks: set[tuple[str, str, str]] = set()
    result = RefreshResult(watermark=now)
    for i in range(0, len(changed), CHUNK):
        part = changed[i : i + CHUNK]
        ids = [r[0] for r in part]
        scope = C.conversation_id.in_(ids)
        added = conv_counts(session, scope)
        added.update(outcome_counts(session, scope))
        _add_counts(session, added)
        _add_tasks(session, task_counts(session, scope))
        _add_versions(session, version_spans(session, scope))
        trials, kinds = trials_of(session, scope), outcomes_of(session, scope)
        for _cid, _at, _a, _v, _t, old_at, old_a, old_v, old_t in part:
            if old_at is not None:
                dirty[(hour_of(_ts(old_at)), old_a, old_v)] |= {CONV_FAMILY, OUTCOME_FAMILY}
                if old_t is not None:
                    dirty_tasks.add((old_a, old_v, old_t))
        members = [
            {
                "conversation_id": r[0], "received_at": r[1], "agent_id": r[2], "agent_version": r[3], "task_id": r[4],
                "trials": trials.get(r[0], (0, 0))[0], "successes": trials.get(r[0], (0, 0))[1],
                "outcomes": _stored_types(kinds.get(r[0])),
            }
            for r in sorted(part, key=lambda r: r[0])
        ]  # fmt: skip
        ins = upsert(session, RollupMemberRow.__table__)
        session.execute(
            ins.on_conflict_do_update(
                index_elements=["conversation_id"],
                set_={k: ins.excluded[k] for k in MEMBER_COLUMNS},
            ),
            members,
        )
        result.added += len(part)
    added_ids = {r[0] for r in changed}
    _count_links(session, start, added_ids, dirty, dirty_tasks, frozen_before)
    hv = _trunc(session, "hour", V.created_at)
    verdicts = select(hv, V.agent_id, V.agent_version).where(V.created_at >= start).distinct()
    for hour, a, v in session.execute(verdicts):
        dirty[(_ts(hour), a, v)].add(JUDGE_FAMILY)
    _recompute(session, dirty, frozen_before)
    _recompute_tasks(session, dirty_tasks, frozen_before)
    result.recomputed, result.tasks = len(dirty), len(dirty_tasks)
    return result


def behind(session: Session) -> bool:
    """Whether anything was written after the watermark (or the rollups were never built): a cheap look
    along three time indexes, so a read catches up only when there is something to catch up on."""
    state = session.get(RollupStateRow, STATE)
    if state is None or state.watermark is None:
        return True
    wm = aware(state.watermark)
    C, L, V = ConversationRow, OutcomeLinkRow, VerdictRow
    return any(
        session.scalar(select(col).where(col > wm).limit(1)) is not None
        for col in (C.received_at, L.linked_at, V.created_at)
    )


def refresh(
    sessions: sessionmaker[Session],
    lag_seconds: float = 300.0,
    now: datetime | None = None,
    frozen_before: Frozen = None,
    only_if_behind: bool = False,
    rebuild_all: bool = False,
) -> RefreshResult:
    """Bring the rollups up to date in a transaction of their own; on Postgres on one snapshot, and
    skipped (``ran`` False) while another replica's run holds the lock, or with ``only_if_behind`` when
    nothing was written since the last run (late commits inside the lag are left to the periodic job).
    ``rebuild_all`` computes them from scratch (:func:`rebuild`) under the same snapshot and lock."""
    if only_if_behind:
        with sessions() as session:
            if not behind(session):
                return RefreshResult(ran=False)
    with sessions.begin() as session:
        if _pg(session):
            session.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
            if not session.scalar(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": LOCK_KEY}):
                return RefreshResult(ran=False)
        if rebuild_all:
            return rebuild(session, now)
        return refresh_in(session, timedelta(seconds=lag_seconds), now, frozen_before)


def snapshot(session: Session) -> tuple[Counts, dict[TaskKey, tuple[int, int]]]:
    """The rollups as stored (rows with nothing counted left out), to hold against :func:`from_scratch`."""
    R, T = RollupHourRow, RollupTaskRow
    counts: Counts = {
        (aware(h), a, v, s): (f, int(n), int(x))
        for h, a, v, s, f, n, x in session.execute(
            select(R.hour, R.agent_id, R.agent_version, R.signal, R.family, R.n, R.x)
        )
        if n or x
    }
    tasks = {
        (a, v, t, aware(d)): (int(n), int(s))
        for a, v, t, d, n, s in session.execute(
            select(T.agent_id, T.agent_version, T.task_id, T.day, T.trials, T.successes)
        )
        if n
    }
    return counts, tasks
