"""store: ``dead_letters.replayed_at`` records when ``POST /v1/dead-letters/{id}/replay`` (``vigil dead-letters
replay``) fed the letter's raw bytes back through its intake and they were taken. The letter is kept, marked,
so on-call sees what was re-sent and retention removes it as any other.

Rows written before keep it NULL: never re-sent.

Revision ID: 0022_dead_letter_replayed
Revises: 0021_detector_feeds
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022_dead_letter_replayed"
down_revision = "0021_detector_feeds"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dead_letters", sa.Column("replayed_at", sa.DateTime(timezone=True), nullable=True))
    # the newest letters of one reason, which re-sending them by reason reads
    op.create_index("ix_dead_letters_reason", "dead_letters", ["reason", "id"])


def downgrade() -> None:
    op.drop_index("ix_dead_letters_reason", table_name="dead_letters")
    with op.batch_alter_table("dead_letters") as batch:
        batch.drop_column("replayed_at")
