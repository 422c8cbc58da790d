"""Queue operations: claim (with an expiring lease), extend, release, skip, label.

A claim is one ``UPDATE ... WHERE id = (SELECT ... LIMIT 1) RETURNING``: on Postgres the inner
select takes ``FOR UPDATE SKIP LOCKED``, so concurrent reviewers each get a different row without
waiting; on SQLite the single statement runs under the database's write lock. Either way the outer
``WHERE`` re-checks that the row is still claimable, so two reviewers never hold one item.
Every function runs in the caller's transaction and writes an audit row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import orjson
from sqlalchemy import ColumnElement, CursorResult, Executable, and_, func, insert, or_, select, update
from sqlalchemy.orm import Session

from vigil.metrics import Metrics
from vigil.review.errors import Conflict, Done, Invalid, NotFound, NotHeld
from vigil.review.flagger import enqueue
from vigil.review.models import ReviewAuditRow, ReviewReasonRow, ReviewSkipRow
from vigil.review.policy import LABELS, REASON_KINDS, SEVERITIES, FlaggingPolicy, Reason
from vigil.store.db import aware, clock, upsert
from vigil.store.models import ConversationRow, FindingRow, OutcomeRow, ReviewItemRow, ReviewLabelRow, VerdictRow

MAX_TEXT = 20_000
VERDICTS = ("pass", "fail", "unscored")


def _changed(session: Session, stmt: Executable) -> int:
    """Rows an UPDATE matched (executing DML yields a CursorResult; Result does not declare rowcount)."""
    return cast(CursorResult[Any], session.execute(stmt)).rowcount


@dataclass(frozen=True, slots=True)
class QueueFilter:
    """Filters of the queue list and of claim-next. Empty fields do not filter.

    Agent, version, rule, severity and outcome match whole values regardless of case ("Support-bot" finds
    "support-bot"); ``search`` finds a part of the conversation id, the task, or the stored conversation
    (its messages, user id and metadata), regardless of case.
    """

    agent: str | None = None
    version: str | None = None
    rule: str | None = None
    verdict: str | None = None
    outcome: str | None = None
    reason: str | None = None
    severity: str | None = None
    search: str | None = None

    def check(self) -> None:
        """Raise Invalid for a severity, verdict or reason kind no item can have: a mistyped one would otherwise read
        as an empty queue (and claim-next as nothing left to claim)."""
        if self.severity and self.severity.lower() not in SEVERITIES:
            raise Invalid(f"severity must be one of {', '.join(SEVERITIES)}, not {self.severity!r}")
        if self.verdict and self.verdict.lower() not in VERDICTS:
            raise Invalid(f"verdict must be one of {', '.join(VERDICTS)}, not {self.verdict!r}")
        if self.reason and self.reason.lower() not in REASON_KINDS:
            raise Invalid(f"reason must be one of {', '.join(REASON_KINDS)}, not {self.reason!r}")

    def clauses(self) -> list[ColumnElement[bool]]:
        out: list[ColumnElement[bool]] = []
        if self.agent:
            out.append(_same(ReviewItemRow.agent_id, self.agent))
        if self.version:
            out.append(_same(ReviewItemRow.agent_version, self.version))
        if self.rule:
            out.append(_has(FindingRow, _same(FindingRow.rule_id, self.rule)))
        if self.verdict:
            out.append(_has(VerdictRow, VerdictRow.verdict == self.verdict.lower()))
        if self.outcome:
            out.append(_has(OutcomeRow, _same(OutcomeRow.type, self.outcome)))
        if self.reason:
            out.append(_has(ReviewReasonRow, ReviewReasonRow.kind == self.reason.lower()))
        if self.severity:
            out.append(_has(ConversationRow, _same(ConversationRow.max_severity, self.severity)))
        if self.search and (term := self.search.strip()):
            term = term[:MAX_SEARCH]
            pattern = "%" + _escape_like(term) + "%"
            in_document = [
                ConversationRow.document.ilike("%" + _escape_like(form) + "%", escape="\\")
                for form in dict.fromkeys(_as_in_json(term))
            ]
            out.append(
                or_(
                    ReviewItemRow.conversation_id.ilike(pattern, escape="\\"),
                    _has(ConversationRow, or_(ConversationRow.task_id.ilike(pattern, escape="\\"), *in_document)),
                )
            )
        return out


MAX_SEARCH = 200


def _same(column: Any, value: str) -> ColumnElement[bool]:
    """Case-insensitive equality (the queue's filters are typed or picked by people)."""
    return cast(ColumnElement[bool], func.lower(column) == value.strip().lower())


def _as_in_json(term: str) -> tuple[str, ...]:
    """``term`` as it may appear inside a JSON string of the stored document (stored as the client sent
    it): a quote, a backslash, a tab or a line break typed into the search box is stored escaped (``\\"``,
    ``\\n``), and text beyond ASCII is stored as typed or, from encoders that write ASCII only (Python's
    json by default), as ``\\u00e9`` escapes: both forms are searched. Text JSON cannot hold (a lone
    surrogate) is searched as typed."""
    try:
        plain = orjson.dumps(term).decode()[1:-1]
    except TypeError:
        return (term,)
    return (plain, json.dumps(term)[1:-1]) if not term.isascii() else (plain,)


def _escape_like(term: str) -> str:
    return term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _has(model: Any, *conditions: ColumnElement[bool]) -> ColumnElement[bool]:
    """EXISTS a ``model`` row of the item's conversation (correlated to review_items only)."""
    return (
        select(model.conversation_id)
        .where(model.conversation_id == ReviewItemRow.conversation_id, *conditions)
        .correlate(ReviewItemRow)
        .exists()
    )


def claimable(now: datetime) -> ColumnElement[bool]:
    return and_(
        ReviewItemRow.status == "open",
        ReviewItemRow.agent_id.is_not(None),
        or_(ReviewItemRow.claimed_by.is_(None), ReviewItemRow.lease_until < now),
    )


def not_done_by(reviewer: str) -> list[ColumnElement[bool]]:
    return [
        ~_has(ReviewLabelRow, ReviewLabelRow.reviewer == reviewer, ReviewLabelRow.is_current.is_(True)),
        ~_has(ReviewSkipRow, ReviewSkipRow.reviewer == reviewer),
    ]


def audit(
    session: Session, actor: str, action: str, conversation_id: str | None, *, at: datetime | None = None, **detail: Any
) -> None:
    """One audit event, stamped ``at`` (the caller's ``now``), else on the database's clock: retention reads a
    reviewer's last event on the item against that clock to time out an assignment, and an event stamped on
    a replica running 3 h behind looked 3 h old (``vigil.store.review_retention.stale_assignment``)."""
    session.execute(
        insert(ReviewAuditRow).values(
            at=at or clock(session), actor=actor, action=action, conversation_id=conversation_id, detail=detail
        )
    )


def claim_next(
    session: Session,
    reviewer: str,
    lease_seconds: int,
    filters: QueueFilter | None = None,
    now: datetime | None = None,
    release_others: bool = True,
    assignment_hours: float = 0.0,
) -> str | None:
    """Claim the highest-priority claimable item; returns its conversation id, or None if none is left.

    With ``release_others`` the reviewer's other unlabelled claims go back to the queue first
    (a reviewer works one item at a time) and are not handed straight back to them. Items assigned to
    the reviewer come first; another reviewer's assigned items are theirs until the assignment is
    ``assignment_hours`` old (0: for good), then anyone's.
    """
    now = now or clock(session)
    held: list[str] = []
    if release_others:
        held = list(session.scalars(select(ReviewItemRow.conversation_id).where(ReviewItemRow.claimed_by == reviewer)))
        for held_id in held:
            release(session, held_id, reviewer, now=now)
    conditions = [claimable(now), *not_done_by(reviewer), *(filters or QueueFilter()).clauses()]
    if held:
        conditions.append(ReviewItemRow.conversation_id.not_in(held))
    cid = None
    # items assigned to this reviewer first; then unassigned ones (others' assigned items are theirs)
    free: ColumnElement[bool] = ReviewItemRow.assignee.is_(None)
    if assignment_hours > 0:
        free = or_(free, ReviewItemRow.assigned_at < now - timedelta(hours=assignment_hours))
    for mine in (ReviewItemRow.assignee == reviewer, free):
        pick = (
            select(ReviewItemRow.id)
            .where(*conditions, mine)
            .order_by(ReviewItemRow.priority.desc(), ReviewItemRow.created_at, ReviewItemRow.id)
            .limit(1)
        )
        if session.get_bind().dialect.name == "postgresql":
            pick = pick.with_for_update(skip_locked=True)
        cid = session.scalar(
            update(ReviewItemRow)
            .where(ReviewItemRow.id == pick.scalar_subquery(), claimable(now))
            .values(claimed_by=reviewer, claimed_at=now, lease_until=now + timedelta(seconds=lease_seconds))
            .returning(ReviewItemRow.conversation_id)
            .execution_options(synchronize_session=False)
        )
        if cid is not None:
            break
    if cid is not None:
        audit(session, reviewer, "claim", cid, at=now, lease_seconds=lease_seconds)
    return cid


def claim(
    session: Session, conversation_id: str, reviewer: str, lease_seconds: int, now: datetime | None = None
) -> datetime:
    """Claim one named item (or renew one's own claim); Conflict if another reviewer holds it, Done if it
    has every review it needs."""
    now = now or clock(session)
    until = now + timedelta(seconds=lease_seconds)
    item = _item(session, conversation_id)
    if item.status == "done":
        raise Done(
            f"conversation {conversation_id!r} is done: it has all its reviews; "
            "to change your label, label it again (no claim needed)"
        )
    if item.agent_id is None:
        raise Conflict(f"conversation {conversation_id!r} has not been received yet")
    mine_or_free = or_(
        ReviewItemRow.claimed_by.is_(None),
        ReviewItemRow.claimed_by == reviewer,
        ReviewItemRow.lease_until < now,
    )
    done = _changed(
        session,
        update(ReviewItemRow)
        .where(ReviewItemRow.conversation_id == conversation_id, ReviewItemRow.status == "open", mine_or_free)
        .values(claimed_by=reviewer, claimed_at=now, lease_until=until)
        .execution_options(synchronize_session=False),
    )
    if not done:
        session.refresh(item)
        if item.status == "done":
            raise Done(f"conversation {conversation_id!r} was just finished by another reviewer")
        raise Conflict(f"{item.claimed_by} holds this item until {aware(item.lease_until):%H:%M:%S} UTC")
    audit(session, reviewer, "claim", conversation_id, at=now, lease_seconds=lease_seconds)
    return until


def extend(
    session: Session, conversation_id: str, reviewer: str, lease_seconds: int, now: datetime | None = None
) -> datetime:
    """Push the lease out again; works after expiry as long as nobody else claimed or labelled the item since.

    Done if the item has every review it needs: a lease on it holds nothing back (and a stale claim
    renewed there made everyone else's relabel answer "someone holds this item")."""
    now = now or clock(session)
    until = now + timedelta(seconds=lease_seconds)
    done = _changed(
        session,
        update(ReviewItemRow)
        .where(
            ReviewItemRow.conversation_id == conversation_id,
            ReviewItemRow.claimed_by == reviewer,
            ReviewItemRow.status == "open",
        )
        .values(lease_until=until)
        .execution_options(synchronize_session=False),
    )
    if not done:
        item = _item(session, conversation_id)
        if item.status == "done":
            raise Done(
                f"conversation {conversation_id!r} is done: it has all its reviews, so there is no lease to extend; "
                "to change your label, label it again (no claim needed)"
            )
        if item.claimed_by not in (None, reviewer):
            raise Conflict(f"you do not hold this item: {item.claimed_by} claimed it after your lease ran out")
        raise NotHeld("you do not hold this item; claim it first")
    audit(session, reviewer, "extend", conversation_id, at=now, lease_until=until.isoformat())
    return until


def release(
    session: Session,
    conversation_id: str,
    reviewer: str,
    *,
    force: bool = False,
    now: datetime | None = None,
    action: str = "release",
) -> None:
    """Give the item back. ``force`` (admins) releases another reviewer's claim; its audit event says it was
    forced and whose claim it was. Conflict if there is nothing to release (the item is not yours, or with
    ``force`` nobody holds it), as an unforced release of an item you do not hold is: no event is written."""
    holder = reviewer
    if force:
        claimed_by = _item(session, conversation_id).claimed_by
        if claimed_by is None:
            raise Conflict("nobody holds this item: there is nothing to release")
        holder = claimed_by
    done = _changed(
        session,
        update(ReviewItemRow)
        .where(ReviewItemRow.conversation_id == conversation_id, ReviewItemRow.claimed_by == holder)
        .values(claimed_by=None, claimed_at=None, lease_until=None)
        .execution_options(synchronize_session=False),
    )
    if not done:
        item = _item(session, conversation_id)
        if force:
            raise Conflict(f"{holder}'s claim ended meanwhile: nothing was released")
        if item.claimed_by is None:
            raise NotHeld("you do not hold this item: nobody does")
        raise Conflict("you do not hold this item")
    forced = {"forced": True, "claimed_by": holder} if force else {}
    audit(session, reviewer, action, conversation_id, at=now, **forced)


def skip(session: Session, conversation_id: str, reviewer: str, now: datetime | None = None) -> None:
    """Release the item and never offer it to this reviewer again through claim-next."""
    item = _item(session, conversation_id)
    now = now or clock(session)
    lease = aware(item.lease_until)
    if item.claimed_by and item.claimed_by != reviewer and lease is not None and lease >= now:
        raise Conflict(f"{item.claimed_by} holds this item")
    if item.claimed_by == reviewer:
        session.execute(
            update(ReviewItemRow)
            .where(ReviewItemRow.id == item.id)
            .values(claimed_by=None, claimed_at=None, lease_until=None)
            .execution_options(synchronize_session=False)
        )
    session.execute(
        upsert(session, ReviewSkipRow)
        .values(conversation_id=conversation_id, reviewer=reviewer, created_at=now)
        .on_conflict_do_nothing()
    )
    audit(session, reviewer, "skip", conversation_id, at=now)


@dataclass(frozen=True, slots=True)
class LabelIn:
    label: str
    category: str | None = None
    severity: str | None = None
    notes: str = ""
    expected_behavior: str = ""
    revision: int | None = None  # the revision the reviewer read, when the caller knows it


def validate_label(data: LabelIn, policy: FlaggingPolicy) -> LabelIn:
    if data.label not in LABELS:
        raise Invalid(f"label must be one of {', '.join(LABELS)}, not {data.label!r}")
    category = data.category or None
    if category is not None and category not in policy.taxonomy:
        raise Invalid(f"category {category!r} is not in the taxonomy ({', '.join(policy.taxonomy)})")
    if data.label == "confirmed_failure" and category is None:
        raise Invalid("a confirmed failure needs a category")
    severity = data.severity or None
    if severity is not None and severity not in SEVERITIES:
        raise Invalid(f"severity must be one of {', '.join(SEVERITIES)}, not {severity!r}")
    for name in ("notes", "expected_behavior"):
        if len(getattr(data, name)) > MAX_TEXT:
            raise Invalid(f"{name} is longer than {MAX_TEXT} characters")
        if "\x00" in getattr(data, name):  # Postgres cannot store it; SQLite would, into every page showing it
            raise Invalid(f"{name} holds a NUL character (\\u0000), which Vigil does not store: nothing was saved")
    return LabelIn(data.label, category, severity, data.notes.strip(), data.expected_behavior.strip(), data.revision)


def _revised(read: int | None, now_at: int | None) -> Conflict:
    return Conflict(
        f"the conversation changed while you read it: you read revision {read}, it is now at revision {now_at}; "
        "read it again and label that"
    )


def label(
    session: Session,
    conversation_id: str,
    reviewer: str,
    data: LabelIn,
    policy: FlaggingPolicy,
    now: datetime | None = None,
    metrics: Metrics | None = None,
    propagated_from: str | None = None,
) -> ReviewLabelRow:
    """Save a new version of ``reviewer``'s label; the previous version stays as history.

    A conversation that is not in the queue enters it (reason ``manual``). Conflict if another
    reviewer holds the item. The reviewer's current label sent again unchanged (same revision, nothing
    held) is returned as it is: a retried request adds no version. Labelling releases the reviewer's own
    claim, and another reviewer's claim whose lease ran out. ``propagated_from``: the conversation whose
    label this one copies (a near-duplicate cluster labelled at once).
    """
    data = validate_label(data, policy)
    now = now or clock(session)
    # read shared-locked, before the item: a newer revision being stored (which locks the conversation,
    # then its labels and item, to supersede them) is waited for, and then seen, so a label is never
    # stamped with a revision that is replaced without superseding it (locks in the same order: no cycle)
    conv = session.scalar(
        select(ConversationRow).where(ConversationRow.conversation_id == conversation_id).with_for_update(read=True)
    )
    if conv is None:
        raise NotFound(f"no conversation {conversation_id!r}")
    if data.revision is not None and data.revision != conv.revision:
        raise _revised(data.revision, conv.revision)
    # the item row is locked so concurrent labels count each other (review_count, status)
    item = session.scalar(
        select(ReviewItemRow).where(ReviewItemRow.conversation_id == conversation_id).with_for_update()
    )
    if item is None:
        enqueue(
            session,
            policy,
            {conversation_id: [Reason("manual", reviewer, 0.0, "labelled without a flag")]},
            {conversation_id: (conv.agent_id, conv.agent_version)},
            actor=reviewer,
        )
        item = _item(session, conversation_id)
    lease = aware(item.lease_until)
    if item.claimed_by not in (None, reviewer) and lease is not None and lease >= now:
        raise Conflict(f"{item.claimed_by} holds this item; wait until they finish")
    current = session.scalar(
        select(ReviewLabelRow).where(
            ReviewLabelRow.conversation_id == conversation_id,
            ReviewLabelRow.reviewer == reviewer,
            ReviewLabelRow.is_current.is_(True),
        )
    )
    if (
        current is not None
        and item.claimed_by is None
        and (current.revision, current.propagated_from) == (conv.revision, propagated_from)
        and (current.label, current.category, current.severity, current.notes, current.expected_behavior)
        == (data.label, data.category, data.severity, data.notes, data.expected_behavior)
    ):
        return current  # the same label of the same revision sent again (a retried request): nothing changes
    last = (
        session.scalar(
            select(func.max(ReviewLabelRow.version)).where(
                ReviewLabelRow.conversation_id == conversation_id, ReviewLabelRow.reviewer == reviewer
            )
        )
        or 0
    )
    session.execute(
        update(ReviewLabelRow)
        .where(
            ReviewLabelRow.conversation_id == conversation_id,
            ReviewLabelRow.reviewer == reviewer,
            ReviewLabelRow.is_current.is_(True),
        )
        .values(is_current=False)
        .execution_options(synchronize_session=False)
    )
    row = ReviewLabelRow(
        conversation_id=conversation_id,
        revision=conv.revision,
        reviewer=reviewer,
        label=data.label,
        category=data.category,
        severity=data.severity,
        notes=data.notes,
        expected_behavior=data.expected_behavior,
        propagated_from=propagated_from,
        version=last + 1,
        is_current=True,
        created_at=now,
    )
    session.add(row)
    session.flush()
    # on SQLite the read above takes no lock and runs before the transaction (its first write begins it):
    # a newer revision may have committed in between. Now this transaction holds the database's write lock,
    # so what is read is what stays; a changed revision refuses the label (on Postgres the shared lock
    # above has made this the same revision already)
    now_at = session.scalar(select(ConversationRow.revision).where(ConversationRow.conversation_id == conversation_id))
    if now_at != conv.revision:
        raise _revised(conv.revision, now_at)
    reviewers = (
        session.scalar(
            select(func.count()).where(
                ReviewLabelRow.conversation_id == conversation_id, ReviewLabelRow.is_current.is_(True)
            )
        )
        or 0
    )
    values: dict[str, Any] = {
        "review_count": reviewers,
        "updated_at": now,
        "status": "done" if reviewers >= item.required_reviews else "open",
    }
    if item.claimed_by is not None:
        # the reviewer's own claim, or another's whose lease ran out (a live one was refused above): left on
        # a finished item, it could be extended there and then blocked everyone's relabel
        values.update(claimed_by=None, claimed_at=None, lease_until=None)
    if item.claimed_by == reviewer and metrics is not None and item.claimed_at is not None:
        metrics.review_label_seconds.observe(max(0.0, (now - aware(item.claimed_at)).total_seconds()))
    if metrics is not None:
        metrics.review_labels.labels(data.label).inc()
    session.execute(
        update(ReviewItemRow)
        .where(ReviewItemRow.id == item.id)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    audit(
        session,
        reviewer,
        "label",
        conversation_id,
        at=now,
        version=row.version,
        label=data.label,
        category=data.category,
        severity=data.severity,
        **({"propagated_from": propagated_from} if propagated_from else {}),
    )
    return row


def _item(session: Session, conversation_id: str) -> ReviewItemRow:
    item = session.scalar(select(ReviewItemRow).where(ReviewItemRow.conversation_id == conversation_id))
    if item is None:
        raise NotFound(f"conversation {conversation_id!r} is not in the review queue")
    return item
