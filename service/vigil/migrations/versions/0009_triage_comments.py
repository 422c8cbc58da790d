"""review stage (triage): reviewers' comments on conversations and messages; labels applied to a
near-duplicate cluster say which conversation's label they copy; items can be assigned to a reviewer;
reviewers' pairwise choices between two versions' conversations of one task.

Revision ID: 0009_triage
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_triage"
down_revision = "0009_harden_sessions"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "review_comments",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("conversation_id", sa.String(length=256), nullable=False),
        sa.Column("message_index", sa.Integer(), nullable=True),
        sa.Column("author", sa.String(length=128), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("review_comments", schema=None) as batch_op:
        batch_op.create_index("ix_review_comments_conversation", ["conversation_id", "created_at"], unique=False)
    op.create_table(
        "review_pairwise",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("task_id", sa.String(length=256), nullable=False),
        sa.Column("conversation_a", sa.String(length=256), nullable=False),
        sa.Column("conversation_b", sa.String(length=256), nullable=False),
        sa.Column("version_a", sa.String(length=128), nullable=False),
        sa.Column("version_b", sa.String(length=128), nullable=False),
        sa.Column("reviewer", sa.String(length=128), nullable=False),
        sa.Column("choice", sa.String(length=8), nullable=False),
        sa.Column("notes", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("review_pairwise", schema=None) as batch_op:
        batch_op.create_index("ix_review_pairwise_created", ["created_at"], unique=False)
        batch_op.create_index("ix_review_pairwise_task", ["task_id", "created_at"], unique=False)
    with op.batch_alter_table("review_labels", schema=None) as batch_op:
        batch_op.add_column(sa.Column("propagated_from", sa.String(length=256), nullable=True))
    with op.batch_alter_table("review_items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("assignee", sa.String(length=128), nullable=True))
        batch_op.create_index("ix_review_items_assignee", ["assignee"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("review_items", schema=None) as batch_op:
        batch_op.drop_index("ix_review_items_assignee")
        batch_op.drop_column("assignee")
    with op.batch_alter_table("review_labels", schema=None) as batch_op:
        batch_op.drop_column("propagated_from")
    with op.batch_alter_table("review_pairwise", schema=None) as batch_op:
        batch_op.drop_index("ix_review_pairwise_task")
        batch_op.drop_index("ix_review_pairwise_created")
    op.drop_table("review_pairwise")
    with op.batch_alter_table("review_comments", schema=None) as batch_op:
        batch_op.drop_index("ix_review_comments_conversation")
    op.drop_table("review_comments")
