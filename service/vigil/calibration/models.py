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

from sqlalchemy import Float, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from vigil.store.db import utcnow
from vigil.store.models import ID, Base


class CalibrationRunRow(Base):
    __tablename__ = "calibration_runs"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
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
