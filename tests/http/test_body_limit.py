"""Every request body is bounded by VIGIL_MAX_REQUEST_BYTES, not only ingest's: FastAPI reads and decodes
a JSON or form body whole before any dependency runs, the key check included, so a 200 MiB comment sent
without a key took 750 MB of memory before its 401."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import INGEST, REVIEWER, make_settings
from vigil.app.runtime import build_runtime
from vigil.app.server import build_app
from vigil.app.wiring import wire

LIMIT = 4096


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/review/items/c-1/comments", {}),  # no key
        ("/v1/review/items/c-1/comments", REVIEWER),
        ("/v1/judges/support-generic/calibration", {"Authorization": "Bearer wrong"}),
        ("/ui/login", {}),
    ],
)
def test_a_body_over_the_limit_is_refused_while_read_on_every_endpoint(sqlite_url: str, path: str, headers) -> None:  # type: ignore[no-untyped-def]
    rt = build_runtime(make_settings(sqlite_url, max_request_bytes=LIMIT), registry=CollectorRegistry())
    wire(rt, {"api"})
    app = build_app(rt, [])
    sent = {"bytes": 0}

    async def body():  # type: ignore[no-untyped-def]
        yield b'{"body": "'
        for _ in range(1000):  # 64 MB offered in chunks, without a Content-Length
            sent["bytes"] += 65536
            yield b"a" * 65536
        yield b'"}'

    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        kind = "application/x-www-form-urlencoded" if path.startswith("/ui/") else "application/json"
        h = {**headers, "content-type": kind}
        async with httpx.AsyncClient(transport=transport, base_url="http://vigil") as client:
            streamed = await client.post(path, content=body(), headers=h)
            declared = await client.post(path, content=b'{"body": "' + b"a" * LIMIT + b'"}', headers=h)
            small = await client.post(path, content=b'{"body": "fine"}', headers=h)
        return streamed, declared, small

    try:
        streamed, declared, small = asyncio.run(scenario())
    finally:
        rt.close()
    assert streamed.status_code == 413 and "VIGIL_MAX_REQUEST_BYTES" in streamed.text, streamed.text
    assert sent["bytes"] < 1_000_000  # reading stopped at the limit, not after 64 MB
    assert declared.status_code == 413, declared.text
    assert small.status_code != 413, small.text  # within the limit: answered as before (401, 404, 422...)


def test_ingest_keeps_its_own_refusal_with_a_dead_letter(sqlite_url: str) -> None:
    rt = build_runtime(make_settings(sqlite_url, max_request_bytes=LIMIT), registry=CollectorRegistry())
    wire(rt, {"api"})
    app = build_app(rt, [])

    async def scenario() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://vigil") as client:
            h = {**INGEST, "content-type": "application/json"}
            return await client.post("/v1/conversations", content=b"[" + b" " * LIMIT + b"]", headers=h)

    try:
        r = asyncio.run(scenario())
    finally:
        rt.close()
    assert r.status_code == 413 and r.json()["reason"] == "oversized", r.text
