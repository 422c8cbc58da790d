"""Request bodies hold VIGIL_MAX_INFLIGHT_BYTES as they arrive, not by the length they declare.

Before, a body reserved its whole declared Content-Length up front: one client declaring most of the
budget and then sending nothing stalled every other ingest request until it was cut off (at 500 bytes a
second, a 32 MiB declaration is 18 hours). Held as they arrive, bodies that together need more than the
budget could wait for each other for good: the youngest is refused with a retryable 503 instead.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import ADMIN, INGEST, make_settings
from tests.support.waiting import async_wait_for, scaled
from vigil.app.runtime import build_runtime
from vigil.app.server import build_app
from vigil.app.wiring import wire
from vigil.http.body import ByteBudget
from vigil.ingest.http import DECODED_BYTES_PER_BODY_BYTE

BUDGET = 1_048_576


def batch(prefix: str, n: int, pad: int) -> bytes:
    conversations = [
        {
            "conversation_id": f"{prefix}-{i}",
            "agent_id": "a",
            "agent_version": "v",
            "messages": [{"role": "user", "content": "x" * pad}, {"role": "assistant", "content": "ok"}],
        }
        for i in range(n)
    ]
    return orjson.dumps(conversations)


def otlp(prefix: str, n: int, pad: int) -> bytes:
    """An OTLP/JSON request of ``n`` finished chat spans, each with a ``pad``-character prompt."""
    spans = [
        {
            "traceId": f"{prefix}{i:04x}".ljust(32, "0"),
            "spanId": f"{i + 1:016x}",
            "name": "chat m",
            "startTimeUnixNano": "1700000000000000000",
            "endTimeUnixNano": "1700000001000000000",
            "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                {"key": "gen_ai.prompt.0.role", "value": {"stringValue": "user"}},
                {"key": "gen_ai.prompt.0.content", "value": {"stringValue": "x" * pad}},
            ],
        }
        for i in range(n)
    ]
    return orjson.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]})


async def trickle(body: bytes, first: int, go: asyncio.Event) -> AsyncIterator[bytes]:
    """``first`` bytes of ``body`` at once, the rest once ``go`` is set."""
    yield body[:first]
    await go.wait()
    for at in range(first, len(body), 65_536):
        yield body[at : at + 65_536]


def post(c: httpx.AsyncClient, body: bytes, content: Any, path: str = "/v1/conversations") -> Any:
    headers = {**INGEST, "Content-Type": "application/json", "Content-Length": str(len(body))}
    return asyncio.create_task(c.post(path, content=content, headers=headers))


def run(sqlite_url: str, scenario: Any) -> None:
    rt = build_runtime(make_settings(sqlite_url, max_inflight_bytes=BUDGET), registry=CollectorRegistry())
    wire(rt, {"api"})
    app = build_app(rt, [])

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=scaled(60)) as c:
            await scenario(c, app)

    try:
        asyncio.run(main())
    finally:
        rt.close()


def stored(c: httpx.AsyncClient, cid: str) -> Any:
    return c.get(f"/v1/conversations/{cid}", headers=ADMIN)


def test_a_stalled_body_holds_only_what_it_sent(sqlite_url: str) -> None:
    slow = batch("slow", 3, 300_000)  # declares about 900 KB of the 1 MiB budget, then stalls
    fast = batch("fast", 2, 100_000)
    assert 800_000 < len(slow) < BUDGET and len(slow) + len(fast) > BUDGET

    async def scenario(c: httpx.AsyncClient, app: Any) -> None:
        go = asyncio.Event()
        stalled = post(c, slow, trickle(slow, 10, go))
        await async_wait_for(lambda: getattr(app.state, "body_budget", None) is not None, what="the slow body read")
        answer = await asyncio.wait_for(post(c, fast, fast), scaled(30))  # before: waited for the slow body
        assert answer.status_code == 202, answer.text
        assert not stalled.done()
        go.set()
        assert (await stalled).status_code == 202
        for cid in ("slow-0", "slow-2", "fast-1"):
            assert (await stored(c, cid)).status_code == 200, cid
        assert app.state.body_budget.free == BUDGET  # everything given back

    run(sqlite_url, scenario)


@pytest.mark.parametrize("path", ["/v1/conversations", "/v1/traces"])
def test_bodies_that_could_never_all_finish_refuse_the_youngest(sqlite_url: str, path: str) -> None:
    make = batch if path == "/v1/conversations" else otlp
    first = make("a1", 2, 330_000)  # each about 660 KB: together more than the budget
    second = make("b2", 2, 330_000)

    async def scenario(c: httpx.AsyncClient, app: Any) -> None:
        go_first, go_second = asyncio.Event(), asyncio.Event()
        older = post(c, first, trickle(first, 400_000, go_first), path)
        await async_wait_for(
            lambda: getattr(app.state, "body_budget", None) is not None and app.state.body_budget.free < 700_000,
            what="the first body holding what it sent",
        )
        younger = post(c, second, trickle(second, 500_000, go_second), path)
        budget: ByteBudget = app.state.body_budget
        await async_wait_for(lambda: budget.free < 100_000, what="both bodies holding what they sent")
        go_first.set()
        go_second.set()
        done = await asyncio.wait_for(asyncio.gather(older, younger), scaled(30))
        assert done[0].status_code in (200, 202), done[0].text
        refused = done[1]
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1", refused.text
        detail = refused.json()["detail" if make is batch else "message"]
        assert "VIGIL_MAX_INFLIGHT_BYTES" in detail and "send it again" in detail
        stage = "http" if make is batch else "otlp"
        assert app.state.runtime.metrics.ingest_errors.labels(stage)._value.get() == 1  # on-call sees it
        assert budget.free == BUDGET
        again = await post(c, second, second, path)  # sent again, alone, it goes through
        assert again.status_code in (200, 202), again.text
        if make is batch:
            assert (await stored(c, "b2-1")).status_code == 200
        assert budget.free == BUDGET

    run(sqlite_url, scenario)


def test_a_body_larger_than_the_budget_still_goes_through_alone() -> None:
    async def scenario() -> None:
        budget = ByteBudget(100_000)
        async with budget.lease(300_000) as lease:
            for size in range(65_536, 300_001, 65_536):
                await asyncio.wait_for(lease.cover(size), 5)
            assert lease.held >= 262_144
        assert budget.free == 100_000

    asyncio.run(scenario())


class PauseFirst:
    """``target.method`` patched so that its first call waits until :meth:`release` (the others go on)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, target: Any, method: str) -> None:
        self.entered, self.released = threading.Event(), threading.Event()
        self.calls: list[int] = []
        real = getattr(target, method)

        def paused(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(1)
            if len(self.calls) == 1:
                self.entered.set()
                self.released.wait(scaled(60))
            return real(*args, **kwargs)

        monkeypatch.setattr(target, method, paused)

    def release(self) -> None:
        self.released.set()


def test_a_body_being_decoded_holds_what_its_objects_take(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A body's parsed, converted and checked objects take about 20 times its bytes: 20 τ² files of 2.7 MB
    sent at once, held as bytes alone (54 MB of the 64 MiB budget), took the server from 229 to 935 MB."""
    first = batch("dec1", 2, 50_000)  # about 100 KB: its bytes fit the budget ten times, its objects do not
    second = batch("dec2", 2, 50_000)
    assert len(first) * DECODED_BYTES_PER_BODY_BYTE > BUDGET > 2 * len(first)
    pause: list[PauseFirst] = []

    async def scenario(c: httpx.AsyncClient, app: Any) -> None:
        pause.append(PauseFirst(monkeypatch, app.state.runtime.pipeline, "process_documents"))
        calls = pause[0].calls
        older = post(c, first, first)
        await async_wait_for(pause[0].entered.is_set, what="the first body being stored")
        budget: ByteBudget = app.state.body_budget
        assert budget.free == 0  # alone, it holds the whole budget while decoded (before: only its 100 KB)
        younger = post(c, second, second)
        await async_wait_for(
            lambda: len(calls) > 1 or any(lease.waiting for lease in budget._leases), what="the second body"
        )
        assert len(calls) == 1 and not younger.done()  # it waits its turn instead of being decoded meanwhile
        pause[0].release()
        done = await asyncio.wait_for(asyncio.gather(older, younger), scaled(30))
        assert [r.status_code for r in done] == [202, 202], [r.text for r in done]
        for cid in ("dec1-1", "dec2-1"):
            assert (await stored(c, cid)).status_code == 200, cid
        assert budget.free == BUDGET

    try:
        run(sqlite_url, scenario)
    finally:
        for p in pause:
            p.release()


def outcomes(prefix: str, n: int) -> bytes:
    return orjson.dumps(
        [
            {"conversation_id": f"{prefix}-{i}", "type": "escalation", "idempotency_key": f"{prefix}-{i}"}
            for i in range(n)
        ]
    )


def otlp_logs(prefix: str, n: int, pad: int) -> bytes:
    """An OTLP protobuf logs request of ``n`` GenAI message events, each with a ``pad``-character body."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    req = ExportLogsServiceRequest()
    records = req.resource_logs.add().scope_logs.add().log_records
    for i in range(n):
        r = records.add(event_name="gen_ai.user.message", time_unix_nano=1_700_000_000_000_000_000)
        r.trace_id = bytes.fromhex(f"{prefix}{i:04x}".ljust(32, "0"))
        r.span_id = (i + 1).to_bytes(8, "big")
        r.body.kvlist_value.values.add(key="content").value.string_value = "x" * pad
    return req.SerializeToString()


@pytest.mark.parametrize("path", ["/v1/outcomes", "/v1/traces", "/v1/logs"])
def test_an_outcomes_or_otlp_body_being_decoded_holds_what_its_objects_take(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Decoded, a batch of outcomes takes about 21 times its bytes, OTLP/JSON spans 15 to 17 times and
    protobuf log records 6 to 12 times (bench.bench_decoded_memory): held as bytes alone, 20 such bodies
    at once took a server several times what the budget allows (docs/scaling.md)."""
    from vigil.ingest.otlp.api import DECODED_BYTES_PER_BODY_BYTE as OTLP_FACTORS
    from vigil.ingest.otlp.ingest import TraceIngest
    from vigil.outcomes.api import DECODED_BYTES_PER_BODY_BYTE as OUTCOMES_FACTOR
    from vigil.outcomes.ingest import OutcomeStore

    if path == "/v1/outcomes":
        first, second, factor = outcomes("oc1", 1_500), outcomes("oc2", 1_500), OUTCOMES_FACTOR
        owner, method, ctype = OutcomeStore, "ingest", "application/json"
    elif path == "/v1/traces":
        first, second, factor = otlp("aa", 2, 50_000), otlp("bb", 2, 50_000), OTLP_FACTORS[False, "application/json"]
        owner, method, ctype = TraceIngest, "ingest", "application/json"
    else:
        first, second = otlp_logs("cc", 2, 50_000), otlp_logs("dd", 2, 50_000)
        factor = OTLP_FACTORS[True, "application/x-protobuf"]
        owner, method, ctype = TraceIngest, "ingest_logs", "application/x-protobuf"
    # its bytes fit the budget several times, its objects do not
    assert len(first) * factor > BUDGET > 2 * len(first)
    pause: list[PauseFirst] = []

    async def scenario(c: httpx.AsyncClient, app: Any) -> None:
        pause.append(PauseFirst(monkeypatch, app.state.runtime.get(owner), method))
        calls = pause[0].calls
        headers = {**INGEST, "Content-Type": ctype}
        older = asyncio.create_task(c.post(path, content=first, headers=headers))
        await async_wait_for(pause[0].entered.is_set, what="the first body being stored")
        budget: ByteBudget = app.state.body_budget
        assert budget.free == 0  # alone, it holds the whole budget while decoded (before: only its bytes)
        younger = asyncio.create_task(c.post(path, content=second, headers=headers))
        await async_wait_for(
            lambda: len(calls) > 1 or any(lease.waiting for lease in budget._leases), what="the second body"
        )
        assert len(calls) == 1 and not younger.done()  # it waits its turn instead of being decoded meanwhile
        pause[0].release()
        done = await asyncio.wait_for(asyncio.gather(older, younger), scaled(30))
        expected = 202 if path == "/v1/outcomes" else 200
        assert [r.status_code for r in done] == [expected, expected], [r.text for r in done]
        assert len(calls) == 2
        assert budget.free == BUDGET

    try:
        run(sqlite_url, scenario)
    finally:
        for p in pause:
            p.release()
