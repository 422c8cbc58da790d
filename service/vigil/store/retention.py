"""Storage that rolls over: rows older than each table's retention are deleted in small batches.

Kept regardless of age: conversations a reviewer labelled or that sit open in the review queue, and
conversations exported as eval tasks (with their findings, verdicts and outcomes), since review, export and
calibration still read them. An open item nobody labelled, holds, assigned or began to review leaves the
queue ``retention_open_review_days`` after it entered (its reasons, skips and audit events replaced by one
``expired`` audit event, kept ``retention_expired_review_days``: :mod:`vigil.store.review_retention`): with
nobody reviewing, the flagger's share of traffic would otherwise stay queued, and stored, for good.

A conversation's outcomes, judge requests and reviewers' comments go with it; an outcome whose
conversation is not stored (it has not come yet, or was deleted before outcomes went with it) goes
``retention_unjoined_outcomes_days`` after it was received, with the review item that waited for that
conversation. The hourly rollups are never deleted: compare and the charts keep answering for periods
whose raw rows are gone. A conversation deleted here leaves the rollup job's membership too; before
deleting, a run records its cutoff (``rollups.RETAINED``), and hours that began before it, or before this
deployment's retention, are no longer recomputed (:mod:`vigil.store.rollup_job`).

Deletes go by an indexed time column in batches of ``retention_batch_rows`` (each its own transaction),
so a run never holds long locks and any replica may run it at the same time as another. A batch's ids go to
Postgres as one array (``db.among``), not a parameter each: building and parsing statements of thousands
of parameters held the interpreter for half a run, and ``serve`` runs retention in a thread beside its
requests.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, column, delete, exists, func, or_, select, table, tuple_
from sqlalchemy.orm import Session, sessionmaker

from vigil.metrics import Metrics
from vigil.settings import Settings
from vigil.store.db import among, aware, clock, upsert
from vigil.store.models import (
    ConversationRow,
    DeadLetterRow,
    FindingRow,
    OutcomeLinkRow,
    OutcomeRow,
    ReviewItemRow,
    ReviewLabelRow,
    VerdictRow,
)
from vigil.store.review_retention import (
    AUDIT,
    REASONS,
    expire_open_items,
    expired_records,
    not_a_record,
    release_assignments,
    stale_assignment,
    unreviewed,
)
from vigil.store.rollups import RETAINED, RollupMemberRow, RollupStateRow

log = logging.getLogger(__name__)

# written by the export stage; named here only to keep what it exported
EXPORTED = table("exported_tasks", column("conversation_id"))
# written by the judge stage; named here only to delete a deleted conversation's requests
JUDGE_REQUESTS = table("judge_requests", column("conversation_id"))
# written by the review stage; named here only to delete a deleted conversation's reviewers' comments
COMMENTS = table("review_comments", column("conversation_id"))

UNJOINED = "retention_unjoined_outcomes"
"""The ``rollup_state`` row whose watermark is the cutoff of the last completed unjoined-outcome pass: the
next one walks only the outcomes received since (those past it were deleted, or are joined and go with
their conversation)."""


def cutoff(days: float, now: datetime) -> datetime | None:
    """Rows older than this are past a retention of ``days`` (None: kept forever). A retention reaching
    before the year 1 (``1e6`` days, ``inf``) keeps everything too, as no stored time is that old."""
    if days <= 0:
        return None
    try:
        return now - timedelta(days=days)
    except OverflowError:
        return None


def frozen_before(settings: Settings, now: datetime) -> datetime | None:
    """Hours before this may have lost raw rows: the rollup job no longer recomputes them (``now``: the
    database's clock, which retention cuts off by)."""
    return cutoff(settings.retention_conversations_days, now)


def kept(conversation_id: Any) -> ColumnElement[bool]:
    """A conversation review, export or calibration still needs."""
    return kept_where(lambda col: col == conversation_id)


def kept_where(matches: Callable[[Any], ColumnElement[bool]], waiting: bool = True) -> ColumnElement[bool]:
    """Any conversation ``matches`` picks (given a table's conversation id column) is one review, export or
    calibration still needs: labelled, queued and open, or exported. ``waiting=False`` leaves out the open
    items still waiting for their conversation (nobody can review those)."""
    L, I = ReviewLabelRow, ReviewItemRow  # noqa: E741
    open_item = (I.status == "open",) if waiting else (I.status == "open", I.agent_id.is_not(None))
    return or_(
        exists().where(matches(L.conversation_id)),
        exists().where(matches(I.conversation_id), *open_item),
        exists().where(matches(EXPORTED.c.conversation_id)),
    )


@dataclass(slots=True)
class RetentionResult:
    dry_run: bool = False
    deleted: dict[str, int] = field(default_factory=dict)
    cutoffs: dict[str, datetime | None] = field(default_factory=dict)
    released: dict[str, int] = field(default_factory=dict)  # rows changed, not deleted (assignments)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "deleted": self.deleted,
            "released": self.released,
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
        return len(s.scalars(delete(model).where(among(s, key, keys), *still).returning(key)).all())

    return remove


def _record_cutoff(sessions: sessionmaker[Session], at: datetime, now: datetime, name: str = RETAINED) -> None:
    """Keep the newest cutoff any run deleted conversations before, committed ahead of the first delete:
    the rollup job freezes the hours before it. Its own settings' cutoff is not enough: a run by hand with
    a shorter retention, a clock running ahead, or the part of the cutoff's hour already deleted. (The
    unjoined-outcome pass keeps its own, ``UNJOINED``, once it has walked up to it.)"""
    with sessions.begin() as s:
        table = RollupStateRow.__table__
        ins = upsert(s, table)
        newest = func.greatest if s.get_bind().dialect.name == "postgresql" else func.max
        s.execute(
            ins.on_conflict_do_update(
                index_elements=["name"],
                set_={"watermark": newest(table.c.watermark, ins.excluded.watermark), "updated_at": now},
            ),
            [{"name": name, "watermark": at, "updated_at": now}],
        )


def _drop_conversations(at: datetime) -> Any:
    C = ConversationRow

    def remove(s: Session, ids: list[str]) -> int:
        gone = list(
            s.scalars(
                delete(C)
                .where(among(s, C.conversation_id, ids), C.received_at < at, ~kept(C.conversation_id))
                .returning(C.conversation_id)
            )
        )
        # The DELETE waited for whoever held a conversation's row (the flagger locks what it enqueues) and
        # then deleted it without seeing the item it committed: this statement sees it.
        postgres = s.get_bind().dialect.name == "postgresql"
        if gone and postgres and s.scalar(select(kept_where(lambda col: among(s, col, gone)))):
            raise _KeptMeanwhile
        if gone:
            for model in (FindingRow, OutcomeRow, OutcomeLinkRow, RollupMemberRow):
                s.execute(delete(model).where(among(s, model.conversation_id, gone)))
            for hanging in (JUDGE_REQUESTS, COMMENTS):
                s.execute(delete(hanging).where(among(s, hanging.c.conversation_id, gone)))
        return len(gone)

    return remove


def _unjoined() -> ColumnElement[bool]:
    """The outcome's conversation is not stored, and no reviewer labelled it, nor export exported it."""
    O = OutcomeRow  # noqa: E741
    return and_(
        ~exists().where(ConversationRow.conversation_id == O.conversation_id),
        ~kept_where(lambda col: col == O.conversation_id, waiting=False),
    )


def _drop_unjoined(s: Session, ids: list[int]) -> int:
    """Delete the outcomes of ``ids`` that are still unjoined, and the items left waiting for their conversation."""
    O, I, C = OutcomeRow, ReviewItemRow, ConversationRow  # noqa: E741
    gone = sorted(set(s.scalars(delete(O).where(among(s, O.id, ids), _unjoined()).returning(O.conversation_id))))
    if not gone:
        return 0
    # A conversation stored meanwhile joined these outcomes in a transaction this DELETE could not see;
    # this statement sees it once committed: undo the batch (it is picked again without them).
    postgres = s.get_bind().dialect.name == "postgresql"
    if postgres and s.scalar(select(exists().where(among(s, C.conversation_id, gone)))):
        raise _KeptMeanwhile
    waited = list(
        s.scalars(
            delete(I)
            .where(
                among(s, I.conversation_id, gone),
                I.agent_id.is_(None),
                I.status == "open",
                ~exists().where(O.conversation_id == I.conversation_id),  # an outcome still waits with it
                ~exists().where(C.conversation_id == I.conversation_id),
            )
            .returning(I.conversation_id)
        )
    )
    if waited:
        s.execute(delete(REASONS).where(among(s, REASONS.c.conversation_id, waited)))
        s.execute(delete(AUDIT).where(among(s, AUDIT.c.conversation_id, waited), not_a_record()))
    return len(gone)


def _unjoined_outcomes(sessions: sessionmaker[Session], at: datetime, now: datetime, batch: int, dry_run: bool) -> int:
    """Delete the outcomes received before ``at`` whose conversation is not stored. Walks only those received
    since the last completed pass's cutoff, in (received_at, id) order: the joined ones it passes are left
    to go with their conversation, so a pass reads what crossed the cutoff since, not every older outcome."""
    O = OutcomeRow  # noqa: E741
    with sessions() as s:
        since = aware(s.scalar(select(RollupStateRow.watermark).where(RollupStateRow.name == UNJOINED)))
    window = [O.received_at < at] + ([O.received_at >= since] if since is not None else [])
    if dry_run:
        with sessions() as s:
            return int(s.scalar(select(func.count()).select_from(O).where(*window, _unjoined())) or 0)
    total, after = 0, None
    while True:
        pick = select(O.received_at, O.id).where(*window)
        if after is not None:
            pick = pick.where(tuple_(O.received_at, O.id) > tuple_(*after))
        try:
            with sessions.begin() as s:
                keys = s.execute(pick.order_by(O.received_at, O.id).limit(batch)).all()
                deleted = _drop_unjoined(s, [k.id for k in keys]) if keys else 0
        except _KeptMeanwhile:
            continue
        total += deleted
        if len(keys) < batch:
            break
        after = tuple(keys[-1])
    _record_cutoff(sessions, at, now, UNJOINED)
    return total


def run(
    sessions: sessionmaker[Session],
    settings: Settings,
    dry_run: bool = False,
    now: datetime | None = None,
    metrics: Metrics | None = None,
) -> RetentionResult:
    """Delete what is past retention (``vigil retention run``; also periodically in serve and detector), after
    releasing review assignments nobody acted on for ``review_assignment_timeout_hours``.

    ``now`` (tests) defaults to the database's clock, as review leases are written by: run on a host whose
    clock ran ahead, an old open item a reviewer held looked free, and went with its conversation."""
    if now is None:
        with sessions() as s:
            now = clock(s)
    batch = settings.retention_batch_rows
    out = RetentionResult(dry_run=dry_run)
    C, F, V, D, I = ConversationRow, FindingRow, VerdictRow, DeadLetterRow, ReviewItemRow  # noqa: E741
    pick: Any

    # first: an assignment released here no longer keeps its item from expiring below
    if (at := cutoff(settings.review_assignment_timeout_hours / 24, now)) is not None:
        pick = select(I.id).where(*stale_assignment(at, now))
        release = release_assignments(at, now, settings.review_assignment_timeout_hours)
        out.released["assignments"] = n = _batches(sessions, pick, release, batch, dry_run)
        if metrics is not None and not dry_run:
            metrics.review_assignments_timed_out.inc(n)

    # then: the conversations of the items that leave the queue go by the conversations' retention below
    if (at := cutoff(settings.retention_open_review_days, now)) is not None:
        pick = select(I.id).where(*unreviewed(at, now))
        expire = expire_open_items(at, now, settings.retention_open_review_days)
        out.deleted["open_review_items"] = _batches(sessions, pick, expire, batch, dry_run)
    out.cutoffs["open_review_items"] = at

    if (at := cutoff(settings.retention_expired_review_days, now)) is not None:
        pick = select(AUDIT.c.id).where(*expired_records(at))
        remove = _deleting(AUDIT, AUDIT.c.id, *expired_records(at))
        out.deleted["expired_review_records"] = _batches(sessions, pick, remove, batch, dry_run)
    out.cutoffs["expired_review_records"] = at

    if (at := cutoff(settings.retention_conversations_days, now)) is not None:
        pick = select(C.conversation_id).where(C.received_at < at, ~kept(C.conversation_id))
        if not dry_run:
            _record_cutoff(sessions, at, now)
        out.deleted["conversations"] = _batches(sessions, pick, _drop_conversations(at), batch, dry_run)
    out.cutoffs["conversations"] = at

    if (at := cutoff(settings.retention_unjoined_outcomes_days, now)) is not None:
        out.deleted["unjoined_outcomes"] = _unjoined_outcomes(sessions, at, now, batch, dry_run)
    out.cutoffs["unjoined_outcomes"] = at

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
    if any(out.deleted.values()) or any(out.released.values()):
        log.info("retention%s: deleted %s, released %s", " (dry run)" if dry_run else "", out.deleted, out.released)
    return out
