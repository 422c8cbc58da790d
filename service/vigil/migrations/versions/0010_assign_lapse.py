"""review stage: when an item was assigned, so an assignment lapses after VIGIL_REVIEW_ASSIGNMENT_HOURS and
claim-next offers the item to everyone again (a reviewer who left no longer holds items for good).

Revision ID: 0010_assign_lapse
Revises: 0010_reads
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_assign_lapse"
down_revision = "0010_reads"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("review_items") as batch:
        batch.add_column(sa.Column("assigned_at", sa.DateTime(timezone=True), nullable=True))
    # items assigned before this column existed: their last change is the best record of when
    op.execute("UPDATE review_items SET assigned_at = updated_at WHERE assignee IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table("review_items") as batch:
        batch.drop_column("assigned_at")
