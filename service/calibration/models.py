"""Tables of the calibration and export stage (on the shared declarative Base).

``calibration_runs`` keeps each ``vigil calibrate`` result per judge version, so the API and UI can show
a labelled set's agreement beside the live review queue's. ``export_runs`` and ``exported_tasks`` make
export incremental: a conversation (or its near-duplicate group) is exported once per format. A run made
over HTTP stays ``pending`` (its would-be ``exported_tasks`` rows kept in ``records``) until the client
acknowledges it has the file; only then do its conversations count as exported.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Float, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from ..store.models import Base, utcnow

_ID = BigInteger().with_variant(Integer, "sqlite")


class CalibrationRunRow(Base):
    __tablename__ = "calibration_runs"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    judge: Mapped[str] = mapped_column(String(64))
    judge_version: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(Text)  # the labelled set's path
    mode: Mapped[str] = mapped_column(String(16))  # verdicts (from a file) | live | offline
    labels: Mapped[int] = mapped_column(Integer)
    kappa: Mapped[float | None] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16))
    report: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_calibration_runs_judge", "judge", "judge_version", "created_at"),)


class ExportRunRow(Base):
    __tablename__ = "export_runs"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    format: Mapped[str] = mapped_column(String(16))
    since: Mapped[int | None] = mapped_column(BigInteger)  # the watermark asked for, if any
    watermark: Mapped[int] = mapped_column(BigInteger)  # highest review label id this run saw
    tasks: Mapped[int] = mapped_column(Integer)
    grouped: Mapped[int] = mapped_column(Integer)  # confirmed failures folded into an earlier task
    actor: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    state: Mapped[str] = mapped_column(String(16), default="done", server_default="done")  # pending | done
    records: Mapped[list[Any] | None]  # pending: [conversation_id, task_id, group_key, emitted] per conversation
    acknowledged_at: Mapped[datetime | None]


class ExportedTaskRow(Base):
    __tablename__ = "exported_tasks"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    format: Mapped[str] = mapped_column(String(16))
    conversation_id: Mapped[str] = mapped_column(String(256))
    task_id: Mapped[str] = mapped_column(String(64))
    group_key: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[int] = mapped_column(_ID)
    emitted: Mapped[bool] = mapped_column(default=True)  # false: folded into its group's task
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("format", "conversation_id", name="uq_exported_tasks_once"),
        Index("ix_exported_tasks_group", "format", "group_key"),
    )
