"""Answer ``HEAD`` wherever ``GET`` is answered: uptime checkers and load balancers probe with it.

FastAPI routes declared with ``@router.get`` accept GET alone, so a ``HEAD /healthz`` was a 405. This
ASGI middleware hands the app a GET (on a copy of the scope: the server's own still says HEAD) and drops
the body of the answer, keeping its status and headers (``content-length`` included, as a HEAD's
should). Everything on the way runs as for the GET: the key or session check, the NUL and body guards.
"""

from __future__ import annotations

from typing import Any


class HeadAsGet:
    """ASGI middleware: a HEAD request is served as its GET, without the response body."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return

        async def headless(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headless)
