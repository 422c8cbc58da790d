"""store: ``dead_letters.query`` keeps the query parameters the intake read of the request whose body a letter
holds (``format``, ``agent_id``, ``agent_version`` of ``POST /v1/conversations?format=...``), URL-encoded, so
``POST /v1/dead-letters/{id}/replay`` reads the body as it was sent instead of as Vigil's own schema.

Rows written before keep it NULL: re-sent without parameters, as before.

Revision ID: 0023_dead_letter_query
Revises: 0022_dead_letter_replayed
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023_dead_letter_query"
down_revision = "0022_dead_letter_replayed"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dead_letters", sa.Column("query", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("dead_letters") as batch:
        batch.drop_column("query")
