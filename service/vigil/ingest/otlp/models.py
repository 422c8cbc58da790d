"""Tables of the tracing stage: the buffer of OTLP spans that conversations are assembled from."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from vigil.store.db import utcnow
from vigil.store.models import Base


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
    span: Mapped[dict[str, Any]]
    received_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("trace_id", "span_id", name="uq_otel_spans_id"),
        Index("ix_otel_spans_conversation", "conversation_key", "start_ns"),
        Index("ix_otel_spans_received", "received_at"),
    )
