"""reads: a version's newest verdicts by time (compare's protocol of the judges that scored it), and a
partial index of the randomly sampled review items (calibration on sampled labels), so neither read scans
a growing table.

Revision ID: 0010_reads
Revises: 0009_console
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_reads"
down_revision = "0009_console"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_verdicts_version", "verdicts", ["agent_id", "agent_version", "created_at"])
    op.create_index(
        "ix_review_items_sampled",
        "review_items",
        ["conversation_id"],
        postgresql_where=sa.text("sampled IS TRUE"),
        sqlite_where=sa.text("sampled = 1"),
    )


def downgrade() -> None:
    op.drop_index("ix_review_items_sampled", table_name="review_items")
    op.drop_index("ix_verdicts_version", table_name="verdicts")
