"""The judge queue in the database: enqueue (idempotent), claim with a lease, finish exactly once.

Claims use ``FOR UPDATE SKIP LOCKED`` on Postgres so workers never wait on each other; SQLite runs one
writer at a time, so the same single ``UPDATE ... RETURNING`` is atomic there as well. A request whose
lease ran out (its worker died) is claimed again; a verdict is written only by the lease's owner, and
``verdicts.request_id`` is unique, so each request gets exactly one verdict.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import ARRAY, String, and_, any_, bindparam, func, or_, select, update
from sqlalchemy.orm import Session

from vigil.judge.models import JudgeRequestRow, JudgeStatusRow
from vigil.store.db import upsert
from vigil.store.models import ConversationRow, OutcomeRow, PairwiseRow, VerdictRow
from vigil.store.writes import insert_new

ACTIVE = ("pending", "running")


def enqueue(session: Session, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Insert judge requests; ones already present (same judge, conversation, revision) are left alone.

    Returns the rows actually inserted. One statement: this runs in the pipeline's transaction, so
    superseding older revisions is left to :func:`claim`, off the ingest path.
    """
    if not rows:
        return []
    t = JudgeRequestRow.__table__
    inserted = set(insert_new(session, t, rows, ["judge", "conversation_id", "revision"], ["judge", "conversation_id"]))  # type: ignore[arg-type]
    return [r for r in rows if (r["judge"], r["conversation_id"]) in inserted]


_O = OutcomeRow.__table__.c
# Built once: this lookup runs for every stored batch, and constructing a statement costs more client
# CPU than the query. Postgres takes the ids as one array parameter instead of one parameter per id.
_EARLY_OUTCOMES = {
    "postgresql": select(_O.conversation_id, _O.type, _O.value).where(
        _O.conversation_id == any_(bindparam("ids", type_=ARRAY(String))), _O.source != "inline"
    ),
    "sqlite": select(_O.conversation_id, _O.type, _O.value).where(
        _O.conversation_id.in_(bindparam("ids", expanding=True)), _O.source != "inline"
    ),
}


def outcomes_of(session: Session, ids: Sequence[str]) -> list[tuple[str, str, float]]:
    """(conversation_id, type, value) of stored outcomes, except inline ones, for these conversations."""
    stmt = _EARLY_OUTCOMES.get(session.get_bind().dialect.name, _EARLY_OUTCOMES["sqlite"])
    return [tuple(r) for r in session.execute(stmt, {"ids": list(ids)}).all()]  # type: ignore[misc]


@dataclass(slots=True)
class Prior:
    """An existing request for a conversation, as the sampler sees it when a newer revision arrives."""

    id: int
    revision: int
    status: str
    reason: str


def requests_for(
    session: Session, judges: Iterable[str], conversation_ids: Iterable[str]
) -> dict[tuple[str, str], list[Prior]]:
    """Existing requests per (judge, conversation), oldest first (uses the (judge, conversation) index)."""
    ids = list(set(conversation_ids))
    if not ids:
        return {}
    R = JudgeRequestRow
    out: dict[tuple[str, str], list[Prior]] = {}
    rows = session.execute(
        select(R.judge, R.conversation_id, R.id, R.revision, R.status, R.reason)
        .where(R.judge.in_(list(judges)), R.conversation_id.in_(ids))
        .order_by(R.id)
    ).all()
    for judge, cid, id_, revision, status, reason in rows:
        out.setdefault((judge, cid), []).append(Prior(id_, revision, status, reason))
    return out


def supersede(session: Session, request_ids: Sequence[int]) -> None:
    """Pending requests for older revisions of conversations that just got a request for a newer one."""
    if request_ids:
        session.execute(
            update(JudgeRequestRow)
            .where(JudgeRequestRow.id.in_(list(request_ids)), JudgeRequestRow.status == "pending")
            .values(status="superseded")
            .execution_options(synchronize_session=False)
        )


def judged_before(session: Session, pairs: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The (judge, conversation) pairs among ``pairs`` that already have a verdict."""
    if not pairs:
        return set()
    V = VerdictRow
    rows = session.execute(
        select(V.judge, V.conversation_id)
        .where(V.judge.in_({j for j, _ in pairs}), V.conversation_id.in_({c for _, c in pairs}))
        .distinct()
    ).all()
    return {(j, c) for j, c in rows} & pairs


@dataclass(slots=True)
class Claimed:
    id: int
    judge: str
    conversation_id: str
    revision: int
    agent_id: str
    agent_version: str
    reason: str
    attempts: int
    document: str | None = None
    stored_revision: int | None = None
    lease_until: datetime | None = None  # when another worker may take it over


def claim(
    session: Session,
    judge: str,
    limit: int,
    owner: str,
    now: datetime,
    lease: float,
    conversation_id: str | None = None,
) -> list[Claimed]:
    """Take up to ``limit`` due requests of ``judge`` (pending and due, or running with an expired lease)."""
    R = JudgeRequestRow
    lease_until = now + timedelta(seconds=lease)
    due = select(R.id).where(
        R.judge == judge,
        or_(
            and_(R.status == "pending", R.next_attempt_at <= now),
            and_(R.status == "running", R.lease_until < now),
        ),
    )
    if conversation_id is not None:
        due = due.where(R.conversation_id == conversation_id)
    # An idle worker polls often; a plain read first keeps it from taking SQLite's write lock for nothing.
    if session.execute(due.limit(1)).first() is None:
        return []
    due = due.order_by(R.next_attempt_at, R.id).limit(limit).with_for_update(skip_locked=True)
    stmt = (
        update(R)
        .where(R.id.in_(due.scalar_subquery()))
        .values(
            status="running",
            lease_owner=owner,
            lease_until=lease_until,
            attempts=R.attempts + 1,
        )
        .returning(R.id, R.judge, R.conversation_id, R.revision, R.agent_id, R.agent_version, R.reason, R.attempts)
        .execution_options(synchronize_session=False)
    )
    claimed = [Claimed(*row, lease_until=lease_until) for row in session.execute(stmt).all()]
    if claimed:
        docs = {
            cid: (rev, doc)
            for cid, rev, doc in session.execute(
                select(ConversationRow.conversation_id, ConversationRow.revision, ConversationRow.document).where(
                    ConversationRow.conversation_id.in_({c.conversation_id for c in claimed})
                )
            ).all()
        }
        for c in claimed:
            found = docs.get(c.conversation_id)
            if found:
                c.stored_revision, c.document = found
        claimed = _drop_superseded(session, claimed)
    return claimed


def _drop_superseded(session: Session, claimed: list[Claimed]) -> list[Claimed]:
    """A request for an older revision, when the stored revision has its own request, is superseded.

    Otherwise it judges the stored (newest) document, and its verdict carries that revision.
    """
    R = JudgeRequestRow
    stale = [c for c in claimed if c.stored_revision is not None and c.stored_revision > c.revision]
    if not stale:
        return claimed
    newer = set(
        session.execute(
            select(R.judge, R.conversation_id, R.revision).where(
                R.conversation_id.in_({c.conversation_id for c in stale})
            )
        ).all()
    )
    dropped = {c.id for c in stale if (c.judge, c.conversation_id, c.stored_revision) in newer}
    if dropped:
        session.execute(
            update(R)
            .where(R.id.in_(dropped))
            .values(status="superseded", lease_until=None, lease_owner=None)
            .execution_options(synchronize_session=False)
        )
    return [c for c in claimed if c.id not in dropped]


def _owned(request_id: int, owner: str) -> Any:
    R = JudgeRequestRow
    return and_(R.id == request_id, R.lease_owner == owner, R.status == "running")


def complete(session: Session, request_id: int, owner: str) -> bool:
    """Mark done if this worker still holds the lease; False means another worker owns it now."""
    res = session.execute(
        update(JudgeRequestRow)
        .where(_owned(request_id, owner))
        .values(status="done", lease_until=None, last_error=None)
        .execution_options(synchronize_session=False)
    )
    return res.rowcount == 1  # type: ignore[attr-defined]


def reschedule(
    session: Session,
    request_id: int,
    owner: str,
    next_at: datetime,
    error: str | None,
    refund_attempt: bool = False,
) -> None:
    R = JudgeRequestRow
    values: dict[str, Any] = {
        "status": "pending",
        "next_attempt_at": next_at,
        "lease_until": None,
        "lease_owner": None,
    }
    if error is not None:
        values["last_error"] = error[:2000]
    if refund_attempt:
        values["attempts"] = R.attempts - 1
    session.execute(
        update(R).where(_owned(request_id, owner)).values(**values).execution_options(synchronize_session=False)
    )


def queue_depth(session: Session, conversation_id: str | None = None) -> dict[str, int]:
    R = JudgeRequestRow
    q = select(R.judge, func.count()).where(R.status.in_(ACTIVE))
    if conversation_id is not None:
        q = q.where(R.conversation_id == conversation_id)
    rows = session.execute(q.group_by(R.judge)).all()
    return {j: int(n) for j, n in rows}


def left_for(session: Session, judges: list[str], owner: str, now: datetime, conversation_id: str | None = None) -> int:
    """Requests of ``judges`` that ``owner`` could still take or is running: pending ones (due or waiting for a
    retry), its own running ones, and those whose lease ran out. Another worker's running request is not
    one: ``--once`` waited up to its lease (300 s) for a request a second worker held."""
    R = JudgeRequestRow
    q = select(func.count()).where(
        R.judge.in_(judges),
        or_(R.status == "pending", and_(R.status == "running", or_(R.lease_owner == owner, R.lease_until < now))),
    )
    if conversation_id is not None:
        q = q.where(R.conversation_id == conversation_id)
    return int(session.scalar(q) or 0)


def spend_since(session: Session, since: datetime) -> dict[str, tuple[float, int]]:
    """Stored spend and number of priced calls per judge since ``since`` (verdicts and pairwise)."""
    out: dict[str, tuple[float, int]] = {}
    for table in (VerdictRow, PairwiseRow):
        q = (
            select(table.judge, func.coalesce(func.sum(table.cost_usd), 0.0), func.count(table.cost_usd))
            .where(table.created_at >= since)
            .group_by(table.judge)
        )
        for judge, total, n in session.execute(q).all():
            t, c = out.get(judge, (0.0, 0))
            out[judge] = (t + float(cast(float, total)), c + int(n))  # coalesced, so never NULL
    return out


def save_status(session: Session, judge: str, state: str, detail: str | None, worker: str, now: datetime) -> None:
    stmt = upsert(session, JudgeStatusRow).values(
        judge=judge, state=state, detail=detail, worker=worker, updated_at=now
    )
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=["judge"],
            set_={"state": state, "detail": detail, "worker": worker, "updated_at": now},
        )
    )


def load_status(session: Session, judges: Iterable[str] | None = None) -> dict[str, JudgeStatusRow]:
    q = select(JudgeStatusRow)
    if judges is not None:
        q = q.where(JudgeStatusRow.judge.in_(list(judges)))
    return {r.judge: r for r in session.scalars(q).all()}


def request_resume(session: Session, judge: str, now: datetime) -> None:
    stmt = upsert(session, JudgeStatusRow).values(
        judge=judge, state="resume_requested", updated_at=now, resume_requested_at=now
    )
    session.execute(stmt.on_conflict_do_update(index_elements=["judge"], set_={"resume_requested_at": now}))


def verdicts_for(session: Session, conversation_id: str) -> list[VerdictRow]:
    return list(
        session.scalars(
            select(VerdictRow).where(VerdictRow.conversation_id == conversation_id).order_by(VerdictRow.id)
        ).all()
    )
