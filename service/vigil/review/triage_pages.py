"""Triage pages of the reviewer UI: bulk actions on the queue, near-duplicate clusters labelled at once,
and the same task from two versions side by side with the reviewer's pairwise choice."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.datastructures import FormData

from vigil.http import runtime_of
from vigil.http.auth import Principal
from vigil.review import clusters as near_dups
from vigil.review import insights, queue, triage
from vigil.review import side_by_side as sbs
from vigil.review.errors import Conflict, Invalid, NotFound
from vigil.review.page_kit import count_labels, form_int, notice_count, reviewer_names, stage_of
from vigil.review.policy import SEVERITIES
from vigil.store import reads
from vigil.ui import folding, transcript
from vigil.ui.forms import Refused, draft_of, form_user, go, posted, safe_next
from vigil.ui.render import render_page, session_slot, ui_user

router = APIRouter(
    prefix="/ui",
    include_in_schema=False,
)
NOTICES = {"chosen": "Your choice is saved."}


@router.post("/queue/bulk", dependencies=[Depends(session_slot)])
def bulk(request: Request, form: FormData = Depends(posted)) -> Response:
    """Skip, assign or unassign the items ticked in the queue list, then back to the list."""
    try:
        p, _ = form_user(request, form)
    except Refused as refused:
        return refused.response
    ids = [str(v) for v in form.getlist("ids")]
    action = str(form.get("action") or "")
    assignee = str(form.get("assignee") or "") or None
    back = str(form.get("back") or "/ui/queue")
    if action == "assign" and assignee not in reviewer_names(request):
        return go(_with_result(back, action, 0, len(ids)))
    try:
        with stage_of(request).sessions.begin() as s:
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


@router.get("/clusters")
def clusters_page(request: Request, notice: str | None = None, user: Principal = Depends(ui_user)) -> Response:
    st = stage_of(request)
    with st.sessions() as s:
        # double review is blind here too: a conversation another reviewer confirmed, not yet labelled by
        # this one, is left out (its cluster would say their verdict and category)
        data = st.failure_clusters.clusters(s, st.rule_descriptions, user.name)
        open_ = [c.as_dict() for c in near_dups.open_clusters(s, reviewer=user.name)]
    said = None
    if notice == "cluster_labelled":
        n, left = notice_count(request, "n"), notice_count(request, "left")
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
    request: Request,
    cluster_id: str,
    user: Principal,
    label_error: str | None = None,
    status_code: int = 200,
    draft: dict[str, str | None] | None = None,
    ticked: set[str] | None = None,
) -> Response:
    """A near-duplicate cluster: its sample to read, its members, and one label form for all of them.

    ``draft`` and ``ticked``: the label and the members a refused form carried, shown again as they were
    (a member the reviewer unticked must not be ticked again behind their back)."""
    st = stage_of(request)
    with st.sessions() as s:
        found = near_dups.find(s, cluster_id, user.name)
        if found is None:
            gone = "This cluster is no longer open: its items may have been labelled, or the queue moved on."
            if label_error:  # the refusal's reason, not only that the cluster changed with it (say, a claim)
                gone = f"Nothing saved: {label_error}. {gone}"
            return render_page(
                request,
                "error.html",
                status_code if label_error else 404,
                title="Label not saved" if label_error else "Cluster not found",
                message=gone,
                back="/ui/clusters#open-clusters",
            )
        cluster = found.as_dict()
        sample = near_dups.sample_messages(s, cluster["sample"][0])
        revision = near_dups.sample_revision(s, cluster["sample"][0])
    return render_page(
        request,
        "cluster_review.html",
        status_code,
        title=f"Review a cluster of {cluster['size']}",
        cluster=cluster,
        sample=sample,
        revision=revision,
        taxonomy=st.policy.taxonomy,
        severities=SEVERITIES,
        rubric=st.policy.rubric,
        filled=draft,
        ticked=ticked,
        label_error=label_error,
        error_field="category" if label_error and "category" in label_error else None,
    )


@router.post("/clusters/{cluster_id}/label", dependencies=[Depends(session_slot)])
def cluster_label(request: Request, cluster_id: str, form: FormData = Depends(posted)) -> Response:
    back = f"/ui/clusters/{quote(cluster_id, safe='')}"
    try:
        p, _ = form_user(request, form, back)
    except Refused as refused:
        return refused.response
    st = stage_of(request)
    read = str(form.get("revision") or "")
    data = queue.LabelIn(
        str(form.get("label") or ""),
        str(form.get("category") or "") or None,
        str(form.get("severity") or "") or None,
        str(form.get("notes") or ""),
        str(form.get("expected_behavior") or ""),
        # the sample's revision the page showed (ASCII digits only, as the conversation page's form)
        form_int(read),
    )
    members = [str(v) for v in form.getlist("member")]
    try:
        with st.sessions.begin() as s:
            out = near_dups.label_cluster(
                s, str(form.get("sample") or ""), members, p.name, data, st.policy, st.metrics
            )
    except (Invalid, Conflict) as exc:
        status = 422 if isinstance(exc, Invalid) else 409
        return _cluster_view(request, cluster_id, p, str(exc), status, draft_of(dict(form)), set(members))
    except NotFound as exc:
        return render_page(request, "error.html", 404, title="Not found", message=str(exc), back=back)
    response = go(
        "/ui/clusters?"
        + urlencode({"notice": "cluster_labelled", "n": len(out["labelled"]), "left": len(out["skipped"])})
        + "#open-clusters"
    )
    return count_labels(request, response, len(out["labelled"]))


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
    st = stage_of(request)
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
                        "rows": _folded_rows(conv),
                        # double review is blind here too: others' labels only once this reviewer gave theirs
                        "item": _blind(insights.item_detail(s, conv["conversation_id"]), user.name),
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


def _folded_rows(conv: dict[str, Any]) -> list[tuple[str, Any]]:
    """One side's transcript with the middle of a long one folded (its gaps open on the conversation page)."""
    document = conv["conversation"] or {"messages": []}
    return transcript.folded(document, conv["findings"], folding.default(len(document.get("messages") or [])))


def _blind(item: dict[str, Any] | None, viewer: str) -> dict[str, Any] | None:
    return None if item is None else insights.blind_view(item, viewer)


@router.post("/side-by-side/choice", dependencies=[Depends(session_slot)])
def side_by_side_choice(request: Request, posted_form: FormData = Depends(posted)) -> Response:
    try:
        p, form = form_user(request, posted_form, "/ui/queue")
    except Refused as refused:
        return refused.response
    ca, cb = str(form.get("conversation_a") or ""), str(form.get("conversation_b") or "")
    try:
        with stage_of(request).sessions.begin() as s:
            chosen = sbs.choose(s, p.name, ca, cb, str(form.get("choice") or ""), str(form.get("notes") or ""))
    except (Invalid, NotFound) as exc:
        return render_page(request, "error.html", 422, title="Choice not saved", message=str(exc))
    back = {"task": chosen["task_id"], "a": chosen["version_a"], "b": chosen["version_b"], "ca": ca, "cb": cb}
    return go("/ui/side-by-side?" + urlencode({**back, "notice": "chosen"}))
