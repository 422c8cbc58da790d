"""Each series' baseline: the agent's previous version, else the version's own older traffic.

Versions are ordered by when the detector first saw them, then by name (versions that appear
together, as in a canary that starts with the detector, compare in name order).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vigil.detector.cusum import upper_bound
from vigil.detector.hourly import Counts, all_totals, counts_since
from vigil.detector.models import DetectorSeriesRow
from vigil.settings import Settings
from vigil.store.db import aware
from vigil.store.signals import Key, version_key


@dataclass(slots=True)
class Baseline:
    label: str  # "version:<v>" or "self"
    rate: float  # the cautious rate the CUSUM uses


def baselines(s: Session, settings: Settings, now: datetime) -> dict[Key, Baseline]:
    """The baseline of every series with enough traffic behind one (series without one warm up).

    A version's own older traffic is its total less its hours since the cutoff: the running totals and a
    range of the newest hours, never every hour stored.
    """
    totals = all_totals(s)
    first = _first_seen(s)
    cutoff = now - timedelta(hours=settings.detector_self_baseline_hours)
    recent = counts_since(s, cutoff.replace(minute=0, second=0, microsecond=0))
    own = {key: (n - recent.get(key, (0, 0))[0], x - recent.get(key, (0, 0))[1]) for key, (n, x) in totals.items()}
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


def _first_seen(s: Session) -> dict[tuple[str, str], datetime]:
    """When the detector first saw each agent version."""
    seen = select(
        DetectorSeriesRow.agent_id,
        DetectorSeriesRow.agent_version,
        func.min(DetectorSeriesRow.first_seen),
    ).group_by(DetectorSeriesRow.agent_id, DetectorSeriesRow.agent_version)
    return {(agent, version): aware(when) for agent, version, when in s.execute(seen)}
