"""The reviewer UI: server-rendered pages and their form posts under ``/ui``.

Every form carries the session's CSRF token; a post without it is refused. Each action calls the
same queue functions as the JSON API, and redirects back (post/redirect/get). A post whose session has
expired goes to the log-in page (and back afterwards); a label posted then is not lost: the log-in page
carries it, and after log-in the conversation page shows it filled in again, unsaved, to check and save.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from vigil.http import runtime_of
from vigil.http.auth import Principal
from vigil.review import api as review_api
from vigil.review import clusters as near_dups
from vigil.review import failures, insights, queue, reviewers, triage
from vigil.review import side_by_side as sbs
from vigil.review.errors import Conflict, Done, Invalid, NotFound
from vigil.review.policy import LABELS, SEVERITIES
from vigil.review.stage import ReviewStage
from vigil.store import reads
from vigil.ui import transcript
from vigil.ui.forms import Refused, draft_of, form_user, go, safe_next
from vigil.ui.render import render_page, sessions_of, ui_user

router = APIRouter(
    prefix="/ui",
    include_in_schema=False,
)

NOTICES = {
    "empty": "Nothing left to claim with these filters.",
    "labelled": "Label saved.",
    "released": "Released back to the queue.",
    "skipped": "Skipped; you will not be offered this item again.",
    "extended": "Lease extended.",
    "claimed": "Claimed: it is yours until the lease runs out.",
    "conflict": "Someone else holds this item.",
    "done": "This item is done: it has all its reviews. You can still change your label below.",
    "queued": "Added to the review queue.",
    "labelled_last": "Label saved. Nothing left to claim with these filters.",
    "commented": "Comment added.",
    "chosen": "Your choice is saved.",
}
# shown as a short-lived toast rather than a notice
TOASTS = {"labelled": "Saved", "commented": "Comment added"}
EXPIRED_LABEL = "Your session expired, so your label was not saved. Log in again and it is filled in for you to save."
STALE_LABEL = "The form had expired, so your label was not saved."
RELOGGED_LABEL = "Logged in again. Your label was not saved yet."
FILTERS = ("agent", "version", "rule", "verdict", "outcome", "reason", "severity", "search")


def _stage(request: Request) -> ReviewStage:
    return runtime_of(request).get(ReviewStage)


def _review_url(cid: str, notice: str | None = None) -> str:
    return f"/ui/review/{quote(cid, safe='')}" + (f"?notice={notice}" if notice else "")


@router.get("/queue")
def queue_page(
    request: Request,
    status: str = "open",
    page: int = 1,
    notice: str | None = None,
    sort: str | None = None,
    order: str | None = None,
    user: Principal = Depends(ui_user),
) -> Response:
    if status not in insights.STATUSES:
        status = "open"
    if sort not in insights.SORTS:
        sort = None
    descending = None if order not in ("asc", "desc") else order == "desc"
    picked = {k: (request.query_params.get(k) or "").strip() or None for k in FILTERS}
    f = queue.QueueFilter(**picked)
    per_page = 50
    page = max(1, page)
    st = _stage(request)
    with st.sessions() as s:
        data = insights.list_queue(s, f, status, per_page, (page - 1) * per_page, sort=sort, descending=descending)
        options = insights.filter_options(s, list(st.rule_descriptions))
    base = {k: v for k, v in picked.items() if v}
    sorting = {"sort": sort, "order": order} if sort else {}

    def qs(**kw: Any) -> str:
        return urlencode({k: v for k, v in {**base, "status": status, **sorting, **kw}.items() if v is not None})

    def sort_qs(column: str) -> str:
        """The link of a column header: sort by it, or flip the order when it is the current sort."""
        if data["sort"] == column:
            return qs(sort=column, order="asc" if data["descending"] else "desc", page=None)
        return qs(sort=column, order=None, page=None)

    return render_page(
        request,
        "queue.html",
        title="Review queue",
        data=data,
        status=status,
        filters=picked,
        options=options,
        page=page,
        pages=max(1, -(-data["total"] // per_page)),
        notice=NOTICES.get(notice or "") or _bulk_notice(request),
        qs=qs,
        sort_qs=sort_qs,
        reviewers=review_api.reviewer_names(request),
        here=str(request.url.path) + ("?" + str(request.url.query) if request.url.query else ""),
        session_labelled=labelled_this_session(request),
    )


@router.post("/queue/claim")
async def claim_next(request: Request) -> Response:
    try:
        p, form = await form_user(request)
    except Refused as refused:
        return refused.response
    f = queue.QueueFilter(**{k: str(form.get(k) or "") or None for k in FILTERS})
    st = _stage(request)
    with st.sessions.begin() as s:
        cid = queue.claim_next(s, p.name, st.lease_seconds, f)
    st.metrics.review_claims.labels("claimed" if cid else "empty").inc()
    if cid is None:
        return go("/ui/queue?" + urlencode({**{k: v for k in FILTERS if (v := form.get(k))}, "notice": "empty"}))
    return go(_review_url(cid))


@router.get("/review/{conversation_id:path}")
def review_page(
    request: Request,
    conversation_id: str,
    notice: str | None = None,
    comment_on: int | None = None,
    user: Principal = Depends(ui_user),
) -> Response:
    toast = TOASTS.get(notice or "")
    return _conversation_page(
        request,
        conversation_id,
        user,
        notice=None if toast else NOTICES.get(notice or ""),
        toast=toast,
        comment_on=comment_on,
    )


def _conversation_page(
    request: Request,
    conversation_id: str,
    user: Principal,
    status_code: int = 200,
    notice: str | None = None,
    draft: dict[str, str | None] | None = None,
    label_error: str | None = None,
    toast: str | None = None,
    comment_on: int | None = None,
) -> Response:
    """The conversation with its review box; ``draft``: an unsaved label to fill the form with;
    ``label_error``: why the label was refused (shown as an error, its field focused)."""
    st = _stage(request)
    rt = runtime_of(request)
    with st.sessions() as s:
        conv = reads.get_conversation(
            s, conversation_id, lambda _cid: rt.metrics.unreadable_documents.labels("ui").inc()
        )
        if conv is None:
            return render_page(
                request, "error.html", 404, title="Not found", message=f"No conversation {conversation_id}"
            )
        for enrich in rt.hooks.conversation_enrichers:
            enrich(s, conv)
        item = insights.item_detail(s, conversation_id)
        hist = insights.history(s, conversation_id)
        notes = triage.comments(s, conversation_id)
    mine = next((lab for lab in (item or {}).get("labels", []) if lab["reviewer"] == user.name), None)
    # double review is blind: others' labels stay hidden until this reviewer has given theirs
    blind = insights.is_blind(item, user.name)
    if blind:
        hist = {**hist, "labels": [lab for lab in hist["labels"] if lab["reviewer"] == user.name]}
    return render_page(
        request,
        "conversation.html",
        status_code,
        title=f"Conversation {conversation_id}",
        conv=conv,
        item=item,
        messages=transcript.build(conv["conversation"] or {"messages": []}, conv["findings"]),
        findings=conv["findings"],
        verdicts=conv.get("verdicts") or [],
        history=hist,
        mine=mine,
        taxonomy=st.policy.taxonomy,
        labels=LABELS,
        severities=SEVERITIES,
        notice=notice,
        me=user.name,
        lease_seconds=st.lease_seconds,
        blind=blind,
        draft=draft,
        rubric=st.policy.rubric,
        comments=notes,
        comment_on=comment_on,
        toast=toast,
        label_error=label_error,
        error_field="category" if label_error and "category" in label_error else None,
        session_labelled=labelled_this_session(request),
    )


def labelled_this_session(request: Request) -> int:
    return int(sessions_of(request).read(request).get("labelled") or 0)


def _count_labels(request: Request, response: Response, n: int = 1) -> Response:
    """Add ``n`` to the session's label counter (kept in the signed session cookie)."""
    sessions = sessions_of(request)
    sessions.read(request)["labelled"] = labelled_this_session(request) + n
    request.state.vigil_session_dirty = True
    sessions.save(request, response)
    return response


def _act(request: Request, cid: str, fn: Callable[[Session, ReviewStage], Any], notice: str) -> Response:
    st = _stage(request)
    try:
        with st.sessions.begin() as s:
            fn(s, st)
    except Done:
        return go(_review_url(cid, "done"))
    except Conflict:
        return go(_review_url(cid, "conflict"))
    except NotFound as exc:
        return render_page(request, "error.html", 404, title="Not found", message=str(exc))
    return go(_review_url(cid, notice))


_LEASE_ACTIONS: dict[str, tuple[Callable[[Session, ReviewStage, str, str], Any], str]] = {
    "claim": (lambda s, st, cid, who: queue.claim(s, cid, who, st.lease_seconds), "claimed"),
    "extend": (lambda s, st, cid, who: queue.extend(s, cid, who, st.lease_seconds), "extended"),
    "release": (lambda s, _st, cid, who: queue.release(s, cid, who), "released"),
}


@router.post("/review/{conversation_id:path}/claim")
@router.post("/review/{conversation_id:path}/extend")
@router.post("/review/{conversation_id:path}/release")
async def lease_action(request: Request, conversation_id: str) -> Response:
    """Claim, extend or release the reviewer's lease on an item (the path's last word), then back to it."""
    try:
        p, _ = await form_user(request, _review_url(conversation_id))
    except Refused as refused:
        return refused.response
    fn, notice = _LEASE_ACTIONS[request.url.path.rsplit("/", 1)[1]]
    return _act(request, conversation_id, lambda s, st: fn(s, st, conversation_id, p.name), notice)


@router.post("/review/{conversation_id:path}/skip")
async def skip(request: Request, conversation_id: str) -> Response:
    try:
        p, form = await form_user(request, _review_url(conversation_id))
    except Refused as refused:
        return refused.response
    st = _stage(request)
    try:
        with st.sessions.begin() as s:
            queue.skip(s, conversation_id, p.name)
            nxt = queue.claim_next(s, p.name, st.lease_seconds) if form.get("next") else None
    except Conflict:
        return go(_review_url(conversation_id, "conflict"))
    except NotFound as exc:
        return render_page(
            request, "error.html", 404, title="Not skipped", message=str(exc), back=_review_url(conversation_id)
        )
    return go(_review_url(nxt) if nxt else "/ui/queue?notice=" + ("empty" if form.get("next") else "skipped"))


@router.post("/review/{conversation_id:path}/label")
async def label(request: Request, conversation_id: str) -> Response:
    form = dict(await request.form())
    sessions = sessions_of(request)
    p = sessions.principal(request)
    if p is None:
        return render_page(
            request,
            "login.html",
            401,
            title="Log in",
            next=_review_url(conversation_id),
            error=EXPIRED_LABEL,
            draft=draft_of(form),
        )
    if not sessions.csrf_ok(request, str(form.get("csrf", ""))):
        return _conversation_page(request, conversation_id, p, 403, notice=STALE_LABEL, draft=draft_of(form))
    st = _stage(request)
    data = queue.LabelIn(
        str(form.get("label", "")),
        str(form.get("category") or "") or None,
        str(form.get("severity") or "") or None,
        str(form.get("notes", "")),
        str(form.get("expected_behavior", "")),
    )
    try:
        with st.sessions.begin() as s:
            queue.label(s, conversation_id, p.name, data, st.policy, metrics=st.metrics)
            nxt = queue.claim_next(s, p.name, st.lease_seconds) if form.get("next") else None
    except (Invalid, Conflict, IntegrityError) as exc:
        # the page again, with what the reviewer typed, so fixing the label loses nothing
        why = "A concurrent change won; please try again." if isinstance(exc, IntegrityError) else str(exc)
        return _conversation_page(
            request,
            conversation_id,
            p,
            422 if isinstance(exc, Invalid) else 409,
            label_error=why,
            draft=draft_of(form),
        )
    except NotFound as exc:
        return render_page(request, "error.html", 404, title="Not found", message=str(exc))
    if form.get("next"):
        return _count_labels(request, go(_review_url(nxt, "labelled") if nxt else "/ui/queue?notice=labelled_last"))
    return _count_labels(request, go(_review_url(conversation_id, "labelled")))


@router.post("/review/{conversation_id:path}/comment")
async def comment(request: Request, conversation_id: str) -> Response:
    try:
        p, form = await form_user(request, _review_url(conversation_id))
    except Refused as refused:
        return refused.response
    raw_index = str(form.get("message_index") or "").strip()
    try:
        with _stage(request).sessions.begin() as s:
            index = int(raw_index) if raw_index else None
            triage.add_comment(s, conversation_id, p.name, str(form.get("body") or ""), index)
    except (Invalid, ValueError) as exc:
        why = str(exc) if isinstance(exc, Invalid) else f"message {raw_index!r} is not a message number"
        return _conversation_page(request, conversation_id, p, 422, notice=f"Comment not added: {why}")
    except NotFound as exc:
        return render_page(request, "error.html", 404, title="Not found", message=str(exc))
    return go(_review_url(conversation_id, "commented") + "#comments")


@router.post("/queue/bulk")
async def bulk(request: Request) -> Response:
    """Skip, assign or unassign the items ticked in the queue list, then back to the list."""
    try:
        p, _ = await form_user(request)
    except Refused as refused:
        return refused.response
    form = await request.form()
    ids = [str(v) for v in form.getlist("ids")]
    action = str(form.get("action") or "")
    assignee = str(form.get("assignee") or "") or None
    back = str(form.get("back") or "/ui/queue")
    if action == "assign" and assignee not in review_api.reviewer_names(request):
        return go(_with_result(back, action, 0, len(ids)))
    try:
        with _stage(request).sessions.begin() as s:
            out = triage.bulk(s, action, ids, p.name, assignee)
    except Invalid:
        return go(_with_result(back, action, 0, len(ids)))
    return go(_with_result(back, action, len(out["done"]), len(out["skipped"]), assignee))


def _with_result(back: str, action: str, done: int, left: int, assignee: str | None = None) -> str:
    """``back`` (a queue URL of this site) saying what a bulk action did, in numbers only."""
    target = back if back.startswith("/ui/queue") and safe_next(back) == back else "/ui/queue"
    target = target.split("#", 1)[0]
    keep = [(k, v) for k, v in parse_qsl(target.partition("?")[2]) if k not in ("bulk", "done", "left", "to", "notice")]
    result = [("bulk", action), ("done", str(done)), ("left", str(left))] + ([("to", assignee)] if assignee else [])
    return "/ui/queue?" + urlencode(keep + result)


def _bulk_notice(request: Request) -> str | None:
    q = request.query_params
    action = q.get("bulk")
    if action not in triage.BULK_ACTIONS:
        return None
    done, left = int(q.get("done") or 0), int(q.get("left") or 0)
    to = q.get("to")
    verb = {"skip": "Skipped", "assign": "Assigned", "unassign": "Unassigned"}[action]
    if action == "assign" and to in review_api.reviewer_names(request):
        verb = f"Assigned to {to}:"
    if done == 0:
        text = "Nothing changed: tick some items" + (" and pick a reviewer." if action == "assign" else ".")
    else:
        text = f"{verb} {done} item{'s' if done != 1 else ''}."
    if left and done:
        text += f" {left} left as they were (held by someone else, done, or not in the queue)."
    return text


@router.get("/progress")
def progress_page(request: Request, user: Principal = Depends(ui_user)) -> Response:
    with _stage(request).sessions() as s:
        data = reviewers.progress(s)
        counts = insights.list_queue(s, queue.QueueFilter(), "open", 1, 0)["counts"]
    return render_page(request, "progress.html", title="Reviewer progress", data=data, counts=counts, labels=LABELS)


@router.get("/clusters")
def clusters_page(request: Request, notice: str | None = None, user: Principal = Depends(ui_user)) -> Response:
    st = _stage(request)
    with st.sessions() as s:
        data = failures.clusters(s, st.rule_descriptions)
        open_ = [c.as_dict() for c in near_dups.open_clusters(s, reviewer=user.name)]
    q = request.query_params
    said = None
    if notice == "cluster_labelled":
        n, left = int(q.get("n") or 0), int(q.get("left") or 0)
        said = f"Labelled {n} conversation{'s' if n != 1 else ''} in one action."
        if left:
            said += f" {left} left as they were (held by someone else, done, or labelled by you already)."
    return render_page(
        request,
        "clusters.html",
        title="Clusters",
        data=data,
        taxonomy=st.policy.taxonomy,
        open_clusters=open_,
        window=near_dups.WINDOW,
        notice=said or NOTICES.get(notice or ""),
    )


@router.get("/clusters/{cluster_id}")
def cluster_page(request: Request, cluster_id: str, user: Principal = Depends(ui_user)) -> Response:
    return _cluster_view(request, cluster_id, user)


def _cluster_view(
    request: Request, cluster_id: str, user: Principal, label_error: str | None = None, status_code: int = 200
) -> Response:
    """A near-duplicate cluster: its sample to read, its members, and one label form for all of them."""
    st = _stage(request)
    with st.sessions() as s:
        found = near_dups.find(s, cluster_id, user.name)
        if found is None:
            return render_page(
                request,
                "error.html",
                404,
                title="Cluster not found",
                message="This cluster is no longer open: its items may have been labelled, or the queue moved on.",
                back="/ui/clusters#open-clusters",
            )
        cluster = found.as_dict()
        sample = near_dups.sample_messages(s, cluster["sample"][0])
    return render_page(
        request,
        "cluster_review.html",
        status_code,
        title=f"Review a cluster of {cluster['size']}",
        cluster=cluster,
        sample=sample,
        taxonomy=st.policy.taxonomy,
        severities=SEVERITIES,
        rubric=st.policy.rubric,
        filled=None,
        label_error=label_error,
        error_field="category" if label_error and "category" in label_error else None,
    )


@router.post("/clusters/{cluster_id}/label")
async def cluster_label(request: Request, cluster_id: str) -> Response:
    back = f"/ui/clusters/{quote(cluster_id, safe='')}"
    try:
        p, _ = await form_user(request, back)
    except Refused as refused:
        return refused.response
    form = await request.form()
    st = _stage(request)
    data = queue.LabelIn(
        str(form.get("label") or ""),
        str(form.get("category") or "") or None,
        str(form.get("severity") or "") or None,
        str(form.get("notes") or ""),
        str(form.get("expected_behavior") or ""),
    )
    members = [str(v) for v in form.getlist("member")]
    try:
        with st.sessions.begin() as s:
            out = near_dups.label_cluster(
                s, str(form.get("sample") or ""), members, p.name, data, st.policy, st.metrics
            )
    except (Invalid, Conflict) as exc:
        return _cluster_view(request, cluster_id, p, str(exc), 422 if isinstance(exc, Invalid) else 409)
    except NotFound as exc:
        return render_page(request, "error.html", 404, title="Not found", message=str(exc), back=back)
    response = go(
        "/ui/clusters?"
        + urlencode({"notice": "cluster_labelled", "n": len(out["labelled"]), "left": len(out["skipped"])})
        + "#open-clusters"
    )
    return _count_labels(request, response, len(out["labelled"]))


@router.get("/side-by-side")
def side_by_side_page(
    request: Request,
    task: str = "",
    a: str | None = None,
    b: str | None = None,
    ca: str | None = None,
    cb: str | None = None,
    notice: str | None = None,
    user: Principal = Depends(ui_user),
) -> Response:
    """The same task from two versions in two columns, and the reviewer's choice between them."""
    rt = runtime_of(request)
    st = _stage(request)
    if not task.strip():
        return render_page(
            request, "error.html", 422, title="Side by side", message="Say which task: /ui/side-by-side?task=..."
        )
    try:
        with st.sessions() as s:
            picked = sbs.pair(s, task, a or None, b or None, ca or None, cb or None)
            sides = []
            for side in ("a", "b"):
                conv = reads.get_conversation(
                    s, picked[side]["conversation_id"], lambda _cid: rt.metrics.unreadable_documents.labels("ui").inc()
                )
                assert conv is not None  # pair() checked it is stored
                sides.append(
                    {
                        **picked[side],
                        "side": side,
                        "conv": conv,
                        "messages": transcript.build(conv["conversation"] or {"messages": []}, conv["findings"]),
                        "item": insights.item_detail(s, conv["conversation_id"]),
                    }
                )
            earlier = sbs.choices(s, task)
    except (Invalid, NotFound) as exc:
        return render_page(
            request, "error.html", 404 if isinstance(exc, NotFound) else 422, title="Side by side", message=str(exc)
        )
    pair_ids = {sides[0]["conversation_id"], sides[1]["conversation_id"]}
    return render_page(
        request,
        "side_by_side.html",
        title=f"Task {task} side by side",
        task=task,
        picked=picked,
        sides=sides,
        earlier=[c for c in earlier if {c["conversation_a"], c["conversation_b"]} == pair_ids],
        notice=NOTICES.get(notice or ""),
    )


@router.post("/side-by-side/choice")
async def side_by_side_choice(request: Request) -> Response:
    try:
        p, form = await form_user(request, "/ui/queue")
    except Refused as refused:
        return refused.response
    ca, cb = str(form.get("conversation_a") or ""), str(form.get("conversation_b") or "")
    try:
        with _stage(request).sessions.begin() as s:
            chosen = sbs.choose(s, p.name, ca, cb, str(form.get("choice") or ""), str(form.get("notes") or ""))
    except (Invalid, NotFound) as exc:
        return render_page(request, "error.html", 422, title="Choice not saved", message=str(exc))
    back = {"task": chosen["task_id"], "a": chosen["version_a"], "b": chosen["version_b"], "ca": ca, "cb": cb}
    return go("/ui/side-by-side?" + urlencode({**back, "notice": "chosen"}))


RELOGGED_PREFIX = "/ui/review/"


def resume_after_login(request: Request, target: str, draft: dict[str, Any]) -> Response | None:
    """``login_resumers`` entry: back to the conversation with the unsaved label filled in."""
    if not target.startswith(RELOGGED_PREFIX):
        return None
    user = sessions_of(request).principal(request)
    if user is None:
        return None
    cid = unquote(target[len(RELOGGED_PREFIX) :])
    return _conversation_page(request, cid, user, notice=RELOGGED_LABEL, draft=draft)
