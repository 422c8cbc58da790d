"""Export's part of an erasure: the record of what was exported, and the conversation in a pending run's records.

Files already written and downloaded are outside Vigil: an erasure cannot reach them (docs/erasure.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from vigil.export.models import ExportedTaskRow, ExportRunRow
from vigil.store.db import among
from vigil.store.erasure import removed


def erase_exports(session: Session, conversation_ids: Sequence[str]) -> dict[str, int]:
    """``Hooks.erasers`` entry: deletes the exported-task rows of ``conversation_ids`` and takes them out of the
    records a pending (unacknowledged) run keeps until its download is acknowledged."""
    T = ExportedTaskRow
    gone = set(conversation_ids)
    tasks = removed(session, delete(T).where(among(session, T.conversation_id, list(gone))))
    changed = 0
    for run in session.scalars(select(ExportRunRow).where(ExportRunRow.state == "pending")):
        kept = [r for r in run.records or [] if r[0] not in gone]
        if len(kept) != len(run.records or []):
            run.records = kept
            changed += 1
    session.flush()
    return {T.__tablename__: tasks, ExportRunRow.__tablename__: changed}
