"""store: erasing a conversation on request. ``erasures`` records each erasure without its content (who, when,
the SHA-256 of the conversation id, the rows removed per table); ``erased_conversations`` keeps the hash of
each id erased with a tombstone, by which ingest drops the conversation if it is sent again.

Revision ID: 0024_erasures
Revises: 0023_dead_letter_query
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0024_erasures"
down_revision = "0023_dead_letter_query"
branch_labels = None
depends_on = None


def upgrade() -> None:
    json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    op.create_table(
        "erasures",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("conversation_hash", sa.String(64), nullable=False),
        sa.Column("counts", json, nullable=False),
        sa.Column("tombstone", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_erasures_hash", "erasures", ["conversation_hash"])
    op.create_table(
        "erased_conversations",
        sa.Column("conversation_hash", sa.String(64), primary_key=True),
        sa.Column("erased_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("erased_conversations")
    op.drop_index("ix_erasures_hash", table_name="erasures")
    op.drop_table("erasures")
