"""Tables of the tracing stage: the buffer of OTLP spans that conversations are assembled from."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from vigil.store.db import utcnow
from vigil.store.models import Base, JsonText


class OtelSpanRow(Base):
    """One received GenAI span, normalised (see :mod:`vigil.ingest.otlp.otlp`); unique per trace and span id."""

    __tablename__ = "otel_spans"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    conversation_key: Mapped[str] = mapped_column(String(256))
    trace_id: Mapped[str] = mapped_column(String(32))
    span_id: Mapped[str] = mapped_column(String(16))
    parent_span_id: Mapped[str | None] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(512))
    start_ns: Mapped[int] = mapped_column(BigInteger)
    end_ns: Mapped[int] = mapped_column(BigInteger)
    span: Mapped[dict[str, Any]] = mapped_column(JsonText)
    received_at: Mapped[datetime] = mapped_column(default=utcnow)

    # no index on conversation_key: a conversation's spans are found through its traces
    # (OtelConversationTraceRow) and this table's (trace_id, span_id) key, which every span needs anyway. An
    # index on a key that sorts anywhere took a fifth of what an interleaved exporter's requests wrote on
    # SQLite: each request adds entries for about 100 conversations in flight, each on a page of its own.
    __table_args__ = (
        UniqueConstraint("trace_id", "span_id", name="uq_otel_spans_id"),
        Index("ix_otel_spans_received", "received_at"),
    )


class OtelConversationTraceRow(Base):
    """The traces a conversation's spans came in: one row per conversation and trace (most conversations have
    one), not per span; its spans are those of these traces stored under its key."""

    __tablename__ = "otel_conversation_traces"

    conversation_key: Mapped[str] = mapped_column(String(256), primary_key=True)
    trace_id: Mapped[str] = mapped_column(String(32), primary_key=True)


class OtelConversationRow(Base):
    """What is known of one conversation assembled from traces: counts, when it last grew, whether it is
    finished (its roots ended, or it was idle for ``VIGIL_OTLP_TRACE_IDLE_SECONDS``), and the lease of
    the replica finishing it."""

    __tablename__ = "otel_conversations"

    conversation_key: Mapped[str] = mapped_column(String(256), primary_key=True)
    span_count: Mapped[int] = mapped_column(Integer, default=0)
    event_count: Mapped[int] = mapped_column(Integer, default=0)
    first_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    processed_at: Mapped[datetime | None]
    idle_finished: Mapped[bool] = mapped_column(Boolean, default=False)
    claimed_by: Mapped[str | None] = mapped_column(String(64))
    claim_until: Mapped[datetime | None]
    # set when a revision of it is stored, cleared when a later one is refused as dated ahead
    conversation_id: Mapped[str | None] = mapped_column(String(256))
    session_id: Mapped[str | None] = mapped_column(String(256))
    user_id: Mapped[str | None] = mapped_column(String(256))

    __table_args__ = (
        Index("ix_otel_conversations_open", "finished_at", "last_seen_at"),
        Index("ix_otel_conversations_session", "session_id", "first_seen_at"),
        Index("ix_otel_conversations_user", "user_id", "first_seen_at"),
    )


class OtelEventRow(Base):
    """One GenAI log record (``POST /v1/logs``), joined to its span by trace and span id when assembling."""

    __tablename__ = "otel_events"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    conversation_key: Mapped[str] = mapped_column(String(256))
    trace_id: Mapped[str] = mapped_column(String(32))
    span_id: Mapped[str | None] = mapped_column(String(16))
    digest: Mapped[str] = mapped_column(String(32))
    time_ns: Mapped[int] = mapped_column(BigInteger)
    event: Mapped[dict[str, Any]] = mapped_column(JsonText)
    received_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("digest", name="uq_otel_events_digest"),
        Index("ix_otel_events_conversation", "conversation_key", "time_ns"),
        Index("ix_otel_events_trace", "trace_id"),
        Index("ix_otel_events_received", "received_at"),
    )


class OtelValueRow(Base):
    """A long span attribute value that several conversations sent (their instructions, most often), stored
    once under its digest; spans refer to it as ``{"$val": digest}`` (see :mod:`vigil.ingest.otlp.shared`)."""

    __tablename__ = "otel_values"

    digest: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    touched_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_otel_values_touched", "touched_at"),)
