"""Judge stage tables: persisted judge requests (the queue) and verdicts.

Other stages read ``verdicts`` (review flagging, calibration, compare); keep these columns stable.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, Float, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from ..store.models import Base, utcnow

_ID = BigInteger().with_variant(Integer, "sqlite")


class JudgeRequestRow(Base):
    __tablename__ = "judge_requests"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
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
    )


class VerdictRow(Base):
    __tablename__ = "verdicts"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    request_id: Mapped[int | None] = mapped_column(_ID, unique=True)
    judge: Mapped[str] = mapped_column(String(64))
    judge_version: Mapped[str] = mapped_column(String(64))
    conversation_id: Mapped[str] = mapped_column(String(256), index=True)
    revision: Mapped[int] = mapped_column(BigInteger)
    agent_id: Mapped[str] = mapped_column(String(256))
    agent_version: Mapped[str] = mapped_column(String(128))
    verdict: Mapped[str] = mapped_column(String(16))  # pass | fail | unscored
    score: Mapped[float | None] = mapped_column(Float)
    categories: Mapped[list[Any]]
    rationale: Mapped[str | None] = mapped_column(Text)
    unscored_reason: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(256))
    offline: Mapped[bool] = mapped_column(Boolean, default=False)
    prompt_hash: Mapped[str] = mapped_column(String(64))
    raw_reply: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    reason: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_verdicts_judge_agent", "judge", "agent_id", "agent_version", "created_at"),)


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


class PairwiseRow(Base):
    """One pairwise comparison, asked in both orders. ``position_bias`` is set when the orders disagree."""

    __tablename__ = "pairwise_comparisons"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    judge: Mapped[str] = mapped_column(String(64))
    judge_version: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(256))
    offline: Mapped[bool] = mapped_column(Boolean, default=False)
    prompt_hash: Mapped[str] = mapped_column(String(64))
    input_hash: Mapped[str] = mapped_column(String(64))
    label_a: Mapped[str | None] = mapped_column(String(256))
    label_b: Mapped[str | None] = mapped_column(String(256))
    winner: Mapped[str | None] = mapped_column(String(8))  # a | b | tie; null when biased or unscored
    position_bias: Mapped[bool] = mapped_column(Boolean, default=False)
    first_choice: Mapped[str | None] = mapped_column(String(8))  # choice when A is shown first (a|b|tie)
    second_choice: Mapped[str | None] = mapped_column(String(8))  # choice when B is shown first, mapped back
    unscored_reason: Mapped[str | None] = mapped_column(String(64))
    rationales: Mapped[list[Any]]
    raw_replies: Mapped[list[Any]]
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_pairwise_judge_created", "judge", "created_at"),)
