"""Refuse URLs no handler can use: a NUL character in the path or query string (and name the NUL
that reaches PostgreSQL from a request body, which ``create_app`` turns into a 400).

PostgreSQL cannot store or compare a string holding NUL (0x00); a NUL that reached a query would answer
500 and write a raw NUL to the log. No Vigil id, name or filter holds one, so such a request is refused
with 400 before routing, on every database alike.
"""

from __future__ import annotations

from typing import Any

import orjson

NUL_TEXT_DETAIL = "a text field holds a NUL character (\\u0000), which the database cannot store: nothing was saved"
NUL_DETAIL = "the URL holds a NUL character (%00): not allowed in a path or query parameter"


def _has_nul(raw: bytes) -> bool:
    return b"\x00" in raw or b"%00" in raw


def holds_nul(scope: dict[str, Any]) -> bool:
    """Whether an HTTP request's path or query string holds NUL (raw or %00)."""
    raw_path = scope.get("raw_path") or scope.get("path", "").encode("utf-8", "surrogateescape")
    return _has_nul(raw_path) or "\x00" in scope.get("path", "") or _has_nul(scope.get("query_string", b""))


class RefuseNul:
    """ASGI middleware: 400 for an HTTP request whose path or query string holds NUL (raw or %00)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and holds_nul(scope):
            body = orjson.dumps({"detail": NUL_DETAIL})
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
