"""OTLP receivers given requests no well-behaved exporter sends: attributes without a string key, far more
spans than bytes would suggest, gzip bodies of several members, cut short or followed by garbage, gRPC
requests that are not protobuf, ids of all zeros or not hex, bodies over the OTLP limit. Each is answered
for good (4xx or INVALID_ARGUMENT, never a retried 5xx) with a message that says what is wrong, and kept
as a dead letter."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import httpx
import orjson
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import INGEST, make_settings, served
from tests.support.services import free_port
from vigil.app.runtime import build_runtime
from vigil.app.server import build_app
from vigil.app.wiring import wire
from vigil.errors import ConfigError
from vigil.ingest.otlp import otlp
from vigil.ingest.otlp.grpc import GrpcReceiver
from vigil.ingest.otlp.models import OtelSpanRow
from vigil.runtime import Runtime
from vigil.settings import Settings
from vigil.store.models import DeadLetterRow

JSON = {**INGEST, "content-type": "application/json"}
PROTOBUF = {**INGEST, "content-type": "application/x-protobuf"}
TRACE = "0af7651916cd43dd8448eb211c80319c"


@contextmanager
def vigil(db_url: str, **overrides: Any) -> Iterator[tuple[str, Runtime]]:
    """The API served on a free port (every request makes a revision: no progress interval)."""
    settings = make_settings(db_url, otlp_progress_interval_seconds=0, **overrides)
    rt = wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})
    with served(rt, close=True) as base:
        yield base, rt


@pytest.fixture
def server(db_url: str) -> Iterator[tuple[str, Runtime]]:
    with vigil(db_url) as served_vigil:
        yield served_vigil


def json_span(span_id: str, trace_id: str = TRACE, **fields: Any) -> dict[str, Any]:
    return {
        "traceId": trace_id,
        "spanId": span_id,
        "parentSpanId": "00f067aa0ba902b7",  # not a root: no conversation is finished by these tests
        "name": "chat m",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000001000000000",
        "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}],
        **fields,
    }


def json_request(*spans: dict[str, Any]) -> bytes:
    return orjson.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]})


def pb_request(*spans: tuple[bytes, bytes], empty: int = 0) -> bytes:
    """A protobuf request of chat spans (trace id, span id), then ``empty`` spans of no field at all."""
    req = ExportTraceServiceRequest()
    scope = req.resource_spans.add().scope_spans.add()
    for trace_id, span_id in spans:
        sp = scope.spans.add(trace_id=trace_id, span_id=span_id, parent_span_id=bytes.fromhex("00f067aa0ba902b7"))
        sp.name = "chat m"
        sp.start_time_unix_nano, sp.end_time_unix_nano = 1_700_000_000_000_000_000, 1_700_000_001_000_000_000
        kv = sp.attributes.add(key="gen_ai.operation.name")
        kv.value.string_value = "chat"
    for _ in range(empty):
        scope.spans.add()
    return req.SerializeToString()


def stored_spans(rt: Runtime) -> list[tuple[str, str]]:
    with rt.sessions() as s:
        return sorted((r.trace_id, r.span_id) for r in s.execute(select(OtelSpanRow.trace_id, OtelSpanRow.span_id)))


def dead_letters(rt: Runtime) -> list[dict[str, Any]]:
    """The OTLP dead letters, newest first."""
    with rt.sessions() as s:
        rows = s.scalars(select(DeadLetterRow).where(DeadLetterRow.source == "otlp").order_by(DeadLetterRow.id.desc()))
        return [{"reason": d.reason, "detail": d.detail, "raw_size": d.raw_size, "raw": d.raw} for d in rows]


def test_json_attribute_whose_key_is_not_a_string_is_a_400_kept_as_a_dead_letter(server: tuple[str, Runtime]) -> None:
    """A number as key reached the store's JSON writer (503, retried forever) and a missing key raised a
    KeyError (500): both are a 400 naming the key, spans and log records alike, kept as dead letters."""
    base, rt = server
    cases = [
        ([{"key": 5, "value": {"stringValue": "x"}}], "has key 5, not a string"),
        ([{"key": None, "value": {"stringValue": "x"}}], "has no key"),
        ([{"value": {"stringValue": "x"}}], "has no key"),
    ]
    for attributes, said in cases:
        r = httpx.post(
            f"{base}/v1/traces",
            content=json_request(json_span("00000000000000a1", attributes=attributes)),
            headers=JSON,
        )
        assert r.status_code == 400 and said in r.json()["message"], r.text
    resource = {"resource": {"attributes": [{"key": 7, "value": {"stringValue": "svc"}}]}, "scopeSpans": []}
    r = httpx.post(f"{base}/v1/traces", content=orjson.dumps({"resourceSpans": [resource]}), headers=JSON)
    assert r.status_code == 400 and "has key 7, not a string" in r.json()["message"], r.text
    record = {
        "traceId": TRACE,
        "spanId": "00000000000000a1",
        "timeUnixNano": "1700000000500000000",
        "eventName": "gen_ai.user.message",
        "attributes": [{"key": 7, "value": {"stringValue": "x"}}],
        "body": {"stringValue": "hi"},
    }
    logs = orjson.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [record]}]}]})
    r = httpx.post(f"{base}/v1/logs", content=logs, headers=JSON)
    assert r.status_code == 400 and "has key 7, not a string" in r.json()["message"], r.text
    r = httpx.post(f"{base}/v1/logs", content=logs.replace(b'"key":7,', b""), headers=JSON)
    assert r.status_code == 400 and "has no key" in r.json()["message"], r.text
    letters = dead_letters(rt)
    assert [d["reason"] for d in letters] == ["malformed_otlp"] * 6
    assert "has no key" in letters[0]["detail"] and letters[0]["raw_size"] == len(logs) - len(b'"key":7,')
    assert stored_spans(rt) == []


def test_more_spans_than_a_request_may_carry_are_refused_before_they_are_decoded(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1 MB of empty protobuf spans (2 bytes each) became 500,000 span dicts and problem strings, ~750 MB:
    over VIGIL_OTLP_MAX_SPANS_PER_REQUEST the request is a 413 (not retried) naming the setting, kept as a
    dead letter, before a span is decoded. Log records too, and JSON; a request at the limit is stored."""
    with vigil(db_url, otlp_max_spans_per_request=3) as (base, rt):
        at_limit = pb_request(*((bytes.fromhex(TRACE), bytes([0, 0, 0, 0, 0, 0, 0, n])) for n in (1, 2, 3)))
        assert httpx.post(f"{base}/v1/traces", content=at_limit, headers=PROTOBUF).status_code == 200
        assert len(stored_spans(rt)) == 3

        def decoded(*args: Any) -> Any:
            raise AssertionError("the spans of a request over the limit were decoded")

        monkeypatch.setattr(otlp, "spans_of_request", decoded)
        monkeypatch.setattr(otlp, "records_of_request", decoded)
        monkeypatch.setattr(otlp, "_json_attrs", decoded)
        sid = ("00000000000000b1", "00000000000000b2", "00000000000000b3", "00000000000000b4")
        log_record = {"traceId": TRACE, "spanId": sid[0], "timeUnixNano": "1", "eventName": "gen_ai.user.message"}
        pb_logs = ExportLogsServiceRequest()
        scope_logs = pb_logs.resource_logs.add().scope_logs.add()
        for _ in range(4):
            scope_logs.log_records.add()
        for path, body, headers, what in (
            ("/v1/traces", pb_request(empty=4), PROTOBUF, "4 spans"),
            ("/v1/traces", json_request(*(json_span(s) for s in sid)), JSON, "4 spans"),
            ("/v1/logs", pb_logs.SerializeToString(), PROTOBUF, "4 log records"),
            (
                "/v1/logs",
                orjson.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [log_record] * 4}]}]}),
                JSON,
                "4 log records",
            ),
        ):
            r = httpx.post(f"{base}{path}", content=body, headers=headers)
            assert r.status_code == 413, (path, r.status_code)
            if headers is JSON:
                assert what in r.json()["message"] and "VIGIL_OTLP_MAX_SPANS_PER_REQUEST" in r.json()["message"]
        letters = dead_letters(rt)
        assert [d["reason"] for d in letters] == ["oversized"] * 4
        assert all("VIGIL_OTLP_MAX_SPANS_PER_REQUEST" in d["detail"] for d in letters)
        assert len(stored_spans(rt)) == 3
    # the default: 500,000 empty spans in 1 MB are refused without decoding one
    limit = Settings.model_fields["otlp_max_spans_per_request"].default
    assert 5_000 <= limit <= 100_000  # above any exporter's batch
    with pytest.raises(otlp.OtlpError) as err:
        otlp.parse_protobuf(pb_request(empty=500_000), limit)
    assert err.value.status == 413 and "500000 spans" in str(err.value)


def test_gzip_bodies_are_read_whole_or_refused(server: tuple[str, Runtime]) -> None:
    """A body of two gzip members (valid gzip, as ``cat a.gz b.gz`` makes) stored its first member only and
    was acknowledged whole; garbage after the stream was ignored; a stream cut after a flush point (no end,
    no CRC) stored what had inflated so far. Every member is now read, the others are 400s naming gzip, and a
    gzip bomb is still refused at the inflated limit."""
    base, rt = server
    gz = {**PROTOBUF, "content-encoding": "gzip"}
    one = pb_request((bytes.fromhex(TRACE), bytes.fromhex("00000000000000c1")))
    two = pb_request((bytes.fromhex(TRACE), bytes.fromhex("00000000000000c2")))
    r = httpx.post(f"{base}/v1/traces", content=gzip.compress(one) + gzip.compress(two), headers=gz)
    assert r.status_code == 200, r.content
    assert stored_spans(rt) == [(TRACE, "00000000000000c1"), (TRACE, "00000000000000c2")]

    three = pb_request((bytes.fromhex(TRACE), bytes.fromhex("00000000000000c3")))
    r = httpx.post(f"{base}/v1/traces", content=gzip.compress(three) + b"GARBAGE" * 10, headers=gz)
    assert r.status_code == 400
    flushed = zlib.compressobj(9, zlib.DEFLATED, 31)
    cut = flushed.compress(three) + flushed.flush(zlib.Z_FULL_FLUSH)  # no end of stream: three is whole
    r = httpx.post(f"{base}/v1/traces", content=cut, headers=gz)
    assert r.status_code == 400
    r = httpx.post(f"{base}/v1/traces", content=gzip.compress(three)[:-4], headers=gz)  # no length
    assert r.status_code == 400
    js = {**JSON, "content-encoding": "gzip"}
    r = httpx.post(
        f"{base}/v1/traces", content=gzip.compress(json_request(json_span("00000000000000c4")))[:-8], headers=js
    )
    assert r.status_code == 400 and "truncated gzip stream" in r.json()["message"], r.text
    assert stored_spans(rt) == [(TRACE, "00000000000000c1"), (TRACE, "00000000000000c2")]
    letters = dead_letters(rt)
    assert [d["reason"] for d in letters] == ["malformed_otlp"] * 4
    assert "truncated gzip stream" in letters[1]["detail"] and "truncated gzip stream" in letters[2]["detail"]
    assert "gzip stream is followed by 70 bytes that are not gzip" in letters[3]["detail"]

    bomb = gzip.compress(b"\0" * (rt.settings.otlp_max_body_bytes + 1))  # 16 KB inflating past the limit
    bomb_members = gzip.compress(b"\0" * (rt.settings.otlp_max_body_bytes // 2 + 1)) * 2  # the bound is for all
    for body in (bomb, bomb_members):
        r = httpx.post(f"{base}/v1/traces", content=body, headers=js)
        assert r.status_code == 413 and "VIGIL_OTLP_MAX_BODY_BYTES" in r.json()["message"], r.text


@pytest.fixture
def grpc_vigil(db_url: str) -> Iterator[tuple[str, Runtime]]:
    """The gRPC receiver on a free port, taking at most 3 spans a request."""
    settings = make_settings(db_url, otlp_grpc_port=free_port(), otlp_max_spans_per_request=3)
    rt = wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})
    build_app(rt)  # the app's keyring is the receiver's
    from vigil.http.auth import KeyRing

    receiver = rt.get(GrpcReceiver)
    receiver.keyring = rt.get(KeyRing)
    port = receiver.start_server()
    yield f"127.0.0.1:{port}", rt
    receiver.stop_server()
    rt.close()


def test_a_second_grpc_receiver_on_a_taken_port_is_refused(grpc_vigil: tuple[str, Runtime]) -> None:
    """gRPC binds with SO_REUSEPORT by default: a second Vigil on the same host and VIGIL_OTLP_GRPC_PORT (another
    database, a stale process) bound the port too, and the kernel dealt exporters' connections to either
    one, so traces landed in whichever database. The second receiver is now refused, as a taken port is."""
    target, rt = grpc_vigil
    port = int(target.rsplit(":", 1)[1])
    settings = make_settings(rt.settings.database_url_str, otlp_grpc_port=port)
    other = wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})
    try:
        with pytest.raises(ConfigError, match="VIGIL_OTLP_GRPC_PORT"):
            other.get(GrpcReceiver).start_server()
    finally:
        other.get(GrpcReceiver).stop_server()
        other.close()


def test_grpc_requests_that_are_not_otlp_are_invalid_argument_kept_as_dead_letters(
    grpc_vigil: tuple[str, Runtime],
) -> None:
    """gRPC's own deserializer answered INTERNAL ('Exception deserializing request!') to a request that is not
    protobuf or has a string that is not UTF-8, and kept nothing. Requests are now read by the HTTP receiver's
    code: INVALID_ARGUMENT (which exporters do not retry) saying what is wrong, kept as a dead letter; too
    many spans likewise. The key is checked first: a stranger's bytes are not kept."""
    target, rt = grpc_vigil
    raw = otlp._raw_request_class()()
    raw.ParseFromString(pb_request((bytes.fromhex(TRACE), bytes.fromhex("00000000000000d1"))))
    good = raw.SerializeToString()
    raw.resource_spans[0].scope_spans[0].spans[0].attributes[0].value.string_value = b"\xff\xfe bad"
    not_utf8 = raw.SerializeToString()
    key = (("authorization", "Bearer ingest-key"),)
    with grpc.insecure_channel(target) as channel:

        def export(service: str, body: bytes, metadata: Any = key) -> grpc.StatusCode:
            call = channel.unary_unary(
                f"/opentelemetry.proto.collector.{service}/Export",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            try:
                call(body, metadata=metadata, timeout=30)
            except grpc.RpcError as exc:
                details.append(exc.details())
                return exc.code()  # type: ignore[no-any-return]
            return grpc.StatusCode.OK

        details: list[str] = []
        trace, logs = "trace.v1.TraceService", "logs.v1.LogsService"
        assert export(trace, b"\xff" * 100, metadata=()) == grpc.StatusCode.UNAUTHENTICATED
        assert export(trace, good) == grpc.StatusCode.OK
        details.clear()
        assert export(trace, not_utf8) == grpc.StatusCode.INVALID_ARGUMENT
        assert export(trace, good[:-5]) == grpc.StatusCode.INVALID_ARGUMENT
        assert export(trace, b"\xff" * 100) == grpc.StatusCode.INVALID_ARGUMENT
        assert export(logs, b"\xff" * 100) == grpc.StatusCode.INVALID_ARGUMENT
        assert export(trace, pb_request(empty=4)) == grpc.StatusCode.INVALID_ARGUMENT
    assert "not UTF-8" in details[0] and all("ExportTraceServiceRequest" in d for d in details[:3])
    assert "ExportLogsServiceRequest" in details[3] and "VIGIL_OTLP_MAX_SPANS_PER_REQUEST" in details[4]
    letters = dead_letters(rt)
    assert [(d["reason"], d["raw_size"]) for d in letters] == [
        ("oversized", len(pb_request(empty=4))),
        ("malformed_otlp", 100),
        ("malformed_otlp", 100),
        ("malformed_otlp", len(good) - 5),
        ("malformed_otlp", len(not_utf8)),
    ]
    assert "OTLP/gRPC opentelemetry.proto.collector.logs.v1.LogsService" in letters[1]["detail"]
    assert stored_spans(rt) == [(TRACE, "00000000000000d1")]


def test_a_grpc_request_over_the_body_limit_is_invalid_argument_kept_as_a_dead_letter(db_url: str) -> None:
    """gRPC refused a message over VIGIL_OTLP_MAX_BODY_BYTES itself with RESOURCE_EXHAUSTED, which OTLP
    exporters retry, and nothing was kept. Up to twice the limit Vigil now refuses it for good
    (INVALID_ARGUMENT, naming the setting) and keeps its first 64 KiB as an ``oversized`` dead letter; only
    past gRPC's own bound (twice the limit, at least 4 MiB) does gRPC still answer RESOURCE_EXHAUSTED."""
    settings = make_settings(db_url, otlp_grpc_port=free_port(), otlp_max_body_bytes=100_000)
    rt = wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})
    build_app(rt)
    from vigil.http.auth import KeyRing

    receiver = rt.get(GrpcReceiver)
    receiver.keyring = rt.get(KeyRing)
    port = receiver.start_server()
    try:
        raw = otlp._raw_request_class()()
        raw.ParseFromString(pb_request((bytes.fromhex(TRACE), bytes.fromhex("00000000000000d2"))))
        raw.resource_spans[0].scope_spans[0].spans[0].attributes[0].value.string_value = b"x" * 150_000
        big = raw.SerializeToString()
        raw.resource_spans[0].scope_spans[0].spans[0].attributes[0].value.string_value = b"x" * 5_000_000
        huge = raw.SerializeToString()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            codes = []
            for body in (big, huge):
                with pytest.raises(grpc.RpcError) as err:
                    call(body, metadata=(("authorization", "Bearer ingest-key"),), timeout=30)
                codes.append((err.value.code(), err.value.details()))
        assert codes[0][0] == grpc.StatusCode.INVALID_ARGUMENT and "VIGIL_OTLP_MAX_BODY_BYTES" in codes[0][1]
        assert codes[1][0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        [letter] = dead_letters(rt)
        assert (letter["reason"], letter["raw_size"]) == ("oversized", 65_536) and big.startswith(letter["raw"])
        assert "VIGIL_OTLP_MAX_BODY_BYTES" in letter["detail"] and str(len(big)) in letter["detail"]
        assert stored_spans(rt) == []
    finally:
        receiver.stop_server()
        rt.close()


def test_a_span_id_of_all_zeros_is_rejected_with_its_span_only(server: tuple[str, Runtime]) -> None:
    """All zeros is no span id (OTLP), as all zeros is no trace id: such a span is rejected, its request's
    other spans stored, over JSON and protobuf."""
    base, rt = server
    body = json_request(json_span("0" * 16), json_span("00000000000000e1"))
    r = httpx.post(f"{base}/v1/traces", content=body, headers=JSON)
    assert r.status_code == 200 and r.json()["partialSuccess"]["rejectedSpans"] == 1, r.text
    assert "invalid ids" in r.json()["partialSuccess"]["errorMessage"]
    body = pb_request((bytes.fromhex(TRACE), bytes(8)), (bytes.fromhex(TRACE), bytes.fromhex("00000000000000e2")))
    r = httpx.post(f"{base}/v1/traces", content=body, headers=PROTOBUF)
    assert r.status_code == 200
    answer = ExportTraceServiceResponse.FromString(r.content)
    assert answer.partial_success.rejected_spans == 1 and "invalid ids" in answer.partial_success.error_message
    assert stored_spans(rt) == [(TRACE, "00000000000000e1"), (TRACE, "00000000000000e2")]


def test_a_json_id_that_is_not_hex_is_named_as_sent(server: tuple[str, Runtime]) -> None:
    """A trace id like "g" * 32 is valid base64 of 24 bytes: the rejection named a 48-character id nobody
    sent. Only base64 of an id's length is read as base64 (the proto3-JSON form some producers send)."""
    base, rt = server
    body = json_request(json_span("00000000000000f1", trace_id="g" * 32))
    r = httpx.post(f"{base}/v1/traces", content=body, headers=JSON)
    assert r.status_code == 200 and r.json()["partialSuccess"]["rejectedSpans"] == 1, r.text
    assert repr("g" * 32) in r.json()["partialSuccess"]["errorMessage"]
    body = json_request(json_span("q83vEjRWeJA=", trace_id="q83vEjRWeJCrze8SNFZ4kA=="))  # base64 of both ids
    r = httpx.post(f"{base}/v1/traces", content=body, headers=JSON)
    assert r.status_code == 200 and "partialSuccess" not in r.json(), r.text
    assert stored_spans(rt) == [("abcdef1234567890abcdef1234567890", "abcdef1234567890")]


def test_a_body_over_the_otlp_limit_names_that_limit_and_its_letter_says_what_was_read(db_url: str) -> None:
    """The 413 named VIGIL_MAX_REQUEST_BYTES although VIGIL_OTLP_MAX_BODY_BYTES (smaller) applied, and the dead
    letter of a body refused on its Content-Length kept nothing, saying nothing about it."""
    with vigil(db_url, otlp_max_body_bytes=4096) as (base, rt):
        r = httpx.post(f"{base}/v1/traces", content=b"\0" * 5000, headers=JSON)
        assert r.status_code == 413
        message = r.json()["message"]
        assert "VIGIL_OTLP_MAX_BODY_BYTES" in message and "VIGIL_MAX_REQUEST_BYTES" not in message, message

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(10):
                yield b"\0" * 1000

        async def stream() -> httpx.Response:
            async with httpx.AsyncClient() as client:
                return await client.post(f"{base}/v1/traces", content=chunks(), headers=JSON)

        import asyncio

        r = asyncio.run(stream())
        assert r.status_code == 413 and "VIGIL_OTLP_MAX_BODY_BYTES" in r.json()["message"], r.text
        streamed, declared = dead_letters(rt)
        assert declared["reason"] == "oversized" and declared["raw_size"] == 0
        assert "request body of 5000 bytes" in declared["detail"]
        assert "Content-Length" in declared["detail"] and "before any of it was read" in declared["detail"]
        assert streamed["raw_size"] > 0 and "refused while reading" in streamed["detail"]
    with vigil(db_url, max_request_bytes=4096) as (base, _):  # the general limit is the smaller one here
        r = httpx.post(f"{base}/v1/traces", content=b"\0" * 5000, headers=JSON)
        assert r.status_code == 413 and "(VIGIL_MAX_REQUEST_BYTES)" in r.json()["message"]


def test_spans_over_a_conversations_limit_are_counted_as_rejected_and_the_limit_named(db_url: str) -> None:
    """A trace of more spans than a conversation holds: the spans beyond the limit are not stored, and the
    answer counts them in ``rejectedSpans`` (an exporter's metrics see them) and names the setting."""
    with vigil(db_url, otlp_max_spans_per_conversation=3) as (base, rt):
        spans = [json_span(f"{i + 1:016x}") for i in range(5)]
        r = httpx.post(f"{base}/v1/traces", content=json_request(*spans), headers=JSON)
        assert r.status_code == 200, r.text
        partial = r.json()["partialSuccess"]
        assert partial["rejectedSpans"] == 2
        assert "2 spans dropped: a conversation holds at most 3 spans" in partial["errorMessage"]
        assert "VIGIL_OTLP_MAX_SPANS_PER_CONVERSATION" in partial["errorMessage"]
        assert len(stored_spans(rt)) == 3


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"resourceSpans": 5}', "resourceSpans must be an array of objects, not int"),
        (b'{"resourceSpans": [{"scopeSpans": "x"}]}', "resourceSpans[].scopeSpans must be an array of objects"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [1]}]}]}', "resourceSpans[].scopeSpans[].spans must be"),
        (b'{"resourceLogs": {}}', "resourceLogs must be an array of objects, not dict"),
        (b'{"resourceLogs": [{"scopeLogs": [{"logRecords": "r"}]}]}', "scopeLogs[].logRecords must be an array"),
    ],
)
def test_a_json_request_of_the_wrong_shape_names_the_field(body: bytes, where: str) -> None:
    """A JSON request whose arrays are something else answered with Python's own words ("'int' object is
    not iterable"); it now names the field and what it must be."""
    parse = otlp.parse_logs_json if b"resourceLogs" in body else otlp.parse_json
    with pytest.raises(otlp.OtlpError) as err:
        parse(body, 100)
    assert where in str(err.value) and err.value.status == 400


def test_a_protobuf_attribute_nested_past_protobufs_limit_is_a_400_that_says_so(server: tuple[str, Runtime]) -> None:
    """An attribute value of key-value lists 40 deep passes protobuf's limit of 100 nested messages. The
    answer says that in OTLP's words (the request type under its own name, not the decoder's copy of it)
    and the request is kept as a dead letter; a span nested within the limit in the same trace is stored."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    base, rt = server

    def request(depth: int, span_id: str) -> bytes:
        value = AnyValue(string_value="x")
        for _ in range(depth):
            outer = AnyValue()
            outer.kvlist_value.values.add(key="a").value.CopyFrom(value)
            value = outer
        req = ExportTraceServiceRequest.FromString(pb_request((bytes.fromhex(TRACE), bytes.fromhex(span_id))))
        req.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="gen_ai.x").value.CopyFrom(value)
        return req.SerializeToString()

    r = httpx.post(f"{base}/v1/traces", content=request(40, "00000000000000f2"), headers=PROTOBUF)
    assert r.status_code == 400
    from google.rpc.status_pb2 import Status

    message = Status.FromString(r.content).message
    assert "opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest" in message, message
    assert "nested deeper than protobuf's limit of 100" in message and "vigil" not in message, message
    assert dead_letters(rt)[0]["reason"] == "malformed_otlp"
    r = httpx.post(f"{base}/v1/traces", content=request(10, "00000000000000f3"), headers=PROTOBUF)
    assert r.status_code == 200, r.content
    assert stored_spans(rt) == [(TRACE, "00000000000000f3")]


@pytest.mark.parametrize(
    "body",
    [gzip.compress(b"\xff" * 15_000_000), gzip.compress(b"\0" * 40_000_000)],
    ids=["inflates-then-fails-to-parse", "bomb"],
)
def test_a_refused_compressed_body_is_freed_with_its_answer(server: tuple[str, Runtime], body: bytes) -> None:
    """A gzip body that inflates to 15 MB and is then refused (not protobuf), or a bomb refused at the
    limit, left its inflated bytes in a reference cycle (the error's frames through the thread pool):
    freed only by a full collection, so a few hundred such requests, each under 15 kB, grew a server by
    gigabytes. Nothing of them may wait for the garbage collector."""
    import gc
    import types

    base, _ = server
    gc.collect()
    gc.disable()
    try:
        for _ in range(2):
            r = httpx.post(f"{base}/v1/traces", content=body, headers={**PROTOBUF, "content-encoding": "gzip"})
            assert r.status_code in (400, 413), r.text
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        frames = [o for o in gc.garbage if isinstance(o, types.FrameType)]
        held = sum(_size(v) for f in frames for v in f.f_locals.values())
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert held < 1_000_000, f"{held} bytes of refused bodies were left for the garbage collector"


def _size(value: Any) -> int:
    """Bytes a frame's local holds: a buffer's, or the parts of a list of them (a body inflated in parts)."""
    if isinstance(value, list):
        return sum(_size(v) for v in value if isinstance(v, bytes))
    if isinstance(value, bytes | bytearray):
        return len(value)
    if isinstance(value, memoryview):
        try:
            return value.nbytes
        except ValueError:  # released: its buffer went back to the pool
            return 0
    return 0


def test_a_request_sent_again_leaves_nothing_for_the_garbage_collector(server: tuple[str, Runtime]) -> None:
    """A request whose spans were stored before (an exporter sending it again after a timeout) failed its
    plain insert on their key; the caught error's frames, in a cycle through SQLAlchemy's, held the
    request's decoded spans and their column values until the collector next ran: 15 MB for a request of
    512 spans, so 20 such requests at once took a server from 222 MB to 549 MB where the byte budget
    allowed about 410. A request's objects are freed with its answer."""
    from tests.support.frames import garbage_frames

    base, rt = server
    body = json_request(*(json_span(f"{i + 1:016x}") for i in range(50)))
    assert httpx.post(f"{base}/v1/traces", content=body, headers=JSON).status_code == 200
    with garbage_frames() as held:
        r = httpx.post(f"{base}/v1/traces", content=body, headers=JSON)
        assert r.status_code == 200, r.text
    assert not held, f"frames of Vigil's left for the garbage collector: {held}"
    assert len(stored_spans(rt)) == 50
