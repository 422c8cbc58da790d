"""store: outcomes by the time they were received, for retention.

Retention never deleted an outcome: those of deleted conversations and those whose conversation never
came stayed forever (0.42 rows per conversation stored). It now deletes them with their conversation, and
walks the outcomes that passed the unjoined-outcome cutoff since its last run along this index.

Revision ID: 0018_outcomes_received
Revises: 0017_conversations_severe
"""

from __future__ import annotations

from alembic import op

revision = "0018_outcomes_received"
down_revision = "0017_conversations_severe"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_outcomes_received", "outcomes", ["received_at", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_outcomes_received", table_name="outcomes")
