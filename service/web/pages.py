"""The reviewer UI: server-rendered pages and their form posts under ``/ui``.

Every form carries the session's CSRF token; a post without it is refused. Each action calls the
same queue functions as the JSON API, and redirects back (post/redirect/get). A post whose session has
expired goes to the log-in page (and back afterwards); a label posted then is not lost: the log-in page
carries it, and after log-in the conversation page shows it filled in again, unsaved, to check and save.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote, urlencode

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..api.auth import Principal
from ..review import insights, queue
from ..review.errors import Conflict, Done, Invalid, NotFound
from ..review.policy import LABELS, SEVERITIES
from ..review.stage import ReviewStage
from ..store import reads
from . import transcript
from .render import STATIC, render_page, sessions_of, ui_user
from .session import UI_ROLES, session_hook_dependency, session_lifespan

router = APIRouter(
    prefix="/ui",
    include_in_schema=False,
    dependencies=[Depends(session_hook_dependency)],
    lifespan=session_lifespan,
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
}
EXPIRED = "Your session expired; please log in again."
EXPIRED_LABEL = "Your session expired, so your label was not saved. Log in again and it is filled in for you to save."
STALE_FORM = "This form had expired (the page was open across a log-in or a restart), so nothing was done."
STALE_LABEL = "The form had expired, so your label was not saved."
RELOGGED_LABEL = "Logged in again. Your label was not saved yet."
DRAFT_FIELDS = ("label", "category", "severity", "notes", "expected_behavior")
FILTERS = ("agent", "version", "rule", "verdict", "outcome", "reason")
STATIC_FILES = {p.name for p in STATIC.iterdir() if p.is_file()}


def _stage(request: Request) -> ReviewStage:
    return request.app.state.runtime.extras["review"]  # type: ignore[no-any-return]


def _go(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def _safe_next(target: str | None) -> str:
    # only same-site paths: "//host" or "/\\host" would leave the site
    if target and target.startswith("/") and not target.startswith(("//", "/\\")):
        return target
    return "/ui/queue"


class _Refused(Exception):
    """A form post the session cannot make: ``response`` says why (log in again, or reload)."""

    def __init__(self, response: Response) -> None:
        self.response = response


async def _form_user(request: Request, back: str = "/ui/queue") -> tuple[Principal, dict[str, Any]]:
    """The poster and the form; raises _Refused (a log-in redirect, or a 403 page) when they cannot post."""
    form = dict(await request.form())
    sessions = sessions_of(request)
    p = sessions.principal(request)
    if p is None:
        raise _Refused(_go("/ui/login?" + urlencode({"next": _safe_next(back), "expired": "1"})))
    if not sessions.csrf_ok(request, str(form.get("csrf", ""))):
        raise _Refused(render_page(request, "error.html", 403, title="Form expired", message=STALE_FORM, back=back))
    return p, form


def _review_url(cid: str, notice: str | None = None) -> str:
    return f"/ui/review/{quote(cid, safe='')}" + (f"?notice={notice}" if notice else "")


def _draft(form: dict[str, Any], prefix: str = "") -> dict[str, str | None] | None:
    """The label a form carried (``prefix`` draft_ on the log-in form), or None if it carried none."""
    draft = {k: str(form.get(prefix + k) or "") or None for k in DRAFT_FIELDS}
    if not any(draft.values()):
        return None
    return {**draft, "notes": draft["notes"] or "", "expected_behavior": draft["expected_behavior"] or ""}


@router.get("/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC_FILES:
        raise HTTPException(404, "no such file")
    return FileResponse(STATIC / name, headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"})


@router.get("")
@router.get("/")
def home() -> RedirectResponse:
    return _go("/ui/queue")


@router.get("/login")
def login_page(request: Request, next: str | None = None, error: str | None = None, expired: bool = False) -> Response:
    message = error or (EXPIRED if expired else None)
    return render_page(request, "login.html", title="Log in", next=_safe_next(next), error=message)


@router.post("/login")
async def login(request: Request) -> Response:
    form = dict(await request.form())
    sessions = sessions_of(request)
    target = _safe_next(str(form.get("next", "")))
    draft = _draft(form, "draft_")
    if not sessions.csrf_ok(request, str(form.get("csrf", ""))):
        return render_page(
            request,
            "login.html",
            403,
            title="Log in",
            next=target,
            error="The form expired; please try again.",
            draft=draft,
        )
    key = str(form.get("api_key", "")).strip()
    p = request.app.state.keyring.lookup(key) if key else None
    if p is None or p.role not in UI_ROLES:
        msg = "That key is not a reviewer or admin key." if p else "Unknown API key."
        return render_page(request, "login.html", 401, title="Log in", next=target, error=msg, draft=draft)
    prefix = "/ui/review/"
    if draft is not None and target.startswith(prefix) and "?" not in target:
        # back to the conversation with the unsaved label filled in (a redirect could not carry it)
        sessions.start(request, p, key)
        return _conversation_page(request, unquote(target[len(prefix) :]), p, notice=RELOGGED_LABEL, draft=draft)
    response = _go(target)
    sessions.login(request, response, p, key)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    try:
        await _form_user(request)
    except _Refused as refused:
        return refused.response
    response = _go("/ui/login")
    sessions_of(request).logout(response)
    return response


@router.get("/queue")
def queue_page(
    request: Request,
    status: str = "open",
    page: int = 1,
    notice: str | None = None,
    user: Principal = Depends(ui_user),
) -> Response:
    if status not in insights.STATUSES:
        status = "open"
    picked = {k: request.query_params.get(k) or None for k in FILTERS}
    f = queue.QueueFilter(**picked)
    per_page = 50
    page = max(1, page)
    with _stage(request).sessions() as s:
        data = insights.list_queue(s, f, status, per_page, (page - 1) * per_page)
    base = {k: v for k, v in picked.items() if v}
    return render_page(
        request,
        "queue.html",
        title="Review queue",
        data=data,
        status=status,
        filters=picked,
        page=page,
        pages=max(1, -(-data["total"] // per_page)),
        notice=NOTICES.get(notice or ""),
        qs=lambda **kw: urlencode({**base, "status": status, **kw}),
    )


@router.post("/queue/claim")
async def claim_next(request: Request) -> Response:
    try:
        p, form = await _form_user(request)
    except _Refused as refused:
        return refused.response
    f = queue.QueueFilter(**{k: str(form.get(k) or "") or None for k in FILTERS})
    st = _stage(request)
    with st.sessions.begin() as s:
        cid = queue.claim_next(s, p.name, st.lease_seconds, f)
    st.metrics.review_claims.labels("claimed" if cid else "empty").inc()
    if cid is None:
        return _go("/ui/queue?" + urlencode({**{k: v for k in FILTERS if (v := form.get(k))}, "notice": "empty"}))
    return _go(_review_url(cid))


@router.get("/review/{conversation_id:path}")
def review_page(
    request: Request, conversation_id: str, notice: str | None = None, user: Principal = Depends(ui_user)
) -> Response:
    return _conversation_page(request, conversation_id, user, notice=NOTICES.get(notice or ""))


def _conversation_page(
    request: Request,
    conversation_id: str,
    user: Principal,
    status_code: int = 200,
    notice: str | None = None,
    draft: dict[str, str | None] | None = None,
) -> Response:
    """The conversation with its review box; ``draft``: an unsaved label to fill the form with."""
    st = _stage(request)
    rt = request.app.state.runtime
    with st.sessions() as s:
        conv = reads.get_conversation(s, conversation_id)
        if conv is None:
            return render_page(
                request, "error.html", 404, title="Not found", message=f"No conversation {conversation_id}"
            )
        for enrich in rt.extras.get("conversation_enrichers", []):
            enrich(s, conv)
        item = insights.item_detail(s, conversation_id)
        hist = insights.history(s, conversation_id)
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
        messages=transcript.build(conv["conversation"], conv["findings"]),
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
    )


def _act(request: Request, cid: str, fn: Callable[[Session, ReviewStage], Any], notice: str) -> Response:
    st = _stage(request)
    try:
        with st.sessions.begin() as s:
            fn(s, st)
    except Done:
        return _go(_review_url(cid, "done"))
    except Conflict:
        return _go(_review_url(cid, "conflict"))
    except NotFound as exc:
        return render_page(request, "error.html", 404, title="Not found", message=str(exc))
    return _go(_review_url(cid, notice))


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
        p, _ = await _form_user(request, _review_url(conversation_id))
    except _Refused as refused:
        return refused.response
    fn, notice = _LEASE_ACTIONS[request.url.path.rsplit("/", 1)[1]]
    return _act(request, conversation_id, lambda s, st: fn(s, st, conversation_id, p.name), notice)


@router.post("/review/{conversation_id:path}/skip")
async def skip(request: Request, conversation_id: str) -> Response:
    try:
        p, form = await _form_user(request, _review_url(conversation_id))
    except _Refused as refused:
        return refused.response
    st = _stage(request)
    try:
        with st.sessions.begin() as s:
            queue.skip(s, conversation_id, p.name)
            nxt = queue.claim_next(s, p.name, st.lease_seconds) if form.get("next") else None
    except Conflict:
        return _go(_review_url(conversation_id, "conflict"))
    except NotFound as exc:
        return render_page(
            request, "error.html", 404, title="Not skipped", message=str(exc), back=_review_url(conversation_id)
        )
    return _go(_review_url(nxt) if nxt else "/ui/queue?notice=" + ("empty" if form.get("next") else "skipped"))


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
            draft=_draft(form),
        )
    if not sessions.csrf_ok(request, str(form.get("csrf", ""))):
        return _conversation_page(request, conversation_id, p, 403, notice=STALE_LABEL, draft=_draft(form))
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
            notice=f"Label not saved: {why}",
            draft=_draft(form),
        )
    except NotFound as exc:
        return render_page(request, "error.html", 404, title="Not found", message=str(exc))
    if form.get("next"):
        return _go(_review_url(nxt) if nxt else "/ui/queue?notice=empty")
    return _go(_review_url(conversation_id, "labelled"))


@router.get("/progress")
def progress_page(request: Request, user: Principal = Depends(ui_user)) -> Response:
    with _stage(request).sessions() as s:
        data = insights.progress(s)
        counts = insights.list_queue(s, queue.QueueFilter(), "open", 1, 0)["counts"]
    return render_page(request, "progress.html", title="Reviewer progress", data=data, counts=counts, labels=LABELS)


@router.get("/clusters")
def clusters_page(request: Request, user: Principal = Depends(ui_user)) -> Response:
    st = _stage(request)
    with st.sessions() as s:
        data = insights.clusters(s, st.rule_descriptions)
    return render_page(request, "clusters.html", title="Failure clusters", data=data, taxonomy=st.policy.taxonomy)
