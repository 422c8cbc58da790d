"""ingest stage (OTLP): per-conversation trace state (idle finishing across replicas, session and user)
and the GenAI log records joined to spans.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "otel_conversations",
        sa.Column("conversation_key", sa.String(length=256), nullable=False),
        sa.Column("span_count", sa.Integer(), nullable=False),
        sa.Column("event_count", sa.Integer(), nullable=False),
        sa.Column("first_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("idle_finished", sa.Boolean(), nullable=False),
        sa.Column("claimed_by", sa.String(length=64), nullable=True),
        sa.Column("claim_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("conversation_id", sa.String(length=256), nullable=True),
        sa.Column("session_id", sa.String(length=256), nullable=True),
        sa.Column("user_id", sa.String(length=256), nullable=True),
        sa.PrimaryKeyConstraint("conversation_key"),
    )
    with op.batch_alter_table("otel_conversations", schema=None) as batch_op:
        batch_op.create_index("ix_otel_conversations_open", ["finished_at", "last_seen_at"], unique=False)
        batch_op.create_index("ix_otel_conversations_session", ["session_id", "first_seen_at"], unique=False)
        batch_op.create_index("ix_otel_conversations_user", ["user_id", "first_seen_at"], unique=False)
    op.create_table(
        "otel_events",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("conversation_key", sa.String(length=256), nullable=False),
        sa.Column("trace_id", sa.String(length=32), nullable=False),
        sa.Column("span_id", sa.String(length=16), nullable=True),
        sa.Column("digest", sa.String(length=32), nullable=False),
        sa.Column("time_ns", sa.BigInteger(), nullable=False),
        sa.Column("event", _JSON, nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("digest", name="uq_otel_events_digest"),
    )
    with op.batch_alter_table("otel_events", schema=None) as batch_op:
        batch_op.create_index("ix_otel_events_conversation", ["conversation_key", "time_ns"], unique=False)
        batch_op.create_index("ix_otel_events_trace", ["trace_id"], unique=False)
        batch_op.create_index("ix_otel_events_received", ["received_at"], unique=False)


def downgrade() -> None:
    op.drop_table("otel_events")
    op.drop_table("otel_conversations")
