"""Request bodies: refused while reading when too large, decoded off the event loop, 503 when unstorable."""

from __future__ import annotations

import asyncio
import threading

import httpx
import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from tests.support.app import ADMIN, INGEST, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.app.server import build_app
from vigil.app.wiring import wire
from vigil.errors import ConfigError
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.store.models import ConversationRow


def sim(n: int) -> list[dict]:
    return list(Simulator(parse_versions("v1:0.0"), 9).stream(n))


@pytest.mark.parametrize("path", ["/v1/conversations", "/v1/outcomes", "/v1/traces"])
def test_a_body_over_the_limit_is_refused_before_it_is_read_whole(sqlite_url, path) -> None:
    rt = build_runtime(make_settings(sqlite_url, max_request_bytes=4096), registry=CollectorRegistry())
    wire(rt, {"api"})
    app = build_app(rt, [])
    sent = {"bytes": 0}

    async def body():  # type: ignore[no-untyped-def]
        for _ in range(1000):  # 64 MB offered in chunks, without a Content-Length
            sent["bytes"] += 65536
            yield b" " * 65536

    async def scenario() -> tuple[int, str, int]:
        transport = httpx.ASGITransport(app=app)
        headers = {**INGEST, "content-type": "application/json"}
        async with httpx.AsyncClient(transport=transport, base_url="http://vigil") as client:
            r = await client.post(path, content=body(), headers=headers)
            declared = await client.post(path, content=b"x" * 5000, headers=headers)
        return r.status_code, r.text, declared.status_code

    status, text, declared = asyncio.run(scenario())
    assert status == 413 and "VIGIL_MAX_REQUEST_BYTES" in text
    assert sent["bytes"] < 1_000_000  # reading stopped at the limit, not after 64 MB
    assert declared == 413
    rt.close()


def test_healthz_answers_while_a_large_request_is_decoded(sqlite_url, monkeypatch) -> None:
    """Decoding and checking run in a worker thread: the event loop stays free for /healthz."""
    import vigil.ingest.http as ingest_http

    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    wire(rt, {"api"})
    app = build_app(rt, [])
    entered, release = threading.Event(), threading.Event()
    real = ingest_http.decode_batch

    def gated(*args, **kwargs):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(ingest_http, "decode_batch", gated)
    conv = sim(1)[0]
    conv["messages"][-1]["content"] = "1 " * 400_000  # ~1 MB of digit runs for the PII and groundedness rules
    body = orjson.dumps(conv)

    async def scenario() -> tuple[int, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://vigil") as client:
            post = asyncio.create_task(client.post("/v1/conversations", content=body, headers=INGEST))
            while not entered.is_set():
                await asyncio.sleep(0.01)
            health = await client.get("/healthz")  # answered while the POST is still being decoded
            assert not post.done()
            release.set()
            return health.status_code, (await post).status_code

    health, posted = asyncio.run(scenario())
    assert health == 200 and posted in (202, 422)
    rt.close()


def test_a_request_that_cannot_be_stored_answers_503_and_stores_nothing(sqlite_url) -> None:
    from sqlalchemy import event, text

    rt = build_runtime(
        make_settings(sqlite_url, store_retry_attempts=2, store_retry_base_seconds=0.01), registry=CollectorRegistry()
    )
    with make_client(rt) as c:
        blocker = rt.engine.connect()  # another writer holds SQLite's write lock throughout
        blocker.execute(text("BEGIN IMMEDIATE"))
        rt.engine.pool.dispose()

        def short_wait(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            dbapi_conn.execute("PRAGMA busy_timeout=50")

        event.listen(rt.engine, "connect", short_wait)
        r = c.post("/v1/conversations", json=sim(3), headers=INGEST)
        blocker.execute(text("ROLLBACK"))
        blocker.close()
        assert r.status_code == 503 and r.headers["Retry-After"] == "2"
        with rt.sessions() as s:
            assert s.scalar(select(func.count()).select_from(ConversationRow)) == 0
        assert c.post("/v1/conversations", json=sim(3), headers=INGEST).status_code == 202  # sent again: stored
        assert c.get("/v1/dead-letters", headers=ADMIN).json() == []
    value = rt.metrics.registry.get_sample_value("vigil_store_retries_total", {"kind": "other"})
    assert value is not None and value >= 1
    rt.close()


def test_a_pack_pattern_re2_cannot_run_is_refused_at_load(tmp_path) -> None:
    from vigil.rules import load_pack

    pack = tmp_path / "mine.yaml"
    pack.write_text(
        "pack: mine\nrules:\n  - id: no-lookahead\n    type: regex\n    args:\n      pattern: 'refund(?! denied)'\n"
    )
    with pytest.raises(ConfigError) as exc:
        load_pack(pack)
    message = str(exc.value)
    assert "mine.yaml" in message and "no-lookahead" in message and "args.pattern" in message
    assert "RE2" in message
