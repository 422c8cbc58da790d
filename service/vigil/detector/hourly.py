"""The detector's stored counts: hourly count rows per series, their running totals, the series rows, and
the hours between.

Every change to ``quality_counts`` goes through this module and adds what it changed to the series' row of
``quality_totals`` in the same transaction, so a series' total over all hours is one row to read however
long its history (:func:`series_totals`, :func:`all_totals`). A leader rebuilds them once when it takes the
lease (:func:`rebuild_totals`): a replica of an older version may have folded counts without them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from vigil.detector.models import DetectorSeriesRow, QualityCountRow, QualityTotalRow
from vigil.store.db import upsert
from vigil.store.signals import OUTCOME, Key

HOUR = timedelta(hours=1)

Counts = dict[Key, tuple[int, int]]  # (observations, failures) per series


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
    stored = {
        (r.agent_id, r.agent_version, r.signal): r
        for r in s.scalars(
            select(QualityCountRow).where(QualityCountRow.hour == hour, QualityCountRow.signal.like(f"{OUTCOME}%"))
        )
    }
    _store_hour(s, hour, stored, inc)


def store_recount(s: Session, hour: datetime, recount: Counts) -> Counts:
    """Store an hour's exact (non-outcome) counts; returns what they add to the statistics' view of it.

    Rows moved to a later hour by a newer revision drop out of this one, so each conversation counts once.
    """
    stored = {
        (r.agent_id, r.agent_version, r.signal): r
        for r in s.scalars(
            select(QualityCountRow).where(QualityCountRow.hour == hour, QualityCountRow.signal.not_like(f"{OUTCOME}%"))
        )
    }
    late: Counts = {}
    for key, (n, x) in recount.items():
        row = stored.get(key)
        if row is not None and (n > row.n or x > row.x):
            # a newer revision can turn a conversation already fed as a success into a failure;
            # the statistics only take the new conversations' failures (the stored count is exact)
            more = max(0, n - row.n)
            late[key] = (more, min(more, max(0, x - row.x)))
    late.update(_store_hour(s, hour, stored, recount))
    return late


def series_rows(s: Session, inc: Counts, start: datetime) -> dict[Key, DetectorSeriesRow]:
    """The series rows of ``inc``'s keys, created (first seen at ``start``) where missing."""
    agents = {k[0] for k in inc}
    series = {
        (r.agent_id, r.agent_version, r.signal): r
        for r in s.scalars(select(DetectorSeriesRow).where(DetectorSeriesRow.agent_id.in_(agents)))
    }
    for key in inc:
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
