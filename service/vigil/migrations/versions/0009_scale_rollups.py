"""Rollups for aggregate reads (hourly counts, pass^k per task, versions seen, the job's state) and
indexes for the hot predicates of the write path and the reads.

Revision ID: 0009_scale
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_scale"
down_revision = "0009_perf_lz4"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "rollup_hourly",
        sa.Column("hour", _TS, nullable=False),
        sa.Column("agent_id", sa.String(length=256), nullable=False),
        sa.Column("agent_version", sa.String(length=128), nullable=False),
        sa.Column("signal", sa.String(length=200), nullable=False),
        sa.Column("family", sa.String(length=16), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("x", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("hour", "agent_id", "agent_version", "signal"),
    )
    op.create_index("ix_rollup_hourly_version", "rollup_hourly", ["agent_id", "agent_version", "hour"])
    op.create_table(
        "rollup_tasks",
        sa.Column("agent_id", sa.String(length=256), nullable=False),
        sa.Column("agent_version", sa.String(length=128), nullable=False),
        sa.Column("task_id", sa.String(length=256), nullable=False),
        sa.Column("day", _TS, nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("successes", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("agent_id", "agent_version", "task_id", "day"),
    )
    op.create_table(
        "rollup_versions",
        sa.Column("agent_id", sa.String(length=256), nullable=False),
        sa.Column("agent_version", sa.String(length=128), nullable=False),
        sa.Column("first_seen", _TS, nullable=False),
        sa.Column("last_seen", _TS, nullable=False),
        sa.PrimaryKeyConstraint("agent_id", "agent_version"),
    )
    op.create_index("ix_rollup_versions_version", "rollup_versions", ["agent_version"])
    op.create_table(
        "rollup_members",
        sa.Column("conversation_id", sa.String(length=256), nullable=False),
        sa.Column("received_at", _TS, nullable=False),
        sa.Column("agent_id", sa.String(length=256), nullable=False),
        sa.Column("agent_version", sa.String(length=128), nullable=False),
        sa.Column("task_id", sa.String(length=256), nullable=True),
        sa.PrimaryKeyConstraint("conversation_id"),
    )
    op.create_index("ix_rollup_members_received_at", "rollup_members", ["received_at"])
    op.create_table(
        "rollup_state",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("watermark", _TS, nullable=True),
        sa.Column("updated_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )

    op.create_index("ix_findings_created", "findings", ["created_at"], postgresql_using="brin")
    op.create_index("ix_dead_letters_created", "dead_letters", ["created_at"], postgresql_using="brin")
    op.create_index("ix_verdicts_created", "verdicts", ["created_at"])
    op.create_index("ix_review_items_done", "review_items", ["status", "updated_at"])
    op.create_index("ix_review_items_claimed", "review_items", ["claimed_by"])
    op.create_index(
        "ix_review_items_waiting",
        "review_items",
        ["conversation_id"],
        postgresql_where=sa.text("agent_id IS NULL"),
        sqlite_where=sa.text("agent_id IS NULL"),
    )
    op.create_index("ix_exported_tasks_conversation", "exported_tasks", ["conversation_id"])


def downgrade() -> None:
    op.drop_index("ix_exported_tasks_conversation", "exported_tasks")
    op.drop_index("ix_review_items_waiting", "review_items")
    op.drop_index("ix_review_items_claimed", "review_items")
    op.drop_index("ix_review_items_done", "review_items")
    op.drop_index("ix_verdicts_created", "verdicts")
    op.drop_index("ix_dead_letters_created", "dead_letters")
    op.drop_index("ix_findings_created", "findings")
    for table in ("rollup_state", "rollup_members", "rollup_versions", "rollup_tasks", "rollup_hourly"):
        op.drop_table(table)
