"""The detector's Prometheus gauges, set from the shared tables so every replica exports the same state."""

from __future__ import annotations

import contextlib
from datetime import datetime

from sqlalchemy import and_, select
from sqlalchemy.orm import Session, sessionmaker

from vigil.detector.hourly import Counts
from vigil.detector.models import DetectorLeaseRow, DetectorSeriesRow, QualityTotalRow
from vigil.metrics import Metrics
from vigil.store.db import aware
from vigil.store.signals import Key


class Gauges:
    """Sets the quality and detector gauges of the live series; drops those of series gone quiet."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.exported: set[Key] = set()  # label sets (signal, agent, version) set by the last refresh

    def refresh(self, sessions: sessionmaker[Session], threshold: float, live_since: datetime, now: datetime) -> None:
        """Export the series seen since ``live_since``; ``now`` is the pass's time."""
        m = self.metrics
        m.detector_threshold.set(threshold)
        with sessions() as s:
            live = {
                (r.agent_id, r.agent_version, r.signal): r
                for r in s.scalars(select(DetectorSeriesRow).where(DetectorSeriesRow.last_seen >= live_since))
            }
            totals = _totals(s, live_since)
            cursor = s.scalar(select(DetectorLeaseRow.cursor))
        # series whose labels fold into "other" share one set of gauges: their summed counts, the
        # largest statistic, and detected if any of them is (never one overwriting another)
        groups: dict[Key, list[Key]] = {}
        for key in live:
            groups.setdefault((m.signal(key[2]), m.agent(key[0]), m.version(key[1])), []).append(key)
        exported: set[Key] = set()
        for labels, keys in groups.items():
            exported.add(labels)
            self._set(labels, [live[k] for k in keys], [totals.get(k, (0, 0)) for k in keys])
        for gone in self.exported - exported:
            self._remove(gone)
        self.exported = exported
        m.detector_last_run.set(now.timestamp())
        if cursor is not None:
            m.detector_cursor.set(aware(cursor).timestamp())

    def _set(self, labels: Key, rows: list[DetectorSeriesRow], counts: list[tuple[int, int]]) -> None:
        m = self.metrics
        n, x = sum(c[0] for c in counts), sum(min(c[1], c[0]) for c in counts)
        if n:
            low, high = _wilson(x, n)
            m.quality_rate.labels(*labels).set(x / n)
            m.quality_rate_lower.labels(*labels).set(float(low))
            m.quality_rate_upper.labels(*labels).set(float(high))
        m.quality_observations.labels(*labels).set(n)
        if len(rows) == 1 and rows[0].baseline_rate is not None:
            m.quality_baseline_rate.labels(*labels).set(rows[0].baseline_rate)
        else:
            with contextlib.suppress(KeyError):
                m.quality_baseline_rate.remove(*labels)
        m.regression_detected.labels(*labels).set(1 if any(r.detection_id is not None for r in rows) else 0)
        m.detector_statistic.labels(*labels).set(max(max(r.statistics or [0.0]) for r in rows))

    def _remove(self, labels: Key) -> None:
        m = self.metrics
        for gauge in (
            m.quality_rate,
            m.quality_rate_lower,
            m.quality_rate_upper,
            m.quality_observations,
            m.quality_baseline_rate,
            m.regression_detected,
            m.detector_statistic,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)


def _totals(s: Session, live_since: datetime) -> Counts:
    """The stored counts over all hours of every series seen since ``live_since`` (their running totals)."""
    T, S = QualityTotalRow, DetectorSeriesRow
    same = and_(S.agent_id == T.agent_id, S.agent_version == T.agent_version, S.signal == T.signal)
    q = select(T.agent_id, T.agent_version, T.signal, T.n, T.x).join(S, same).where(S.last_seen >= live_since)
    return {(a, v, sig): (int(n), int(x)) for a, v, sig, n, x in s.execute(q)}


def _wilson(x: int, n: int) -> tuple[float, float]:
    """The 95% Wilson interval of ``x`` of ``n`` (statsmodels, a second to import: imported when used)."""
    from statsmodels.stats.proportion import proportion_confint

    low, high = proportion_confint(x, n, alpha=0.05, method="wilson")
    return float(low), float(high)
