"""Read queries behind the API and UI."""

from __future__ import annotations

import base64
import json
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Select, bindparam, func, or_, select
from sqlalchemy.orm import Session

from vigil.rules import SEVERITY_RANK
from vigil.schema import loads_exact
from vigil.store.db import among, aware
from vigil.store.models import ConversationRow, DeadLetterRow, FindingRow, OutcomeRow, ReviewLabelRow

log = logging.getLogger(__name__)
Unreadable = Callable[[str], None]  # called with the conversation id of a document that cannot be read


def read_document(text: str) -> dict[str, Any] | None:
    """A stored conversation document as JSON, or None if it cannot be read at all.

    Documents are stored as strict JSON; one stored by an older Vigil may hold NaN or Infinity (read as
    null) or a lone surrogate (read as U+FFFD), so a reader never fails on it.
    """
    try:
        doc = loads_exact(text)  # integers beyond 64 bits stay exact (orjson alone reads them as floats)
    except orjson.JSONDecodeError:
        try:
            doc = json.loads(
                text.encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
                parse_constant=lambda _c: None,
                parse_float=lambda f: v if (v := float(f)) - v == 0 else None,
            )
        except (ValueError, RecursionError):
            return None
    return doc if isinstance(doc, dict) else None


def finding_dict(f: FindingRow) -> dict[str, Any]:
    return {
        "rule_id": f.rule_id,
        "rule_type": f.rule_type,
        "severity": f.severity,
        "message": f.message,
        "evidence": f.evidence,
        "details": f.details,
        "revision": f.revision,
    }


def summary_dict(c: ConversationRow) -> dict[str, Any]:
    return {
        "conversation_id": c.conversation_id,
        "revision": c.revision,
        "agent_id": c.agent_id,
        "agent_version": c.agent_version,
        "task_id": c.task_id,
        "status": c.status,
        "received_at": aware(c.received_at),
        "message_count": c.message_count,
        "tool_call_count": c.tool_call_count,
        "tool_error_count": c.tool_error_count,
        "finding_count": c.finding_count,
        "max_severity": c.max_severity,
        "cost_usd": c.cost_usd,
    }


def get_conversation(
    session: Session, conversation_id: str, unreadable: Unreadable | None = None
) -> dict[str, Any] | None:
    """The stored conversation with findings and outcomes; ``conversation`` is None (and ``unreadable`` is
    called) when its stored document cannot be read."""
    row = session.get(ConversationRow, conversation_id)
    if row is None:
        return None
    findings = session.scalars(
        select(FindingRow).where(FindingRow.conversation_id == conversation_id).order_by(FindingRow.id)
    ).all()
    outcomes = session.scalars(
        select(OutcomeRow).where(OutcomeRow.conversation_id == conversation_id).order_by(OutcomeRow.occurred_at)
    ).all()
    out = summary_dict(row)
    out["conversation"] = read_document(row.document)
    if out["conversation"] is None:
        log.warning("stored document of %s cannot be read", conversation_id)
        if unreadable is not None:
            unreadable(conversation_id)
    out["findings"] = [finding_dict(f) for f in findings]
    out["outcomes"] = [
        {"type": o.type, "value": o.value, "occurred_at": aware(o.occurred_at), "source": o.source} for o in outcomes
    ]
    return out


def list_query(
    agent: str | None = None,
    version: str | None = None,
    rule: str | None = None,
    min_severity: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Select[ConversationRow]:
    q = select(ConversationRow)
    if agent:
        q = q.where(ConversationRow.agent_id == agent)
    if version:
        q = q.where(ConversationRow.agent_version == version)
    # compare in UTC: SQLite stores UTC wall time and would otherwise ignore a given offset
    if since:
        q = q.where(ConversationRow.received_at >= aware(since))
    if until:
        q = q.where(ConversationRow.received_at < aware(until))
    if rule:
        q = q.where(
            ConversationRow.conversation_id.in_(select(FindingRow.conversation_id).where(FindingRow.rule_id == rule))
        )
    if min_severity:
        allowed = [s for s, r in SEVERITY_RANK.items() if r >= SEVERITY_RANK[min_severity]]
        # written out, not bound: a database proves the query needs only the partial index of high and
        # critical conversations (ix_conversations_severe) from the values themselves
        q = q.where(ConversationRow.max_severity.in_(_written_out("severities", allowed)))
        if SEVERITY_RANK[min_severity] >= SEVERITY_RANK["high"]:
            # the index's own condition, word for word: SQLite uses a partial index only for a query that
            # repeats it (it does not prove that "critical" implies "high or critical")
            q = q.where(ConversationRow.max_severity.in_(_written_out("severe", SEVERE)))
    return q


SEVERE = ["high", "critical"]  # the conversations ix_conversations_severe holds


def _written_out(name: str, values: list[str]) -> Any:
    return bindparam(name, values, expanding=True, literal_execute=True)


def newest_received(
    session: Session, agent: str, version: str, since: datetime | None = None, until: datetime | None = None
) -> datetime | None:
    """When the version's newest conversation in [since, until) was received: one read of the (agent,
    version, received) index alone.

    Reads of a version's newest rows start there. Without it Postgres may walk ``received_at`` backward from
    the end and filter out everyone's newer conversations to reach a version whose traffic ended long ago
    (v1 over a month: a million rows at 10M stored): its estimate assumes a version's rows are spread
    evenly over time."""
    C = ConversationRow
    q = select(C.received_at).where(C.agent_id == agent, C.agent_version == version)
    if since is not None:
        q = q.where(C.received_at >= aware(since))
    if until is not None:
        q = q.where(C.received_at < aware(until))
    return session.scalar(q.order_by(C.received_at.desc()).limit(1))


class BadCursor(ValueError):
    """A list cursor that this Vigil did not hand out (or from another ordering)."""


def encode_cursor(*values: Any) -> str:
    """An opaque keyset cursor: the sort key of the last row shown."""
    raw = orjson.dumps([v.isoformat() if isinstance(v, datetime) else v for v in values])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str, n: int) -> list[Any]:
    try:
        values = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        raise BadCursor("cursor is not one Vigil handed out") from None
    if not isinstance(values, list) or len(values) != n:
        raise BadCursor("cursor is not one Vigil handed out")
    return values


def cursor_time(value: Any) -> datetime:
    try:
        # OverflowError: an offset that moves the time past year 1 or 9999 in UTC
        return aware(datetime.fromisoformat(value))
    except (TypeError, ValueError, OverflowError):
        raise BadCursor("cursor is not one Vigil handed out") from None


_INT64 = 2**63


def cursor_int(value: Any) -> int:
    """An id from a cursor: an integer a database column holds (a bool, a float or 2**64 is not one)."""
    if value.__class__ is not int or not -_INT64 <= value < _INT64:
        raise BadCursor("cursor is not one Vigil handed out")
    return int(value)


def cursor_number(value: Any) -> float:
    """A priority from a cursor: a finite number (not a bool, a string or a list)."""
    if value.__class__ not in (int, float) or not math.isfinite(value):
        raise BadCursor("cursor is not one Vigil handed out")
    return float(value)


def cursor_text(value: Any) -> str:
    if not isinstance(value, str):
        raise BadCursor("cursor is not one Vigil handed out")
    return value


def capped_count(session: Session, q: Select[Any], cap: int) -> tuple[int, bool]:
    """Rows of ``q`` counted up to ``cap``: (count, True when there are more). Never reads past ``cap + 1`` rows."""
    n = session.scalar(select(func.count()).select_from(q.limit(cap + 1).subquery())) or 0
    return min(n, cap), n > cap


def count_text(n: int, more: bool) -> str:
    return f"{n:,}+" if more else f"{n:,}"


def list_conversations(
    session: Session,
    limit: int = 50,
    offset: int = 0,
    cursor: str | None = None,
    count_cap: int = 10_000,
    **filters: Any,
) -> dict[str, Any]:
    """Newest first. Page with ``cursor`` (the previous page's ``next_cursor``: keyset, flat at any depth)
    or ``offset`` (bounded by the caller); ``total`` counts up to ``count_cap`` (``total_capped`` beyond)."""
    C = ConversationRow
    q = list_query(**filters)
    if filters.get("rule"):
        # the matches, up to the cap the count reads anyway: a rule found in few conversations is read by key.
        # Walking received_at backward for them, as Postgres plans it, read every newer conversation when the
        # rule's were old (953k index probes, 0.8-1.5 s at 1M conversations for 7k in the oldest 5%)
        few = list(session.scalars(q.with_only_columns(C.conversation_id).limit(count_cap + 1)))
        total, capped = min(len(few), count_cap), len(few) > count_cap
        if not capped:
            q = q.where(among(session, C.conversation_id, few))
    else:
        total, capped = capped_count(session, q.with_only_columns(C.conversation_id), count_cap)
    if filters.get("agent") and filters.get("version"):
        newest = newest_received(
            session, filters["agent"], filters["version"], filters.get("since"), filters.get("until")
        )
        if newest is None:
            return _page([], total, capped, limit, offset)
        q = q.where(C.received_at <= newest)
    if cursor:
        at_raw, cid_raw = decode_cursor(cursor, 2)
        at, cid = cursor_time(at_raw), cursor_text(cid_raw)
        q = q.where(C.received_at <= at, or_(C.received_at < at, C.conversation_id > cid))
    rows = session.scalars(q.order_by(C.received_at.desc(), C.conversation_id).limit(limit).offset(offset)).all()
    return _page(rows, total, capped, limit, offset)


def _page(rows: Sequence[ConversationRow], total: int, capped: bool, limit: int, offset: int) -> dict[str, Any]:
    last = rows[-1] if len(rows) == limit else None
    return {
        "total": total,
        "total_capped": capped,
        "total_text": count_text(total, capped),
        "items": [summary_dict(r) for r in rows],
        "limit": limit,
        "offset": offset,
        "next_cursor": encode_cursor(aware(last.received_at), last.conversation_id) if last else None,
    }


def list_dead_letters(
    session: Session, limit: int = 50, reason: str | None = None, source: str | None = None
) -> list[dict[str, Any]]:
    q = select(DeadLetterRow).order_by(DeadLetterRow.id.desc()).limit(limit)
    if reason:
        q = q.where(DeadLetterRow.reason == reason)
    if source:
        q = q.where(DeadLetterRow.source == source)
    return [
        {
            "id": d.id,
            "source": d.source,
            "topic": d.topic,
            "partition": d.partition,
            "offset": d.offset,
            "key": d.key,
            "reason": d.reason,
            "detail": d.detail,
            "raw_size": d.raw_size,
            "raw_preview": d.raw[:2000].decode("utf-8", "replace"),
            "created_at": aware(d.created_at),
            "replayed_at": aware(d.replayed_at),
            "query": d.query,
        }
        for d in session.scalars(q).all()
    ]


def current_labels(session: Session, ids: list[str] | None = None) -> dict[str, list[ReviewLabelRow]]:
    """Reviewers' present labels (``is_current``) per conversation, oldest first; of ``ids`` if given."""
    q = select(ReviewLabelRow).where(ReviewLabelRow.is_current.is_(True)).order_by(ReviewLabelRow.id)
    out: dict[str, list[ReviewLabelRow]] = defaultdict(list)
    chunks = [None] if ids is None else [ids[i : i + 500] for i in range(0, len(ids), 500)]
    for chunk in chunks:
        rows = session.scalars(q if chunk is None else q.where(ReviewLabelRow.conversation_id.in_(chunk))).all()
        for row in rows:
            out[row.conversation_id].append(row)
    return out


@dataclass(frozen=True, slots=True)
class LabelWindow:
    """What a read bounded to the newest labels considered: ``considered`` labels of at most ``limit``;
    ``bounded`` when older labels exist beyond the bound (and so did not count)."""

    considered: int
    bounded: bool
    limit: int

    def as_dict(self, limit_name: str) -> dict[str, Any]:
        return {"labels_considered": self.considered, "bounded": self.bounded, limit_name: self.limit}


def newest_ids(session: Session, newest: Select[Any], limit: int) -> tuple[list[str], LabelWindow]:
    """The distinct conversation ids of ``newest`` (newest first, unlimited) up to ``limit`` rows, and the
    window they make: one row past the bound says whether it cut anything."""
    rows = list(session.scalars(newest.limit(limit + 1)))
    window = LabelWindow(min(len(rows), limit), len(rows) > limit, limit)
    return list(dict.fromkeys(rows[:limit])), window


def newest_labels(session: Session, max_labels: int) -> tuple[dict[str, list[tuple[str, str]]], LabelWindow]:
    """``(reviewer, label)`` of the current labels, oldest first, of the conversations that the newest
    ``max_labels`` current labels (by id) are on, every current label of each: what agreement between
    reviewers reads. A backward walk of the labels' primary key that stops at ``max_labels``, then a look-up
    by conversation, so the cost stays flat however many labels are stored. The window says whether the
    bound left older labels out."""
    L = ReviewLabelRow
    newest = select(L.conversation_id).where(L.is_current.is_(True)).order_by(L.id.desc())
    ids, window = newest_ids(session, newest, max_labels)  # as ids: a subquery made Postgres scan every label
    q = (
        select(L.conversation_id, L.reviewer, L.label)
        .where(L.is_current.is_(True), among(session, L.conversation_id, ids))
        .order_by(L.id)
    )
    out: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for cid, reviewer, label in session.execute(q):
        out[cid].append((reviewer, label))
    return dict(out), window


def labels_of_newest(session: Session, max_labels: int) -> dict[str, list[tuple[str, str]]]:
    """:func:`newest_labels` without its window."""
    return newest_labels(session, max_labels)[0]


def confirmed_failures(session: Session, votes: dict[str, list[ReviewLabelRow]] | None = None) -> dict[str, str]:
    """Conversation id → category, for conversations whose current labels lean to confirmed_failure.

    More ``confirmed_failure`` than ``not_a_failure`` labels (``unsure`` takes no side). A tie (one reviewer
    against another) is disputed and left out, as calibration leaves it out: exporting it, or counting it in
    failure clusters, would take one reviewer's word over the other's. ``votes``: the current labels a
    caller already read (:func:`current_labels`), so that it decides on the labels it uses, not on a second
    read that a label saved in between makes different."""
    votes = current_labels(session) if votes is None else votes
    out: dict[str, str] = {}
    for cid, rows in votes.items():
        yes = [r for r in rows if r.label == "confirmed_failure"]
        no = sum(1 for r in rows if r.label == "not_a_failure")
        if len(yes) > no:
            out[cid] = Counter(r.category or "other" for r in yes).most_common(1)[0][0]
    return out
