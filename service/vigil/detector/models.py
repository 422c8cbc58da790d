"""Detector tables: hourly aggregated counts and their totals, what each conversation was fed as, per-series
CUSUM state, detections, the leader lease."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Float, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from vigil.store.db import utcnow
from vigil.store.models import ID, Base


class QualityCountRow(Base):
    """Observations ``n`` and failures ``x`` of one signal of one agent version in one hour."""

    __tablename__ = "quality_counts"

    agent_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    agent_version: Mapped[str] = mapped_column(String(128), primary_key=True)
    signal: Mapped[str] = mapped_column(String(128), primary_key=True)
    hour: Mapped[datetime] = mapped_column(primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger, default=0)
    x: Mapped[int] = mapped_column(BigInteger, default=0)

    # the recent hours of every series: a baseline's newest hours, the home page's last day
    __table_args__ = (Index("ix_quality_counts_hour", "hour"),)


class QualityTotalRow(Base):
    """Every hour of one series' ``quality_counts`` summed, kept up to date by whatever changes them
    (:mod:`vigil.detector.hourly`): gauges, baselines and alerts read one row a series, not every hour."""

    __tablename__ = "quality_totals"

    agent_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    agent_version: Mapped[str] = mapped_column(String(128), primary_key=True)
    signal: Mapped[str] = mapped_column(String(128), primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger, default=0)
    x: Mapped[int] = mapped_column(BigInteger, default=0)


class DetectorFeedRow(Base):
    """What one conversation was fed to the statistics and the hourly counts as (:mod:`vigil.detector.feeds`).

    ``failed``: its conversation signals that failed (None: none did). ``outcome_hour``: the hour whose
    settled outcome signals counted it (None: not yet).
    """

    __tablename__ = "detector_feeds"

    conversation_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    agent_id: Mapped[str] = mapped_column(String(256))
    agent_version: Mapped[str] = mapped_column(String(128))
    revision: Mapped[int] = mapped_column(BigInteger)
    hour: Mapped[datetime]
    failed: Mapped[list[Any] | None]
    outcome_hour: Mapped[datetime | None]

    __table_args__ = (Index("ix_detector_feeds_hour", "hour"),)


class DetectorSeriesRow(Base):
    """The sequential test's state for one signal of one agent version."""

    __tablename__ = "detector_series"

    agent_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    agent_version: Mapped[str] = mapped_column(String(128), primary_key=True)
    signal: Mapped[str] = mapped_column(String(128), primary_key=True)
    statistics: Mapped[list[Any]]
    baseline: Mapped[str | None] = mapped_column(String(160))
    baseline_rate: Mapped[float | None] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16), default="warming_up")  # warming_up | monitoring | regressed
    detection_id: Mapped[int | None] = mapped_column(ID)
    first_seen: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)


class DetectionRow(Base):
    """A regression the detector raised: when it started and (once evidence fades) when it ended."""

    __tablename__ = "detections"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(String(256))
    agent_version: Mapped[str] = mapped_column(String(128))
    signal: Mapped[str] = mapped_column(String(128))
    baseline: Mapped[str] = mapped_column(String(160))
    baseline_rate: Mapped[float] = mapped_column(Float)
    rate: Mapped[float] = mapped_column(Float)
    observations: Mapped[int] = mapped_column(BigInteger)
    statistic: Mapped[float] = mapped_column(Float)
    threshold: Mapped[float] = mapped_column(Float)
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
    end_reason: Mapped[str | None] = mapped_column(String(32))

    __table_args__ = (Index("ix_detections_series", "agent_id", "agent_version", "signal", "started_at"),)


class DetectorLeaseRow(Base):
    """Elects the one active detector; ``cursor`` is how far stored data has been folded in, ``fed_since``
    where the record of what each conversation was fed as (``detector_feeds``) begins."""

    __tablename__ = "detector_lease"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(256))
    lease_until: Mapped[datetime]
    cursor: Mapped[datetime | None]
    fed_since: Mapped[datetime | None]
