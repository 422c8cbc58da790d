"""The detector's stored counts: hourly count rows per series, the series rows, and the hours between."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, bindparam, case, func, select, update
from sqlalchemy.orm import Session

from vigil.detector.models import DetectorSeriesRow, QualityCountRow
from vigil.store.db import upsert
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
    zero); returns the counts stored before."""
    stored = {
        (r.agent_id, r.agent_version, r.signal): r
        for r in s.scalars(select(QualityCountRow).where(QualityCountRow.hour == hour, *which))
    }
    before = {key: (r.n, r.x) for key, r in stored.items()}
    for key, (n, x) in counts.items():
        row = stored.pop(key, None)
        if row is None:
            s.add(QualityCountRow(agent_id=key[0], agent_version=key[1], signal=key[2], hour=hour, n=n, x=x))
        else:
            row.n, row.x = n, x
    for row in stored.values():
        row.n, row.x = 0, 0
    return before


def add_changes(s: Session, changes: Changes) -> None:
    """Add ``changes`` to the stored counts of their hours. They may be negative (a conversation a newer
    revision moved to another hour, or whose failure it took back); a count never goes below zero."""
    rows = [
        {"a": a, "v": v, "sig": sig, "h": hour, "dn": n, "dx": x}
        for (hour, (a, v, sig)), (n, x) in sorted(changes.items())
        if n or x
    ]
    if not rows:
        return
    t = QualityCountRow.__table__
    s.execute(
        upsert(s, t).on_conflict_do_nothing(index_elements=["agent_id", "agent_version", "signal", "hour"]),
        [
            {"agent_id": r["a"], "agent_version": r["v"], "signal": r["sig"], "hour": r["h"], "n": 0, "x": 0}
            for r in rows
        ],
    )
    n, x = t.c.n + bindparam("dn"), t.c.x + bindparam("dx")
    s.execute(
        update(t)
        .where(
            t.c.agent_id == bindparam("a"),
            t.c.agent_version == bindparam("v"),
            t.c.signal == bindparam("sig"),
            t.c.hour == bindparam("h"),
        )
        .values(n=case((n < 0, 0), else_=n), x=case((x < 0, 0), else_=x)),
        rows,
    )


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
    n, x = s.execute(
        select(func.coalesce(func.sum(QualityCountRow.n), 0), func.coalesce(func.sum(QualityCountRow.x), 0)).where(
            QualityCountRow.agent_id == agent,
            QualityCountRow.agent_version == version,
            QualityCountRow.signal == signal,
        )
    ).one()
    return int(n), int(x)
