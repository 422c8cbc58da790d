"""tracing stage tables: the OTLP span buffer.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "otel_spans",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("conversation_key", sa.String(length=256), nullable=False),
        sa.Column("trace_id", sa.String(length=32), nullable=False),
        sa.Column("span_id", sa.String(length=16), nullable=False),
        sa.Column("parent_span_id", sa.String(length=16), nullable=True),
        sa.Column("name", sa.String(length=512), nullable=False),
        sa.Column("start_ns", sa.BigInteger(), nullable=False),
        sa.Column("end_ns", sa.BigInteger(), nullable=False),
        sa.Column(
            "span",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("trace_id", "span_id", name="uq_otel_spans_id"),
    )
    with op.batch_alter_table("otel_spans", schema=None) as batch_op:
        batch_op.create_index("ix_otel_spans_conversation", ["conversation_key", "start_ns"], unique=False)
        batch_op.create_index("ix_otel_spans_received", ["received_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("otel_spans", schema=None) as batch_op:
        batch_op.drop_index("ix_otel_spans_received")
        batch_op.drop_index("ix_otel_spans_conversation")
    op.drop_table("otel_spans")
