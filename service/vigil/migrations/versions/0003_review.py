"""review stage tables.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "review_items",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("conversation_id", sa.String(length=256), nullable=False),
        sa.Column("agent_id", sa.String(length=256), nullable=True),
        sa.Column("agent_version", sa.String(length=128), nullable=True),
        sa.Column("priority", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("required_reviews", sa.Integer(), nullable=False),
        sa.Column("review_count", sa.Integer(), nullable=False),
        sa.Column("sampled", sa.Boolean(), nullable=False),
        sa.Column("claimed_by", sa.String(length=128), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("conversation_id"),
    )
    with op.batch_alter_table("review_items", schema=None) as batch_op:
        batch_op.create_index("ix_review_items_claimable", ["status", "priority", "created_at"], unique=False)

    op.create_table(
        "review_reasons",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("conversation_id", sa.String(length=256), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("conversation_id", "kind", "key", name="uq_review_reasons_once"),
    )
    with op.batch_alter_table("review_reasons", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_review_reasons_conversation_id"), ["conversation_id"], unique=False)
        batch_op.create_index("ix_review_reasons_kind", ["kind", "key"], unique=False)

    op.create_table(
        "review_labels",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("conversation_id", sa.String(length=256), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=True),
        sa.Column("reviewer", sa.String(length=128), nullable=False),
        sa.Column("label", sa.String(length=32), nullable=False),
        sa.Column("category", sa.String(length=64), nullable=True),
        sa.Column("severity", sa.String(length=16), nullable=True),
        sa.Column("notes", sa.Text(), nullable=False),
        sa.Column("expected_behavior", sa.Text(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("is_current", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("conversation_id", "reviewer", "version", name="uq_review_labels_version"),
    )
    with op.batch_alter_table("review_labels", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_review_labels_conversation_id"), ["conversation_id"], unique=False)
        batch_op.create_index("ix_review_labels_current", ["is_current", "label", "created_at"], unique=False)
        batch_op.create_index("ix_review_labels_reviewer", ["reviewer", "created_at"], unique=False)

    op.create_table(
        "review_skips",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("conversation_id", sa.String(length=256), nullable=False),
        sa.Column("reviewer", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("conversation_id", "reviewer", name="uq_review_skips_once"),
    )

    op.create_table(
        "review_audit",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("action", sa.String(length=32), nullable=False),
        sa.Column("conversation_id", sa.String(length=256), nullable=True),
        sa.Column("detail", _JSON, nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("review_audit", schema=None) as batch_op:
        batch_op.create_index("ix_review_audit_actor", ["actor", "at"], unique=False)
        batch_op.create_index("ix_review_audit_conversation", ["conversation_id", "at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("review_audit", schema=None) as batch_op:
        batch_op.drop_index("ix_review_audit_conversation")
        batch_op.drop_index("ix_review_audit_actor")
    op.drop_table("review_audit")
    op.drop_table("review_skips")
    with op.batch_alter_table("review_labels", schema=None) as batch_op:
        batch_op.drop_index("ix_review_labels_reviewer")
        batch_op.drop_index("ix_review_labels_current")
        batch_op.drop_index(batch_op.f("ix_review_labels_conversation_id"))
    op.drop_table("review_labels")
    with op.batch_alter_table("review_reasons", schema=None) as batch_op:
        batch_op.drop_index("ix_review_reasons_kind")
        batch_op.drop_index(batch_op.f("ix_review_reasons_conversation_id"))
    op.drop_table("review_reasons")
    with op.batch_alter_table("review_items", schema=None) as batch_op:
        batch_op.drop_index("ix_review_items_claimable")
    op.drop_table("review_items")
