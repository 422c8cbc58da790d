"""export: ``exported_tasks`` records the revision each task was built from, unique per format, conversation
and revision, so a newer revision reviewers confirm again is exported again by an incremental run.

Rows recorded before take the revision stored when this migration runs (the one they were exported at,
unless a newer revision arrived since); pending runs' ``records`` gain it the same way. The downgrade keeps
the newest revision's row of each format and conversation.

Revision ID: 0016_exported_task_revision
Revises: 0015_dead_letter_last_offset
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016_exported_task_revision"
down_revision = "0015_dead_letter_last_offset"
branch_labels = None
depends_on = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
_RUNS = sa.table("export_runs", sa.column("id", sa.BigInteger()), sa.column("state"), sa.column("records", _JSON))
_CONVERSATIONS = sa.table("conversations", sa.column("conversation_id"), sa.column("revision"))
Records = list[list[Any]]  # a pending run's [conversation_id, task_id, group_key, emitted(, revision)]


def _rewrite_pending(change: Callable[[sa.Connection, Records], Records]) -> None:
    conn = op.get_bind()
    pending = conn.execute(sa.select(_RUNS.c.id, _RUNS.c.records).where(_RUNS.c.state == "pending")).all()
    for run_id, records in pending:
        if records:
            conn.execute(sa.update(_RUNS).where(_RUNS.c.id == run_id).values(records=change(conn, records)))


def _with_revision(conn: sa.Connection, records: Records) -> Records:
    revision_of = sa.select(_CONVERSATIONS.c.revision).where(_CONVERSATIONS.c.conversation_id == sa.bindparam("cid"))
    return [[*r[:4], conn.execute(revision_of, {"cid": r[0]}).scalar() or 0] for r in records]


def upgrade() -> None:
    with op.batch_alter_table("exported_tasks") as batch:
        batch.add_column(sa.Column("revision", sa.BigInteger(), nullable=True))
    tasks = sa.table("exported_tasks", sa.column("conversation_id"), sa.column("revision"))
    stored = (
        sa.select(_CONVERSATIONS.c.revision)
        .where(_CONVERSATIONS.c.conversation_id == tasks.c.conversation_id)
        .scalar_subquery()
    )
    op.execute(sa.update(tasks).values(revision=sa.func.coalesce(stored, 0)))
    with op.batch_alter_table("exported_tasks") as batch:
        batch.alter_column("revision", existing_type=sa.BigInteger(), nullable=False)
        batch.drop_constraint("uq_exported_tasks_once", type_="unique")
        batch.create_unique_constraint("uq_exported_tasks_revision", ["format", "conversation_id", "revision"])
    _rewrite_pending(_with_revision)


def downgrade() -> None:
    op.execute(
        "DELETE FROM exported_tasks WHERE EXISTS (SELECT 1 FROM exported_tasks newer "
        "WHERE newer.format = exported_tasks.format AND newer.conversation_id = exported_tasks.conversation_id "
        "AND newer.revision > exported_tasks.revision)"
    )
    with op.batch_alter_table("exported_tasks") as batch:
        batch.drop_constraint("uq_exported_tasks_revision", type_="unique")
        batch.create_unique_constraint("uq_exported_tasks_once", ["format", "conversation_id"])
        batch.drop_column("revision")
    _rewrite_pending(lambda _conn, records: [r[:4] for r in records])
