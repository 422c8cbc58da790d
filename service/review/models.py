"""Review stage tables: the queue, why each item is in it, reviewers' labels (versioned), the audit log.

``review_labels`` is read by calibration and export: one row per label version; the row with
``is_current`` true is a reviewer's present answer for a conversation. Keep these columns stable.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, Float, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from ..store.models import Base, utcnow

_ID = BigInteger().with_variant(Integer, "sqlite")


class ReviewItemRow(Base):
    """One conversation in the queue (a conversation enters once)."""

    __tablename__ = "review_items"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(String(256), unique=True)
    # null until the conversation itself is stored (an outcome may arrive first); such items wait
    agent_id: Mapped[str | None] = mapped_column(String(256))
    agent_version: Mapped[str | None] = mapped_column(String(128))
    priority: Mapped[float] = mapped_column(Float, default=0.0)
    status: Mapped[str] = mapped_column(String(16), default="open")  # open | done
    required_reviews: Mapped[int] = mapped_column(Integer, default=1)
    review_count: Mapped[int] = mapped_column(Integer, default=0)
    sampled: Mapped[bool] = mapped_column(Boolean, default=False)
    claimed_by: Mapped[str | None] = mapped_column(String(128))
    claimed_at: Mapped[datetime | None]
    lease_until: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_review_items_claimable", "status", "priority", "created_at"),)


class ReviewReasonRow(Base):
    """Why an item is in the queue; unique per (conversation_id, kind, key), so a repeat adds nothing."""

    __tablename__ = "review_reasons"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(String(256), index=True)
    kind: Mapped[str] = mapped_column(
        String(32)
    )  # finding | judge_fail | judge_low_score | outcome | sample | manual
    key: Mapped[str] = mapped_column(String(128))  # rule id, judge name, outcome type, ...
    weight: Mapped[float] = mapped_column(Float)
    detail: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("conversation_id", "kind", "key", name="uq_review_reasons_once"),
        Index("ix_review_reasons_kind", "kind", "key"),
    )


class ReviewLabelRow(Base):
    """A reviewer's label on a conversation. Changing a label adds a version; older versions stay."""

    __tablename__ = "review_labels"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(String(256), index=True)
    revision: Mapped[int | None] = mapped_column(BigInteger)  # conversation revision the reviewer saw
    reviewer: Mapped[str] = mapped_column(String(128))
    label: Mapped[str] = mapped_column(String(32))  # confirmed_failure | not_a_failure | unsure
    category: Mapped[str | None] = mapped_column(String(64))
    severity: Mapped[str | None] = mapped_column(String(16))
    notes: Mapped[str] = mapped_column(Text, default="")
    expected_behavior: Mapped[str] = mapped_column(Text, default="")
    version: Mapped[int] = mapped_column(Integer)
    is_current: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("conversation_id", "reviewer", "version", name="uq_review_labels_version"),
        Index("ix_review_labels_current", "is_current", "label", "created_at"),
        Index("ix_review_labels_reviewer", "reviewer", "created_at"),
    )


class ReviewSkipRow(Base):
    """A reviewer passed on an item; claim-next does not offer it to them again."""

    __tablename__ = "review_skips"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(String(256))
    reviewer: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("conversation_id", "reviewer", name="uq_review_skips_once"),)


class ReviewAuditRow(Base):
    """Every review action: who, what, when."""

    __tablename__ = "review_audit"

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(32))
    conversation_id: Mapped[str | None] = mapped_column(String(256))
    detail: Mapped[dict[str, Any]]

    __table_args__ = (
        Index("ix_review_audit_conversation", "conversation_id", "at"),
        Index("ix_review_audit_actor", "actor", "at"),
    )
