"""detector: ``detector_feeds`` records what each conversation was fed to the statistics and the hourly counts
as (revision, agent version, hour, failed signals, the hour its outcomes counted in), so a newer revision
corrects that instead of counting the conversation again; ``detector_lease.fed_since`` says where the
record begins.

The table starts empty and ``fed_since`` NULL: the detector's next pass sets it to its cursor, recounts the
hour the cursor is in and records conversations from there on. A conversation fed before the upgrade and
revised after it counts once more (nothing says what it was fed as).

Revision ID: 0021_detector_feeds
Revises: 0020_judge_requests_conversation
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0021_detector_feeds"
down_revision = "0020_judge_requests_conversation"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "detector_feeds",
        sa.Column("conversation_id", sa.String(length=256), nullable=False),
        sa.Column("agent_id", sa.String(length=256), nullable=False),
        sa.Column("agent_version", sa.String(length=128), nullable=False),
        sa.Column("revision", sa.BigInteger(), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("failed", _JSON, nullable=True),
        sa.Column("outcome_hour", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("conversation_id"),
    )
    op.create_index("ix_detector_feeds_hour", "detector_feeds", ["hour"], unique=False)
    op.add_column("detector_lease", sa.Column("fed_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("detector_lease") as batch:
        batch.drop_column("fed_since")
    op.drop_index("ix_detector_feeds_hour", table_name="detector_feeds")
    op.drop_table("detector_feeds")
