"""The same task from two agent versions, side by side, and reviewers' pairwise choices between them.

A pair is picked by task and versions: the most recent stored conversation of the task in each version
(or the conversations named). The reviewer's choice (``a``, ``b`` or ``tie``) is stored and exported in
the shape of a calibration pairwise file's human field, so it can be set against a pairwise judge.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vigil.review import queue
from vigil.review.errors import Invalid, NotFound
from vigil.review.models import ReviewPairwiseRow
from vigil.store.db import aware, clock
from vigil.store.models import ConversationRow

CHOICES = ("a", "b", "tie")
PER_VERSION = 10
MAX_NOTES = 5000


def versions_of_task(session: Session, task_id: str) -> list[dict[str, Any]]:
    """The versions that ran ``task_id``, with how many stored conversations each has, newest version first."""
    rows = session.execute(
        select(ConversationRow.agent_version, func.count(), func.max(ConversationRow.received_at))
        .where(ConversationRow.task_id == task_id)
        .group_by(ConversationRow.agent_version)
        .order_by(func.max(ConversationRow.received_at).desc())
    ).all()
    return [{"version": v, "conversations": n, "latest": aware(at)} for v, n, at in rows]


def has_other_version(session: Session, task_id: str, version: str) -> bool:
    """Whether a version other than ``version`` ran ``task_id``: something to set beside it."""
    found = session.scalars(
        select(ConversationRow.conversation_id)
        .where(ConversationRow.task_id == task_id, ConversationRow.agent_version != version)
        .limit(1)
    ).first()
    return found is not None


def runs(session: Session, task_id: str, version: str, limit: int = PER_VERSION) -> list[str]:
    """Conversation ids of ``task_id`` in ``version``, most recent first."""
    return list(
        session.scalars(
            select(ConversationRow.conversation_id)
            .where(ConversationRow.task_id == task_id, ConversationRow.agent_version == version)
            .order_by(ConversationRow.received_at.desc(), ConversationRow.conversation_id)
            .limit(limit)
        )
    )


def pair(
    session: Session,
    task_id: str,
    version_a: str | None = None,
    version_b: str | None = None,
    conversation_a: str | None = None,
    conversation_b: str | None = None,
) -> dict[str, Any]:
    """The two conversations to show: named ones, else the latest of each version. Missing versions default
    to the two most recent versions of the task (``a`` the newer). Invalid if a side cannot be filled."""
    if conversation_a and not version_a:
        version_a = _version_of(session, conversation_a, task_id)
    if conversation_b and not version_b:
        version_b = _version_of(session, conversation_b, task_id)
    versions = [v["version"] for v in versions_of_task(session, task_id)]
    if not versions:
        raise NotFound(f"no stored conversation of task {task_id!r}")
    if not version_a:
        version_a = next((v for v in versions if v != version_b), None)
    if not version_b:
        version_b = next((v for v in versions if v != version_a), None)
    if not version_a or not version_b:
        raise Invalid(f"task {task_id!r} ran on one version only ({versions[0]}); there is nothing to set beside it")
    if version_a == version_b and not (conversation_a and conversation_b and conversation_a != conversation_b):
        raise Invalid("pick two different versions (or two different conversations) to compare")
    sides = {}
    for side, version, named in (("a", version_a, conversation_a), ("b", version_b, conversation_b)):
        listed = runs(session, task_id, version)
        if named:
            _version_of(session, named, task_id, version)
        cid = named or (listed[0] if listed else None)
        if cid is None:
            raise NotFound(f"version {version!r} has no stored conversation of task {task_id!r}")
        sides[side] = {"version": version, "conversation_id": cid, "others": [c for c in listed if c != cid]}
    return {"task_id": task_id, "versions": versions, **sides}


def _version_of(session: Session, conversation_id: str, task_id: str, version: str | None = None) -> str:
    row = session.get(ConversationRow, conversation_id)
    if row is None:
        raise NotFound(f"no conversation {conversation_id!r}")
    if row.task_id != task_id:
        raise Invalid(f"conversation {conversation_id!r} is not a run of task {task_id!r}")
    if version is not None and row.agent_version != version:
        raise Invalid(f"conversation {conversation_id!r} is version {row.agent_version}, not {version}")
    return row.agent_version


def choose(
    session: Session,
    reviewer: str,
    conversation_a: str,
    conversation_b: str,
    choice: str,
    notes: str = "",
) -> dict[str, Any]:
    """Store ``reviewer``'s choice between two runs of one task (``a``, ``b`` or ``tie``)."""
    if choice not in CHOICES:
        raise Invalid(f"choice must be one of {', '.join(CHOICES)}, not {choice!r}")
    if len(notes) > MAX_NOTES:
        raise Invalid(f"notes are at most {MAX_NOTES} characters")
    if conversation_a == conversation_b:
        raise Invalid("a conversation cannot be compared with itself")
    a, b = session.get(ConversationRow, conversation_a), session.get(ConversationRow, conversation_b)
    if a is None or b is None:
        raise NotFound(f"no conversation {conversation_a if a is None else conversation_b!r}")
    if not a.task_id or a.task_id != b.task_id:
        raise Invalid("both conversations must be runs of the same task")
    choice_row = ReviewPairwiseRow(
        task_id=a.task_id,
        conversation_a=conversation_a,
        conversation_b=conversation_b,
        version_a=a.agent_version,
        version_b=b.agent_version,
        reviewer=reviewer,
        choice=choice,
        notes=notes.strip(),
        created_at=clock(session),
    )
    session.add(choice_row)
    session.flush()
    queue.audit(session, reviewer, "pairwise", conversation_a, versus=conversation_b, choice=choice)
    return choice_dict(choice_row)


def choices(session: Session, task_id: str | None = None, limit: int = 1000, offset: int = 0) -> list[dict[str, Any]]:
    """Reviewers' pairwise choices, oldest first (each with ``human``, as a calibration pairwise file has it)."""
    q = select(ReviewPairwiseRow).order_by(ReviewPairwiseRow.id).limit(limit).offset(offset)
    if task_id:
        q = q.where(ReviewPairwiseRow.task_id == task_id)
    return [choice_dict(r) for r in session.scalars(q)]


def choice_dict(r: ReviewPairwiseRow) -> dict[str, Any]:
    return {
        "id": r.id,
        "task_id": r.task_id,
        "conversation_a": r.conversation_a,
        "conversation_b": r.conversation_b,
        "version_a": r.version_a,
        "version_b": r.version_b,
        "reviewer": r.reviewer,
        "human": r.choice,
        "notes": r.notes,
        "created_at": aware(r.created_at),
    }
