"""Read side of the review queue: the list with counts, one item, blind views, history and audit, labels.

Reviewers' progress is in :mod:`vigil.review.reviewers`, failure clusters in :mod:`vigil.review.failures`.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, or_, select
from sqlalchemy.orm import Session, aliased

from vigil.review.errors import Invalid
from vigil.review.models import ReviewAuditRow, ReviewReasonRow
from vigil.review.policy import REASON_KINDS
from vigil.review.queue import QueueFilter, aware, claimable
from vigil.store import reads
from vigil.store.db import clock
from vigil.store.models import ConversationRow, ReviewItemRow, ReviewLabelRow

STATUSES = ("open", "available", "claimed", "done", "waiting", "all")
# sortable columns of the queue list: name -> the column; ties fall back to the item id
SORTS: dict[str, Any] = {
    "priority": ReviewItemRow.priority,
    "flagged": ReviewItemRow.created_at,
    "received": ConversationRow.received_at,
    "agent": ReviewItemRow.agent_id,
    "version": ReviewItemRow.agent_version,
    "messages": ConversationRow.message_count,
    "findings": ConversationRow.finding_count,
    "updated": ReviewItemRow.updated_at,
}
SNIPPET_CHARS = 160


def _status_clause(status: str, now: datetime) -> ColumnElement[bool] | None:
    item = ReviewItemRow
    ready = and_(item.status == "open", item.agent_id.is_not(None))
    return {
        "open": ready,
        "available": claimable(now),
        "claimed": and_(ready, item.claimed_by.is_not(None), item.lease_until >= now),
        "done": item.status == "done",
        "waiting": and_(item.status == "open", item.agent_id.is_(None)),
        "all": None,
    }[status]


def item_state(item: ReviewItemRow, now: datetime) -> str:
    if item.status == "done":
        return "done"
    if item.agent_id is None:
        return "waiting"
    lease = aware(item.lease_until)
    if item.claimed_by and lease is not None and lease >= now:
        return "claimed"
    return "available"


def item_dict(item: ReviewItemRow, now: datetime) -> dict[str, Any]:
    state = item_state(item, now)
    return {
        "conversation_id": item.conversation_id,
        "agent_id": item.agent_id,
        "agent_version": item.agent_version,
        "priority": item.priority,
        "state": state,
        "required_reviews": item.required_reviews,
        "review_count": item.review_count,
        "sampled": item.sampled,
        "claimed_by": item.claimed_by if state == "claimed" else None,
        "lease_until": aware(item.lease_until) if state == "claimed" else None,
        "assignee": item.assignee,
        "created_at": aware(item.created_at),
        "updated_at": aware(item.updated_at),
    }


def reasons_of(session: Session, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if ids:
        rows = session.scalars(
            select(ReviewReasonRow)
            .where(ReviewReasonRow.conversation_id.in_(ids))
            .order_by(ReviewReasonRow.weight.desc(), ReviewReasonRow.id)
        ).all()
        for r in rows:
            out[r.conversation_id].append(
                {
                    "kind": r.kind,
                    "key": r.key,
                    "weight": r.weight,
                    "detail": r.detail,
                    "created_at": aware(r.created_at),
                }
            )
    return out


def label_dict(r: ReviewLabelRow) -> dict[str, Any]:
    return {
        "conversation_id": r.conversation_id,
        "revision": r.revision,
        "reviewer": r.reviewer,
        "label": r.label,
        "category": r.category,
        "severity": r.severity,
        "notes": r.notes,
        "expected_behavior": r.expected_behavior,
        "propagated_from": r.propagated_from,
        "version": r.version,
        "is_current": r.is_current,
        "created_at": aware(r.created_at),
    }


def current_label_dicts(session: Session, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    if not ids:
        return {}
    return {cid: [label_dict(r) for r in rows] for cid, rows in reads.current_labels(session, ids).items()}


def list_queue(
    session: Session,
    filters: QueueFilter,
    status: str = "open",
    limit: int = 50,
    offset: int = 0,
    now: datetime | None = None,
    cursor: str | None = None,
    count_cap: int = 10_000,
    sort: str | None = None,
    descending: bool | None = None,
) -> dict[str, Any]:
    """Items matching ``filters`` in ``status``, with counts per state and per reason kind.

    Counts stop at ``count_cap`` (``capped`` names the states beyond it). ``sort`` names a column of
    :data:`SORTS` (default: priority, or last update for done items); ``descending`` defaults to True for
    priority and times, False for names and counts. Page the default order with ``cursor`` (the previous
    page's ``next_cursor``, keyset: flat at any depth); a sorted list pages with a bounded ``offset``."""
    now = now or clock(session)
    clauses = filters.clauses()
    counts, capped = _state_counts(session, clauses, now, count_cap)
    by_reason = _open_by_reason(session, clauses, now, count_cap)
    q = (
        select(ReviewItemRow, ConversationRow)
        .outerjoin(ConversationRow, ConversationRow.conversation_id == ReviewItemRow.conversation_id)
        .where(*clauses)
    )
    sc = _status_clause(status, now)
    if sc is not None:
        q = q.where(sc)
    keyset = _is_default_order(status, sort, descending)
    if cursor and not keyset:
        raise Invalid("cursor pages the default order; page a sorted list with offset")
    if not keyset:
        q = q.order_by(*_ordering(status, sort, descending))
    else:
        I = ReviewItemRow  # noqa: E741
        if status == "done":
            q = q.order_by(I.updated_at.desc(), I.id.desc())
            if cursor:
                at_raw, id_raw = reads.decode_cursor(cursor, 2)
                at, last_id = reads.cursor_time(at_raw), reads.cursor_int(id_raw)
                q = q.where(I.updated_at <= at, or_(I.updated_at < at, I.id < last_id))
        else:
            q = q.order_by(I.priority.desc(), I.created_at, I.id)
            if cursor:
                prio_raw, at_raw, id_raw = reads.decode_cursor(cursor, 3)
                prio, at, last_id = reads.cursor_number(prio_raw), reads.cursor_time(at_raw), reads.cursor_int(id_raw)
                q = q.where(
                    I.priority <= prio,
                    or_(I.priority < prio, I.created_at > at, and_(I.created_at == at, I.id > last_id)),
                )
    rows = session.execute(q.limit(limit).offset(offset)).all()
    ids = [item.conversation_id for item, _ in rows]
    reasons, labels = reasons_of(session, ids), current_label_dicts(session, ids)
    items = []
    for item, conv in rows:
        d = item_dict(item, now)
        d["reasons"] = reasons.get(item.conversation_id, [])
        d["labels"] = labels.get(item.conversation_id, [])
        _add_summary(d, conv)
        items.append(d)
    last = rows[-1][0] if len(rows) == limit and keyset else None
    next_cursor = None
    if last is not None:
        next_cursor = (
            reads.encode_cursor(aware(last.updated_at), last.id)
            if status == "done"
            else reads.encode_cursor(last.priority, aware(last.created_at), last.id)
        )
    total = counts.get(status, counts["all"])
    return {
        "status": status,
        "counts": counts,
        "capped": sorted(capped),
        "count_text": {k: reads.count_text(v, k in capped) for k, v in counts.items()},
        "reasons": by_reason,
        "items": items,
        "limit": limit,
        "offset": offset,
        "total": total,
        "total_capped": status in capped,
        "next_cursor": next_cursor,
        "sort": sort or ("updated" if status == "done" else "priority"),
        "descending": _descending(sort, descending, status),
    }


def _descending(sort: str | None, descending: bool | None, status: str) -> bool:
    if descending is not None:
        return descending
    return (sort or "priority") in ("priority", "flagged", "received", "updated") or (sort is None and status == "done")


def _ordering(status: str, sort: str | None, descending: bool | None) -> list[Any]:
    if sort is None and status == "done":
        return [ReviewItemRow.updated_at.desc(), ReviewItemRow.id.desc()]
    if sort is None or sort == "priority" and descending in (None, True):
        return [ReviewItemRow.priority.desc(), ReviewItemRow.created_at, ReviewItemRow.id]
    if sort not in SORTS:
        raise Invalid(f"sort must be one of {', '.join(SORTS)}, not {sort!r}")
    column = SORTS[sort]
    if _descending(sort, descending, status):
        return [column.desc(), ReviewItemRow.id.desc()]
    return [column.asc(), ReviewItemRow.id]


def _is_default_order(status: str, sort: str | None, descending: bool | None) -> bool:
    if status == "done":
        return sort is None
    return sort is None or (sort == "priority" and descending in (None, True))


def _state_counts(
    session: Session, clauses: list[ColumnElement[bool]], now: datetime, cap: int
) -> tuple[dict[str, int], set[str]]:
    """Items matching ``clauses`` in each state, and in the states made of them (open, all), each counted
    up to ``cap``; the second value names the states with more."""
    counts: dict[str, int] = {}
    capped: set[str] = set()
    for s in ("available", "claimed", "done", "waiting"):
        extra = [c] if (c := _status_clause(s, now)) is not None else []
        counts[s], more = reads.capped_count(session, select(ReviewItemRow.id).where(*clauses, *extra), cap)
        if more:
            capped.add(s)
    counts["open"] = counts["available"] + counts["claimed"]
    counts["all"] = counts["open"] + counts["done"] + counts["waiting"]
    if capped & {"available", "claimed"}:
        capped.add("open")
    if capped:
        capped.add("all")
    return counts, capped


def _open_by_reason(session: Session, clauses: list[ColumnElement[bool]], now: datetime, cap: int) -> dict[str, int]:
    """Open items matching ``clauses`` per reason kind (an item with several reasons counts in each),
    each counted up to ``cap``."""
    open_clause = _status_clause("open", now)
    assert open_clause is not None  # only "all" has no clause
    out: dict[str, int] = {}
    for kind in REASON_KINDS:
        has = (
            select(ReviewReasonRow.id)
            .where(ReviewReasonRow.conversation_id == ReviewItemRow.conversation_id, ReviewReasonRow.kind == kind)
            .exists()
        )
        n, _more = reads.capped_count(session, select(ReviewItemRow.id).where(*clauses, open_clause, has), cap)
        if n:
            out[kind] = n
    return out


def item_detail(session: Session, conversation_id: str, now: datetime | None = None) -> dict[str, Any] | None:
    now = now or clock(session)
    item = session.scalar(select(ReviewItemRow).where(ReviewItemRow.conversation_id == conversation_id))
    if item is None:
        return None
    d = item_dict(item, now)
    d["reasons"] = reasons_of(session, [conversation_id]).get(conversation_id, [])
    d["labels"] = current_label_dicts(session, [conversation_id]).get(conversation_id, [])
    _add_summary(d, session.get(ConversationRow, conversation_id))
    return d


def is_blind(item: dict[str, Any] | None, viewer: str | None) -> bool:
    """Double review is blind: until ``viewer`` has labelled an open multi-reviewer item, others' labels
    stay hidden from them (``viewer`` None: hidden from anyone without a name, e.g. another stage's view)."""
    if item is None or item["required_reviews"] <= 1 or item["state"] == "done":
        return False
    return not any(lab["reviewer"] == viewer for lab in item["labels"])


def blind_view(item: dict[str, Any], viewer: str | None) -> dict[str, Any]:
    """``item`` as ``viewer`` may see it: others' labels left out while the review is blind to them."""
    if not is_blind(item, viewer):
        return item
    return {**item, "labels": [lab for lab in item["labels"] if lab["reviewer"] == viewer], "labels_hidden": True}


def blind_history(hist: dict[str, Any], item: dict[str, Any] | None, viewer: str) -> dict[str, Any]:
    """A conversation's history without other reviewers' labels (and their label events) while blind."""
    if not is_blind(item, viewer):
        return hist
    return {
        **hist,
        "labels": [lab for lab in hist["labels"] if lab["reviewer"] == viewer],
        "audit": [e for e in hist["audit"] if e["action"] != "label" or e["actor"] == viewer],
    }


def blind_comments(comments: list[dict[str, Any]], item: dict[str, Any] | None, viewer: str) -> list[dict[str, Any]]:
    """A conversation's comments without other reviewers' while the review is blind to ``viewer``: a comment
    says what its author thinks of the conversation as plainly as their label does."""
    if not is_blind(item, viewer):
        return comments
    return [c for c in comments if c["author"] == viewer]


def blind_clause(viewer: str) -> ColumnElement[bool]:
    """Labels ``viewer`` may see: their own, and any on a conversation whose review is not blind to them."""
    mine = aliased(ReviewLabelRow)
    theirs = select(mine.conversation_id).where(mine.reviewer == viewer, mine.is_current.is_(True))
    blind = select(ReviewItemRow.conversation_id).where(
        ReviewItemRow.required_reviews > 1,
        ReviewItemRow.status != "done",
        ReviewItemRow.conversation_id.not_in(theirs),
    )
    return or_(ReviewLabelRow.reviewer == viewer, ReviewLabelRow.conversation_id.not_in(blind))


def _add_summary(d: dict[str, Any], conv: ConversationRow | None) -> None:
    d["max_severity"] = conv.max_severity if conv else None
    d["finding_count"] = conv.finding_count if conv else 0
    d["message_count"] = conv.message_count if conv else 0
    d["task_id"] = conv.task_id if conv else None
    d["received_at"] = aware(conv.received_at) if conv else None
    d["flagged_at"] = d["created_at"]
    d["snippet"] = snippet(conv.document) if conv else ""


def snippet(document: str, limit: int = SNIPPET_CHARS) -> str:
    """The first user message of a stored conversation, on one line, cut at ``limit`` characters."""
    doc = reads.read_document(document) or {}
    for m in doc.get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                content = " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
            text = " ".join(str(content or "").split())
            if text:
                return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
    return ""


def history(session: Session, conversation_id: str) -> dict[str, Any]:
    """Every label version and every audit event of one conversation, oldest first."""
    labels = session.scalars(
        select(ReviewLabelRow)
        .where(ReviewLabelRow.conversation_id == conversation_id)
        .order_by(ReviewLabelRow.created_at, ReviewLabelRow.id)
    ).all()
    events = session.scalars(
        select(ReviewAuditRow)
        .where(ReviewAuditRow.conversation_id == conversation_id)
        .order_by(ReviewAuditRow.at, ReviewAuditRow.id)
    ).all()
    return {
        "conversation_id": conversation_id,
        "labels": [label_dict(r) for r in labels],
        "audit": [audit_dict(e) for e in events],
    }


def audit_dict(e: ReviewAuditRow) -> dict[str, Any]:
    return {
        "at": aware(e.at),
        "actor": e.actor,
        "action": e.action,
        "conversation_id": e.conversation_id,
        "detail": e.detail,
    }


def audit_log(
    session: Session,
    actor: str | None = None,
    conversation_id: str | None = None,
    action: str | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    q = select(ReviewAuditRow).order_by(ReviewAuditRow.id.desc()).limit(limit)
    if actor:
        q = q.where(ReviewAuditRow.actor == actor)
    if conversation_id:
        q = q.where(ReviewAuditRow.conversation_id == conversation_id)
    if action:
        q = q.where(ReviewAuditRow.action == action)
    return [audit_dict(e) for e in session.scalars(q).all()]


def labels_export(
    session: Session,
    since: datetime | None = None,
    current_only: bool = True,
    limit: int = 1000,
    offset: int = 0,
    viewer: str | None = None,
) -> list[dict[str, Any]]:
    """Labels, oldest first; with ``viewer``, others' labels on reviews still blind to them are left out."""
    q = select(ReviewLabelRow).order_by(ReviewLabelRow.id).limit(limit).offset(offset)
    if current_only:
        q = q.where(ReviewLabelRow.is_current.is_(True))
    if since:
        q = q.where(ReviewLabelRow.created_at >= since)
    if viewer is not None:
        q = q.where(blind_clause(viewer))
    return [label_dict(r) for r in session.scalars(q).all()]


def filter_options(session: Session, rule_ids: list[str] | None = None) -> dict[str, list[str]]:
    """Known values for the queue's filter menus: agents and versions (seen in traffic, or with open items),
    rules (loaded and flagging), severities, outcome types that flagged, reason kinds and statuses."""
    from vigil.review.policy import SEVERITIES

    def distinct(column: Any, *where: ColumnElement[bool]) -> list[str]:
        return [v for v in session.scalars(select(column).where(column.is_not(None), *where).distinct()) if v]

    from vigil.store.rollups import RollupVersionRow

    rules = set(rule_ids or []) | set(distinct(ReviewReasonRow.key, ReviewReasonRow.kind == "finding"))
    # every version the rollups know (a small table), and those of open items (the queue, not all traffic)
    seen = session.execute(select(RollupVersionRow.agent_id, RollupVersionRow.agent_version)).all()
    is_open = ReviewItemRow.status == "open"
    agents = {a for a, _ in seen} | set(distinct(ReviewItemRow.agent_id, is_open))
    versions = {v for _, v in seen} | set(distinct(ReviewItemRow.agent_version, is_open))
    return {
        "agent": sorted(agents),
        "version": sorted(versions, reverse=True),
        "rule": sorted(rules),
        "severity": list(reversed(SEVERITIES)),
        "outcome": sorted(distinct(ReviewReasonRow.key, ReviewReasonRow.kind == "outcome")),
        "reason": ["finding", "judge_fail", "judge_low_score", "outcome", "sample", "manual"],
        "verdict": ["fail", "pass", "unscored"],
        "status": list(STATUSES),
        "sort": list(SORTS),
    }
