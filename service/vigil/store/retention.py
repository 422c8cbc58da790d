"""Storage that rolls over: rows older than each table's retention are deleted in small batches.

Kept regardless of age: conversations a reviewer labelled or that sit open in the review queue, and
conversations exported as eval tasks (with their findings and verdicts), since review, export and
calibration still read them. The hourly rollups are never deleted: compare and the charts keep
answering for periods whose raw rows are gone. A conversation deleted here leaves the rollup job's
membership too; before deleting, a run records its cutoff (``rollups.RETAINED``), and hours that began
before it, or before this deployment's retention, are no longer recomputed (:mod:`vigil.store.rollup_job`).

Deletes go by an indexed time column in batches of ``retention_batch_rows`` (each its own transaction),
so a run never holds long locks and any replica may run it at the same time as another.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, column, delete, exists, func, or_, select, table
from sqlalchemy.orm import Session, sessionmaker

from vigil.settings import Settings
from vigil.store.db import among, upsert
from vigil.store.models import (
    ConversationRow,
    DeadLetterRow,
    FindingRow,
    OutcomeLinkRow,
    ReviewItemRow,
    ReviewLabelRow,
    VerdictRow,
)
from vigil.store.rollups import RETAINED, RollupMemberRow, RollupStateRow

log = logging.getLogger(__name__)

# written by the export stage; named here only to keep what it exported
EXPORTED = table("exported_tasks", column("conversation_id"))


def cutoff(days: float, now: datetime) -> datetime | None:
    """Rows older than this are past a retention of ``days`` (None: kept forever). A retention reaching
    before the year 1 (``1e6`` days, ``inf``) keeps everything too, as no stored time is that old."""
    if days <= 0:
        return None
    try:
        return now - timedelta(days=days)
    except OverflowError:
        return None


def frozen_before(settings: Settings, now: datetime | None = None) -> datetime | None:
    """Hours before this may have lost raw rows: the rollup job no longer recomputes them."""
    return cutoff(settings.retention_conversations_days, now or datetime.now(UTC))


def kept(conversation_id: Any) -> ColumnElement[bool]:
    """A conversation review, export or calibration still needs."""
    return kept_where(lambda col: col == conversation_id)


def kept_where(matches: Callable[[Any], ColumnElement[bool]]) -> ColumnElement[bool]:
    """Any conversation ``matches`` picks (given a table's conversation id column) is one review, export or
    calibration still needs: labelled, queued and open, or exported."""
    L, I = ReviewLabelRow, ReviewItemRow  # noqa: E741
    return or_(
        exists().where(matches(L.conversation_id)),
        exists().where(matches(I.conversation_id), I.status == "open"),
        exists().where(matches(EXPORTED.c.conversation_id)),
    )


@dataclass(slots=True)
class RetentionResult:
    dry_run: bool = False
    deleted: dict[str, int] = field(default_factory=dict)
    cutoffs: dict[str, datetime | None] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "deleted": self.deleted,
            "cutoffs": {k: v.isoformat() if v else None for k, v in self.cutoffs.items()},
        }


class _KeptMeanwhile(Exception):
    """A conversation of the batch was enqueued or labelled while its DELETE ran: the batch is undone."""


def _batches(sessions: sessionmaker[Session], pick: Any, remove: Any, batch: int, dry_run: bool) -> int:
    """Select up to ``batch`` keys with ``pick``, delete them with ``remove`` (which deletes only those that
    still match, and says how many); repeat until none are left. Returns the rows deleted. A batch undone by
    ``remove`` is picked again (without what is kept now)."""
    total = 0
    while True:
        try:
            with sessions.begin() as s:
                keys = list(s.scalars(pick.limit(batch)))
                if not keys:
                    return total
                if dry_run:  # count every match without deleting (one bounded pass per batch)
                    return total + int(s.scalar(select(func.count()).select_from(pick.subquery())) or 0)
                deleted = remove(s, keys)
        except _KeptMeanwhile:
            continue
        total += deleted
        if len(keys) < batch:
            return total


def _deleting(model: Any, key: Any, *still: ColumnElement[bool]) -> Any:
    """``remove`` for ``_batches``: deletes the picked keys that match ``still`` when the DELETE runs.
    The pick and the delete are two statements: between them a reviewer may enqueue or label a picked
    conversation, or another replica may delete it; checking again in the DELETE keeps the first and
    counts the second once."""

    def remove(s: Session, keys: list[Any]) -> int:
        return len(s.scalars(delete(model).where(key.in_(keys), *still).returning(key)).all())

    return remove


def _record_cutoff(sessions: sessionmaker[Session], at: datetime, now: datetime) -> None:
    """Keep the newest cutoff any run deleted conversations before, committed ahead of the first delete:
    the rollup job freezes the hours before it. Its own settings' cutoff is not enough: a run by hand with
    a shorter retention, a clock running ahead, or the part of the cutoff's hour already deleted."""
    with sessions.begin() as s:
        table = RollupStateRow.__table__
        ins = upsert(s, table)
        newest = func.greatest if s.get_bind().dialect.name == "postgresql" else func.max
        s.execute(
            ins.on_conflict_do_update(
                index_elements=["name"],
                set_={"watermark": newest(table.c.watermark, ins.excluded.watermark), "updated_at": now},
            ),
            [{"name": RETAINED, "watermark": at, "updated_at": now}],
        )


def _drop_conversations(at: datetime) -> Any:
    C = ConversationRow

    def remove(s: Session, ids: list[str]) -> int:
        gone = list(
            s.scalars(
                delete(C)
                .where(C.conversation_id.in_(ids), C.received_at < at, ~kept(C.conversation_id))
                .returning(C.conversation_id)
            )
        )
        # The DELETE waited for whoever held a conversation's row (the flagger locks what it enqueues) and
        # then deleted it without seeing the item it committed: this statement sees it.
        postgres = s.get_bind().dialect.name == "postgresql"
        if gone and postgres and s.scalar(select(kept_where(lambda col: among(s, col, gone)))):
            raise _KeptMeanwhile
        if gone:
            for model in (FindingRow, OutcomeLinkRow, RollupMemberRow):
                s.execute(delete(model).where(model.conversation_id.in_(gone)))
        return len(gone)

    return remove


def run(
    sessions: sessionmaker[Session], settings: Settings, dry_run: bool = False, now: datetime | None = None
) -> RetentionResult:
    """Delete what is past retention (``vigil retention run``; also periodically in serve and detector)."""
    now = now or datetime.now(UTC)
    batch = settings.retention_batch_rows
    out = RetentionResult(dry_run=dry_run)
    C, F, V, D = ConversationRow, FindingRow, VerdictRow, DeadLetterRow
    pick: Any

    if (at := cutoff(settings.retention_conversations_days, now)) is not None:
        pick = select(C.conversation_id).where(C.received_at < at, ~kept(C.conversation_id))
        if not dry_run:
            _record_cutoff(sessions, at, now)
        out.deleted["conversations"] = _batches(sessions, pick, _drop_conversations(at), batch, dry_run)
    out.cutoffs["conversations"] = at

    if (at := cutoff(settings.retention_findings_days, now)) is not None:
        pick = select(F.id).where(F.created_at < at, ~kept(F.conversation_id))
        remove = _deleting(F, F.id, ~kept(F.conversation_id))
        out.deleted["findings"] = _batches(sessions, pick, remove, batch, dry_run)
    out.cutoffs["findings"] = at

    if (at := cutoff(settings.retention_verdicts_days, now)) is not None:
        pick = select(V.id).where(V.created_at < at, ~kept(V.conversation_id))
        remove = _deleting(V, V.id, ~kept(V.conversation_id))
        out.deleted["verdicts"] = _batches(sessions, pick, remove, batch, dry_run)
    out.cutoffs["verdicts"] = at

    if (at := cutoff(settings.retention_dead_letters_days, now)) is not None:
        pick = select(D.id).where(D.created_at < at)
        out.deleted["dead_letters"] = _batches(sessions, pick, _deleting(D, D.id), batch, dry_run)
    out.cutoffs["dead_letters"] = at
    if any(out.deleted.values()):
        log.info("retention%s: %s", " (dry run)" if dry_run else "", out.deleted)
    return out
