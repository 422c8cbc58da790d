"""Review stage tables: the queue, why each item is in it, reviewers' labels (versioned), the audit log.

``review_labels`` is read by calibration and export: one row per label version; the row with
``is_current`` true is a reviewer's present answer for a conversation. Keep these columns stable.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Float, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from vigil.store.db import utcnow
from vigil.store.models import ID, Base


class ReviewReasonRow(Base):
    """Why an item is in the queue; unique per (conversation_id, kind, key), so a repeat adds nothing."""

    __tablename__ = "review_reasons"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(String(256), index=True)
    kind: Mapped[str] = mapped_column(String(32))  # finding | judge_fail | judge_low_score | outcome | sample | manual
    key: Mapped[str] = mapped_column(String(128))  # rule id, judge name, outcome type, ...
    weight: Mapped[float] = mapped_column(Float)
    detail: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("conversation_id", "kind", "key", name="uq_review_reasons_once"),
        Index("ix_review_reasons_kind", "kind", "key"),
    )


class ReviewSkipRow(Base):
    """A reviewer passed on an item; claim-next does not offer it to them again."""

    __tablename__ = "review_skips"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(String(256))
    reviewer: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("conversation_id", "reviewer", name="uq_review_skips_once"),)


class ReviewAuditRow(Base):
    """Every review action: who, what, when."""

    __tablename__ = "review_audit"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(32))
    conversation_id: Mapped[str | None] = mapped_column(String(256))
    detail: Mapped[dict[str, Any]]

    __table_args__ = (
        Index("ix_review_audit_conversation", "conversation_id", "at"),
        Index("ix_review_audit_actor", "actor", "at"),
    )


class ReviewCommentRow(Base):
    """A reviewer's comment on a conversation, or on one of its messages (``message_index``)."""

    __tablename__ = "review_comments"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(String(256))
    message_index: Mapped[int | None] = mapped_column(Integer)
    author: Mapped[str] = mapped_column(String(128))
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_review_comments_conversation", "conversation_id", "created_at"),)


class ReviewPairwiseRow(Base):
    """A reviewer's choice between two conversations of the same task side by side (two versions):
    ``a``, ``b`` or ``tie``. The human half of a pairwise calibration set."""

    __tablename__ = "review_pairwise"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(256))
    conversation_a: Mapped[str] = mapped_column(String(256))
    conversation_b: Mapped[str] = mapped_column(String(256))
    version_a: Mapped[str] = mapped_column(String(128))
    version_b: Mapped[str] = mapped_column(String(128))
    reviewer: Mapped[str] = mapped_column(String(128))
    choice: Mapped[str] = mapped_column(String(8))  # a | b | tie
    notes: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        Index("ix_review_pairwise_task", "task_id", "created_at"),
        Index("ix_review_pairwise_created", "created_at"),
    )
