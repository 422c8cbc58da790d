"""console: review items by when they entered the queue, so the home page counts a window's flagged
conversations per agent version from the index alone (no scan of the queue's history).

Revision ID: 0009_console
Revises: 0008
"""

from __future__ import annotations

from alembic import op

revision = "0009_console"
down_revision = "0009_triage"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_review_items_created", "review_items", ["created_at", "agent_id", "agent_version"])


def downgrade() -> None:
    op.drop_index("ix_review_items_created", table_name="review_items")
