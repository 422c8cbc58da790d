"""calibration stage tables: calibration runs, export runs, exported tasks.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "calibration_runs",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("judge", sa.String(length=64), nullable=False),
        sa.Column("judge_version", sa.String(length=64), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("labels", sa.Integer(), nullable=False),
        sa.Column("kappa", sa.Float(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("report", _JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("calibration_runs", schema=None) as batch_op:
        batch_op.create_index("ix_calibration_runs_judge", ["judge", "judge_version", "created_at"], unique=False)

    op.create_table(
        "export_runs",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("since", sa.BigInteger(), nullable=True),
        sa.Column("watermark", sa.BigInteger(), nullable=False),
        sa.Column("tasks", sa.Integer(), nullable=False),
        sa.Column("grouped", sa.Integer(), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )

    op.create_table(
        "exported_tasks",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("format", sa.String(length=16), nullable=False),
        sa.Column("conversation_id", sa.String(length=256), nullable=False),
        sa.Column("task_id", sa.String(length=64), nullable=False),
        sa.Column("group_key", sa.String(length=64), nullable=False),
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("emitted", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("format", "conversation_id", name="uq_exported_tasks_once"),
    )
    with op.batch_alter_table("exported_tasks", schema=None) as batch_op:
        batch_op.create_index("ix_exported_tasks_group", ["format", "group_key"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("exported_tasks", schema=None) as batch_op:
        batch_op.drop_index("ix_exported_tasks_group")
    op.drop_table("exported_tasks")
    op.drop_table("export_runs")
    with op.batch_alter_table("calibration_runs", schema=None) as batch_op:
        batch_op.drop_index("ix_calibration_runs_judge")
    op.drop_table("calibration_runs")
