"""Page rendering for the reviewer UI, shared with other stages' pages.

A stage adds a page by registering a router (``rt.hooks.routers``), a nav entry
(``rt.extras["ui_nav"]``: ``(label, path)``), and a template folder (``rt.extras["ui_template_dirs"]``)
whose templates ``{% extends "base.html" %}``; its handlers take ``user: Principal = Depends(ui_user)``
and return ``render_page(request, "its_page.html", ...)``. Templates autoescape everything: pass
transcript text as data, never as markup.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse
from jinja2 import ChoiceLoader, Environment, FileSystemLoader, select_autoescape

from vigil.http import runtime_of
from vigil.http.auth import Principal
from vigil.money import usd
from vigil.ui.session import SessionManager

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


def ui_user(request: Request) -> Principal:
    """Dependency of UI pages: the logged-in reviewer, or a redirect to the login page."""
    p = sessions_of(request).principal(request)
    if p is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(303, "log in first", headers={"Location": f"/ui/login?next={quote(target, safe='')}"})
    return p


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
        request.app.state.ui_env = env
    return env


def render_page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """Render ``template`` with the layout's context (user, nav, CSRF token) and the security headers."""
    sessions = sessions_of(request)
    nav = [(label, path, request.url.path.startswith(path)) for label, path in runtime_of(request).hooks.nav]
    ctx = {
        "request": request,
        "user": sessions.principal(request),
        "csrf": sessions.csrf_token(request),
        "nav": nav,
        "path": request.url.path,
        **context,
    }
    html = environment(request).get_template(template).render(ctx)
    response = HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)
    sessions.save(request, response)
    return response
