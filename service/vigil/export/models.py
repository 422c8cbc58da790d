"""Export's tables: what was exported, so export is incremental.

``export_runs`` and ``exported_tasks`` make export incremental: a revision of a conversation (or its
near-duplicate group) is exported once per format, and a newer revision confirmed again is exported again.
A run made over HTTP stays ``pending`` (its would-be ``exported_tasks`` rows kept in ``records``) until the
client acknowledges it has the file; only then do its conversations count as exported.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from vigil.store.db import utcnow
from vigil.store.models import ID, Base


class ExportRunRow(Base):
    __tablename__ = "export_runs"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    format: Mapped[str] = mapped_column(String(16))
    since: Mapped[int | None] = mapped_column(BigInteger)  # the watermark asked for, if any
    watermark: Mapped[int] = mapped_column(BigInteger)  # highest review label id this run saw
    tasks: Mapped[int] = mapped_column(Integer)
    grouped: Mapped[int] = mapped_column(Integer)  # confirmed failures folded into an earlier task
    actor: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    state: Mapped[str] = mapped_column(String(16), default="done", server_default="done")  # pending | done
    # pending: [conversation_id, task_id, group_key, emitted, revision] per conversation
    records: Mapped[list[Any] | None]
    acknowledged_at: Mapped[datetime | None]


class ExportedTaskRow(Base):
    __tablename__ = "exported_tasks"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    format: Mapped[str] = mapped_column(String(16))
    conversation_id: Mapped[str] = mapped_column(String(256))
    revision: Mapped[int] = mapped_column(BigInteger)  # the conversation's revision the task was built from
    task_id: Mapped[str] = mapped_column(String(64))
    group_key: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[int] = mapped_column(ID)
    emitted: Mapped[bool] = mapped_column(default=True)  # false: folded into its group's task
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        UniqueConstraint("format", "conversation_id", "revision", name="uq_exported_tasks_revision"),
        Index("ix_exported_tasks_group", "format", "group_key"),
        Index("ix_exported_tasks_conversation", "conversation_id"),  # retention keeps exported conversations
    )
