"""store: ``rollup_members`` records what each conversation added to the per-task counts (``trials`` and
``successes``, 0 or 1) and to the outcome counts (``outcomes``: the types it counted under, one a line)
when the rollup job last counted it. A read then counts the tail's tasks and outcome links from the
conversations the tail touches (their part now, less their part as counted) instead of recounting every
conversation of each touched task (a task's whole history) or of each touched hour, on every read.

Rows written before keep them NULL: nothing says what they were counted as, so a read recounts their task
or hour from the base tables, as before.

Revision ID: 0025_rollup_member_trials
Revises: 0024_erasures
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025_rollup_member_trials"
down_revision = "0024_erasures"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("rollup_members", sa.Column("trials", sa.SmallInteger(), nullable=True))
    op.add_column("rollup_members", sa.Column("successes", sa.SmallInteger(), nullable=True))
    op.add_column("rollup_members", sa.Column("outcomes", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollup_members") as batch:
        batch.drop_column("outcomes")
        batch.drop_column("successes")
        batch.drop_column("trials")
