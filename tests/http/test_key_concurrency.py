"""One key runs at most VIGIL_KEY_CONCURRENCY requests at once; more wait their turn, and past a bound
are refused with 429, while other keys go on. Without it, 100 concurrent compare reads of one reviewer
key held every worker thread and a cheap read of another user took 24 s."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import INGEST, make_settings
from tests.support.waiting import async_wait_for, scaled
from vigil.app.runtime import build_runtime
from vigil.app.server import build_app
from vigil.app.wiring import wire
from vigil.review import insights

RITA = {"Authorization": "Bearer rita-key"}
RAJ = {"Authorization": "Bearer raj-key"}
CONV = {
    "conversation_id": "k-1",
    "agent_id": "a",
    "agent_version": "v",
    "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
}


def test_one_key_cannot_take_every_worker(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = build_runtime(make_settings(sqlite_url, key_concurrency=2), registry=CollectorRegistry())
    wire(rt, {"api"})
    app = build_app(rt, [])
    release = threading.Event()
    running: list[int] = []
    real = insights.filter_options

    def held(*args: Any) -> Any:
        running.append(1)
        release.wait(scaled(30))
        return real(*args)

    monkeypatch.setattr(insights, "filter_options", held)

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=scaled(60)) as c:
            filters = "/v1/review/queue/filters"
            first = [asyncio.create_task(c.get(filters, headers=RITA)) for _ in range(2)]
            await async_wait_for(lambda: len(running) == 2, what="two requests of rita running")
            waiting = [asyncio.create_task(c.get(filters, headers=RITA)) for _ in range(16)]
            slots = app.state.key_slots
            await async_wait_for(lambda: len(slots._waiting["rita"]) == 16, what="sixteen waiting")
            refused = await c.get(filters, headers=RITA)
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1", refused.text
            # another key, and ingest with rita's requests in the way, go on
            assert (await c.get("/v1/review/taxonomy", headers=RAJ)).status_code == 200
            stored = await c.post("/v1/conversations", json=[CONV], headers=INGEST)
            assert stored.status_code == 202, stored.text
            assert len(running) == 2
            release.set()
            answers = await asyncio.gather(*first, *waiting)
            assert [r.status_code for r in answers] == [200] * 18
            assert len(running) == 18
            assert slots._running["rita"] == 0 and not slots._waiting["rita"]

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        rt.close()


def test_console_forms_take_their_keys_slot_too(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reviewer's forms (an export, labels, comments) took no slot of their key: one session posting
    exports as fast as it could held every worker thread, while pages of the same key waited their turn."""
    import re

    from vigil.export import run as export_run

    rt = build_runtime(make_settings(sqlite_url, key_concurrency=1), registry=CollectorRegistry())
    wire(rt, {"api"})
    app = build_app(rt, [])
    release = threading.Event()
    running: list[int] = []
    real = export_run.export

    def held(*args: Any, **kwargs: Any) -> Any:
        running.append(1)
        release.wait(scaled(30))
        return real(*args, **kwargs)

    monkeypatch.setattr(export_run, "export", held)

    async def scenario() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=scaled(60)) as c:
            page = await c.get("/ui/login")
            token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
            await c.post("/ui/login", data={"csrf": token, "api_key": "admin-key"})
            page = await c.get("/ui/export")
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
            export = asyncio.create_task(c.post("/ui/export", data={"csrf": csrf, "format": "native"}))
            await async_wait_for(lambda: len(running) == 1, what="the export running")
            queue = asyncio.create_task(c.get("/ui/queue"))
            slots = app.state.key_slots
            await async_wait_for(lambda: len(slots._waiting["admin"]) == 1, what="the page waiting its turn")
            assert not queue.done()
            release.set()
            answers = await asyncio.gather(export, queue)
            assert [r.status_code for r in answers] == [200, 200], [r.text[:200] for r in answers]
            assert slots._running["admin"] == 0

    try:
        asyncio.run(scenario())
    finally:
        release.set()
        rt.close()
