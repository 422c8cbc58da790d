"""The UI's own pages: static files, log in, log out, and ``/ui`` itself."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import FileResponse, RedirectResponse, Response
from starlette.datastructures import FormData

from vigil.http import runtime_of
from vigil.ui.forms import Refused, draft_of, form_user, go, posted, safe_next
from vigil.ui.render import STATIC, render_page, sessions_of
from vigil.ui.session import UI_ROLES

router = APIRouter(prefix="/ui", include_in_schema=False)

EXPIRED = "Your session expired; please log in again."
# ``/ui/login?error=CODE`` shows one of these fixed texts; any other code shows nothing, so a link cannot
# make the real origin display words of an attacker's choosing.
LOGIN_ERRORS = {
    "bad_credentials": "Unknown API key.",
    "not_reviewer": "That key is not a reviewer or admin key.",
    "form_expired": "The form expired; please try again.",
    "session_expired": EXPIRED,
    "logged_out": "You were logged out; please log in again.",
}
STATIC_FILES = {p.name for p in STATIC.iterdir() if p.is_file()}


@router.get("/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC_FILES:
        raise HTTPException(404, "no such file")
    return FileResponse(STATIC / name, headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"})


@router.get("")
@router.get("/")
def home() -> RedirectResponse:
    # a process wired without the console (a stage on its own) has no home page: its queue is the start
    return go("/ui/queue")


@router.get("/login")
def login_page(request: Request, next: str | None = None, error: str | None = None, expired: bool = False) -> Response:
    message = LOGIN_ERRORS.get(error or "") or (EXPIRED if expired else None)
    sessions = sessions_of(request)
    if sessions.proxy is not None and sessions.proxy_identity(request) is not None:
        if sessions.principal(request) is not None:
            return go(safe_next(next))  # signed in at the proxy: nothing to log in to
        message = sessions.proxy_refusal(request)
    return render_page(request, "login.html", title="Log in", next=safe_next(next), error=message)


@router.post("/login")
def login(request: Request, posted_form: FormData = Depends(posted)) -> Response:
    """Log in (a worker thread: the session's row is written, and the page resumed after it read)."""
    form = dict(posted_form)
    sessions = sessions_of(request)
    target = safe_next(str(form.get("next", "")))
    draft = draft_of(form, "draft_")
    if not sessions.csrf_ok(request, str(form.get("csrf", ""))):
        return render_page(
            request,
            "login.html",
            403,
            title="Log in",
            next=target,
            error=LOGIN_ERRORS["form_expired"],
            draft=draft,
        )
    key = str(form.get("api_key", "")).strip()
    p = request.app.state.keyring.lookup(key) if key else None
    if p is None or p.role not in UI_ROLES:
        msg = LOGIN_ERRORS["not_reviewer" if p else "bad_credentials"]
        return render_page(request, "login.html", 401, title="Log in", next=target, error=msg, draft=draft)
    if draft is not None:
        # a page that can show the unsaved label again gets it now (a redirect could not carry it); the
        # target's query is the resumer's to read (the conversation page's crumb back rides in it)
        sessions.start(request, p, key)
        for resume in runtime_of(request).hooks.login_resumers:
            page = resume(request, target, draft)
            if page is not None:
                return page
    response = go(target)
    sessions.login(request, response, p, key)
    return response


@router.post("/logout")
def logout(request: Request, form: FormData = Depends(posted)) -> Response:
    try:
        form_user(request, form)
    except Refused as refused:
        return refused.response
    sessions = sessions_of(request)
    # a user the proxy signed in leaves through the proxy's sign-out (the proxy's own session would let
    # them straight back in); the page shows them Log out only when it is configured
    by_proxy = sessions.signed_in_by_proxy(request) and sessions.proxy is not None and sessions.proxy.logout_url
    response = go(sessions.proxy.logout_url if by_proxy and sessions.proxy else "/ui/login")
    sessions.logout(request, response)
    return response
