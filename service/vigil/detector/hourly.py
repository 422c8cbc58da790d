"""The detector's stored counts: hourly count rows per series, the series rows, and the hours between."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vigil.detector.models import DetectorSeriesRow, QualityCountRow
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


def set_outcome_counts(s: Session, hour: datetime, inc: Counts) -> None:
    """Store ``inc`` as the hour's outcome counts; outcome series it leaves out count zero."""
    stored = {
        (r.agent_id, r.agent_version, r.signal): r
        for r in s.scalars(
            select(QualityCountRow).where(QualityCountRow.hour == hour, QualityCountRow.signal.like(f"{OUTCOME}%"))
        )
    }
    for key, (n, x) in inc.items():
        row = stored.pop(key, None)
        if row is None:
            s.add(QualityCountRow(agent_id=key[0], agent_version=key[1], signal=key[2], hour=hour, n=n, x=x))
        else:
            row.n, row.x = n, x
    for row in stored.values():
        row.n, row.x = 0, 0


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
        row = stored.pop(key, None)
        if row is None:
            s.add(QualityCountRow(agent_id=key[0], agent_version=key[1], signal=key[2], hour=hour, n=n, x=x))
            late[key] = (n, x)
            continue
        if n > row.n or x > row.x:
            # a newer revision can turn a conversation already fed as a success into a failure;
            # the statistics only take the new conversations' failures (the stored count is exact)
            more = max(0, n - row.n)
            late[key] = (more, min(more, max(0, x - row.x)))
        row.n, row.x = n, x
    for row in stored.values():
        row.n, row.x = 0, 0
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
    n, x = s.execute(
        select(func.coalesce(func.sum(QualityCountRow.n), 0), func.coalesce(func.sum(QualityCountRow.x), 0)).where(
            QualityCountRow.agent_id == agent,
            QualityCountRow.agent_version == version,
            QualityCountRow.signal == signal,
        )
    ).one()
    return int(n), int(x)
