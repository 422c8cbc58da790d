"""Each series' baseline: the agent's previous version, else the version's own older traffic.

Versions are ordered by when the detector first saw them, then by name (versions that appear
together, as in a canary that starts with the detector, compare in name order).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from vigil.detector.cusum import upper_bound
from vigil.detector.hourly import Counts
from vigil.detector.models import DetectorSeriesRow, QualityCountRow
from vigil.settings import Settings
from vigil.store.db import aware
from vigil.store.signals import Key, version_key


@dataclass(slots=True)
class Baseline:
    label: str  # "version:<v>" or "self"
    rate: float  # the cautious rate the CUSUM uses


def baselines(s: Session, settings: Settings, now: datetime) -> dict[Key, Baseline]:
    """The baseline of every series with enough traffic behind one (series without one warm up)."""
    q = _sums()
    totals = _counts(s, q)
    first = _first_seen(s)
    cutoff = now - timedelta(hours=settings.detector_self_baseline_hours)
    own = _counts(s, q.where(QualityCountRow.hour < cutoff.replace(minute=0, second=0, microsecond=0)))
    order: dict[str, list[str]] = {}
    for agent, version in sorted(first, key=lambda av: (first[av], version_key(av[1]))):
        order.setdefault(agent, []).append(version)
    out: dict[Key, Baseline] = {}
    for agent, version, signal in totals:
        if (agent, version) not in first:
            continue
        base = _choose(settings, (agent, version, signal), order[agent], totals, own)
        if base is not None:
            out[(agent, version, signal)] = base
    return out


def _choose(settings: Settings, key: Key, versions: list[str], totals: Counts, own: Counts) -> Baseline | None:
    """The previous version's traffic if there is enough of it, else the version's own older traffic."""
    agent, version, signal = key
    minimum, confidence = settings.detector_min_baseline, settings.detector_baseline_confidence
    position = versions.index(version)
    if position > 0:
        prev = versions[position - 1]
        n, x = totals.get((agent, prev, signal), (0, 0))
        if n >= minimum:
            return Baseline(f"version:{prev}", upper_bound(min(x, n), n, confidence))
    n, x = own.get(key, (0, 0))
    if n >= minimum:
        return Baseline("self", upper_bound(min(x, n), n, confidence))
    return None


def _sums() -> Select[str, str, str, int, int, datetime]:
    return select(
        QualityCountRow.agent_id,
        QualityCountRow.agent_version,
        QualityCountRow.signal,
        func.sum(QualityCountRow.n),
        func.sum(QualityCountRow.x),
        func.min(QualityCountRow.hour),
    ).group_by(QualityCountRow.agent_id, QualityCountRow.agent_version, QualityCountRow.signal)


def _counts(s: Session, q: Select[str, str, str, int, int, datetime]) -> Counts:
    return {(agent, version, signal): (int(n), int(x)) for agent, version, signal, n, x, _ in s.execute(q)}


def _first_seen(s: Session) -> dict[tuple[str, str], datetime]:
    """When the detector first saw each agent version."""
    seen = select(
        DetectorSeriesRow.agent_id,
        DetectorSeriesRow.agent_version,
        func.min(DetectorSeriesRow.first_seen),
    ).group_by(DetectorSeriesRow.agent_id, DetectorSeriesRow.agent_version)
    return {(agent, version): aware(when) for agent, version, when in s.execute(seen)}
