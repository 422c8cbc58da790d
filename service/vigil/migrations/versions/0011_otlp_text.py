"""tracing: OTLP spans and log records kept as JSON text on Postgres, lz4-compressed where it has lz4.

They are written on every export and only ever read back whole, so Postgres need not parse them into
``jsonb`` (which, with pglz, cost the database four times what native ingest of the same conversations
costs it). SQLite stores JSON as text already: nothing to do there.

Revision ID: 0011_otlp_text
Revises: 0010_assign_lapse
"""

from __future__ import annotations

from alembic import op

revision = "0011_otlp_text"
down_revision = "0010_assign_lapse"
branch_labels = None
depends_on = None

COLUMNS = (("otel_spans", "span"), ("otel_events", "event"))


def _postgres() -> bool:
    return bool(op.get_bind().dialect.name == "postgresql")


def _has_lz4() -> bool:
    methods = (
        op.get_bind().exec_driver_sql("SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'")
    ).scalar()  # absent before Postgres 14
    return "lz4" in (methods or [])


def upgrade() -> None:
    if not _postgres():
        return
    lz4 = _has_lz4()
    for table, column in COLUMNS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE text USING {column}::text")
        if lz4:
            op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION lz4")


def downgrade() -> None:
    if not _postgres():
        return
    lz4 = _has_lz4()
    for table, column in COLUMNS:
        if lz4:
            op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION DEFAULT")
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE jsonb USING {column}::jsonb")
