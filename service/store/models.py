"""Tables of the pipeline's core: conversations, findings, outcomes, dead letters.

Later stages keep their tables beside their code, on the same :class:`Base`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JsonType = JSON().with_variant(JSONB(), "postgresql")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JsonType, list[Any]: JsonType, datetime: DateTime(timezone=True)}

    if TYPE_CHECKING:
        # every model declares __tablename__, so it maps to a Table (SQLAlchemy allows any FromClause)
        __table__: ClassVar[Table]


class ConversationRow(Base):
    __tablename__ = "conversations"

    conversation_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    revision: Mapped[int] = mapped_column(BigInteger)
    schema_version: Mapped[int] = mapped_column(Integer, default=1)
    agent_id: Mapped[str] = mapped_column(String(256))
    agent_version: Mapped[str] = mapped_column(String(128))
    task_id: Mapped[str | None] = mapped_column(String(256))
    intent: Mapped[str | None] = mapped_column(String(256))
    status: Mapped[str | None] = mapped_column(String(16))
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    received_at: Mapped[datetime] = mapped_column(default=utcnow)
    message_count: Mapped[int] = mapped_column(Integer)
    tool_call_count: Mapped[int] = mapped_column(Integer)
    tool_error_count: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int | None] = mapped_column(BigInteger)
    cost_usd: Mapped[float | None] = mapped_column(Float)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    finding_count: Mapped[int] = mapped_column(Integer, default=0)
    max_severity: Mapped[str | None] = mapped_column(String(16))
    document: Mapped[str] = mapped_column(Text)

    __table_args__ = (
        Index("ix_conversations_agent", "agent_id", "agent_version", "received_at"),
        Index("ix_conversations_received", "received_at"),
        Index("ix_conversations_task", "task_id"),
    )


class FindingRow(Base):
    __tablename__ = "findings"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    conversation_id: Mapped[str] = mapped_column(String(256), index=True)
    revision: Mapped[int] = mapped_column(BigInteger)
    agent_id: Mapped[str] = mapped_column(String(256))
    agent_version: Mapped[str] = mapped_column(String(128))
    rule_id: Mapped[str] = mapped_column(String(64))
    rule_type: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    evidence: Mapped[list[Any]]
    details: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_findings_rule", "rule_id", "agent_id", "agent_version"),)


class OutcomeRow(Base):
    __tablename__ = "outcomes"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    idempotency_key: Mapped[str] = mapped_column(String(512), unique=True)
    conversation_id: Mapped[str] = mapped_column(String(256), index=True)
    type: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float, default=1.0)
    occurred_at: Mapped[datetime]
    received_at: Mapped[datetime] = mapped_column(default=utcnow)
    source: Mapped[str] = mapped_column(String(32), default="api")


class DeadLetterRow(Base):
    __tablename__ = "dead_letters"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    source: Mapped[str] = mapped_column(String(32))
    topic: Mapped[str | None] = mapped_column(String(256))
    partition: Mapped[int | None] = mapped_column(Integer)
    offset: Mapped[int | None] = mapped_column(BigInteger)
    key: Mapped[str | None] = mapped_column(String(512))
    reason: Mapped[str] = mapped_column(String(64))
    detail: Mapped[str] = mapped_column(Text)
    raw: Mapped[bytes] = mapped_column(LargeBinary)
    raw_size: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("source", "topic", "partition", "offset", name="uq_dead_letters_position"),
    )
