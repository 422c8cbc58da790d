"""Judge stage tables: persisted judge requests (the queue) and verdicts.

Other stages read ``verdicts`` (review flagging, calibration, compare); keep these columns stable.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from vigil.store.db import utcnow
from vigil.store.models import ID, Base


class JudgeRequestRow(Base):
    __tablename__ = "judge_requests"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    judge: Mapped[str] = mapped_column(String(64))
    conversation_id: Mapped[str] = mapped_column(String(256))
    revision: Mapped[int] = mapped_column(BigInteger)
    agent_id: Mapped[str] = mapped_column(String(256))
    agent_version: Mapped[str] = mapped_column(String(128))
    reason: Mapped[str] = mapped_column(String(32))  # sampled | flagged | outcome | min_per_hour | manual
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | running | done | superseded
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    lease_until: Mapped[datetime | None]
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("judge", "conversation_id", "revision", name="uq_judge_requests_once"),
        Index("ix_judge_requests_due", "status", "next_attempt_at"),
        # a conversation's requests whatever the judge: retention deletes them with it, a claim finds newer ones
        Index("ix_judge_requests_conversation", "conversation_id"),
    )


class JudgeStatusRow(Base):
    """Each judge's worker state, so an API process shows the state a separate worker process holds."""

    __tablename__ = "judge_status"

    judge: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(
        String(32)
    )  # running | budget_unknown | paused_budget | stopped_config_error | circuit_open
    detail: Mapped[str | None] = mapped_column(Text)
    worker: Mapped[str | None] = mapped_column(String(128))
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    resume_requested_at: Mapped[datetime | None]
