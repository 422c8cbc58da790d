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
