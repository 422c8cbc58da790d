"""The review API: everything the reviewer UI does, as JSON endpoints under ``/v1/review``.

Callers authenticate with ``Authorization: Bearer KEY`` (reviewer or admin), or with the UI's
session cookie plus an ``X-CSRF-Token`` header on writes. Double review is blind here as in the UI: a
reviewer who has not labelled an open multi-reviewer item does not get others' labels on it (items, queue,
history, labels); admins see everything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from vigil.http import runtime_of
from vigil.http.auth import Principal, require
from vigil.http.params import MAX_OFFSET, Instant
from vigil.review import clusters as near_dups
from vigil.review import insights, queue, reviewers, triage
from vigil.review import side_by_side as sbs
from vigil.review.errors import Conflict, Invalid, NotFound, ReviewError
from vigil.review.flagger import enqueue
from vigil.review.page_kit import reviewer_names
from vigil.review.policy import LABELS, SEVERITIES, Reason
from vigil.review.schemas import (
    BulkIn,
    BulkOut,
    ClaimFilters,
    ClaimOut,
    ClusterLabelIn,
    ClusterLabelOut,
    ClustersOut,
    CommentIn,
    CommentOut,
    EnqueueIn,
    HistoryOut,
    ItemOut,
    LabelIn,
    LabelOut,
    LeaseOut,
    OpenClusterOut,
    OpenClustersOut,
    PairwiseIn,
    PairwiseOut,
    QueueOut,
    SideBySideOut,
    TaxonomyOut,
)
from vigil.review.stage import ReviewStage
from vigil.store.reads import BadCursor

router = APIRouter(
    prefix="/v1/review",
    tags=["review"],
)
T = TypeVar("T")
Status = Literal["open", "available", "claimed", "done", "waiting", "all"]


def stage_of(request: Request) -> ReviewStage:
    return runtime_of(request).get(ReviewStage)


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except NotFound as exc:
        raise HTTPException(404, str(exc)) from exc
    except Conflict as exc:
        raise HTTPException(409, str(exc)) from exc
    except Invalid as exc:
        raise HTTPException(422, str(exc)) from exc
    except IntegrityError as exc:
        raise HTTPException(409, "a concurrent change won; try again") from exc


def run(request: Request, fn: Callable[[Session, ReviewStage], T]) -> T:
    """Run ``fn`` in one transaction, mapping review errors to HTTP errors."""
    st = stage_of(request)
    with _errors(), st.sessions.begin() as session:
        return fn(session, st)


def _item(session: Session, cid: str, p: Principal) -> dict[str, Any]:
    found = insights.item_detail(session, cid)
    if found is None:
        raise NotFound(f"conversation {cid!r} is not in the review queue")
    return _seen_by(found, p)


def _seen_by(item: dict[str, Any], p: Principal) -> dict[str, Any]:
    return item if p.can("admin") else insights.blind_view(item, p.name)


@router.get("/queue", response_model=QueueOut)
def list_queue(
    request: Request,
    status: Status = "open",
    agent: str | None = None,
    version: str | None = None,
    rule: str | None = Query(None, description="Conversations with a finding of this rule"),
    verdict: Literal["pass", "fail", "unscored"] | None = Query(None, description="Any judge verdict of this kind"),
    outcome: str | None = Query(None, description="Conversations with an outcome of this type"),
    reason: str | None = Query(None, description="Items flagged for this reason kind"),
    severity: str | None = Query(None, description="Conversations whose most severe finding has this severity"),
    q: str | None = Query(
        None, max_length=200, description="Search: part of the conversation id, task, user id or message text"
    ),
    sort: str | None = Query(None, description=f"Sort by one of: {', '.join(insights.SORTS)} (default priority)"),
    order: Literal["asc", "desc"] | None = Query(None, description="Default: desc for priority and times"),
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(
        0, ge=0, le=MAX_OFFSET, description="Items to skip (bounded by list_max_offset; page deeper with cursor)."
    ),
    cursor: str | None = Query(None, description="next_cursor of the previous page (keyset pagination)."),
    p: Principal = require("reviewer"),
) -> Any:
    """Queue items with counts per state and per reason kind, highest priority first.

    Agent, version, rule, severity and outcome match regardless of case."""
    f = queue.QueueFilter(agent, version, rule, verdict, outcome, reason, severity, q)
    with _errors():
        f.check()
    desc = None if order is None else order == "desc"
    settings = runtime_of(request).settings
    if offset > settings.list_max_offset:
        raise HTTPException(422, f"offset above {settings.list_max_offset}: page with cursor (next_cursor)")
    try:
        out = run(
            request,
            lambda s, _st: insights.list_queue(
                s,
                f,
                status,
                limit,
                offset,
                cursor=cursor,
                count_cap=settings.list_count_cap,
                sort=sort,
                descending=desc,
            ),
        )
    except BadCursor as exc:
        raise HTTPException(422, str(exc)) from None
    out["items"] = [_seen_by(item, p) for item in out["items"]]
    return out


@router.get("/queue/filters")
def queue_filters(request: Request, _: Principal = require("reviewer")) -> dict[str, list[str]]:
    """Known values of the queue's filters (agents, versions, rules, severities, outcomes, ...)."""
    return run(request, lambda s, st: insights.filter_options(s, list(st.rule_descriptions)))


@router.post("/claim", response_model=ClaimOut, responses={204: {"description": "Nothing left to claim"}})
def claim_next(request: Request, body: ClaimFilters | None = None, p: Principal = require("reviewer")) -> Any:
    """Claim the highest-priority available item (optionally filtered) with a lease."""
    b = body or ClaimFilters()
    f = queue.QueueFilter(b.agent, b.version, b.rule, b.verdict, b.outcome, b.reason, b.severity, b.q)
    with _errors():
        f.check()

    def go(s: Session, st: ReviewStage) -> Any:
        cid = queue.claim_next(
            s, p.name, st.lease_seconds, f, release_others=b.release_others, assignment_hours=st.assignment_hours
        )
        st.metrics.review_claims.labels("claimed" if cid else "empty").inc()
        if cid is None:
            return None
        item = _item(s, cid, p)
        return {"conversation_id": cid, "lease_until": item["lease_until"], "item": item}

    out = run(request, go)
    return Response(status_code=204) if out is None else out


def _the_item_itself(request: Request, conversation_id: str, suffix: str, p: Principal) -> Response | None:
    """The item whose id ends in ``/history`` or ``/comments`` (sent with the slash encoded, ``%2F``), which
    routing took for that sub-resource of the id before it; None for a request of the sub-resource."""
    raw = request.scope.get("raw_path") or b""
    if raw.endswith(b"/" + suffix.encode()):
        return None
    item = run(request, lambda s, _st: _item(s, f"{conversation_id}/{suffix}", p))
    return JSONResponse(jsonable_encoder(ItemOut.model_validate(item)))


@router.get("/items/{conversation_id:path}/history", response_model=HistoryOut)
def history(request: Request, conversation_id: str, p: Principal = require("reviewer")) -> Any:
    """Every label version and audit event of one conversation (others' labels hidden while blind to you)."""
    if (itself := _the_item_itself(request, conversation_id, "history", p)) is not None:
        return itself

    def go(s: Session, _st: ReviewStage) -> Any:
        hist = insights.history(s, conversation_id)
        if p.can("admin"):
            return hist
        return insights.blind_history(hist, insights.item_detail(s, conversation_id), p.name)

    return run(request, go)


@router.get("/items/{conversation_id:path}/comments", response_model=list[CommentOut])
def list_comments(request: Request, conversation_id: str, p: Principal = require("reviewer")) -> Any:
    """Reviewers' comments on this conversation and its messages, oldest first (others' hidden while a
    double review is blind to you)."""
    if (itself := _the_item_itself(request, conversation_id, "comments", p)) is not None:
        return itself

    def go(s: Session, _st: ReviewStage) -> Any:
        notes = triage.comments(s, conversation_id)
        if p.can("admin"):
            return notes
        return insights.blind_comments(notes, insights.item_detail(s, conversation_id), p.name)

    return run(request, go)


@router.post("/items/{conversation_id:path}/comments", response_model=CommentOut, status_code=201)
def add_comment(request: Request, conversation_id: str, body: CommentIn, p: Principal = require("reviewer")) -> Any:
    """Comment on a stored conversation, or on one of its messages (``message_index``)."""
    return run(request, lambda s, _st: triage.add_comment(s, conversation_id, p.name, body.body, body.message_index))


@router.post("/items/{conversation_id:path}/claim", response_model=LeaseOut)
def claim_item(request: Request, conversation_id: str, p: Principal = require("reviewer")) -> Any:
    """Claim this item (409 if another reviewer holds it)."""

    def go(s: Session, st: ReviewStage) -> Any:
        try:
            until = queue.claim(s, conversation_id, p.name, st.lease_seconds)
        except Conflict:
            st.metrics.review_claims.labels("conflict").inc()
            raise
        st.metrics.review_claims.labels("claimed").inc()
        return {"conversation_id": conversation_id, "lease_until": until}

    return run(request, go)


@router.post("/items/{conversation_id:path}/extend", response_model=LeaseOut)
def extend(request: Request, conversation_id: str, p: Principal = require("reviewer")) -> Any:
    """Extend your lease on this item by the configured lease time from now."""
    return run(
        request,
        lambda s, st: {
            "conversation_id": conversation_id,
            "lease_until": queue.extend(s, conversation_id, p.name, st.lease_seconds),
        },
    )


@router.post("/items/{conversation_id:path}/release", status_code=204)
def release(
    request: Request,
    conversation_id: str,
    force: bool = Query(False, description="Admins only"),
    p: Principal = require("reviewer"),
) -> Response:
    """Give your claim back to the queue (admins may force another reviewer's)."""
    if force and not p.can("admin"):
        raise HTTPException(403, "only admins may release another reviewer's claim")
    run(request, lambda s, _st: queue.release(s, conversation_id, p.name, force=force))
    return Response(status_code=204)


@router.post("/items/{conversation_id:path}/skip", status_code=204)
def skip(request: Request, conversation_id: str, p: Principal = require("reviewer")) -> Response:
    """Release the item and do not offer it to you again."""
    run(request, lambda s, _st: queue.skip(s, conversation_id, p.name))
    return Response(status_code=204)


@router.post("/items/{conversation_id:path}/labels", response_model=LabelOut, status_code=201)
def label(request: Request, conversation_id: str, body: LabelIn, p: Principal = require("reviewer")) -> Any:
    """Save your label (a new version if you labelled before). Releases your claim."""
    data = queue.LabelIn(body.label, body.category, body.severity, body.notes, body.expected_behavior, body.revision)
    return run(
        request,
        lambda s, st: insights.label_dict(queue.label(s, conversation_id, p.name, data, st.policy, metrics=st.metrics)),
    )


@router.get("/items/{conversation_id:path}", response_model=ItemOut)
def get_item(request: Request, conversation_id: str, p: Principal = require("reviewer")) -> Any:
    """One queue item with its reasons and current labels (others' hidden while the review is blind to you)."""
    return run(request, lambda s, _st: _item(s, conversation_id, p))


@router.post("/items", response_model=ItemOut, status_code=201)
def add_item(request: Request, body: EnqueueIn, p: Principal = require("reviewer")) -> Any:
    """Put a stored conversation in the queue by hand (or add a manual reason to its item)."""

    def go(s: Session, st: ReviewStage) -> Any:
        from vigil.store.models import ConversationRow

        conv = s.get(ConversationRow, body.conversation_id)
        if conv is None:
            raise NotFound(f"no conversation {body.conversation_id!r}")
        enqueue(
            s,
            st.policy,
            {conv.conversation_id: [Reason("manual", p.name, body.weight, body.note)]},
            {conv.conversation_id: (conv.agent_id, conv.agent_version)},
            st.metrics,
            actor=p.name,
        )
        gone = select(ConversationRow.conversation_id).where(ConversationRow.conversation_id == conv.conversation_id)
        if s.scalar(gone) is None:  # retention deleted it while the enqueue waited on its row: no item
            raise NotFound(f"no conversation {body.conversation_id!r}")
        return _item(s, conv.conversation_id, p)

    return run(request, go)


@router.get("/labels", response_model=list[LabelOut])
def labels(
    request: Request,
    since: Instant | None = None,
    current_only: bool = True,
    limit: int = Query(1000, ge=1, le=10_000),
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
    p: Principal = require("reviewer"),
) -> Any:
    """Reviewers' labels (current versions by default), oldest first: input of calibration and export.

    A reviewer does not get others' labels on double reviews still blind to them; admins get all."""
    viewer = None if p.can("admin") else p.name
    return run(request, lambda s, _st: insights.labels_export(s, since, current_only, limit, offset, viewer))


@router.get("/clusters", response_model=ClustersOut)
def clusters(request: Request, p: Principal = require("reviewer")) -> Any:
    """Confirmed failures grouped by category, rule and tool; a double review still blind to you is left out
    (it would tell you another reviewer's verdict); admins get all."""
    viewer = None if p.can("admin") else p.name
    return run(request, lambda s, st: st.failure_clusters.clusters(s, st.rule_descriptions, viewer))


@router.get("/reviewers")
def reviewers_list(request: Request, _: Principal = require("reviewer")) -> list[str]:
    """Reviewers items can be assigned to."""
    return reviewer_names(request)


@router.post("/bulk", response_model=BulkOut)
def bulk(request: Request, body: BulkIn, p: Principal = require("reviewer")) -> Any:
    """Skip (for you), assign (to a reviewer: their claim-next offers the items to them first and to nobody
    else) or unassign many items at once. Items that cannot be changed (another reviewer holds them, done,
    unknown) are listed under ``skipped``."""
    names = reviewer_names(request)
    return run(
        request,
        lambda s, _st: triage.bulk(s, body.action, body.conversation_ids, p.name, body.assignee, reviewers=names),
    )


@router.get("/queue/clusters", response_model=OpenClustersOut)
def open_clusters(
    request: Request,
    min_size: int = Query(2, ge=1, le=1000, description="Smallest cluster to list"),
    p: Principal = require("reviewer"),
) -> Any:
    """Near-duplicate clusters of the open queue (same main reason, near-identical first user message);
    items you labelled or skipped are left out."""
    return run(
        request,
        lambda s, _st: {
            "clusters": [c.as_dict() for c in near_dups.open_clusters(s, min_size, reviewer=p.name)],
            "window": near_dups.WINDOW,
        },
    )


@router.get("/queue/clusters/{cluster_id}", response_model=OpenClusterOut)
def open_cluster(request: Request, cluster_id: str, p: Principal = require("reviewer")) -> Any:
    """One near-duplicate cluster of the open queue."""

    def go(s: Session, _st: ReviewStage) -> Any:
        found = near_dups.find(s, cluster_id, p.name)
        if found is None:
            raise NotFound(f"no open cluster {cluster_id!r} (its items may have been labelled)")
        return found.as_dict()

    return run(request, go)


@router.post("/queue/clusters/label", response_model=ClusterLabelOut)
def label_cluster(request: Request, body: ClusterLabelIn, p: Principal = require("reviewer")) -> Any:
    """Label ``sample`` and apply the label to ``members`` in one action; each copy says it was propagated
    from ``sample`` by you. Members another reviewer holds, done ones and ones you labelled are skipped."""
    data = queue.LabelIn(body.label, body.category, body.severity, body.notes, body.expected_behavior, body.revision)
    return run(
        request,
        lambda s, st: near_dups.label_cluster(s, body.sample, body.members, p.name, data, st.policy, st.metrics),
    )


@router.get("/side-by-side", response_model=SideBySideOut)
def side_by_side(
    request: Request,
    task: str = Query(..., min_length=1, max_length=256, description="Task id"),
    a: str | None = Query(None, description="Version on the left (default: the task's most recent version)"),
    b: str | None = Query(None, description="Version on the right (default: the next most recent)"),
    ca: str | None = Query(None, description="A conversation of version a to show (default: its latest run)"),
    cb: str | None = Query(None, description="A conversation of version b to show"),
    _: Principal = require("reviewer"),
) -> Any:
    """Two runs of the same task from two versions, to read side by side and choose between."""
    return run(request, lambda s, _st: sbs.pair(s, task, a, b, ca, cb))


@router.post("/pairwise", response_model=PairwiseOut, status_code=201)
def pairwise_choose(request: Request, body: PairwiseIn, p: Principal = require("reviewer")) -> Any:
    """Record which of two runs of one task did better (a, b or tie)."""
    return run(
        request, lambda s, _st: sbs.choose(s, p.name, body.conversation_a, body.conversation_b, body.choice, body.notes)
    )


@router.get("/pairwise", response_model=list[PairwiseOut])
def pairwise_list(
    request: Request,
    task: str | None = None,
    limit: int = Query(1000, ge=1, le=10_000),
    offset: int = Query(0, ge=0, le=MAX_OFFSET),
    _: Principal = require("reviewer"),
) -> Any:
    """Reviewers' pairwise choices, oldest first."""
    return run(request, lambda s, _st: sbs.choices(s, task, limit, offset))


@router.get("/progress")
def progress(request: Request, _: Principal = require("reviewer")) -> dict[str, Any]:
    """Per-reviewer counts and inter-reviewer agreement."""
    max_labels = runtime_of(request).settings.agreement_max_labels
    return run(request, lambda s, _st: reviewers.progress(s, max_labels))


@router.get("/audit")
def audit(
    request: Request,
    actor: str | None = None,
    conversation_id: str | None = None,
    action: str | None = None,
    limit: int = Query(100, ge=1, le=1000),
    _: Principal = require("admin"),
) -> list[dict[str, Any]]:
    """The review audit log, newest first (admins)."""
    return run(request, lambda s, _st: insights.audit_log(s, actor, conversation_id, action, limit))


@router.get("/taxonomy", response_model=TaxonomyOut)
def taxonomy(request: Request, _: Principal = require("reviewer")) -> Any:
    """Labels, failure categories and severities a label may use."""
    st = stage_of(request)
    return {
        "labels": list(LABELS),
        "rubric": st.policy.rubric,
        "categories": st.policy.taxonomy,
        "severities": list(SEVERITIES),
        "lease_seconds": st.lease_seconds,
    }


__all__ = ["router", "ReviewError"]
