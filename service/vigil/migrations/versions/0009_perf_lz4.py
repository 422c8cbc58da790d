"""store: compress conversation documents with lz4 on Postgres (pglz cost a fifth of the write path's CPU).

Only values written from now on use lz4; stored ones keep pglz until rewritten (both read the same).
A Postgres built without lz4 keeps pglz. SQLite has no column compression: nothing to do.

Revision ID: 0009_perf_lz4
Revises: 0008
"""

from __future__ import annotations

from alembic import op

revision = "0009_perf_lz4"
down_revision = "0008"
branch_labels = None
depends_on = None


def _postgres_with_lz4() -> bool:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return False
    methods = bind.exec_driver_sql(
        "SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'"
    ).scalar()  # absent before Postgres 14
    return "lz4" in (methods or [])


def upgrade() -> None:
    if _postgres_with_lz4():
        op.execute("ALTER TABLE conversations ALTER COLUMN document SET COMPRESSION lz4")


def downgrade() -> None:
    if _postgres_with_lz4():
        op.execute("ALTER TABLE conversations ALTER COLUMN document SET COMPRESSION DEFAULT")
