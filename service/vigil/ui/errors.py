"""Error pages under ``/ui``: a styled page with a way back instead of the API's JSON.

API paths keep their JSON bodies (``{"detail": ...}``); only requests for ``/ui`` pages get HTML. A page
reads the database (the session, the banners), so it is rendered in a worker thread, never on the event
loop: with the database slow or away, a wait there stalled every request of the process.
"""

from __future__ import annotations

import html
import logging
from typing import Any

from fastapi import Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from vigil.http.app import database_unavailable
from vigil.http.guard import holds_nul
from vigil.http.unencodable import validation_response
from vigil.store.db import StoreUnavailable
from vigil.ui.render import SECURITY_HEADERS, render_page

log = logging.getLogger(__name__)

TITLES = {
    400: "Bad request",
    403: "Not allowed",
    404: "Page not found",
    405: "Not allowed here",
    500: "Something went wrong",
    503: "Not available just now",
}


NUL_PAGE = "This address holds a NUL character (%00), which no page can use: remove it and try again."


def is_page_path(path: str) -> bool:
    return (path == "/ui" or path.startswith("/ui/")) and not path.startswith("/ui/static/")


def is_page(request: Request) -> bool:
    return is_page_path(request.url.path)


def bare_page(status: int, message: str) -> HTMLResponse:
    """An error page without the layout, which reads the database (the session, the banners)."""
    title = html.escape(TITLES.get(status, f"Error {status}"))
    body = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title} · Vigil</title>'
        '<link rel="stylesheet" href="/ui/static/vigil.css"></head><body><main id="main">'
        f'<h1>{title}</h1><p class="error">{html.escape(message)}</p>'
        '<p><a href="/ui">Home</a> <a href="/ui/queue">Review queue</a></p></main></body></html>'
    )
    return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)


def error_page(request: Request, status: int, message: str) -> Response:
    try:
        return render_page(
            request, "error.html", status, title=TITLES.get(status, f"Error {status}"), message=message, status=status
        )
    except Exception as exc:  # the layout needs the database (the session): a bare page rather than fail twice
        if status != 503:
            log.exception("error page failed to render")
        else:
            log.debug("error page rendered bare: %s", exc)
        return bare_page(status, message)


class NulPages:
    """ASGI middleware around ``RefuseNul``: a page's address holding NUL gets the 400 page, not the API's JSON.

    The bare page: answered before routing, on the event loop, where the layout's database reads must not run."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and is_page_path(scope.get("path", "")) and holds_nul(scope):
            await bare_page(400, NUL_PAGE)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def not_found_message(request: Request, detail: Any) -> str:
    if detail and detail != "Not Found":
        return str(detail)
    return f"There is no page at {request.url.path}. It may have moved, or the address may be mistyped."


def install(app: Any) -> None:
    """Register the handlers: HTTP errors, bad query parameters and unhandled errors of UI pages."""
    app.add_middleware(NulPages)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if exc.status_code < 400 or not is_page(request):
            return await http_exception_handler(request, exc)
        message = not_found_message(request, exc.detail) if exc.status_code == 404 else str(exc.detail)
        if exc.status_code == 405:
            message = f"{request.method} is not something {request.url.path} does; go back and use its links."
        return await run_in_threadpool(error_page, request, exc.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def bad_parameters(request: Request, exc: RequestValidationError) -> Response:
        if not is_page(request):
            return validation_response(exc)
        wrong = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return await run_in_threadpool(
            error_page, request, 400, f"This address has a parameter the page cannot use ({wrong})."
        )

    @app.exception_handler(StoreUnavailable)
    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def database_away(request: Request, exc: Exception) -> Response:
        answer = database_unavailable(request, exc)
        if not is_page(request):
            return answer
        page = await run_in_threadpool(
            error_page, request, 503, "The database is not answering just now; nothing was changed. Try again shortly."
        )
        page.headers["Retry-After"] = answer.headers["Retry-After"]
        return page

    @app.exception_handler(Exception)
    async def unhandled(request: Request, exc: Exception) -> Response:
        path = request.url.path.encode("unicode_escape").decode("ascii")  # no control characters in the log
        log.exception("unhandled error on %s %s", request.method, path)
        if not is_page(request):
            return JSONResponse({"detail": f"internal error: {type(exc).__name__}"}, 500)
        why = f"The page failed ({type(exc).__name__}); it is logged. Try again, or go back."
        return await run_in_threadpool(error_page, request, 500, why)
