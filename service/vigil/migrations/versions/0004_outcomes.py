"""outcomes stage tables: outcome links; detector counts, series, detections and lease.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "outcome_links",
        sa.Column("outcome_id", _ID, nullable=False),
        sa.Column("conversation_id", sa.String(length=256), nullable=False),
        sa.Column("agent_id", sa.String(length=256), nullable=False),
        sa.Column("agent_version", sa.String(length=128), nullable=False),
        sa.Column("type", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("happened", sa.Boolean(), nullable=False),
        sa.Column("attributed", sa.Boolean(), nullable=False),
        sa.Column("conversation_received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("linked_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("outcome_id"),
    )
    op.create_index("ix_outcome_links_conversation_id", "outcome_links", ["conversation_id"], unique=False)
    op.create_index("ix_outcome_links_linked", "outcome_links", ["linked_at"], unique=False)
    op.create_index("ix_outcome_links_version", "outcome_links", ["agent_id", "agent_version", "type"], unique=False)

    op.create_table(
        "quality_counts",
        sa.Column("agent_id", sa.String(length=256), nullable=False),
        sa.Column("agent_version", sa.String(length=128), nullable=False),
        sa.Column("signal", sa.String(length=128), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("x", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("agent_id", "agent_version", "signal", "hour"),
    )
    op.create_table(
        "detector_series",
        sa.Column("agent_id", sa.String(length=256), nullable=False),
        sa.Column("agent_version", sa.String(length=128), nullable=False),
        sa.Column("signal", sa.String(length=128), nullable=False),
        sa.Column("statistics", _JSON, nullable=False),
        sa.Column("baseline", sa.String(length=160), nullable=True),
        sa.Column("baseline_rate", sa.Float(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("detection_id", _ID, nullable=True),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("agent_id", "agent_version", "signal"),
    )
    op.create_table(
        "detections",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("agent_id", sa.String(length=256), nullable=False),
        sa.Column("agent_version", sa.String(length=128), nullable=False),
        sa.Column("signal", sa.String(length=128), nullable=False),
        sa.Column("baseline", sa.String(length=160), nullable=False),
        sa.Column("baseline_rate", sa.Float(), nullable=False),
        sa.Column("rate", sa.Float(), nullable=False),
        sa.Column("observations", sa.BigInteger(), nullable=False),
        sa.Column("statistic", sa.Float(), nullable=False),
        sa.Column("threshold", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_detections_series",
        "detections",
        ["agent_id", "agent_version", "signal", "started_at"],
        unique=False,
    )
    op.create_table(
        "detector_lease",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=256), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cursor", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )


def downgrade() -> None:
    op.drop_table("detector_lease")
    op.drop_index("ix_detections_series", table_name="detections")
    op.drop_table("detections")
    op.drop_table("detector_series")
    op.drop_table("quality_counts")
    op.drop_index("ix_outcome_links_version", table_name="outcome_links")
    op.drop_index("ix_outcome_links_linked", table_name="outcome_links")
    op.drop_index("ix_outcome_links_conversation_id", table_name="outcome_links")
    op.drop_table("outcome_links")
