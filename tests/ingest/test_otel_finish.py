"""Traces that never end are finished by the idle timeout, once, whichever replica gets there; GenAI log
records (JSON and protobuf) join their spans; the gRPC receiver checks keys like HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import orjson
import pytest
from fastapi.testclient import TestClient
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from prometheus_client import CollectorRegistry
from sqlalchemy import select, update

from tests.support.app import INGEST, REVIEWER, make_settings
from tests.support.services import free_port
from vigil.app.runtime import build_runtime
from vigil.app.server import build_app
from vigil.app.wiring import wire
from vigil.ingest.otlp.finisher import TraceFinisher
from vigil.ingest.otlp.grpc import GrpcReceiver
from vigil.ingest.otlp.ingest import TraceIngest
from vigil.ingest.otlp.models import OtelConversationRow
from vigil.runtime import Runtime
from vigil.store.db import aware
from vigil.store.models import ConversationRow

TRACE = "5b8efff798038103d269b633813fc60c"


def replica(url: str, roles: set[str] | None = None, **overrides: Any) -> Runtime:
    s = make_settings(url, **{"judge_mode": "offline", "otlp_trace_idle_seconds": 30.0, **overrides})
    return wire(build_runtime(s, registry=CollectorRegistry()), roles or {"consume"})


def chat_span(trace: str, span_id: str, parent: str | None, start: int, **attrs: Any) -> dict[str, Any]:
    return {
        "trace_id": trace,
        "span_id": span_id,
        "parent_span_id": parent,
        "name": "chat m",
        "kind": 3,
        "start_ns": start,
        "end_ns": start + 1000,
        "attributes": {"gen_ai.operation.name": "chat", **attrs},
        "events": [],
        "status": {"code": 0, "message": ""},
        "resource": {"service.name": "idle-agent"},
    }


def stored(rt: Runtime, cid: str) -> ConversationRow | None:
    with rt.sessions() as s:
        row = s.get(ConversationRow, cid)
        if row is not None:
            s.expunge(row)
        return row


def _growth(rt: Runtime, key: str) -> tuple[datetime, int]:
    with rt.sessions() as s:
        row = s.execute(
            select(OtelConversationRow.last_seen_at, OtelConversationRow.span_count).where(
                OtelConversationRow.conversation_key == key
            )
        ).one()
    return aware(row[0]), row[1]


def test_when_a_trace_last_grew_is_rewritten_at_most_every_tenth_of_the_idle_timeout(db_url: str) -> None:
    """Requests of a trace in flight change only its counts until a tenth of the idle timeout (60 s here, so
    a loaded machine cannot stretch two requests past it) has passed: the idle finisher still sees it grow,
    and waits the timeout from then."""
    rt = replica(db_url, otlp_trace_idle_seconds=600.0)
    ingest = rt.get(TraceIngest)
    trace, key = f"{77:032x}", "growing"

    def grow(n: int) -> None:
        said = orjson.dumps([{"role": "assistant", "parts": [{"type": "text", "content": f"step {n}"}]}]).decode()
        attrs = {"gen_ai.conversation.id": key, "gen_ai.output.messages": said}
        ingest.ingest([chat_span(trace, f"{n:016x}", "00000000000000ff", 10**18 + n, **attrs)])

    grow(1)
    first, _ = _growth(rt, key)
    grow(2)
    assert _growth(rt, key) == (first, 2)  # within 60 s of the last rewrite: only the count moved
    with rt.sessions.begin() as s:  # as if it last grew 61 s ago
        s.execute(
            update(OtelConversationRow)
            .where(OtelConversationRow.conversation_key == key)
            .values(last_seen_at=first - timedelta(seconds=61))
        )
    grow(3)
    seen, count = _growth(rt, key)
    assert count == 3 and seen >= first  # rewritten to the request's time
    assert not ingest.finish_idle("early", now=seen + timedelta(seconds=599))
    assert ingest.finish_idle("idle", now=seen + timedelta(seconds=601)) == [key]
    rt.close()


def test_a_conversations_session_and_user_are_the_first_any_request_named(db_url: str) -> None:
    """One request's spans per conversation and call, several conversations per request: each count adds up,
    the session and user ids are the first a span named (a later request naming none, or others, keeps
    them), and a conversation whose first spans named none takes them from a later request."""
    rt = replica(db_url)
    ingest = rt.get(TraceIngest)
    said = orjson.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "hi"}]}]).decode()

    def spans(n: int, **labels: str) -> list[dict[str, Any]]:
        out = []
        for conv in ("c-early", "c-late"):
            attrs = {"gen_ai.conversation.id": conv, "gen_ai.output.messages": said}
            if conv == "c-early" or n > 1:  # c-late names its labels only from the second request on
                attrs.update(labels)
            trace = f"{(conv == 'c-late') + 1:032x}"
            out.append(chat_span(trace, f"{n:016x}", "00000000000000ff", 10**18 + n, **attrs))
        return out

    ingest.ingest(spans(1, **{"session.id": "s-1", "user.id": "u-1"}))
    ingest.ingest(spans(2))
    ingest.ingest(spans(3, **{"session.id": "s-2", "user.id": "u-2"}))
    with rt.sessions() as s:
        rows = {
            r.conversation_key: (r.span_count, r.event_count, r.session_id, r.user_id)
            for r in s.scalars(select(OtelConversationRow))
        }
    assert rows == {"c-early": (3, 0, "s-1", "u-1"), "c-late": (3, 0, "s-2", "u-2")}
    rt.close()


def test_a_trace_finds_its_conversation_whichever_replica_learnt_it(db_url: str) -> None:
    """Spans of one trace over three replicas that remember nothing of each other: the first has no
    conversation id (kept under the trace's own key), the second names it (the first moves to it), the
    third names nothing (it joins the conversation the second named, found in the database)."""
    a, b, c = replica(db_url), replica(db_url), replica(db_url)
    trace, root = f"{91:032x}", "00000000000000ff"

    def keys(rt: Runtime) -> list[str]:
        with rt.sessions() as s:
            return list(s.scalars(select(OtelConversationRow.conversation_key)).all())

    def said(text: str) -> str:
        return orjson.dumps([{"role": "assistant", "parts": [{"type": "text", "content": text}]}]).decode()

    a.get(TraceIngest).ingest(
        [chat_span(trace, "00000000000000a1", root, 10**18, **{"gen_ai.output.messages": said("one")})]
    )
    named = {"gen_ai.conversation.id": "conv-learnt", "gen_ai.output.messages": said("two")}
    b.get(TraceIngest).ingest([chat_span(trace, "00000000000000a2", root, 10**18 + 10, **named)])
    assert keys(b) == ["conv-learnt"]  # the first span moved to the conversation the second named
    third = chat_span(trace, "00000000000000a3", root, 10**18 + 20, **{"gen_ai.output.messages": said("three")})
    ends = {**chat_span(trace, root, None, 10**18 - 5), "name": "invoke_agent"}
    ends["attributes"] = {"gen_ai.operation.name": "invoke_agent"}
    c.get(TraceIngest).ingest([third, ends])
    row = stored(c, "conv-learnt")
    assert row is not None and row.status == "finished"
    texts = [m["content"] for m in orjson.loads(row.document)["messages"]]
    assert texts == ["one", "two", "three"]
    assert keys(c) == ["conv-learnt"]  # nothing left under the trace's own key
    assert stored(c, f"otel-{trace}") is None
    for rt in (a, b, c):
        rt.close()


def test_idle_traces_are_finished_once_across_replicas(db_url: str) -> None:
    a, b = replica(db_url), replica(db_url)
    msgs = orjson.dumps([{"role": "user", "parts": [{"type": "text", "content": "hello?"}]}]).decode()
    out = orjson.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "hi"}]}]).decode()
    traces = [f"{i:032x}" for i in range(1, 13)]
    for t in traces:  # children of a root span that never arrives
        span = chat_span(t, "00000000000000a1", "00000000000000ff", 10**18)
        span["attributes"].update({"gen_ai.input.messages": msgs, "gen_ai.output.messages": out})
        a.get(TraceIngest).ingest([span])
    # unfinished and begun less than VIGIL_OTLP_PROGRESS_INTERVAL_SECONDS ago: not through the pipeline yet
    assert stored(a, f"otel-{traces[0]}") is None
    assert not a.get(TraceIngest).finish_idle("early")  # not idle yet

    later = datetime.now(UTC) + timedelta(seconds=31)
    results: dict[str, list[str]] = {}

    def finish(name: str, rt: Runtime) -> None:
        results[name] = rt.get(TraceIngest).finish_idle(name, now=later)

    threads = [threading.Thread(target=finish, args=(n, rt)) for n, rt in (("a", a), ("b", b), ("a2", a))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    finished = [c for r in results.values() for c in r]
    assert sorted(finished) == sorted(f"otel-{t}" for t in traces)  # each exactly once
    for t in traces:
        row = stored(a, f"otel-{t}")
        assert row is not None and row.status == "finished" and row.revision == 2  # one span, + the idle finish
    idle = [
        rt.metrics.registry.get_sample_value("vigil_otlp_conversations_finished_total", {"how": "idle"})
        for rt in (a, b)
    ]
    assert sum(n or 0 for n in idle) == len(traces)
    assert not a.get(TraceIngest).finish_idle("again", now=later + timedelta(hours=1))
    # a late span still adds to a finished conversation, which stays finished
    late = chat_span(traces[0], "00000000000000a2", "00000000000000ff", 10**18 + 5000)
    late["attributes"]["gen_ai.output.messages"] = orjson.dumps(
        [{"role": "assistant", "parts": [{"type": "text", "content": "still there?"}]}]
    ).decode()
    a.get(TraceIngest).ingest([late])
    row = stored(a, f"otel-{traces[0]}")
    assert row is not None and row.status == "finished" and row.revision == 3 and row.message_count == 3
    for rt in (a, b):
        rt.close()


def test_a_long_trace_shows_progress_once_per_interval(sqlite_url: str) -> None:
    rt = replica(sqlite_url, {"api"}, otlp_progress_interval_seconds=5.0)
    ingest = rt.get(TraceIngest)
    key = f"otel-{TRACE}"

    def turn(i: int, parent: str | None = "00000000000000ff") -> dict[str, Any]:
        span = chat_span(TRACE, f"{i:016x}", parent, 10**18 + i * 1000)
        span["attributes"]["gen_ai.output.messages"] = orjson.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": f"step {i}"}]}]
        ).decode()
        return span

    ingest.ingest([turn(1)])
    assert stored(rt, key) is None  # begun less than 5 s ago
    with rt.sessions.begin() as s:  # as if the trace had begun a minute ago
        s.execute(update(OtelConversationRow).values(first_seen_at=datetime.now(UTC) - timedelta(minutes=1)))
    ingest.ingest([turn(2)])
    row = stored(rt, key)
    assert row is not None and (row.status, row.revision) == ("in_progress", 2)
    ingest.ingest([turn(3)])
    assert stored(rt, key).revision == 2  # type: ignore[union-attr]  # shown 0 s ago: waits
    root = turn(4, parent=None)
    ingest.ingest([root])
    row = stored(rt, key)
    assert row is not None and (row.status, row.revision, row.message_count) == ("finished", 4, 4)
    rt.close()


def test_the_finisher_thread_runs_in_consume_and_serve_roles(sqlite_url: str) -> None:
    for roles in ({"consume"}, {"serve"}):
        rt = replica(sqlite_url, roles)
        assert rt.find(TraceFinisher) is not None
        rt.close()
    rt = replica(sqlite_url, {"api"})
    assert rt.find(TraceFinisher) is None
    rt.close()


def log_request(trace: str, span_id: str, event: str, attrs: list[dict[str, Any]], body: Any = None) -> bytes:
    record: dict[str, Any] = {
        "timeUnixNano": "1700000000000000000",
        "traceId": trace,
        "spanId": span_id,
        "eventName": event,
        "attributes": attrs,
    }
    if body is not None:
        record["body"] = body
    return orjson.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [record]}]}]})


def test_json_log_events_arriving_before_their_span_are_joined(sqlite_url: str) -> None:
    rt = replica(sqlite_url, {"api"})
    client = TestClient(build_app(rt))
    headers = {**INGEST, "content-type": "application/json"}
    user = log_request(
        TRACE,
        "00000000000000b1",
        "gen_ai.user.message",
        [{"key": "gen_ai.provider.name", "value": {"stringValue": "openai"}}],
        {"kvlistValue": {"values": [{"key": "content", "value": {"stringValue": "Where is my parcel?"}}]}},
    )
    choice = log_request(
        TRACE,
        "00000000000000b1",
        "gen_ai.choice",
        [{"key": "gen_ai.provider.name", "value": {"stringValue": "openai"}}],
        {
            "kvlistValue": {
                "values": [
                    {"key": "index", "value": {"intValue": "0"}},
                    {
                        "key": "message",
                        "value": {
                            "kvlistValue": {"values": [{"key": "content", "value": {"stringValue": "It ships today."}}]}
                        },
                    },
                ]
            }
        },
    )
    for body in (user, choice, choice):  # the retry of a record changes nothing
        r = client.post("/v1/logs", content=body, headers=headers)
        assert r.status_code == 200 and r.json() == {}
    assert stored(rt, f"otel-{TRACE}") is None  # no span yet: waits
    span = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": TRACE,
                                "spanId": "00000000000000b1",
                                "name": "chat gpt-4o",
                                "startTimeUnixNano": "1700000000000000000",
                                "endTimeUnixNano": "1700000001000000000",
                                "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    assert client.post("/v1/traces", content=orjson.dumps(span), headers=headers).status_code == 200
    row = stored(rt, f"otel-{TRACE}")
    assert row is not None and row.status == "finished" and row.revision == 3  # one span, two log records
    doc = orjson.loads(row.document)
    assert [(m["role"], m["content"]) for m in doc["messages"]] == [
        ("user", "Where is my parcel?"),
        ("assistant", "It ships today."),
    ]
    get = rt.metrics.registry.get_sample_value
    assert get("vigil_otlp_log_records_total", {"outcome": "stored"}) == 2
    assert get("vigil_otlp_log_records_total", {"outcome": "duplicate"}) == 1
    r = client.post("/v1/logs", content=b"{nope", headers=headers)
    assert r.status_code == 400 and "not JSON" in r.json()["message"]
    assert (
        client.post("/v1/logs", content=user, headers={**REVIEWER, "content-type": "application/json"}).status_code
        == 403
    )
    rt.close()


@pytest.fixture
def grpc_receiver(sqlite_url: str) -> Iterator[tuple[str, Runtime]]:
    rt = replica(sqlite_url, {"api"}, otlp_grpc_port=free_port())
    build_app(rt)  # the app's keyring is the receiver's
    receiver = rt.get(GrpcReceiver)
    from vigil.http.auth import KeyRing

    receiver.keyring = rt.get(KeyRing)
    port = receiver.start_server()
    yield f"127.0.0.1:{port}", rt
    receiver.stop_server()
    rt.close()


def test_grpc_receiver_checks_keys_and_stores_spans(grpc_receiver: tuple[str, Runtime]) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    target, rt = grpc_receiver
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    msgs = orjson.dumps([{"role": "user", "parts": [{"type": "text", "content": "grpc?"}]}]).decode()
    with provider.get_tracer("t").start_as_current_span(
        "chat", attributes={"gen_ai.operation.name": "chat", "gen_ai.input.messages": msgs}
    ) as sp:
        trace_id = format(sp.get_span_context().trace_id, "032x")
    request = encode_spans(memory.get_finished_spans())
    with grpc.insecure_channel(target) as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Export(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            stub.Export(request, metadata=(("authorization", "Bearer rita-key"),), timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        reply = stub.Export(request, metadata=(("authorization", "Bearer ingest-key"),), timeout=10)
        assert isinstance(reply, trace_service_pb2.ExportTraceServiceResponse)
        assert not reply.HasField("partial_success")
        bad = trace_service_pb2.ExportTraceServiceRequest()
        bad.CopyFrom(request)
        bad.resource_spans[0].scope_spans[0].spans[0].span_id = bytes(8)  # all zeros: no span id
        reply = stub.Export(bad, metadata=(("authorization", "Bearer ingest-key"),), timeout=10)
        assert reply.partial_success.rejected_spans == 1 and "invalid ids" in reply.partial_success.error_message
    row = stored(rt, f"otel-{trace_id}")
    assert row is not None and row.status == "finished" and row.message_count == 1
    with rt.sessions() as s:
        assert s.scalars(select(ConversationRow.conversation_id)).all() == [f"otel-{trace_id}"]
