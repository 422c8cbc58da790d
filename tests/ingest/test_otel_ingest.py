"""OTLP/HTTP ingest: spans made by the opentelemetry-sdk, sent by its OTLP exporter to a real server."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from tests.support.app import ADMIN, INGEST, REVIEWER, make_settings
from tests.support.services import free_port, wait_port
from vigil.app.runtime import build_runtime
from vigil.app.server import build_app
from vigil.app.wiring import wire
from vigil.ingest.otlp.models import OtelSpanRow
from vigil.runtime import Runtime
from vigil.store.models import ConversationRow, DeadLetterRow


@pytest.fixture
def server(db_url: str) -> Iterator[tuple[str, Runtime]]:
    # every request makes a revision here (by default an unfinished one waits VIGIL_OTLP_PROGRESS_INTERVAL_SECONDS)
    settings = make_settings(db_url, otlp_progress_interval_seconds=0)
    rt = wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(build_app(rt), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    assert wait_port(port)
    yield f"http://127.0.0.1:{port}", rt
    srv.should_exit = True
    thread.join(10)
    rt.close()


def agent_tracer(exporter: Any, service: str = "shop-agent", version: str = "2.1.0"):  # type: ignore[no-untyped-def]
    provider = TracerProvider(resource=Resource.create({"service.name": service, "service.version": version}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, provider.get_tracer("agent")


def otlp_exporter(base: str, key: dict[str, str] = INGEST, **kw: Any) -> OTLPSpanExporter:
    return OTLPSpanExporter(endpoint=f"{base}/v1/traces", headers={"authorization": key["Authorization"]}, **kw)


SYSTEM = [{"type": "text", "content": "You are a retail support agent. Confirm before any write action."}]
USER = {"role": "user", "parts": [{"type": "text", "content": "Cancel order #W1234567 please."}]}
CALL = {
    "role": "assistant",
    "parts": [
        {
            "type": "tool_call",
            "id": "call_1",
            "name": "get_order_details",
            "arguments": {"order_id": "#W1234567"},
        }
    ],
}
RESULT = {
    "role": "tool",
    "parts": [{"type": "tool_call_response", "id": "call_1", "response": {"status": "pending"}}],
}
FINAL = {
    "role": "assistant",
    "parts": [{"type": "text", "content": "Order #W1234567 is pending. Shall I cancel it?"}],
    "finish_reason": "stop",
}


def run_agent_turn(tracer: Any, conversation_id: str | None = "conv-otel-1", tool_fails: bool = False) -> str:
    """One agent turn the way a GenAI-instrumented agent traces it; returns the trace id (hex)."""
    root_attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "shop-agent"}
    if conversation_id:
        root_attrs["gen_ai.conversation.id"] = conversation_id
    with tracer.start_as_current_span("invoke_agent shop-agent", attributes=root_attrs) as root:
        with tracer.start_as_current_span(
            "chat gpt-4o",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.provider.name": "openai",
                "gen_ai.usage.input_tokens": 120,
                "gen_ai.usage.output_tokens": 20,
                "gen_ai.system_instructions": orjson.dumps(SYSTEM).decode(),
                "gen_ai.input.messages": orjson.dumps([USER]).decode(),
                "gen_ai.output.messages": orjson.dumps([CALL]).decode(),
            },
        ):
            pass
        with tracer.start_as_current_span(
            "execute_tool get_order_details",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "get_order_details",
                "gen_ai.tool.call.id": "call_1",
            },
        ) as tool:
            if tool_fails:
                tool.set_status(Status(StatusCode.ERROR, "upstream timeout"))
        with tracer.start_as_current_span(
            "chat gpt-4o",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.usage.input_tokens": 200,
                "gen_ai.usage.output_tokens": 30,
                "gen_ai.input.messages": orjson.dumps([USER, CALL, RESULT]).decode(),
                "gen_ai.output.messages": orjson.dumps([FINAL]).decode(),
            },
        ):
            pass
        return format(root.get_span_context().trace_id, "032x")


def stored(rt: Runtime, conversation_id: str) -> tuple[ConversationRow, dict[str, Any]]:
    with rt.sessions() as s:
        row = s.get(ConversationRow, conversation_id)
        assert row is not None, f"{conversation_id} was not stored"
        s.expunge(row)
    return row, orjson.loads(row.document)


def test_sdk_exporter_spans_become_a_growing_conversation(server: tuple[str, Runtime]) -> None:
    base, rt = server
    provider, tracer = agent_tracer(otlp_exporter(base))
    run_agent_turn(tracer)
    provider.shutdown()

    row, doc = stored(rt, "conv-otel-1")
    assert row.revision == 4  # one revision per span: chat, tool, chat, invoke_agent
    assert row.status == "finished"
    assert (row.agent_id, row.agent_version) == ("shop-agent", "2.1.0")
    roles = [m["role"] for m in doc["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert doc["messages"][2]["tool_calls"][0]["function"]["name"] == "get_order_details"
    assert doc["messages"][3]["tool_call_id"] == "call_1"
    assert "pending" in doc["messages"][3]["content"]
    assert doc["messages"][4]["content"].startswith("Order #W1234567 is pending")
    assert doc["usage"]["prompt_tokens"] == 320 and doc["usage"]["completion_tokens"] == 50
    assert doc["metadata"]["models"] == ["gpt-4o"] and doc["metadata"]["provider"] == "openai"
    assert row.tool_call_count == 1
    text = rt.metrics.registry.get_sample_value
    assert text("vigil_otlp_spans_total", {"outcome": "stored"}) == 4
    # a first revision counts as processed, later ones as updated; the spans before the one carrying
    # gen_ai.conversation.id built a conversation keyed by the trace, hence two first revisions
    labels = {"agent": "shop-agent", "agent_version": "2.1.0", "source": "otlp"}
    assert text("vigil_conversations_processed_total", labels) == 2
    assert text("vigil_conversations_updated_total", labels) == 2


def test_gzip_and_failed_tool_marks_an_error(server: tuple[str, Runtime]) -> None:
    base, rt = server
    provider, tracer = agent_tracer(otlp_exporter(base, compression=Compression.Gzip))
    run_agent_turn(tracer, "conv-otel-err", tool_fails=True)
    provider.shutdown()
    row, doc = stored(rt, "conv-otel-err")
    tool = [m for m in doc["messages"] if m["role"] == "tool"]
    assert tool[0]["is_error"] is True
    assert row.tool_error_count == 1


def test_trace_without_conversation_id_is_keyed_by_trace(server: tuple[str, Runtime]) -> None:
    base, rt = server
    provider, tracer = agent_tracer(otlp_exporter(base))
    trace_id = run_agent_turn(tracer, conversation_id=None)
    provider.shutdown()
    row, _ = stored(rt, f"otel-{trace_id}")
    assert row.message_count == 5


def test_older_prompt_and_completion_events(server: tuple[str, Runtime]) -> None:
    base, rt = server
    provider, tracer = agent_tracer(otlp_exporter(base), service="legacy-bot", version="0.9")
    with tracer.start_as_current_span(
        "chat gpt-3.5",
        attributes={
            "gen_ai.system": "openai",
            "gen_ai.request.model": "gpt-3.5-turbo",
            "gen_ai.conversation.id": "legacy-1",
            "gen_ai.usage.prompt_tokens": 12,
            "gen_ai.usage.completion_tokens": 7,
        },
    ) as sp:
        sp.add_event(
            "gen_ai.content.prompt",
            {
                "gen_ai.prompt": orjson.dumps(
                    [
                        {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "Where is my parcel?"},
                    ]
                ).decode()
            },
        )
        sp.add_event(
            "gen_ai.content.completion",
            {"gen_ai.completion": orjson.dumps([{"role": "assistant", "content": "It ships tomorrow."}]).decode()},
        )
    with tracer.start_as_current_span(
        "chat gpt-3.5", attributes={"gen_ai.system": "openai", "gen_ai.conversation.id": "legacy-1"}
    ) as sp:
        sp.add_event("gen_ai.user.message", {"content": "Thanks! And my refund?"})
        sp.add_event(
            "gen_ai.choice",
            {
                "index": 0,
                "finish_reason": "stop",
                "message": orjson.dumps({"content": "Refunded on Monday."}).decode(),
            },
        )
    provider.shutdown()
    row, doc = stored(rt, "legacy-1")
    assert [(m["role"], m.get("content")) for m in doc["messages"]] == [
        ("system", "Be brief."),
        ("user", "Where is my parcel?"),
        ("assistant", "It ships tomorrow."),
        ("user", "Thanks! And my refund?"),
        ("assistant", "Refunded on Monday."),
    ]
    assert (row.agent_id, row.agent_version, row.tokens) == ("legacy-bot", "0.9", 19)


def otlp_json(spans: list[Any]) -> bytes:
    """OTLP/JSON as the specification writes it: hex trace and span ids."""
    doc = MessageToDict(encode_spans(spans))
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in sp:
                        sp[k] = __import__("base64").b64decode(sp[k]).hex()
    return orjson.dumps(doc)


def test_json_encoding_and_retries_are_idempotent(server: tuple[str, Runtime]) -> None:
    base, rt = server
    memory = InMemorySpanExporter()
    provider, tracer = agent_tracer(memory)
    run_agent_turn(tracer, "conv-json")
    body = otlp_json(list(memory.get_finished_spans()))
    headers = {**INGEST, "content-type": "application/json"}
    for _ in range(2):
        r = httpx.post(f"{base}/v1/traces", content=body, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json() == {}
    r = httpx.post(f"{base}/v1/traces", content=gzip.compress(body), headers={**headers, "content-encoding": "gzip"})
    assert r.status_code == 200
    row, _ = stored(rt, "conv-json")
    assert row.revision == 4 and row.message_count == 5
    with rt.sessions() as s:
        assert s.scalar(select(func.count()).select_from(OtelSpanRow)) == 4
    assert rt.metrics.registry.get_sample_value("vigil_otlp_spans_total", {"outcome": "duplicate"}) == 8


def test_conversation_id_arriving_after_earlier_spans(server: tuple[str, Runtime]) -> None:
    base, rt = server
    memory = InMemorySpanExporter()
    provider, tracer = agent_tracer(memory)
    run_agent_turn(tracer, "conv-late")
    spans = list(memory.get_finished_spans())
    children, root = spans[:-1], spans[-1:]
    headers = {**INGEST, "content-type": "application/json"}
    assert httpx.post(f"{base}/v1/traces", content=otlp_json(children), headers=headers).status_code == 200
    assert httpx.post(f"{base}/v1/traces", content=otlp_json(root), headers=headers).status_code == 200
    row, _ = stored(rt, "conv-late")
    assert row.revision == 4 and row.message_count == 5 and row.status == "finished"


def test_bad_requests_get_clear_answers(server: tuple[str, Runtime]) -> None:
    base, rt = server
    url = f"{base}/v1/traces"
    r = httpx.post(url, content=b"\xff\x00garbage", headers={**INGEST, "content-type": "application/x-protobuf"})
    assert r.status_code == 400
    r = httpx.post(url, content=b"{not json", headers={**INGEST, "content-type": "application/json"})
    assert r.status_code == 400 and "not JSON" in r.json()["message"]
    r = httpx.post(url, content=b"a", headers={**INGEST, "content-type": "text/plain"})
    assert r.status_code == 415 and "not supported" in r.json()["message"]
    r = httpx.post(url, content=b"{}", headers={**INGEST, "content-type": "application/json", "content-encoding": "br"})
    assert r.status_code == 415
    assert httpx.post(url, content=b"{}", headers={"content-type": "application/json"}).status_code == 401
    assert httpx.post(url, content=b"{}", headers={**REVIEWER, "content-type": "application/json"}).status_code == 403
    assert httpx.post(url, content=b"{}", headers={**ADMIN, "content-type": "application/json"}).status_code == 200
    bad = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "zz",
                                "spanId": "0102030405060708",
                                "name": "chat",
                                "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}],
                            },
                            {
                                "traceId": "0af7651916cd43dd8448eb211c80319c",
                                "spanId": "b7ad6b7169203331",
                                "parentSpanId": "00f067aa0ba902b7",  # a root span would be kept as a container
                                "name": "GET /",
                                "attributes": [{"key": "http.method", "value": {"stringValue": "GET"}}],
                            },
                        ]
                    }
                ]
            }
        ]
    }
    r = httpx.post(url, content=orjson.dumps(bad), headers={**INGEST, "content-type": "application/json"})
    assert r.status_code == 200
    assert r.json()["partialSuccess"]["rejectedSpans"] == 1
    assert "invalid ids" in r.json()["partialSuccess"]["errorMessage"]
    assert rt.metrics.registry.get_sample_value("vigil_otlp_spans_total", {"outcome": "ignored"}) == 1
    with rt.sessions() as s:
        assert s.scalar(select(func.count()).select_from(OtelSpanRow)) == 0


def _json_span(span_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": span_id,
        "name": "chat m",
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
            {"key": "gen_ai.conversation.id", "value": {"stringValue": "conv-wide"}},
        ],
        **fields,
    }


def test_integers_no_column_or_writer_holds_are_refused_not_retried(server: tuple[str, Runtime]) -> None:
    """An OTLP/JSON integer beyond its protobuf type is not OTLP: 400, kept as a dead letter. A fixed64 time
    past what the store holds (the year 2262) rejects its span only. Neither is a 503 the exporter retries."""
    base, rt = server
    url = f"{base}/v1/traces"
    headers = {**INGEST, "content-type": "application/json"}
    wide = {"key": "gen_ai.usage.input_tokens", "value": {"intValue": str(2**70)}}
    for span in (
        _json_span("00000000000000a1", attributes=[wide]),
        _json_span("00000000000000a2", startTimeUnixNano=str(2**64)),
        _json_span("00000000000000a3", kind=2**40),
    ):
        body = orjson.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
        r = httpx.post(url, content=body, headers=headers)
        assert r.status_code == 400 and "out of range" in r.json()["message"], r.text
    late = _json_span("00000000000000b1", startTimeUnixNano=str(2**63), endTimeUnixNano=str(2**64 - 1))
    body = orjson.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [late, _json_span("00000000000000b2")]}]}]})
    r = httpx.post(url, content=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["partialSuccess"]["rejectedSpans"] == 1
    assert "beyond the year 2262" in r.json()["partialSuccess"]["errorMessage"]
    logs = {
        "resourceLogs": [
            {
                "scopeLogs": [
                    {
                        "logRecords": [
                            {
                                "traceId": "0af7651916cd43dd8448eb211c80319c",
                                "spanId": "00000000000000b2",
                                "timeUnixNano": str(2**63),
                                "eventName": "gen_ai.user.message",
                                "body": {"stringValue": "hi"},
                            }
                        ]
                    }
                ]
            }
        ]
    }
    r = httpx.post(f"{base}/v1/logs", content=orjson.dumps(logs), headers=headers)
    assert r.status_code == 200 and r.json()["partialSuccess"]["rejectedLogRecords"] == 1, r.text
    with rt.sessions() as s:
        assert s.scalars(select(OtelSpanRow.span_id)).all() == ["00000000000000b2"]
        assert s.scalar(select(func.count()).select_from(DeadLetterRow)) == 3


def test_attribute_values_nested_past_32_levels_are_refused_not_retried(server: tuple[str, Runtime]) -> None:
    """OTLP/JSON values nested 256 to about 340 levels deep parsed, then could not be written as the stored
    span (503, retried forever); past 32 levels the request is now a 400 kept as a dead letter."""
    base, rt = server

    def post(depth: int, span_id: str) -> httpx.Response:
        span = orjson.dumps(_json_span(span_id)).decode()
        deep = '{"arrayValue": {"values": [' * depth + '{"stringValue": "x"}' + "]}}" * depth
        span = span.replace('"attributes":[', f'"attributes":[{{"key": "deep", "value": {deep}}},', 1)
        body = '{"resourceSpans": [{"scopeSpans": [{"spans": [' + span + "]}]}]}"
        return httpx.post(f"{base}/v1/traces", content=body, headers={**INGEST, "content-type": "application/json"})

    assert post(32, "00000000000000c1").status_code == 200
    for depth, span_id in ((33, "00000000000000c2"), (300, "00000000000000c3")):
        r = post(depth, span_id)
        assert r.status_code == 400 and "nested deeper than 32 levels" in r.json()["message"], r.text
    with rt.sessions() as s:
        assert s.scalars(select(OtelSpanRow.span_id)).all() == ["00000000000000c1"]
        assert s.scalar(select(func.count()).select_from(DeadLetterRow)) == 2


def test_rejected_requests_are_kept_as_dead_letters(server: tuple[str, Runtime]) -> None:
    base, rt = server
    url = f"{base}/v1/traces"
    garbage = b"\x0a\xff\xff\xff\xff\x0f" + bytes(range(256)) * 80  # a truncated length-delimited field
    pb = {**INGEST, "content-type": "application/x-protobuf"}
    assert httpx.post(url, content=garbage, headers=pb).status_code == 400
    dead = httpx.get(f"{base}/v1/dead-letters", headers=ADMIN).json()
    assert len(dead) == 1
    letter = dead[0]
    assert (letter["source"], letter["reason"], letter["raw_size"]) == ("otlp", "malformed_otlp", len(garbage))
    assert "ExportTraceServiceRequest" in letter["detail"] and "application/x-protobuf" in letter["detail"]
    with rt.sessions() as s:
        kept = s.scalars(select(DeadLetterRow)).one().raw
    assert kept == garbage[: rt.settings.dead_letter_raw_bytes] and len(kept) < len(garbage)
    js = {**INGEST, "content-type": "application/json"}
    assert httpx.post(url, content=b"{not json", headers=js).status_code == 400
    zipped = {**js, "content-encoding": "gzip"}
    assert httpx.post(url, content=b"not gzip at all", headers=zipped).status_code == 400
    assert httpx.post(url, content=b"{}", headers={**js, "content-encoding": "br"}).status_code == 415
    dead = httpx.get(f"{base}/v1/dead-letters", headers=ADMIN).json()
    assert [(d["reason"], d["raw_preview"]) for d in dead[:3]] == [
        ("unsupported_media", "{}"),
        ("malformed_otlp", "not gzip at all"),
        ("malformed_otlp", "{not json"),
    ]
    assert "gzip" in dead[1]["detail"]
    sample = rt.metrics.registry.get_sample_value
    assert sample("vigil_dead_letters_total", {"reason": "malformed_otlp", "source": "otlp"}) == 3
    assert httpx.post(url, content=b"{}", headers=js).status_code == 200
    assert len(httpx.get(f"{base}/v1/dead-letters", headers=ADMIN).json()) == 4


def test_exporter_without_key_is_refused(server: tuple[str, Runtime]) -> None:
    base, rt = server
    memory = InMemorySpanExporter()
    _, tracer = agent_tracer(memory)
    run_agent_turn(tracer, "conv-nokey")
    exporter = OTLPSpanExporter(endpoint=f"{base}/v1/traces", headers={"authorization": "Bearer wrong"})
    assert exporter.export(list(memory.get_finished_spans())) == SpanExportResult.FAILURE
    with rt.sessions() as s:
        assert s.get(ConversationRow, "conv-nokey") is None


def test_spans_read_back_from_their_rows_are_the_spans_received(server: tuple[str, Runtime]) -> None:
    """A span's row keeps in its JSON only what its columns do not (and no empty events or unset status):
    read back, every span is as received, a name longer than the column and a failed status included."""
    from vigil.ingest.otlp.ingest import TraceIngest
    from vigil.ingest.otlp.otlp import parse

    base, rt = server
    memory = InMemorySpanExporter()
    provider, tracer = agent_tracer(memory)
    run_agent_turn(tracer, "conv-rows", tool_fails=True)
    with tracer.start_as_current_span(
        "chat " + "m" * 600, attributes={"gen_ai.operation.name": "chat", "gen_ai.conversation.id": "conv-rows"}
    ) as sp:
        sp.add_event("gen_ai.choice", {"index": 0, "content": "done"})
    body = otlp_json(list(memory.get_finished_spans()))
    r = httpx.post(f"{base}/v1/traces", content=body, headers={**INGEST, "content-type": "application/json"})
    assert r.status_code == 200, r.text
    received = sorted(parse(body, "application/json")[0], key=lambda s: s["span_id"])
    with rt.sessions() as s:
        rows = s.execute(select(OtelSpanRow.name, OtelSpanRow.span)).all()
    assert len(rows) == len(received) == 5
    assert max(len(name) for name, _ in rows) == 512
    assert not any("trace_id" in span or "start_ns" in span for _, span in rows)
    read = sorted(rt.get(TraceIngest)._load("conv-rows")[0], key=lambda s: s["span_id"])
    assert read == received
    assert [s["name"] for s in read if len(s["name"]) > 512] == ["chat " + "m" * 600]
    assert any(s["status"]["code"] == 2 for s in read) and any(s["events"] for s in read)


def test_a_growing_history_over_protobuf_is_stored_once_and_read_back_whole(server: tuple[str, Runtime]) -> None:
    """Each chat span resends the history so far, over protobuf and in two requests: the decoder finds each
    one extends the last (``EXTENDS``), the rows keep only what is new (``$ext``, never the hint itself),
    and both the spans read back and the assembled conversation are what was sent. Only the root names
    the conversation, as most instrumentations send it."""
    from vigil.ingest.otlp.ingest import TraceIngest
    from vigil.ingest.otlp.otlp import EXTENDS, parse_protobuf

    base, rt = server
    memory = InMemorySpanExporter()
    provider, tracer = agent_tracer(memory)
    history: list[dict[str, Any]] = []
    said = []
    with tracer.start_as_current_span(
        "invoke_agent shop-agent",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv-growing"},
    ):
        for turn in range(6):
            history.append({"role": "user", "parts": [{"type": "text", "content": f"question {turn}: " + "é" * 90}]})
            reply = {"role": "assistant", "parts": [{"type": "text", "content": f"answer {turn}: " + "w" * 120}]}
            with tracer.start_as_current_span(
                "chat gpt-4o",
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.input.messages": orjson.dumps(history).decode(),
                    "gen_ai.output.messages": orjson.dumps([reply]).decode(),
                },
            ):
                pass
            history.append(reply)
            said += [f"question {turn}: " + "é" * 90, f"answer {turn}: " + "w" * 120]
    spans = list(memory.get_finished_spans())
    bodies = [encode_spans(spans[:3]).SerializeToString(), encode_spans(spans[3:]).SerializeToString()]
    received = []
    for body in bodies:
        r = httpx.post(f"{base}/v1/traces", content=body, headers={**INGEST, "content-type": "application/x-protobuf"})
        assert r.status_code == 200, r.text
        received += parse_protobuf(body)
    # each history past the first long one extends the one before (this second decoding of the second
    # request does not know the first's: the server's decoding of it ended the trace)
    assert sum(EXTENDS in s for s in received) >= 3
    for s in received:
        s.pop(EXTENDS, None)
    with rt.sessions() as s:
        stored_rows = [orjson.dumps(span).decode() for span in s.scalars(select(OtelSpanRow.span))]
    assert not any(f'"{EXTENDS}"' in row for row in stored_rows)
    # the chat spans name no conversation: the first request's wait under the trace's key, and move to the
    # conversation the root names; the second request's first span still extends the first's last
    assert sum('"$ext"' in row for row in stored_rows) == 4
    read = rt.get(TraceIngest)._load("conv-growing")[0]
    assert sorted(read, key=lambda s: s["span_id"]) == sorted(received, key=lambda s: s["span_id"])
    row, doc = stored(rt, "conv-growing")
    assert row.status == "finished"
    assert [m["content"] for m in doc["messages"]] == said
