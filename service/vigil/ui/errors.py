"""Error pages under ``/ui``: a styled page with a way back instead of the API's JSON.

API paths keep their JSON bodies (``{"detail": ...}``); only requests for ``/ui`` pages get HTML.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException

from vigil.http.unencodable import validation_response
from vigil.ui.render import render_page

log = logging.getLogger(__name__)

TITLES = {
    400: "Bad request",
    403: "Not allowed",
    404: "Page not found",
    405: "Not allowed here",
    500: "Something went wrong",
}


def is_page(request: Request) -> bool:
    path = request.url.path
    return (path == "/ui" or path.startswith("/ui/")) and not path.startswith("/ui/static/")


def error_page(request: Request, status: int, message: str) -> Response:
    try:
        return render_page(
            request, "error.html", status, title=TITLES.get(status, f"Error {status}"), message=message, status=status
        )
    except Exception:  # the page itself could not render: say so plainly rather than fail twice
        log.exception("error page failed to render")
        return PlainTextResponse(f"{status}: {message}", status_code=status)


def not_found_message(request: Request, detail: Any) -> str:
    if detail and detail != "Not Found":
        return str(detail)
    return f"There is no page at {request.url.path}. It may have moved, or the address may be mistyped."


def install(app: Any) -> None:
    """Register the handlers: HTTP errors, bad query parameters and unhandled errors of UI pages."""

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if exc.status_code < 400 or not is_page(request):
            return await http_exception_handler(request, exc)
        message = not_found_message(request, exc.detail) if exc.status_code == 404 else str(exc.detail)
        if exc.status_code == 405:
            message = f"{request.method} is not something {request.url.path} does; go back and use its links."
        return error_page(request, exc.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def bad_parameters(request: Request, exc: RequestValidationError) -> Response:
        if not is_page(request):
            return validation_response(exc)
        wrong = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors())
        return error_page(request, 400, f"This address has a parameter the page cannot use ({wrong}).")

    @app.exception_handler(Exception)
    async def unhandled(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        if not is_page(request):
            return JSONResponse({"detail": f"internal error: {type(exc).__name__}"}, 500)
        return error_page(request, 500, f"The page failed ({type(exc).__name__}); it is logged. Try again, or go back.")
