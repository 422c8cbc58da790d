"""store: a partial index of the conversations whose worst finding is high or critical, by severity and time.

``GET /v1/conversations?severity=critical`` (and ``high``, and the console's list) walked every conversation
newest first to find the few that qualify: 150-350 ms at 1M conversations, growing with the table. The
index holds only those conversations, so the writer pays for it on them alone; a rare severity is one range
of it, newest first.

Revision ID: 0017_conversations_severe
Revises: 0016_exported_task_revision
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_conversations_severe"
down_revision = "0016_exported_task_revision"
branch_labels = None
depends_on = None

SEVERE = sa.text("max_severity IN ('high', 'critical')")


def upgrade() -> None:
    op.create_index(
        "ix_conversations_severe",
        "conversations",
        ["max_severity", "received_at"],
        unique=False,
        postgresql_where=SEVERE,
        sqlite_where=SEVERE,
    )


def downgrade() -> None:
    op.drop_index("ix_conversations_severe", table_name="conversations")
