"""Page rendering for the reviewer UI, shared with other stages' pages.

A stage adds a page by registering a router (``rt.hooks.add_router``), a nav entry
(``rt.hooks.add_page(label, path)``), and a template folder (``rt.hooks.add_templates``)
whose templates ``{% extends "base.html" %}``; its handlers take ``user: Principal = Depends(ui_user)``
and return ``render_page(request, "its_page.html", ...)``. Templates autoescape everything: pass
transcript text as data, never as markup. A handler is a plain ``def`` (FastAPI runs it in a worker
thread): rendering reads the database (the session, the banners), which must not run on the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import Depends, HTTPException, Request
from fastapi.responses import HTMLResponse
from jinja2 import ChoiceLoader, Environment, FileSystemLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from vigil.http import runtime_of
from vigil.http.auth import Principal, key_slots
from vigil.money import usd
from vigil.ui.labels import outcome_label, reason_key
from vigil.ui.session import SessionManager
from vigil.ui.visible import visible

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).resolve().parent / "templates"
STATIC = Path(__file__).resolve().parent / "static"

# no inline script or style may run: transcript text that slipped past escaping still could not execute
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def sessions_of(request: Request) -> SessionManager:
    return request.app.state.ui_sessions  # type: ignore[no-any-return]


def logged_in(request: Request) -> Principal:
    """The logged-in reviewer, or a redirect to the login page."""
    sessions = sessions_of(request)
    p = sessions.principal(request)
    if p is None:
        refusal = sessions.proxy_refusal(request)
        if refusal:  # signed in at the proxy, but no role here: the log-in page would only send them back
            raise HTTPException(403, refusal)
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(303, "log in first", headers={"Location": f"/ui/login?next={quote(target, safe='')}"})
    return p


async def ui_user(request: Request, p: Principal = Depends(logged_in)) -> AsyncIterator[Principal]:
    """Dependency of UI pages: the logged-in reviewer, within their key's share of the process."""
    async with key_slots(request).hold(p.name):
        yield p


async def session_slot(request: Request) -> AsyncIterator[None]:
    """Dependency of UI forms (POST): the poster's key's share of the process (``VIGIL_KEY_CONCURRENCY``),
    as pages take theirs through :func:`ui_user`. Without it one reviewer's session posting exports or
    labels as fast as it could held every worker thread. A post without a session takes none: the form
    sends it to the login page. The session's row is read in a worker thread, not on the event loop."""
    p = await run_in_threadpool(sessions_of(request).principal, request)
    if p is None:
        yield
        return
    async with key_slots(request).hold(p.name):
        yield


def thousands(n: object) -> str:
    """An integer with thousands separators ("2,804"), as every figure on a page; anything else as it is."""
    return f"{n:,}" if isinstance(n, int) and not isinstance(n, bool) else str(n)


def count_of(n: object, noun: str, plural: str | None = None) -> str:
    """``n`` and its noun, singular for one: "1 tool error", "2,804 tool errors"."""
    one = isinstance(n, int) and not isinstance(n, bool) and n == 1
    return f"{thousands(n)} {noun if one else (plural or noun + 's')}"


def environment(request: Request) -> Environment:
    env: Environment | None = getattr(request.app.state, "ui_env", None)
    if env is None:
        dirs = [str(TEMPLATES), *(str(d) for d in runtime_of(request).hooks.templates)]
        env = Environment(
            loader=ChoiceLoader([FileSystemLoader(d) for d in dirs]),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        env.filters["q"] = lambda v: quote(str(v), safe="")
        env.filters["pct"] = lambda v: "–" if v is None else f"{100 * v:.0f}%"
        env.filters["usd"] = usd
        env.filters["when"] = lambda v: "" if v is None else f"{v:%Y-%m-%d %H:%M} UTC"
        env.filters["outcome"] = outcome_label
        env.filters["reason_key"] = reason_key
        env.filters["visible"] = visible
        env.filters["num"] = thousands
        env.filters["count"] = count_of
        request.app.state.ui_env = env
    return env


def is_under(path: str, href: str) -> bool:
    """``path`` is the page ``href`` or one below it; the UI's root (Home) holds only itself."""
    if href.rstrip("/") == "/ui":
        return path.rstrip("/") == "/ui"
    return path == href or path.startswith(href.rstrip("/") + "/")


def nav_of(request: Request) -> list[tuple[str, str, bool]]:
    """The nav entries, the one holding this page marked (the longest match)."""
    path = request.url.path
    entries = runtime_of(request).hooks.nav
    holding = max((href for _, href in entries if is_under(path, href)), key=len, default=None)
    return [(label, href, href == holding) for label, href in entries]


def banners(request: Request) -> list[dict[str, str]]:
    """What the stages want every page to show on top (an active alert); a failing source shows nothing."""
    out: list[dict[str, str]] = []
    for source in runtime_of(request).hooks.banners:
        try:
            out.extend(source())
        except Exception:  # a page must render even when, say, the database is away for the banner's read
            log.exception("banner source failed")
    return out


def render_page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """Render ``template`` with the layout's context (user, nav, banners, CSRF token) and the security headers."""
    sessions = sessions_of(request)
    user = sessions.principal(request)
    ctx = {
        "request": request,
        "user": user,
        "can_log_out": sessions.can_log_out(request),
        "csrf": sessions.csrf_token(request),
        "nav": nav_of(request),
        "path": request.url.path,
        "banners": banners(request) if user is not None else [],
        **context,
    }
    html = environment(request).get_template(template).render(ctx)
    response = HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)
    sessions.save(request, response)
    return response
