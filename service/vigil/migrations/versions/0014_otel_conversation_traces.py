"""ingest stage (OTLP): a conversation's spans are found through the traces they came in
(``otel_conversation_traces``, one row per conversation and trace) instead of an index on the span table's
conversation key, which every span added an entry to at a place of its own.

Revision ID: 0014_otel_conversation_traces
Revises: 0013_otel_values
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_otel_conversation_traces"
down_revision = "0013_otel_values"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "otel_conversation_traces",
        sa.Column("conversation_key", sa.String(length=256), nullable=False),
        sa.Column("trace_id", sa.String(length=32), nullable=False),
        sa.PrimaryKeyConstraint("conversation_key", "trace_id"),
    )
    op.execute(
        "INSERT INTO otel_conversation_traces (conversation_key, trace_id) "
        "SELECT DISTINCT conversation_key, trace_id FROM otel_spans"
    )
    op.drop_index("ix_otel_spans_conversation", table_name="otel_spans")


def downgrade() -> None:
    op.create_index("ix_otel_spans_conversation", "otel_spans", ["conversation_key", "start_ns"], unique=False)
    op.drop_table("otel_conversation_traces")
