"""OTLP bodies are read into buffers reused from one request to the next (``vigil.http.body.POOL``).

A reused buffer must never leak one request into another: a short body after a long one is read as
itself (not with the long one's tail), a body refused after a long one is kept as a dead letter with
exactly its own bytes, concurrent requests each get a buffer of their own, and a buffer something
still holds a view of is never handed out again."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import pytest

from tests.ingest.test_otlp_hostile import JSON, PROTOBUF, TRACE, dead_letters, json_request, json_span, server
from vigil.http import body as body_module
from vigil.http.body import BufferPool
from vigil.runtime import Runtime

__all__ = ["server"]  # the fixture, imported for these tests


def _span_with(span_id: str, text: str) -> dict[str, Any]:
    span = json_span(span_id)
    span["attributes"].append({"key": "gen_ai.prompt.0.content", "value": {"stringValue": text}})
    return span


def _stored_texts(rt: Runtime) -> dict[str, str]:
    """Each stored span's prompt text, by span id, as read back from the span rows."""
    from sqlalchemy import select

    from vigil.ingest.otlp.compact import expand
    from vigil.ingest.otlp.ingest import _restored
    from vigil.ingest.otlp.models import OtelSpanRow as r

    with rt.sessions() as session:
        rows = session.execute(
            select(r.span, r.trace_id, r.span_id, r.parent_span_id, r.name, r.start_ns, r.end_ns)
            .where(r.trace_id == TRACE)
            .order_by(r.start_ns, r.id)
        )
        spans = expand([_restored(*row) for row in rows])
    return {s["span_id"]: s["attributes"].get("gen_ai.prompt.0.content", "") for s in spans}


def test_a_short_body_after_a_long_one_is_read_as_itself(server: tuple[str, Runtime]) -> None:
    base, rt = server
    long_text, short_text = "L" * 600_000, "short"
    assert body_module.POOL.keep >= 1
    r = httpx.post(f"{base}/v1/traces", content=json_request(_span_with("00000000000000a1", long_text)), headers=JSON)
    assert r.status_code == 200, r.text
    short = json_request(_span_with("00000000000000a2", short_text))
    r = httpx.post(f"{base}/v1/traces", content=short, headers=JSON)
    # read with the long body's tail behind it, this JSON has trailing bytes and is refused
    assert r.status_code == 200, r.text
    assert _stored_texts(rt) == {"00000000000000a1": long_text, "00000000000000a2": short_text}
    assert body_module.POOL.kept_bytes >= 600_000  # the long body's buffer was kept for reuse


def test_a_refused_body_after_a_long_one_is_kept_as_exactly_its_own_bytes(server: tuple[str, Runtime]) -> None:
    base, rt = server
    r = httpx.post(
        f"{base}/v1/traces", content=json_request(_span_with("00000000000000b1", "x" * 400_000)), headers=JSON
    )
    assert r.status_code == 200, r.text
    bad = b"\x0a\x05not protobuf at all"
    r = httpx.post(f"{base}/v1/traces", content=bad, headers=PROTOBUF)
    assert r.status_code == 400
    # the next request reuses (and overwrites) the buffer: the letter must already hold a copy
    r = httpx.post(
        f"{base}/v1/traces", content=json_request(_span_with("00000000000000b2", "y" * 400_000)), headers=JSON
    )
    assert r.status_code == 200, r.text
    letter = dead_letters(rt)[0]
    assert letter["reason"] == "malformed_otlp" and letter["raw"] == bad and letter["raw_size"] == len(bad)


def test_concurrent_bodies_each_get_their_own_buffer(server: tuple[str, Runtime]) -> None:
    base, rt = server
    texts = {f"{i:016x}": chr(ord("a") + i) * (50_000 + 37_000 * i) for i in range(1, 9)}

    async def send() -> list[int]:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            answers = await asyncio.gather(
                *(
                    client.post("/v1/traces", content=json_request(_span_with(span_id, text)), headers=JSON)
                    for span_id, text in texts.items()
                )
            )
        return [a.status_code for a in answers]

    for _ in range(3):
        assert asyncio.run(send()) == [200] * len(texts)
    assert _stored_texts(rt) == texts
    assert len(body_module.POOL._free) <= body_module.POOL.keep


def test_a_buffer_still_viewed_is_not_reused_and_the_pool_is_bounded() -> None:
    pool = BufferPool(keep=2, max_bytes=1000)
    held = pool.take()
    held[:] = b"kept"
    view = memoryview(held)
    pool.give(held)  # a view of it is alive: reusing it would overwrite what the view reads
    assert pool.kept_bytes == 0 and pool.take() is not held
    view.release()
    pool.give(held)
    assert pool.take() is held

    big = bytearray(1001)
    pool.give(big)  # over max_bytes: not kept
    assert pool.kept_bytes == 0
    for n in (10, 20, 30):
        pool.give(bytearray(n))
    assert len(pool._free) == 2 and pool.kept_bytes == 30  # at most keep buffers


def test_a_chunked_body_over_the_limit_keeps_its_start_from_a_reused_buffer(db_url: str) -> None:
    """The dead letter of a chunked body refused while reading holds that body's first bytes, not those
    of the body the buffer held before."""
    from tests.ingest.test_otlp_hostile import vigil

    with vigil(db_url, otlp_max_body_bytes=200_000) as (base, rt):
        r = httpx.post(
            f"{base}/v1/traces", content=json_request(_span_with("00000000000000c1", "z" * 150_000)), headers=JSON
        )
        assert r.status_code == 200, r.text

        def chunks() -> Any:
            for _ in range(30):
                yield b"q" * 10_000

        r = httpx.post(f"{base}/v1/traces", content=chunks(), headers=JSON)
        assert r.status_code == 413, r.text
        letter = dead_letters(rt)[0]
        assert letter["reason"] == "oversized" and set(letter["raw"]) == {ord("q")}
        assert 0 < len(letter["raw"]) <= body_module.PREFIX_BYTES


@pytest.mark.parametrize("media", ["json", "protobuf"])
def test_pooled_views_are_read_by_both_parsers(media: str) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from vigil.ingest.otlp.otlp import parse

    if media == "json":
        raw = json_request(_span_with("00000000000000d1", "hello"))
        ctype = "application/json"
    else:
        req = ExportTraceServiceRequest()
        sp = (
            req.resource_spans.add()
            .scope_spans.add()
            .spans.add(trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex("00000000000000d1"))
        )
        sp.name = "chat m"
        kv = sp.attributes.add(key="gen_ai.prompt.0.content")
        kv.value.string_value = "hello"
        raw = req.SerializeToString()
        ctype = "application/x-protobuf"
    buf = bytearray(raw) + b"garbage past the body"
    with memoryview(buf) as whole:
        view = whole[: len(raw)].toreadonly()
    spans, _ = parse(view, ctype)
    buf[: len(raw)] = b"\0" * len(raw)  # the parsed spans hold copies, not views of the buffer
    view.release()
    assert [s["attributes"]["gen_ai.prompt.0.content"] for s in spans] == ["hello"]
    assert orjson.loads(orjson.dumps(spans[0]["span_id"])) == "00000000000000d1"
