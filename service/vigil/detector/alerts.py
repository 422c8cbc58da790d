"""Detections: opened when a series' CUSUM alarms, ended when it recovers or its series goes quiet."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from vigil.detector.hourly import series_totals
from vigil.detector.models import DetectionRow, DetectorSeriesRow
from vigil.metrics import Metrics
from vigil.store.db import after_commit
from vigil.store.signals import Key

log = logging.getLogger(__name__)


def open_detection(s: Session, row: DetectorSeriesRow, statistic: float, at: datetime, threshold: float) -> int:
    """Store a detection of ``row``'s series, with its rate over all stored hours; returns its id."""
    n, x = series_totals(s, row.agent_id, row.agent_version, row.signal)
    det = DetectionRow(
        agent_id=row.agent_id,
        agent_version=row.agent_version,
        signal=row.signal,
        baseline=row.baseline or "",
        baseline_rate=row.baseline_rate or 0.0,
        rate=x / n if n else 0.0,
        observations=n,
        statistic=statistic,
        threshold=threshold,
        started_at=at,
    )
    s.add(det)
    s.flush()
    log.warning(
        "regression detected: %s %s %s rate %.4f vs baseline %.4f (%s)",
        row.agent_id,
        row.agent_version,
        row.signal,
        det.rate,
        det.baseline_rate,
        det.baseline,
    )
    return det.id


def end_detection(s: Session, detection_id: int, at: datetime, reason: str) -> None:
    det = s.get(DetectionRow, detection_id)
    if det is not None and det.ended_at is None:
        det.ended_at, det.end_reason = at, reason


def retire(s: Session, now: datetime, retire_hours: float) -> None:
    """End the detections of series that have seen no data for ``retire_hours``."""
    cutoff = now - timedelta(hours=retire_hours)
    for row in s.scalars(
        select(DetectorSeriesRow).where(
            DetectorSeriesRow.detection_id.is_not(None), DetectorSeriesRow.last_seen < cutoff
        )
    ).all():
        end_detection(s, row.detection_id, now, "retired")  # type: ignore[arg-type]
        row.detection_id, row.state = None, "monitoring"


def count_opened(s: Session, metrics: Metrics, opened: list[Key]) -> None:
    """Count the detections opened in ``s`` once its transaction commits."""
    m = metrics

    def count() -> None:
        for agent, version, signal in opened:
            m.detections.labels(m.signal(signal), m.agent(agent), m.version(version)).inc()

    after_commit(s, count)
