"""review stage: trigram indexes (pg_trgm, Postgres only) for the queue's text search, so a search reads
the matching conversations' index entries instead of every stored document.

The search is ``ILIKE '%term%'`` on the conversation's task id and its stored document (and on the item's
own conversation id, which its unique index serves: ids are short); a GIN index of trigrams serves such
a pattern of three characters or more. Where ``CREATE EXTENSION pg_trgm`` is not permitted the migration
logs so and creates nothing: the search still works, scanning as before. On a large database create the
indexes ``CONCURRENTLY`` beforehand (docs/scaling.md): the migration keeps indexes that already exist.

Revision ID: 0011_search_trgm
Revises: 0010_assign_lapse
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

revision = "0011_search_trgm"
down_revision = "0010_assign_lapse"
branch_labels = None
depends_on = None

log = logging.getLogger("vigil.migrations")

# (index, table, column): what the queue search matches with ILIKE
INDEXES = (
    ("ix_conversations_task_trgm", "conversations", "task_id"),
    ("ix_conversations_document_trgm", "conversations", "document"),
)


def _trigrams(bind: sa.Connection) -> bool:
    """pg_trgm is there or could be created; False (logged) when this role may not create it."""
    try:
        with bind.begin_nested():  # a refusal aborts only the savepoint, not the migration
            bind.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except sa.exc.DBAPIError as exc:
        log.warning(
            "pg_trgm is not available (%s): the review queue's text search keeps scanning conversations; "
            "install it (CREATE EXTENSION pg_trgm, as a role allowed to) and run this migration again",
            str(exc.orig).strip().splitlines()[0] if exc.orig else exc,
        )
        return False
    return True


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql" or not _trigrams(bind):
        return
    for name, table, column in INDEXES:
        op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {table} USING gin ({column} gin_trgm_ops)")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, _table, _column in INDEXES:
        op.execute(f"DROP INDEX IF EXISTS {name}")
