"""How the review queue ages out, for the retention job (:mod:`vigil.store.retention`).

An open item nobody labelled, holds, is assigned or began to review leaves the queue
``retention_open_review_days`` after it entered. Its reasons, skips and audit events go with it (a reviewer
may have extended a lease a hundred times: the events of an item have no bound), and one ``expired`` audit
event stays in their place: the item's reasons, when it was flagged and expired, how many events of each
action it had and who acted on it. That record is a row of a few hundred bytes per expired item, and goes in
its turn ``retention_expired_review_days`` after the item expired.

An assignment nobody acts on (no claim, comment, label, skip or other event of the assignee on the item) for
``review_assignment_timeout_hours`` is released: the item goes back to the pool with an ``assignment_timeout``
event, and can expire as any other.

The review stage owns these tables; they are named here only to keep their history when retention deletes.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, column, delete, exists, func, insert, or_, select, table, update
from sqlalchemy.orm import Session
from sqlalchemy.types import DateTime, Integer, String

from vigil.store.db import among, aware
from vigil.store.models import JsonType, ReviewItemRow, ReviewLabelRow

REASONS = table("review_reasons", column("conversation_id"), column("kind"), column("key"))
SKIPS = table("review_skips", column("conversation_id"))
AUDIT = table(
    "review_audit",
    column("id", Integer),
    column("at", DateTime(timezone=True)),
    column("actor", String),
    column("action", String),
    column("conversation_id", String),
    column("detail", JsonType),
)

ACTOR = "retention"
"""The actor of the events retention writes: its own, so deleting old records reads an index range of them
(``ix_review_audit_actor``), not every system event."""
EXPIRED = "expired"
TIMED_OUT = "assignment_timeout"
SYSTEM_ACTORS = ("vigil", ACTOR)  # the flagger's and retention's events: nobody looked at the item
MAX_LISTED = 20  # reasons and reviewers an expired record names (the counts stay whole)


def not_a_record() -> ColumnElement[bool]:
    """An audit event other than an ``expired`` record: a conversation queued again after its item expired
    may expire again, and each record stays until its own retention."""
    return ~and_(AUDIT.c.actor == ACTOR, AUDIT.c.action == EXPIRED)


def unreviewed(at: datetime, now: datetime) -> list[ColumnElement[bool]]:
    """An item open in the queue since before ``at`` whose conversation is stored, that no reviewer labelled
    (any version, of any revision), began a multiple review of, holds now (a lease that ran out holds
    nothing), or is assigned to. An assignment is a person's decision that someone should look at the item:
    it keeps the item after it lapsed for claim-next (``review_assignment_hours`` only opens it to everyone),
    until it is unassigned, or released after ``review_assignment_timeout_hours`` without activity."""
    I, L = ReviewItemRow, ReviewLabelRow  # noqa: E741
    return [
        I.status == "open",
        I.created_at < at,
        I.agent_id.is_not(None),
        I.review_count == 0,
        I.assignee.is_(None),
        or_(I.claimed_by.is_(None), I.lease_until < now),
        ~exists().where(L.conversation_id == I.conversation_id),
    ]


def expire_open_items(at: datetime, now: datetime, days: float) -> Any:
    """``remove`` for the retention job's batches: deletes the picked items still unreviewed (a reviewer may
    have claimed or labelled one since the pick: the DELETE checks again) and what hangs off them, and writes
    each one's ``expired`` record, in the same transaction."""
    I = ReviewItemRow  # noqa: E741

    def remove(s: Session, ids: list[int]) -> int:
        gone = s.execute(
            delete(I).where(among(s, I.id, ids), *unreviewed(at, now)).returning(I.conversation_id, I.created_at)
        ).all()
        if not gone:
            return 0
        cids = [g.conversation_id for g in gone]
        records = _records(s, cids)
        for hanging in (REASONS, SKIPS):
            s.execute(delete(hanging).where(among(s, hanging.c.conversation_id, cids)))
        s.execute(delete(AUDIT).where(among(s, AUDIT.c.conversation_id, cids), not_a_record()))
        s.execute(
            insert(AUDIT),
            [
                {
                    "at": now,
                    "actor": ACTOR,
                    "action": EXPIRED,
                    "conversation_id": g.conversation_id,
                    "detail": {
                        "flagged_at": aware(g.created_at).isoformat(),
                        "expired_at": now.isoformat(),
                        "after_days": days,
                        **records[g.conversation_id],
                    },
                }
                for g in gone
            ],
        )
        return len(gone)

    return remove


def _records(s: Session, cids: list[str]) -> dict[str, dict[str, Any]]:
    """What the items of ``cids`` leave behind: their reasons, events by action, who acted, and when last."""
    out: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"reasons": [], "reasons_total": 0, "events": {}, "reviewers": [], "last_activity_at": None}
    )
    last_activity: dict[str, datetime] = {}
    for cid, kind, key in s.execute(
        select(REASONS.c.conversation_id, REASONS.c.kind, REASONS.c.key)
        .where(among(s, REASONS.c.conversation_id, cids))
        .order_by(REASONS.c.conversation_id, REASONS.c.kind, REASONS.c.key)
    ):
        rec = out[cid]
        rec["reasons_total"] += 1
        if len(rec["reasons"]) < MAX_LISTED:
            rec["reasons"].append([kind, key])
    A = AUDIT.c  # noqa: N806
    for cid, actor, action, n, last in s.execute(
        select(A.conversation_id, A.actor, A.action, func.count(), func.max(A.at))
        .where(among(s, A.conversation_id, cids), not_a_record())
        .group_by(A.conversation_id, A.actor, A.action)
        .order_by(A.conversation_id, A.actor, A.action)
    ):
        rec = out[cid]
        rec["events"][action] = rec["events"].get(action, 0) + int(n)
        if actor in SYSTEM_ACTORS:
            continue
        if actor not in rec["reviewers"] and len(rec["reviewers"]) < MAX_LISTED:
            rec["reviewers"].append(actor)
        last_at = aware(last)
        if last_at is not None and (cid not in last_activity or last_at > last_activity[cid]):
            last_activity[cid] = last_at
            rec["last_activity_at"] = last_at.isoformat()
    return {cid: out[cid] for cid in cids}


def stale_assignment(at: datetime, now: datetime) -> list[ColumnElement[bool]]:
    """An open item assigned before ``at`` whose assignee left no audit event on it since, that nobody holds."""
    I = ReviewItemRow  # noqa: E741
    return [
        I.status == "open",
        I.assignee.is_not(None),
        I.assigned_at < at,
        or_(I.claimed_by.is_(None), I.lease_until < now),
        ~exists().where(AUDIT.c.conversation_id == I.conversation_id, AUDIT.c.actor == I.assignee, AUDIT.c.at >= at),
    ]


def release_assignments(at: datetime, now: datetime, hours: float) -> Any:
    """``remove`` for the retention job's batches: releases the picked assignments still stale when the UPDATE
    runs (the assignee may have claimed the item since the pick, or someone assigned it anew), each with an
    ``assignment_timeout`` event saying whose it was."""
    I, A = ReviewItemRow, AUDIT.c  # noqa: E741

    def remove(s: Session, ids: list[int]) -> int:
        held = s.execute(
            select(I.id, I.conversation_id, I.assignee, I.assigned_at).where(
                among(s, I.id, ids), *stale_assignment(at, now)
            )
        ).all()
        if not held:
            return 0
        freed = set(
            s.scalars(
                update(I)
                .where(among(s, I.id, [h.id for h in held]), *stale_assignment(at, now))
                .values(assignee=None, assigned_at=None, updated_at=now)
                .returning(I.id)
                .execution_options(synchronize_session=False)
            )
        )
        held = [h for h in held if h.id in freed]
        if not held:
            return 0
        last = {
            (cid, actor): aware(when)
            for cid, actor, when in s.execute(
                select(A.conversation_id, A.actor, func.max(A.at))
                .where(among(s, A.conversation_id, [h.conversation_id for h in held]))
                .group_by(A.conversation_id, A.actor)
            )
        }
        s.execute(
            insert(AUDIT),
            [
                {
                    "at": now,
                    "actor": ACTOR,
                    "action": TIMED_OUT,
                    "conversation_id": h.conversation_id,
                    "detail": {
                        "assignee": h.assignee,
                        "assigned_at": aware(h.assigned_at).isoformat() if h.assigned_at else None,
                        "after_hours": hours,
                        "last_activity_at": _iso(last.get((h.conversation_id, h.assignee))),
                    },
                }
                for h in held
            ],
        )
        return len(held)

    return remove


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def expired_records(at: datetime) -> list[ColumnElement[bool]]:
    """Retention's ``expired`` records written before ``at``."""
    return [AUDIT.c.actor == ACTOR, AUDIT.c.at < at, AUDIT.c.action == EXPIRED]
