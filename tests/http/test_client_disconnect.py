"""A client that hangs up while its body is being read is an ordinary event, not an internal error: it
used to be logged as "unhandled error" with two full tracebacks per request (one by Vigil, one by the
server), so anyone with an ingest key could fill the log by opening requests and dropping them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import ADMIN, make_settings
from vigil.app.runtime import build_runtime
from vigil.app.server import build_app
from vigil.app.wiring import wire


def post_then_hang_up(app: Any, path: str, content_type: str) -> list[dict[str, Any]]:
    """POST ``path`` declaring 100,000 bytes, send 20 of them and disconnect; the messages sent back."""
    key = ADMIN["Authorization"].encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"test"),
            (b"authorization", key),
            (b"content-type", content_type.encode()),
            (b"content-length", b"100000"),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }
    messages = [
        {"type": "http.request", "body": b'[{"conversation_id":', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if len(messages) > 1 else messages[0]

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/v1/conversations", "application/json"),
        ("/v1/outcomes", "application/json"),
        ("/v1/traces", "application/x-protobuf"),
    ],
)
def test_a_client_hanging_up_mid_body_is_not_an_error(sqlite_url: str, caplog, path: str, content_type: str) -> None:  # type: ignore[no-untyped-def]
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    wire(rt, {"api"})
    app = build_app(rt, [])
    try:
        with caplog.at_level(logging.INFO):
            post_then_hang_up(app, path, content_type)  # raised ClientDisconnect out of the app
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert errors == [], [r.getMessage() for r in errors]
        assert any("disconnected" in r.getMessage() for r in caplog.records)
    finally:
        rt.close()
