"""The span-count check of an OTLP protobuf request reads tags and lengths (``within_limit``) instead of
parsing the body a first time; protobuf's own count still decides whenever the walk cannot tell."""

from __future__ import annotations

import contextlib

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.ingest.test_otlp_hostile import pb_request
from vigil.ingest.otlp import otlp

TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")


def _request(resources: int, scopes: int, spans: int) -> bytes:
    """Spans over several resources and scopes, with the fields a real request has beside them."""
    req = ExportTraceServiceRequest()
    n = 0
    for r in range(resources):
        rs = req.resource_spans.add(schema_url="https://opentelemetry.io/schemas/1.26.0")
        rs.resource.attributes.add(key="service.name").value.string_value = f"svc-{r}"
        for s in range(scopes):
            ss = rs.scope_spans.add(schema_url="x")
            ss.scope.name, ss.scope.version = "instrumentation", str(s)
            for _ in range(spans):
                n += 1
                sp = ss.spans.add(trace_id=TRACE, span_id=n.to_bytes(8, "big"), name="chat " + "m" * (n % 300))
                sp.start_time_unix_nano, sp.end_time_unix_nano, sp.kind = n, n + 1, 3
                sp.attributes.add(key="gen_ai.input.messages").value.string_value = "é" * (n * 37 % 5000)
    return req.SerializeToString()


@pytest.mark.parametrize(("resources", "scopes", "spans"), [(1, 1, 512), (3, 2, 40), (1, 4, 0), (2, 1, 1)])
def test_the_walk_counts_as_protobuf_does(resources: int, scopes: int, spans: int) -> None:
    body = _request(resources, scopes, spans)
    count = otlp.count_items(body)
    assert count == resources * scopes * spans
    signed, chars = memoryview(body).cast("b"), memoryview(body).cast("c")  # read as unsigned bytes all the same
    for view in (body, memoryview(body), memoryview(bytearray(body)), signed, chars):
        assert otlp.within_limit(view, count)
        assert otlp.within_limit(view, count + 1)
        if count:
            assert not otlp.within_limit(view, count - 1)
    logs = ExportLogsServiceRequest()
    for _ in range(3):
        logs.resource_logs.add().scope_logs.add().log_records.add(body=None)
    assert otlp.within_limit(logs.SerializeToString(), 3) and not otlp.within_limit(logs.SerializeToString(), 2)


def test_a_request_within_the_limit_is_not_parsed_to_be_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    body = _request(1, 1, 512)

    def parsed(data: object) -> int:
        raise AssertionError("a request within the limit was parsed to count its spans")

    monkeypatch.setattr(otlp, "count_items", parsed)
    assert len(otlp.parse_protobuf(body, 512)) == 512
    with pytest.raises(AssertionError, match="parsed to count"):
        otlp.parse_protobuf(body, 511)  # over it: the exact count names the figure


def test_over_the_limit_the_exact_count_is_named() -> None:
    with pytest.raises(otlp.OtlpError) as err:
        otlp.parse_protobuf(pb_request(empty=500_000), 50_000)
    assert err.value.status == 413 and "500000 spans" in str(err.value)


def test_bodies_the_walk_cannot_read_are_left_to_protobuf() -> None:
    body = _request(1, 1, 3)
    # truncated, a group where a message is, a length past the end, a field number 0
    for bad in (body[:-5], b"\x0b" + body, b"\x0a\xff\xff\x03" + body, b"\x02\x00" + body):
        assert not otlp.within_limit(bad, 10)
        with pytest.raises((DecodeError, otlp.OtlpError)):
            otlp.parse_protobuf(bad + b"\x0a" * 30, 10)  # over twice the limit in bytes: the count decides
    # unknown fields of every wire type are skipped, as protobuf skips them
    unknown = b"\x78\x01" + b"\x79" + b"\x00" * 8 + b"\x7d" + b"\x00" * 4 + b"\x7a\x02ab"
    assert otlp.within_limit(unknown + body, 3) and not otlp.within_limit(unknown + body, 2)
    assert otlp.count_items(unknown + body) == 3


def test_a_body_of_fields_that_are_not_spans_costs_the_walk_a_bounded_effort(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 MB of 2-byte unknown fields inside a scope: the walk gives up after the limit and its slack, and
    protobuf counts (in C) instead of Python walking 8 million fields."""
    filler = b"\x18\x01" * 4_000_000  # field 3, varint 1
    resource = b"\x12" + _len(len(filler)) + filler  # one scope_spans holding the filler
    body = b"\x0a" + _len(len(resource)) + resource
    read = 0
    varint = otlp._varint

    def counted(*args: object) -> tuple[int, int]:
        nonlocal read
        read += 1
        return varint(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(otlp, "_varint", counted)
    assert not otlp.within_limit(body, 1_000)
    assert read <= 2 * (1_000 + otlp.WALK_SLACK) + 8, read  # a tag and a value a field, not 8 million fields
    assert otlp.count_items(body) == 0


def _len(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 127, n >> 7
        out.append(b | (128 if n else 0))
        if not n:
            return bytes(out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 3),
    st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=6),
    st.integers(0, 2000),
    st.integers(0, 12),
)
def test_the_walk_never_lets_a_request_over_the_limit_through(
    shape: int, flips: list[tuple[int, int]], cut: int, limit: int
) -> None:
    """Whatever bytes: when the walk says "within", protobuf agrees, or refuses the body as not protobuf."""
    body = bytearray(_request(1 + shape % 2, 1 + shape // 2, 3))
    for at, value in flips:
        body[at % len(body)] = value
    data = bytes(body[: max(0, len(body) - cut)])
    if otlp.within_limit(data, limit):
        with contextlib.suppress(DecodeError):  # not protobuf: refused when parsed
            assert otlp.count_items(data) <= limit
