"""Working the queue in bulk (skip, assign) and reviewers' comments on conversations and messages.

Each function runs in the caller's transaction and writes audit rows. A bulk action acts on every item
it can and reports the others with the reason, so one held item never blocks the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from vigil.review import queue
from vigil.review.errors import Conflict, Invalid, NotFound
from vigil.review.models import ReviewCommentRow
from vigil.store.db import aware, clock
from vigil.store.models import ConversationRow, ReviewItemRow

MAX_BULK = 500
MAX_COMMENT = 5000
BULK_ACTIONS = ("skip", "assign", "unassign")
REVIEWER_ROLES = ("reviewer", "admin")  # the keys whose names items can be assigned to


def reviewer_names(keys: Iterable[Any]) -> list[str]:
    """The names of ``keys`` (API keys) that may review: the people items can be assigned to."""
    return sorted({k.name for k in keys if k.role in REVIEWER_ROLES})


def check_assignee(assignee: str | None, reviewers: Sequence[str]) -> None:
    """Invalid unless ``assignee`` is one of ``reviewers`` (the names of reviewer and admin keys): an item
    assigned to a name nobody logs in with would wait for nobody (the API and the command line say so
    alike)."""
    names = ", ".join(reviewers)
    if not assignee:
        raise Invalid(f"assign needs an assignee: one of {names}")
    if assignee not in reviewers:
        raise Invalid(f"{assignee!r} is not a reviewer; one of {names}")


def bulk(
    session: Session,
    action: str,
    conversation_ids: list[str],
    actor: str,
    assignee: str | None = None,
    now: datetime | None = None,
    reviewers: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``skip`` (for ``actor``), ``assign`` (to ``assignee``, one of ``reviewers`` when given) or ``unassign``
    each item; returns what was done and what was left, with why. Items another reviewer holds are left as
    they were, whatever the action."""
    if action not in BULK_ACTIONS:
        raise Invalid(f"action must be one of {', '.join(BULK_ACTIONS)}, not {action!r}")
    if action == "assign" and reviewers is not None:
        check_assignee(assignee, reviewers)
    ids = list(dict.fromkeys(c for c in conversation_ids if c))
    if not ids:
        raise Invalid("select at least one item")
    if len(ids) > MAX_BULK:
        raise Invalid(f"at most {MAX_BULK} items at once, not {len(ids)}")
    if action == "assign" and not assignee:
        raise Invalid("say whom to assign the items to")
    now = now or clock(session)
    items = {
        i.conversation_id: i
        for i in session.scalars(select(ReviewItemRow).where(ReviewItemRow.conversation_id.in_(ids)))
    }
    done: list[str] = []
    left: list[dict[str, str]] = []
    for cid in ids:
        item = items.get(cid)
        why = _why_not(item, actor, now)
        if why is None and action == "skip":
            try:
                queue.skip(session, cid, actor, now=now)
            except (Conflict, NotFound) as exc:
                why = str(exc)
        elif why is None:
            who = assignee if action == "assign" else None
            session.execute(
                update(ReviewItemRow)
                .where(ReviewItemRow.conversation_id == cid)
                .values(assignee=who, assigned_at=now if who else None, updated_at=now)
                .execution_options(synchronize_session=False)
            )
            queue.audit(session, actor, action, cid, at=now, **({"assignee": who} if who else {}))
        if why is None:
            done.append(cid)
        else:
            left.append({"conversation_id": cid, "why": why})
    return {"action": action, "done": done, "skipped": left, "assignee": assignee if action == "assign" else None}


def _why_not(item: ReviewItemRow | None, actor: str, now: datetime) -> str | None:
    if item is None:
        return "not in the review queue"
    if item.status == "done":
        return "already done"
    lease = aware(item.lease_until)
    if item.claimed_by not in (None, actor) and lease is not None and lease >= now:
        return f"{item.claimed_by} holds it"
    return None


def add_comment(
    session: Session, conversation_id: str, author: str, body: str, message_index: int | None = None
) -> dict[str, Any]:
    """A comment on a stored conversation (on one of its messages with ``message_index``)."""
    text = body.strip()
    if not text:
        raise Invalid("a comment needs some text")
    if len(text) > MAX_COMMENT:
        raise Invalid(f"a comment is at most {MAX_COMMENT} characters, not {len(text)}")
    if "\x00" in text:  # Postgres cannot store it; SQLite would, into every page showing it
        raise Invalid("a comment holds a NUL character (\\u0000), which Vigil does not store: nothing was saved")
    conv = session.get(ConversationRow, conversation_id)
    if conv is None:
        raise NotFound(f"no conversation {conversation_id!r}")
    if message_index is not None and not 0 <= message_index < conv.message_count:
        raise Invalid(f"message {message_index} is not in this conversation (it has {conv.message_count})")
    row = ReviewCommentRow(
        conversation_id=conversation_id,
        message_index=message_index,
        author=author,
        body=text,
        created_at=clock(session),
    )
    session.add(row)
    session.flush()
    queue.audit(session, author, "comment", conversation_id, comment_id=row.id, message_index=message_index)
    return comment_dict(row)


def comments(session: Session, conversation_id: str) -> list[dict[str, Any]]:
    """A conversation's comments, oldest first."""
    rows = session.scalars(
        select(ReviewCommentRow)
        .where(ReviewCommentRow.conversation_id == conversation_id)
        .order_by(ReviewCommentRow.created_at, ReviewCommentRow.id)
    )
    return [comment_dict(r) for r in rows]


def comment_dict(r: ReviewCommentRow) -> dict[str, Any]:
    return {
        "id": r.id,
        "conversation_id": r.conversation_id,
        "message_index": r.message_index,
        "author": r.author,
        "body": r.body,
        "created_at": aware(r.created_at),
    }
