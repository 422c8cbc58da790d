"""store: a dead-letter row of Kafka messages records the last offset it holds (``last_offset``), so a
topic read again (another consumer group, other batch sizes) records and counts no bad message twice.

Rows written before keep it NULL: they count as holding their first offset only.

Revision ID: 0015_dead_letter_last_offset
Revises: 0014_otel_conversation_traces
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_dead_letter_last_offset"
down_revision = "0014_otel_conversation_traces"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dead_letters", sa.Column("last_offset", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dead_letters") as batch:
        batch.drop_column("last_offset")
