"""calibration stage: export runs over HTTP stay pending until the client acknowledges the file.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("export_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("state", sa.String(length=16), server_default="done", nullable=False))
        batch_op.add_column(sa.Column("records", _JSON, nullable=True))
        batch_op.add_column(sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("export_runs", schema=None) as batch_op:
        batch_op.drop_column("acknowledged_at")
        batch_op.drop_column("records")
        batch_op.drop_column("state")
