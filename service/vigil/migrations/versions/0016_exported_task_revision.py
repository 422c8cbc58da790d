"""export: ``exported_tasks`` records the revision each task was built from, unique per format, conversation
and revision, so a newer revision reviewers confirm again is exported again by an incremental run.

Rows recorded before take the revision they were exported at: the newest revision labelled among the labels
their run saw (up to its watermark), else the revision stored now. (The stored one alone would mark a newer
revision, confirmed again before this migration ran, as exported: it would never be.) Pending runs'
``records`` gain it the same way. The downgrade keeps the newest revision's row of each format and
conversation.

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
_RUNS = sa.table(
    "export_runs",
    sa.column("id", sa.BigInteger()),
    sa.column("state"),
    sa.column("records", _JSON),
    sa.column("watermark", sa.BigInteger()),
)
_CONVERSATIONS = sa.table("conversations", sa.column("conversation_id"), sa.column("revision"))
_LABELS = sa.table("review_labels", sa.column("id"), sa.column("conversation_id"), sa.column("revision"))
Records = list[list[Any]]  # a pending run's [conversation_id, task_id, group_key, emitted(, revision)]


def _rewrite_pending(change: Callable[[sa.Connection, Records, int], Records]) -> None:
    conn = op.get_bind()
    pending = conn.execute(
        sa.select(_RUNS.c.id, _RUNS.c.records, _RUNS.c.watermark).where(_RUNS.c.state == "pending")
    ).all()
    for run_id, records, watermark in pending:
        if records:
            conn.execute(
                sa.update(_RUNS).where(_RUNS.c.id == run_id).values(records=change(conn, records, watermark or 0))
            )


def _exported_revision(conversation_id: Any, watermark: Any) -> Any:
    """The revision a run exported a conversation at: the newest its labels up to the run's watermark were
    given on (each label records the revision its reviewer read), else the one stored now, else 0."""
    labelled = (
        sa.select(sa.func.max(_LABELS.c.revision))
        .where(_LABELS.c.conversation_id == conversation_id, _LABELS.c.id <= watermark)
        .scalar_subquery()
    )
    stored = (
        sa.select(_CONVERSATIONS.c.revision).where(_CONVERSATIONS.c.conversation_id == conversation_id)
    ).scalar_subquery()
    return sa.func.coalesce(labelled, stored, 0)


def _with_revision(conn: sa.Connection, records: Records, watermark: int) -> Records:
    revision_of = sa.select(_exported_revision(sa.bindparam("cid"), watermark))
    return [[*r[:4], conn.execute(revision_of, {"cid": r[0]}).scalar() or 0] for r in records]


def upgrade() -> None:
    with op.batch_alter_table("exported_tasks") as batch:
        batch.add_column(sa.Column("revision", sa.BigInteger(), nullable=True))
    tasks = sa.table("exported_tasks", sa.column("conversation_id"), sa.column("revision"), sa.column("run_id"))
    watermark = sa.select(_RUNS.c.watermark).where(_RUNS.c.id == tasks.c.run_id).scalar_subquery()
    op.execute(sa.update(tasks).values(revision=_exported_revision(tasks.c.conversation_id, watermark)))
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
    _rewrite_pending(lambda _conn, records, _watermark: [r[:4] for r in records])
