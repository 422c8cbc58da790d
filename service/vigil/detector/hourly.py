"""The detector's stored counts: hourly count rows per series, their running totals, the series rows, and
the hours between.

Every change to ``quality_counts`` goes through this module and adds what it changed to the series' row of
``quality_totals`` in the same transaction, so a series' total over all hours is one row to read however
long its history (:func:`series_totals`, :func:`all_totals`). A leader rebuilds them once when it takes the
lease (:func:`rebuild_totals`): a replica of an older version may have folded counts without them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, delete, func, insert, select, tuple_
from sqlalchemy.orm import Session

from vigil.detector.models import DetectorSeriesRow, QualityCountRow, QualityTotalRow
from vigil.store.db import aware, upsert
from vigil.store.signals import JUDGE, OUTCOME, Key

HOUR = timedelta(hours=1)

Counts = dict[Key, tuple[int, int]]  # (observations, failures) per series
Changes = dict[tuple[datetime, Key], tuple[int, int]]  # (observations, failures) to add per hour and series


def hours(start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
    """``[start, end)`` cut at each hour boundary."""
    a = start
    while a < end:
        b = min(end, a.replace(minute=0, second=0, microsecond=0) + HOUR)
        yield a, b
        a = b


def floor_hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def add_counts(s: Session, start: datetime, inc: Counts) -> None:
    """Add ``inc`` to the stored counts of the hour ``start`` falls in."""
    hour = start.replace(minute=0, second=0, microsecond=0)
    rows = [
        {"agent_id": a, "agent_version": v, "signal": sig, "hour": hour, "n": n, "x": x}
        for (a, v, sig), (n, x) in inc.items()
        if n or x
    ]
    if not rows:
        return
    ins = upsert(s, QualityCountRow)
    s.execute(
        ins.on_conflict_do_update(
            index_elements=["agent_id", "agent_version", "signal", "hour"],
            set_={"n": QualityCountRow.n + ins.excluded.n, "x": QualityCountRow.x + ins.excluded.x},
        ),
        rows,
    )
    _add_totals(s, {key: (n, x) for key, (n, x) in inc.items() if n or x})


def _add_totals(s: Session, changes: Counts) -> None:
    """Add what the hourly counts of each series changed by to its total (a new series starts at zero)."""
    T = QualityTotalRow
    rows = [
        {"agent_id": a, "agent_version": v, "signal": sig, "n": n, "x": x}
        for (a, v, sig), (n, x) in sorted(changes.items())  # one lock order for every writer
    ]
    if not rows:
        return
    ins = upsert(s, T)
    s.execute(
        ins.on_conflict_do_update(
            index_elements=["agent_id", "agent_version", "signal"],
            set_={"n": T.n + ins.excluded.n, "x": T.x + ins.excluded.x},
        ),
        rows,
    )


def _store_hour(s: Session, hour: datetime, stored: dict[Key, QualityCountRow], counts: Counts) -> Counts:
    """Set the hour's rows of ``stored`` to ``counts`` (a new row where none is; zero where ``counts`` leaves
    one out) and the totals with them; returns the rows that were new."""
    changes: Counts = {}
    new: Counts = {}
    for key, (n, x) in counts.items():
        row = stored.pop(key, None)
        if row is None:
            s.add(QualityCountRow(agent_id=key[0], agent_version=key[1], signal=key[2], hour=hour, n=n, x=x))
            changes[key] = new[key] = (n, x)
            continue
        if (n, x) != (row.n, row.x):
            changes[key] = (n - row.n, x - row.x)
            row.n, row.x = n, x
    for key, row in stored.items():
        if row.n or row.x:
            changes[key] = (-row.n, -row.x)
            row.n, row.x = 0, 0
    _add_totals(s, changes)
    return new


def set_outcome_counts(s: Session, hour: datetime, inc: Counts) -> None:
    """Store ``inc`` as the hour's outcome counts; outcome series it leaves out count zero."""
    _store(s, hour, inc, QualityCountRow.signal.like(f"{OUTCOME}%"))


def set_conversation_counts(s: Session, hour: datetime, recount: Counts) -> None:
    """Store ``recount`` as the hour's conversation signal counts (neither outcome nor judge signals)."""
    _store(
        s, hour, recount, QualityCountRow.signal.not_like(f"{OUTCOME}%"), QualityCountRow.signal.not_like(f"{JUDGE}%")
    )


def store_judge_recount(s: Session, hour: datetime, recount: Counts) -> Counts:
    """Store an hour's exact judge counts; returns what they add to the statistics' view of it
    (verdicts a replica committed after the pass that read their hour)."""
    before = _store(s, hour, recount, QualityCountRow.signal.like(f"{JUDGE}%"))
    late: Counts = {}
    for key, (n, x) in recount.items():
        was_n, was_x = before.get(key, (0, 0))
        if n > was_n:  # verdicts are only ever added: the new ones
            late[key] = (n - was_n, min(n - was_n, max(0, x - was_x)))
    return late


def _store(s: Session, hour: datetime, counts: Counts, *which: ColumnElement[bool]) -> Counts:
    """Store ``counts`` as the hour's counts of the signals ``which`` selects (those it leaves out count
    zero), and the totals with them; returns the counts stored before."""
    stored = {
        (r.agent_id, r.agent_version, r.signal): r
        for r in s.scalars(select(QualityCountRow).where(QualityCountRow.hour == hour, *which))
    }
    before = {key: (r.n, r.x) for key, r in stored.items()}
    _store_hour(s, hour, stored, counts)
    return before


def add_changes(s: Session, changes: Changes) -> None:
    """Add ``changes`` to the stored counts of their hours, and what they changed to the totals. They may be
    negative (a conversation a newer revision moved to another hour, or whose failure it took back); a count
    never goes below zero."""
    changes = {k: c for k, c in changes.items() if c[0] or c[1]}
    if not changes:
        return
    C = QualityCountRow
    wanted = sorted(changes)  # one lock order for every writer
    stored: dict[tuple[datetime, Key], QualityCountRow] = {}
    for part in range(0, len(wanted), 500):
        keys = [(h, a, v, sig) for h, (a, v, sig) in wanted[part : part + 500]]
        for r in s.scalars(select(C).where(tuple_(C.hour, C.agent_id, C.agent_version, C.signal).in_(keys))):
            stored[(aware(r.hour), (r.agent_id, r.agent_version, r.signal))] = r
    totals: Counts = {}
    for hour_key in wanted:
        dn, dx = changes[hour_key]
        hour, key = hour_key
        row = stored.get(hour_key)
        if row is None:
            n, x = max(0, dn), max(0, dx)
            if n or x:
                s.add(C(agent_id=key[0], agent_version=key[1], signal=key[2], hour=hour, n=n, x=x))
            was = (0, 0)
        else:
            was = (row.n, row.x)
            n, x = max(0, row.n + dn), max(0, row.x + dx)
            row.n, row.x = n, x
        tn, tx = totals.get(key, (0, 0))
        totals[key] = (tn + n - was[0], tx + x - was[1])
    _add_totals(s, {k: c for k, c in totals.items() if c[0] or c[1]})


def series_rows(s: Session, keys: Collection[Key], start: datetime) -> dict[Key, DetectorSeriesRow]:
    """The series rows of ``keys``, created (first seen at ``start``) where missing."""
    agents = {k[0] for k in keys}
    series = {
        (r.agent_id, r.agent_version, r.signal): r
        for r in s.scalars(select(DetectorSeriesRow).where(DetectorSeriesRow.agent_id.in_(agents)))
    }
    for key in keys:
        if key not in series:
            row = DetectorSeriesRow(
                agent_id=key[0],
                agent_version=key[1],
                signal=key[2],
                statistics=[],
                state="warming_up",
                first_seen=start,
                last_seen=start,
            )
            s.add(row)
            series[key] = row
    return series


def series_totals(s: Session, agent: str, version: str, signal: str) -> tuple[int, int]:
    """One series' stored counts over all hours."""
    T = QualityTotalRow
    row = s.execute(
        select(T.n, T.x).where(T.agent_id == agent, T.agent_version == version, T.signal == signal)
    ).one_or_none()
    return (int(row.n), int(row.x)) if row is not None else (0, 0)


def all_totals(s: Session) -> Counts:
    """Every series' stored counts over all hours."""
    T = QualityTotalRow
    rows = s.execute(select(T.agent_id, T.agent_version, T.signal, T.n, T.x))
    return {(a, v, sig): (int(n), int(x)) for a, v, sig, n, x in rows}


def counts_since(s: Session, hour: datetime) -> Counts:
    """Every series' stored counts of the hours from ``hour`` on (a range of the hour index)."""
    C = QualityCountRow
    q = (
        select(C.agent_id, C.agent_version, C.signal, func.sum(C.n), func.sum(C.x))
        .where(C.hour >= hour)
        .group_by(C.agent_id, C.agent_version, C.signal)
    )
    return {(a, v, sig): (int(n), int(x)) for a, v, sig, n, x in s.execute(q)}


def rebuild_totals(s: Session) -> None:
    """Sum every series' hours again (reads them all: once, when a detector takes the lease)."""
    C, T = QualityCountRow, QualityTotalRow
    s.execute(delete(T))
    cols = [C.agent_id, C.agent_version, C.signal]
    summed = select(*cols, func.sum(C.n), func.sum(C.x)).group_by(*cols)
    s.execute(insert(T).from_select(["agent_id", "agent_version", "signal", "n", "x"], summed))
