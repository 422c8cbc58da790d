"""Decoding OTLP/protobuf trace requests: attribute values read as bytes give the same spans as protobuf's own
string decoding, a long value a span repeats or extends shares the earlier span's string, and a value that
is not UTF-8 is refused as protobuf refuses it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from vigil.ingest.otlp.otlp import EXTENDS, RECENT_VALUES, OtlpError, RecentValues, parse_protobuf, spans_of_request

SYSTEM = "Règles de la boutique 🛒: " + "réponds poliment. " * 40  # multi-byte characters, over 256 bytes


def kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    if isinstance(value, bytes):
        return KeyValue(key=key, value=AnyValue(bytes_value=value))
    if isinstance(value, list):
        return KeyValue(key=key, value=AnyValue(array_value=ArrayValue(values=[kv("", v).value for v in value])))
    if isinstance(value, dict):
        return KeyValue(key=key, value=AnyValue(kvlist_value=KeyValueList(values=[kv(k, v) for k, v in value.items()])))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def history(turns: int, trace: int) -> str:
    return json.dumps(
        [
            {"role": "user", "parts": [{"type": "text", "content": f"trace {trace}, tour {i}: où est ma commande ? ✈️"}]}
            for i in range(turns)
        ],
        ensure_ascii=False,
    )


def request(spans: list[Span]) -> bytes:
    resource = Resource(attributes=[kv("service.name", "boutique-agent"), kv("service.version", "1.0")])
    req = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=spans)])]
    )
    return req.SerializeToString()


def chat(trace: int, n: int, attrs: dict[str, Any]) -> Span:
    return Span(
        trace_id=trace.to_bytes(16, "big"),
        span_id=(trace * 100 + n).to_bytes(8, "big"),
        parent_span_id=(trace * 100).to_bytes(8, "big"),
        name="chat m",
        start_time_unix_nano=1_000 + n,
        end_time_unix_nano=2_000 + n,
        attributes=[kv(k, v) for k, v in attrs.items()],
    )


def standard(data: bytes) -> list[dict[str, Any]]:
    req = ExportTraceServiceRequest()
    req.ParseFromString(data)
    return spans_of_request(req)


def test_values_match_protobufs_decoding_and_repeats_share_one_string() -> None:
    spans = []
    for n in range(4):  # two traces interleaved, as one exporter sends a busy fleet's spans
        for trace in (1, 2):
            attrs: dict[str, Any] = {
                "gen_ai.operation.name": "chat",
                "gen_ai.system_instructions": SYSTEM,
                "gen_ai.input.messages": history(n + 8, trace),  # the history so far: each extends the last
                "gen_ai.output.messages": "",
                "note": f"span {n}: " + "x" * 300,  # as long as the last one, not equal to it
                "gen_ai.usage.input_tokens": 10 + n,
                "flag": n % 2 == 0,
                "score": 0.5,
                "tags": ["é", "b" * 300, 3],
                "extra": {"k": "ü" * 200, "n": 1},
                "blob": b"\x00\xff",
            }
            if n == 3:  # not an extension: a history rewritten from the start
                attrs["gen_ai.input.messages"] = history(2, trace) + " " * 300
            spans.append(chat(trace, n, attrs))
    data = request(spans)

    got = parse_protobuf(data)

    # what extends what, found while decoding (see EXTENDS): only each trace's growing history
    bases = [s.pop(EXTENDS, None) for s in got]
    assert got == standard(data)
    first, second = got[0]["attributes"], got[2]["attributes"]  # trace 1, spans 0 and 1
    assert bases[0] is None and bases[1] is None  # the first of each trace extends nothing
    assert [list(b) for b in bases[2:6]] == [["gen_ai.input.messages"]] * 4
    assert bases[2]["gen_ai.input.messages"] is first["gen_ai.input.messages"]
    assert bases[6] is None and bases[7] is None  # rewritten from the start: not an extension
    assert second["gen_ai.system_instructions"] is first["gen_ai.system_instructions"]
    assert json.loads(second["gen_ai.input.messages"])[-1]["parts"][0]["content"].startswith("trace 1, tour 8")
    assert got[0]["attributes"]["gen_ai.input.messages"] != got[1]["attributes"]["gen_ai.input.messages"]
    assert got[0]["attributes"]["tags"] == ["é", "b" * 300, 3]
    assert got[0]["attributes"]["blob"] == "00ff"


def with_bytes(data: bytes, text: str, raw: bytes) -> bytes:
    """``data`` with the UTF-8 of ``text`` replaced by ``raw`` of the same length (a value protobuf cannot build)."""
    encoded = text.encode()
    assert len(raw) == len(encoded) and data.count(encoded) == 1
    return data.replace(encoded, raw)


@pytest.mark.parametrize("where", ["long", "extension", "short", "nested"])
def test_a_value_that_is_not_utf8_is_refused(where: str) -> None:
    marker = "Z" * 300 if where != "short" else "ZZZZ"
    base = history(8, 1)
    attrs: list[dict[str, Any]] = [{"gen_ai.input.messages": base}, {"gen_ai.input.messages": base}]
    if where == "long":
        attrs[0]["note"] = marker
    elif where == "extension":
        attrs[1]["gen_ai.input.messages"] = base[:-1] + ', "' + marker + '"]'
    elif where == "short":
        attrs[1]["note"] = marker
    else:
        attrs[1]["tags"] = ["ok", marker]
    data = request([chat(1, n, {"gen_ai.operation.name": "chat", **a}) for n, a in enumerate(attrs)])
    bad = with_bytes(data, marker, b"\xff" + marker.encode()[1:])

    assert parse_protobuf(data)  # the same request with valid text is read
    with pytest.raises(OtlpError) as err:
        parse_protobuf(bad)
    assert err.value.status == 400


def test_a_trace_split_over_requests_reuses_its_earlier_values_until_its_root_ends() -> None:
    trace = 77
    first = parse_protobuf(request([chat(trace, n, {"sys": SYSTEM, "in": history(n + 8, trace)}) for n in (0, 1)]))
    later = parse_protobuf(request([chat(trace, 2, {"sys": SYSTEM, "in": history(10, trace)})]))

    assert later[0]["attributes"]["sys"] is first[1]["attributes"]["sys"]
    assert later[0]["attributes"]["in"] == history(10, trace)
    key = f"{trace:032x}"
    assert RECENT_VALUES.get(key)["in"][1] is later[0]["attributes"]["in"]
    root = Span(trace_id=trace.to_bytes(16, "big"), span_id=(trace * 100).to_bytes(8, "big"), name="agent")
    parse_protobuf(request([root]))
    assert RECENT_VALUES.get(key) == {}


def test_recent_values_keep_within_their_byte_budget() -> None:
    recent = RecentValues(max_bytes=2000)  # each value held costs its bytes and its string: 600
    for t in range(5):
        recent.put({f"t{t}": {"a": (b"x" * 300, "x" * 300)}}, set())
    assert len(recent) == 3 and recent.get("t0") == {} and recent.get("t4")["a"][1] == "x" * 300
    recent.put({}, {"t4"})
    assert recent.get("t4") == {} and len(recent) == 2
