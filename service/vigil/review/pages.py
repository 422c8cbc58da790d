"""The reviewer UI: server-rendered pages and their form posts under ``/ui``.

Every form carries the session's CSRF token; a post without it is refused. Each action calls the
same queue functions as the JSON API, and redirects back (post/redirect/get). A post whose session has
expired goes to the log-in page (and back afterwards); a label posted then is not lost: the log-in page
carries it, and after log-in the conversation page shows it filled in again, unsaved, to check and save.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from starlette.datastructures import FormData

from vigil.http import runtime_of
from vigil.http.auth import Principal
from vigil.review import insights, queue, reviewers, triage
from vigil.review import side_by_side as sbs
from vigil.review.errors import Conflict, Done, Invalid, NotFound, NotHeld
from vigil.review.page_kit import (
    FILTERS,
    bulk_notice,
    count_labels,
    form_int,
    labelled_this_session,
    queue_filter_of,
    remember_queue_filter,
    remembered_filter,
    remembered_queue_filter,
    reviewer_names,
    stage_of,
)
from vigil.review.policy import LABELS, SEVERITIES
from vigil.review.stage import ReviewStage
from vigil.store import reads
from vigil.store.db import clock
from vigil.ui import folding, transcript
from vigil.ui.forms import Refused, comment_draft, draft_of, form_user, go, label_draft, posted
from vigil.ui.links import anchor, back_crumb, back_from, quality_link
from vigil.ui.render import render_page, session_slot, sessions_of, ui_user

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
    "not_held": "You no longer hold this item (claiming another item gives back the one you held): claim it to go on.",
    "done": "This item is done: it has all its reviews. You can still change your label below.",
    "queued": "Added to the review queue.",
    "labelled_last": "Label saved. Nothing left to claim with these filters.",
    "commented": "Comment added.",
}
# shown as a short-lived toast rather than a notice
TOASTS = {"labelled": "Saved", "commented": "Comment added", "skipped_next": "Skipped: this is the next item"}
EXPIRED_LABEL = "Your session expired, so your label was not saved. Log in again and it is filled in for you to save."
STALE_LABEL = "The form had expired, so your label was not saved."
RELOGGED_LABEL = "Logged in again. Your label was not saved yet."
EXPIRED_COMMENT = "Your session expired, so your comment was not added. Log in again and it is filled in for you."
STALE_COMMENT = "The form had expired, so your comment was not added: it is below, to add again."
RELOGGED_COMMENT = "Logged in again. Your comment was not added yet: it is below."


def _stage(request: Request) -> ReviewStage:
    return stage_of(request)


def _review_url(cid: str, notice: str | None = None, came_from: str | None = None) -> str:
    """The conversation's page; ``came_from``, its crumb back to a list, is kept only where it is one."""
    query = urlencode({k: v for k, v in (("notice", notice), ("from", back_from(came_from))) if v})
    return f"/ui/review/{quote(cid, safe='')}" + ("?" + query if query else "")


def _came_from(form: Mapping[str, Any]) -> str | None:
    """The ``from`` a form of the conversation page carried (its crumb back; checked where it is used)."""
    return str(form.get("from") or "") or None


@router.get("/queue")
def queue_page(
    request: Request,
    status: str = "open",
    page: int = 1,
    cursor: str | None = None,
    notice: str | None = None,
    sort: str | None = None,
    order: str | None = None,
    user: Principal = Depends(ui_user),
) -> Response:
    """The queue, 50 items a page: numbered pages as deep as ``list_max_offset`` reaches, and past the deepest
    one ``cursor`` pages on by position in the default order (keyset: flat at any depth)."""
    if status not in insights.STATUSES:
        status = "open"
    if sort not in insights.SORTS:
        sort = None
    descending = None if order not in ("asc", "desc") else order == "desc"
    picked = {k: (request.query_params.get(k) or "").strip() or None for k in FILTERS}
    f = queue.QueueFilter(**picked)
    per_page = 50
    settings = runtime_of(request).settings
    deepest = settings.list_max_offset // per_page + 1
    base = {k: v for k, v in picked.items() if v}
    sorting = {"sort": sort, "order": order} if sort else {}

    def qs(**kw: Any) -> str:
        return urlencode({k: v for k, v in {**base, "status": status, **sorting, **kw}.items() if v is not None})

    if cursor is None and not 1 <= page <= deepest:
        # a page past the deepest is not shown as another: it would list the deepest under the wrong number
        there = min(max(page, 1), deepest)
        why = (
            f"Page {page} is past the deepest numbered page ({deepest}): go on from page {deepest} with Older →, "
            "or narrow the filters."
            if page > deepest
            else f"Page {page} does not exist: pages are numbered from 1."
        )
        back = f"/ui/queue?{qs(page=there)}"
        return render_page(request, "error.html", 400, title="No such page", message=why, back=back)
    st = _stage(request)
    try:
        f.check()
        with st.sessions() as s:
            data = insights.list_queue(
                s,
                f,
                status,
                per_page,
                0 if cursor else (page - 1) * per_page,
                cursor=cursor,
                count_cap=settings.list_count_cap,
                sort=sort,
                descending=descending,
            )
            options = insights.filter_options(s, list(st.rule_descriptions))
    except (reads.BadCursor, Invalid) as exc:
        back = f"/ui/queue?{qs()}"
        return render_page(request, "error.html", 400, title="Bad request", message=str(exc), back=back)
    pages = max(1, -(-data["total"] // per_page))
    full = len(data["items"]) == per_page
    newer = older = None
    if cursor:
        newer = qs()
        older = qs(cursor=data["next_cursor"]) if data["next_cursor"] else None
    else:
        newer = qs(page=page - 1) if page > 1 else None
        if full and (page < pages or data["total_capped"]):
            # past the deepest numbered page the keyset cursor goes on (the default order only has one)
            more = qs(page=page + 1) if page < deepest else None
            older = more or (qs(cursor=data["next_cursor"]) if data["next_cursor"] else None)

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
        pages=pages,
        deepest=deepest,
        cursor=cursor,
        newer=newer,
        older=older,
        # a sorted list has no cursor: past its deepest numbered page there is no Older link, and the page says why
        sorted_too_deep=full and older is None and not cursor and page == deepest,
        notice=NOTICES.get(notice or "") or bulk_notice(request),
        qs=qs,
        sort_qs=sort_qs,
        reviewers=reviewer_names(request),
        here=str(request.url.path) + ("?" + str(request.url.query) if request.url.query else ""),
        session_labelled=labelled_this_session(request),
    )


@router.post("/queue/claim", dependencies=[Depends(session_slot)])
def claim_next(request: Request, posted_form: FormData = Depends(posted)) -> Response:
    try:
        p, form = form_user(request, posted_form)
    except Refused as refused:
        return refused.response
    # a filter is at most an id's length (search: MAX_SEARCH), and one holding a control character
    # matches nothing: neither is echoed back whole into the redirect (a 100 kB field made a 100 kB header)
    values = {k: str(form.get(k) or "")[:256] for k in FILTERS}
    f = queue.QueueFilter(**{k: v or None for k, v in values.items()})
    try:
        f.check()
    except Invalid:  # the queue page with these filters says which value no item can have
        return go("/ui/queue?" + urlencode(queue_filter_of(values)))
    st = _stage(request)
    with st.sessions.begin() as s:
        cid = queue.claim_next(s, p.name, st.lease_seconds, f, assignment_hours=st.assignment_hours)
    st.metrics.review_claims.labels("claimed" if cid else "empty").inc()
    kept = queue_filter_of(values)
    if cid is None:
        return remember_queue_filter(request, go("/ui/queue?" + urlencode({**kept, "notice": "empty"})), kept)
    return remember_queue_filter(request, go(_review_url(cid)), kept)


@router.get("/review/{conversation_id:path}")
def review_page(
    request: Request,
    conversation_id: str,
    notice: str | None = None,
    comment_on: int | None = None,
    messages: str | None = None,
    around: str | None = None,
    user: Principal = Depends(ui_user),
) -> Response:
    """The conversation page; a long transcript shows its first and last messages, ``messages=A-B`` a
    window of it and ``around=N`` the window around message N (see :mod:`vigil.ui.folding`)."""
    toast = TOASTS.get(notice or "")
    return _conversation_page(
        request,
        conversation_id,
        user,
        notice=None if toast else NOTICES.get(notice or ""),
        toast=toast,
        comment_on=comment_on,
        window=(messages, around),
        came_from=request.query_params.get("from"),
    )


def _conversation_page(
    request: Request,
    conversation_id: str,
    user: Principal,
    status_code: int = 200,
    notice: str | None = None,
    draft: dict[str, str | None] | None = None,
    label_error: str | None = None,
    unsent: dict[str, str | None] | None = None,
    toast: str | None = None,
    comment_on: int | None = None,
    window: tuple[str | None, str | None] = (None, None),
    came_from: str | None = None,
) -> Response:
    """The conversation with its review box; ``draft``: an unsaved label to fill the form with;
    ``label_error``: why the label was refused (shown as an error, its field focused); ``unsent``: a comment
    that was not added (its text and message, filled in again); ``window``: the
    ``messages`` and ``around`` parameters that pick the shown part of a long transcript; ``came_from``: the
    list it was opened from (its crumb back, which its links and forms carry on; dropped unless one of ours)."""
    came_from = back_from(came_from)
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
        now = clock(s)  # the lease's clock: the page says what is left of it, not the browser's clock
        item = insights.item_detail(s, conversation_id, now)
        hist = insights.history(s, conversation_id)
        notes = triage.comments(s, conversation_id)
        task = conv.get("task_id")
        # the link leads somewhere only when another version ran the task (else "ran on one version only")
        pairable = (
            isinstance(task, str) and bool(task.strip()) and sbs.has_other_version(s, task, conv["agent_version"])
        )
    mine = next((lab for lab in (item or {}).get("labels", []) if lab["reviewer"] == user.name), None)
    # double review is blind: others' labels stay hidden until this reviewer has given theirs
    blind = insights.is_blind(item, user.name)
    hist = insights.blind_history(hist, item, user.name)  # the API's rule: their labels and label events
    shown_notes = insights.blind_comments(notes, item, user.name)
    document = conv["conversation"] or {"messages": []}
    try:
        fold = folding.pick(len(document.get("messages") or []), *window)
        asked = comment_on if window == (None, None) and comment_on is not None else -1
        if 0 <= asked < fold.total and not fold.visible(asked):  # commenting on a folded message: show it
            fold = folding.around(fold.total, asked)
    except folding.BadWindow as exc:
        back = _review_url(conversation_id, came_from=came_from)
        return render_page(request, "error.html", 400, title="Bad request", message=str(exc), status=400, back=back)
    carry = urlencode({"from": came_from}) if came_from else ""
    fold = replace(fold, page=_review_url(conversation_id), carry=carry)
    rows = transcript.folded(document, conv["findings"], fold)
    messages = [m for kind, m in rows if kind == "m"]
    return render_page(
        request,
        "conversation.html",
        status_code,
        title=f"Conversation {conversation_id}",
        conv=conv,
        pairable=pairable,
        item=item,
        messages=messages,
        hidden=sum(transcript.hidden_characters(m) for m in messages),
        rows=rows,
        fold=fold,
        tools=transcript.tools(conv["conversation"] or {}),
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
        lease_left=_seconds_left(item, now),
        blind=blind,
        draft=draft,
        rubric=st.policy.rubric,
        comments=shown_notes,
        comments_hidden=len(notes) - len(shown_notes),
        comment_on=comment_on,
        unsent=unsent,
        toast=toast,
        label_error=label_error,
        error_field="category" if label_error and "category" in label_error else None,
        session_labelled=labelled_this_session(request),
        queue_filter=remembered_queue_filter(request),
        back=back_crumb(came_from),
        came_from=came_from,
        rule_descriptions=st.rule_descriptions,
        rule_conversations=lambda rule: (
            "/ui/conversations?"
            + urlencode({"agent": conv["agent_id"], "version": conv["agent_version"], "rule": rule})
        ),
        rule_chart=lambda rule: quality_link(conv["agent_id"], conv["agent_version"]) + "#" + anchor(f"rule:{rule}"),
    )


def _act(
    request: Request, cid: str, fn: Callable[[Session, ReviewStage], Any], notice: str, came_from: str | None
) -> Response:
    st = _stage(request)
    try:
        with st.sessions.begin() as s:
            fn(s, st)
    except Done:
        return go(_review_url(cid, "done", came_from))
    except NotHeld:
        return go(_review_url(cid, "not_held", came_from))
    except Conflict:
        return go(_review_url(cid, "conflict", came_from))
    except NotFound as exc:
        return render_page(request, "error.html", 404, title="Not found", message=str(exc))
    return go(_review_url(cid, notice, came_from))


_LEASE_ACTIONS: dict[str, tuple[Callable[[Session, ReviewStage, str, str], Any], str]] = {
    "claim": (lambda s, st, cid, who: queue.claim(s, cid, who, st.lease_seconds), "claimed"),
    "extend": (lambda s, st, cid, who: queue.extend(s, cid, who, st.lease_seconds), "extended"),
    "release": (lambda s, _st, cid, who: queue.release(s, cid, who), "released"),
}


@router.post("/review/{conversation_id:path}/claim", dependencies=[Depends(session_slot)])
@router.post("/review/{conversation_id:path}/extend", dependencies=[Depends(session_slot)])
@router.post("/review/{conversation_id:path}/release", dependencies=[Depends(session_slot)])
def lease_action(request: Request, conversation_id: str, posted_form: FormData = Depends(posted)) -> Response:
    """Claim, extend or release the reviewer's lease on an item (the path's last word), then back to it."""
    came_from = _came_from(posted_form)
    try:
        p, _ = form_user(request, posted_form, _review_url(conversation_id, came_from=came_from))
    except Refused as refused:
        return refused.response
    action = request.url.path.rsplit("/", 1)[1]
    fn, notice = _LEASE_ACTIONS[action]

    def act(s: Session, st: ReviewStage) -> Any:
        if action != "claim":
            return fn(s, st, conversation_id, p.name)
        try:
            fn(s, st, conversation_id, p.name)
        except Conflict:
            st.metrics.review_claims.labels("conflict").inc()
            raise
        st.metrics.review_claims.labels("claimed").inc()

    return _act(request, conversation_id, act, notice, came_from)


def _count_claim_next(st: ReviewStage, form: dict[str, Any], cid: str | None) -> None:
    """*Save & next* and *Skip & next* claim the next item as *Claim next* does, and count the same."""
    if form.get("next"):
        st.metrics.review_claims.labels("claimed" if cid else "empty").inc()


@router.post("/review/{conversation_id:path}/skip", dependencies=[Depends(session_slot)])
def skip(request: Request, conversation_id: str, posted_form: FormData = Depends(posted)) -> Response:
    here = _review_url(conversation_id, came_from=_came_from(posted_form))
    try:
        p, form = form_user(request, posted_form, here)
    except Refused as refused:
        return refused.response
    st = _stage(request)
    try:
        with st.sessions.begin() as s:
            queue.skip(s, conversation_id, p.name)
            nxt = (
                queue.claim_next(
                    s, p.name, st.lease_seconds, remembered_filter(request), assignment_hours=st.assignment_hours
                )
                if form.get("next")
                else None
            )
    except Conflict:
        return go(_review_url(conversation_id, "conflict", _came_from(form)))
    except NotFound as exc:
        return render_page(request, "error.html", 404, title="Not skipped", message=str(exc), back=here)
    _count_claim_next(st, form, nxt)
    notice = "empty" if form.get("next") else "skipped"
    back = "/ui/queue?" + urlencode({**remembered_queue_filter(request), "notice": notice})
    return go(_review_url(nxt, "skipped_next") if nxt else back)


def _log_in_again(
    request: Request, conversation_id: str, why: str, draft: dict[str, str | None] | None, came_from: str | None
) -> Response:
    """The log-in page for a post whose session expired, carrying what was typed back to the conversation."""
    back = _review_url(conversation_id, came_from=came_from)
    return render_page(request, "login.html", 401, title="Log in", next=back, error=why, draft=draft)


@router.post("/review/{conversation_id:path}/label", dependencies=[Depends(session_slot)])
def label(request: Request, conversation_id: str, posted_form: FormData = Depends(posted)) -> Response:
    form = dict(posted_form)
    came_from = _came_from(form)
    sessions = sessions_of(request)
    p = sessions.principal(request)
    if p is None:
        return _log_in_again(request, conversation_id, EXPIRED_LABEL, draft_of(form), came_from)
    if not sessions.csrf_ok(request, str(form.get("csrf", ""))):
        return _conversation_page(
            request, conversation_id, p, 403, notice=STALE_LABEL, draft=draft_of(form), came_from=came_from
        )
    st = _stage(request)
    read = str(form.get("revision", ""))
    data = queue.LabelIn(
        str(form.get("label", "")),
        str(form.get("category") or "") or None,
        str(form.get("severity") or "") or None,
        str(form.get("notes", "")),
        str(form.get("expected_behavior", "")),
        # the revision the page showed ("²" is a digit to isdigit, not to int: ASCII only)
        form_int(read),
    )
    try:
        with st.sessions.begin() as s:
            queue.label(s, conversation_id, p.name, data, st.policy, metrics=st.metrics)
            nxt = (
                queue.claim_next(
                    s, p.name, st.lease_seconds, remembered_filter(request), assignment_hours=st.assignment_hours
                )
                if form.get("next")
                else None
            )
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
            came_from=came_from,
        )
    except NotFound as exc:
        return render_page(request, "error.html", 404, title="Not found", message=str(exc))
    _count_claim_next(st, form, nxt)
    if form.get("next"):
        last = "/ui/queue?" + urlencode({**remembered_queue_filter(request), "notice": "labelled_last"})
        return count_labels(request, go(_review_url(nxt, "labelled") if nxt else last))
    return count_labels(request, go(_review_url(conversation_id, "labelled", came_from)))


@router.post("/review/{conversation_id:path}/comment", dependencies=[Depends(session_slot)])
def comment(request: Request, conversation_id: str, posted_form: FormData = Depends(posted)) -> Response:
    form = dict(posted_form)
    raw_index = str(form.get("message_index") or "").strip()
    # the typed comment survives every refusal: an expired session, a stale form, a bad message number
    unsent = comment_draft({"comment": str(form.get("body") or ""), "comment_on": raw_index or None})
    came_from = _came_from(form)
    sessions = sessions_of(request)
    p = sessions.principal(request)
    if p is None:
        return _log_in_again(request, conversation_id, EXPIRED_COMMENT, unsent, came_from)
    if not sessions.csrf_ok(request, str(form.get("csrf", ""))):
        return _conversation_page(
            request,
            conversation_id,
            p,
            403,
            notice=STALE_COMMENT,
            unsent=unsent,
            comment_on=form_int(raw_index),
            came_from=came_from,
        )
    try:
        with _stage(request).sessions.begin() as s:
            index = form_int(raw_index)
            if raw_index and index is None:
                raise ValueError(raw_index)
            triage.add_comment(s, conversation_id, p.name, str(form.get("body") or ""), index)
    except (Invalid, ValueError) as exc:
        why = str(exc) if isinstance(exc, Invalid) else f"message {raw_index!r} is not a message number"
        return _conversation_page(
            request,
            conversation_id,
            p,
            422,
            notice=f"Comment not added: {why}",
            unsent=unsent,
            comment_on=form_int(raw_index),
            came_from=came_from,
        )
    except NotFound as exc:
        return render_page(request, "error.html", 404, title="Not found", message=str(exc))
    return go(_review_url(conversation_id, "commented", came_from) + "#comments")


@router.get("/progress")
def progress_page(request: Request, user: Principal = Depends(ui_user)) -> Response:
    settings = runtime_of(request).settings
    cap = settings.list_count_cap
    with _stage(request).sessions() as s:
        data = reviewers.progress(s, settings.agreement_max_labels)
        counts = insights.list_queue(s, queue.QueueFilter(), "open", 1, 0, count_cap=cap)["count_text"]
    return render_page(request, "progress.html", title="Reviewer progress", data=data, counts=counts, labels=LABELS)


RELOGGED_PREFIX = "/ui/review/"


def resume_after_login(request: Request, target: str, draft: dict[str, Any]) -> Response | None:
    """``login_resumers`` entry: back to the conversation with the unsaved label filled in (and its crumb)."""
    if not target.startswith(RELOGGED_PREFIX):
        return None
    user = sessions_of(request).principal(request)
    if user is None:
        return None
    path, _, query = target.partition("?")  # the id is quoted whole: a "?" starts the query
    cid = unquote(path[len(RELOGGED_PREFIX) :])
    came_from = next(iter(parse_qs(query).get("from", [])), None)
    label, unsent = label_draft(draft), comment_draft(draft)
    notice = RELOGGED_LABEL if label is not None or unsent is None else RELOGGED_COMMENT
    on = form_int(str(unsent.get("comment_on") or "")) if unsent else None
    return _conversation_page(
        request, cid, user, notice=notice, draft=label, unsent=unsent, comment_on=on, came_from=came_from
    )


def _seconds_left(item: dict[str, Any] | None, now: datetime) -> int | None:
    """Whole seconds left of a claimed item's lease at ``now`` (None: not claimed), what the page counts down
    from: a browser's own clock, ahead or behind the database's, showed a fresh lease expired or hours long."""
    until = (item or {}).get("lease_until")
    return None if until is None else max(0, int((until - now).total_seconds()))
