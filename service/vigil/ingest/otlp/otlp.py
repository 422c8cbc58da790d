"""Decodes OTLP trace and log requests (protobuf or JSON) into plain span and log-record dicts.

A normalised span is ``{"trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns",
"end_ns", "attributes", "events", "status", "resource"}`` with hex ids, attribute values as plain
Python values (lists and dicts for arrays and key-value lists) and only the ``service.*`` and
``deployment.*`` resource attributes. A normalised log record is ``{"trace_id", "span_id", "name",
"time_ns", "attributes", "body", "resource"}``; ``name`` is the record's event name (or its
``event.name`` attribute).
"""

from __future__ import annotations

import base64
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import orjson

from vigil.errors import VigilError
from vigil.http.encoding import Undecodable, inflate

HEX_TRACE = re.compile(r"^[0-9a-f]{32}$")
HEX_SPAN = re.compile(r"^[0-9a-f]{16}$")
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class OtlpError(VigilError):
    """An OTLP request that cannot be read at all; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def decompress(body: bytes | memoryview, encoding: str | None, limit: int) -> bytes | memoryview:
    """``body`` inflated (gzip, deflate or none), never to more than ``limit`` bytes (a bomb stops there: 413)."""
    try:
        return inflate(body, encoding, limit, "VIGIL_OTLP_MAX_BODY_BYTES")
    except Undecodable as exc:
        raise OtlpError(str(exc), exc.status) from exc


# --- protobuf ---------------------------------------------------------------


def parse_protobuf(data: bytes | memoryview, max_spans: int | None = None) -> list[dict[str, Any]]:
    """Spans of an ``ExportTraceServiceRequest``; one of more than ``max_spans`` spans is refused (413)
    before its spans are parsed (see :func:`count_items`)."""
    from google.protobuf.message import DecodeError

    req = _raw_request_class()()
    try:
        _check_count(data, max_spans, "spans")
        req.ParseFromString(data)
    except DecodeError as exc:
        raise OtlpError(f"body is not an OTLP ExportTraceServiceRequest: {_decode_error(exc)}") from exc
    try:
        return spans_of_request(req)
    except UnicodeDecodeError as exc:
        raise OtlpError(f"body is not an OTLP ExportTraceServiceRequest: a string value is not UTF-8 ({exc})") from exc


def _decode_error(exc: Exception) -> str:
    """protobuf's parse error in the words of the OTLP specification: the message types under their own
    names (not those of the decoder's copy, see :func:`_raw_request_class`), and a nesting too deep said so."""
    text = str(exc)
    for standard, raw in _RAW_PACKAGES.items():
        text = text.replace(f"{raw}.", f"{standard}.")
    return text.replace(
        "Exceeded upb_DecodeOptions_MaxDepth",
        f"messages nested deeper than protobuf's limit of {PROTOBUF_MAX_DEPTH} (an attribute value of key-value "
        "lists or arrays within each other, most likely)",
    )


PROTOBUF_MAX_DEPTH = 100  # upb's default recursion limit, which the Python runtime parses with
MAX_ITEMS_SETTING = "VIGIL_OTLP_MAX_SPANS_PER_REQUEST"


def too_many(count: int, limit: int, what: str) -> OtlpError:
    """413: not retried by OTLP/HTTP exporters (they retry 429, 502, 503 and 504 only), and the reason
    (``oversized``) its dead letter is kept under."""
    also = "" if what == "spans" else ", which bounds log records too"
    return OtlpError(
        f"request holds {count} {what}, more than the {limit} one request may ({MAX_ITEMS_SETTING}{also}): "
        "send smaller batches",
        413,
    )


def _check_count(data: bytes | memoryview, limit: int | None, what: str) -> None:
    # every span or log record takes at least 2 bytes (its tag and length): a smaller body is within the limit
    if limit is not None and len(data) > 2 * limit and not within_limit(data, limit):
        count = count_items(data)  # over it, or cannot tell: the exact count (and protobuf's own error) decides
        if count > limit:
            raise too_many(count, limit, what)


class _CannotTell(Exception):
    pass


WALK_SLACK = 4096  # fields beyond the items a walk reads before it leaves the count to protobuf


def within_limit(data: bytes | memoryview, limit: int) -> bool:
    """Whether a protobuf ``ExportTraceServiceRequest`` (or ``ExportLogsServiceRequest``) holds at most
    ``limit`` spans (or log records), read from the tags and lengths of its three outer levels only: no
    copy, nothing decoded, and it stops at the first item over the limit. :func:`count_items` parses the
    body to count (it copies every span's bytes, about 2% of what OTLP ingest costs); this walk costs about
    a microsecond a span. ``False`` also when it cannot tell cheaply (the body is not laid out as such a
    request, or has more than ``limit`` + ``WALK_SLACK`` fields at those levels): the exact count decides."""
    buf = data if isinstance(data, memoryview) else memoryview(data)
    if buf.ndim != 1 or buf.itemsize != 1:
        return False
    if buf.format != "B":  # signed bytes or chars read as unsigned bytes
        buf = buf.cast("B")
    budget = [limit + WALK_SLACK]
    count = 0
    try:
        # resource_spans / resource_logs = 1, scope_spans / scope_logs = 2, spans / log_records = 2
        for number, start, end in _fields(buf, 0, len(buf), budget):
            if number != 1:
                continue
            for number2, start2, end2 in _fields(buf, start, end, budget):
                if number2 != 2:
                    continue
                for number3, _, _ in _fields(buf, start2, end2, budget):
                    if number3 == 2:
                        count += 1
                        if count > limit:
                            return False
    except _CannotTell:
        return False
    return True


def _fields(buf: memoryview, i: int, end: int, budget: list[int]) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field of the message in ``buf[i:end]``; other
    fields are skipped. Raises ``_CannotTell`` on anything else (groups, a truncated field) or once
    ``budget`` fields were read, all levels together."""
    while i < end:
        budget[0] -= 1
        if budget[0] < 0:
            raise _CannotTell
        tag, i = _varint(buf, i, end)
        wire = tag & 7
        if wire == 2:
            n, i = _varint(buf, i, end)
            if i + n > end:
                raise _CannotTell
            yield tag >> 3, i, i + n
            i += n
        elif wire == 0:
            _, i = _varint(buf, i, end)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise _CannotTell
        if i > end or tag >> 3 == 0:
            raise _CannotTell


def _varint(buf: memoryview, i: int, end: int) -> tuple[int, int]:
    b = buf[i] if i < end else 256
    if b < 128:  # nearly every tag, and the length of anything under 128 bytes
        return b, i + 1
    value = shift = 0
    while i < end and shift < 64:
        b = buf[i]
        i += 1
        value |= (b & 127) << shift
        if b < 128:
            return value, i
        shift += 7
    raise _CannotTell


_count_class: Any = None


def count_items(data: bytes | memoryview) -> int:
    """How many spans (or log records) a protobuf ``ExportTraceServiceRequest`` (or ``ExportLogsServiceRequest``)
    holds, reading the request only as far as that: they are kept as bytes, about 30 each in memory where a
    parsed empty span takes 170 and its decoded dict far more (a 16 MB body can hold 8 million). Raises
    ``DecodeError`` on a body that is not protobuf."""
    global _count_class
    if _count_class is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        field = descriptor_pb2.FieldDescriptorProto
        proto = descriptor_pb2.FileDescriptorProto(name="vigil_otlp_count.proto", package="vigil.otlp_count")
        proto.syntax = "proto3"
        # resource_spans / resource_logs = 1, scope_spans / scope_logs = 2, spans / log_records = 2
        for name, number, kind, of in (
            ("Request", 1, field.TYPE_MESSAGE, "Resource"),
            ("Resource", 2, field.TYPE_MESSAGE, "Scope"),
            ("Scope", 2, field.TYPE_BYTES, ""),
        ):
            f = proto.message_type.add(name=name).field.add(name="items", number=number, type=kind)
            f.label = field.LABEL_REPEATED
            if of:
                f.type_name = f".vigil.otlp_count.{of}"
        pool = descriptor_pool.DescriptorPool()
        pool.Add(proto)
        _count_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("vigil.otlp_count.Request"))
    req = _count_class()
    req.ParseFromString(data)
    return sum(len(scope.items) for resource in req.items for scope in resource.items)


_RAW_PACKAGES = {
    "opentelemetry.proto.common.v1": "vigil.otlp_raw.common.v1",
    "opentelemetry.proto.resource.v1": "vigil.otlp_raw.resource.v1",
    "opentelemetry.proto.trace.v1": "vigil.otlp_raw.trace.v1",
    "opentelemetry.proto.collector.trace.v1": "vigil.otlp_raw.collector.trace.v1",
}
_raw_class: Any = None


def _raw_request_class() -> Any:
    """``ExportTraceServiceRequest`` as is, except that ``AnyValue.string_value`` is declared ``bytes`` (the
    same wire format): attribute values are read without decoding them, so a long value a span repeats
    from the previous one (every inference span resends the instructions and the history) is compared as
    bytes and shares the previous span's string instead of being validated and decoded again. Values
    that are decoded are checked as strictly as protobuf checks a string."""
    global _raw_class
    if _raw_class is not None:
        return _raw_class
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.resource.v1 import resource_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    def renamed(type_name: str) -> str:
        for old, new in _RAW_PACKAGES.items():
            if type_name.startswith(f".{old}."):
                return f".{new}{type_name[len(old) + 1 :]}"
        return type_name

    def retype(messages: Any) -> None:
        for m in messages:
            for f in m.field:
                if f.type_name:
                    f.type_name = renamed(f.type_name)
                if m.name == "AnyValue" and f.name == "string_value":
                    f.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
            retype(m.nested_type)

    pool = descriptor_pool.DescriptorPool()
    for module in (common_pb2, resource_pb2, trace_pb2, trace_service_pb2):
        proto = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(proto)
        proto.name = f"vigil_otlp_raw/{proto.name}"
        proto.package = _RAW_PACKAGES[proto.package]
        proto.dependency[:] = [f"vigil_otlp_raw/{d}" for d in proto.dependency]
        proto.ClearField("options")
        del proto.service[:]
        retype(proto.message_type)
        pool.Add(proto)
    name = f"{_RAW_PACKAGES['opentelemetry.proto.collector.trace.v1']}.ExportTraceServiceRequest"
    _raw_class = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    return _raw_class


def spans_of_request(req: Any) -> list[dict[str, Any]]:
    """Spans of a parsed ``ExportTraceServiceRequest`` (the HTTP and gRPC receivers share this); string values
    may come as bytes (see :func:`_raw_request_class`). Raises ``UnicodeDecodeError`` on one that is not UTF-8."""
    spans: list[dict[str, Any]] = []
    append = spans.append
    hexes: dict[bytes, str] = {}  # a request's spans share few trace ids
    seen = _Seen(RECENT_VALUES)
    for rs in req.resource_spans:
        resource = _resource({kv.key: _pb_value(kv.value) for kv in rs.resource.attributes})
        for ss in rs.scope_spans:
            for sp in ss.spans:
                tid = sp.trace_id
                trace_id = hexes.get(tid)
                if trace_id is None:
                    trace_id = hexes[tid] = tid.hex()
                status = sp.status
                extends: dict[str, str] = {}
                span = {
                    "trace_id": trace_id,
                    "span_id": sp.span_id.hex(),
                    # empty or all zeros: no parent (OTLP), so the span is its trace's root
                    "parent_span_id": pid.hex() if (pid := sp.parent_span_id) and pid != NO_SPAN else None,
                    "name": sp.name,
                    "kind": sp.kind,
                    "start_ns": sp.start_time_unix_nano,
                    "end_ns": sp.end_time_unix_nano,
                    "attributes": _attributes(sp.attributes, trace_id, seen, extends),
                    "events": _events(sp.events) if sp.events else [],
                    "status": {"code": status.code, "message": status.message},
                    "resource": resource,
                }
                if extends:
                    span[EXTENDS] = extends
                append(span)
                if not span["parent_span_id"]:
                    seen.ended.add(trace_id)
    seen.keep()
    return spans


def _events(events: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": ev.name,
            "time_ns": ev.time_unix_nano,
            "attributes": {kv.key: _pb_value(kv.value) for kv in ev.attributes},
        }
        for ev in events
    ]


def parse_logs_protobuf(data: bytes | memoryview, max_records: int | None = None) -> list[dict[str, Any]]:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    req = ExportLogsServiceRequest()
    try:
        _check_count(data, max_records, "log records")
        req.ParseFromString(data)
    except DecodeError as exc:
        raise OtlpError(f"body is not an OTLP ExportLogsServiceRequest: {_decode_error(exc)}") from exc
    return records_of_request(req)


def records_of_request(req: Any) -> list[dict[str, Any]]:
    """Log records of a parsed ``ExportLogsServiceRequest``."""
    out: list[dict[str, Any]] = []
    for rl in req.resource_logs:
        resource = _resource({kv.key: _pb_value(kv.value) for kv in rl.resource.attributes})
        for sl in rl.scope_logs:
            for lr in sl.log_records:
                attrs = {kv.key: _pb_value(kv.value) for kv in lr.attributes}
                name = getattr(lr, "event_name", "") or str(attrs.get("event.name") or "")
                out.append(
                    {
                        "trace_id": lr.trace_id.hex(),
                        "span_id": lr.span_id.hex() or None,
                        "name": name,
                        "time_ns": int(lr.time_unix_nano or lr.observed_time_unix_nano),
                        "attributes": attrs,
                        "body": _pb_value(lr.body),
                        "resource": resource,
                    }
                )
    return out


def logs_response(rejected: int, message: str) -> bytes:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

    resp = ExportLogsServiceResponse()
    if rejected or message:
        resp.partial_success.rejected_log_records = rejected
        resp.partial_success.error_message = message
    return bytes(resp.SerializeToString())


REUSE_BYTES = 256  # shorter values are decoded as they come
Values = dict[str, tuple[bytes, str]]  # attribute -> its latest long value, as received and decoded


class RecentValues:
    """The latest long string value of each attribute of the traces a process is receiving, as bytes and as
    decoded text, so a span that repeats or extends its trace's previous value (sent in an earlier request
    when a busy exporter interleaves many traces) is not decoded again. Traces whose root span ended are
    dropped; the least recently used go first beyond ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._traces: OrderedDict[str, tuple[Values, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._traces)

    def get(self, trace_id: str) -> Values:
        with self._lock:
            entry = self._traces.get(trace_id)
        return dict(entry[0]) if entry else {}

    def put(self, traces: dict[str, Values], ended: set[str]) -> None:
        with self._lock:
            for trace_id, values in traces.items():
                old = self._traces.pop(trace_id, None)
                if old is not None:
                    self._bytes -= old[1]
                if trace_id in ended:
                    continue
                size = sum(len(b) + len(t) for b, t in values.values())  # the bytes and their string
                self._traces[trace_id] = (values, size)
                self._bytes += size
            for trace_id in ended.difference(traces):
                gone = self._traces.pop(trace_id, None)
                if gone is not None:
                    self._bytes -= gone[1]
            while self._bytes > self.max_bytes and self._traces:
                _, (_, size) = self._traces.popitem(last=False)
                self._bytes -= size


RECENT_VALUES = RecentValues(32 * 1024 * 1024)


class _Seen(dict[str, Values]):
    """One request's long values by trace, starting from what ``recent`` holds of each trace."""

    def __init__(self, recent: RecentValues) -> None:
        super().__init__()
        self.recent = recent
        self.ended: set[str] = set()

    def __missing__(self, trace_id: str) -> Values:
        values = self[trace_id] = self.recent.get(trace_id)
        return values

    def keep(self) -> None:
        if self or self.ended:
            self.recent.put(self, self.ended)


EXTENDS = "extends"  # a span's key, not stored: see _attributes


def _attributes(kvs: Any, trace_id: str, seen: _Seen, extends: dict[str, str]) -> dict[str, Any]:
    """A span's attributes; string values (nearly all of them) without a call per value.

    A long value sent as bytes that equals the latest value of the same attribute in the same trace is
    that value's string; one that extends it (a JSON list with items appended) is its string with only
    the new bytes decoded (see :class:`RecentValues`), and ``extends`` maps the attribute to the string
    it extends: ``value == base[:-1] + value[len(base) - 1:]``, ``base`` ending in ``]`` and ``value``
    having ``,`` there. Whoever holds that very string object (``is``) need not compare the two again
    (see :func:`~vigil.ingest.otlp.compact.compact` and ``InputCache``)."""
    out: dict[str, Any] = {}
    values: Values | None = None
    for kv in kvs:
        v = kv.value
        b = v.string_value
        if not b:  # another kind of value, or ""
            out[kv.key] = _pb_value(v)
        elif b.__class__ is str:
            out[kv.key] = b
        elif len(b) < REUSE_BYTES:
            out[kv.key] = b.decode()
        else:
            if values is None:
                values = seen[trace_id]
            key = kv.key
            prev = values.get(key)
            if prev is None:
                text = b.decode()
            else:
                pb, ps = prev
                n = len(pb) - 1
                if b == pb:
                    text = ps
                elif len(b) > n and b[n] == 44 and pb[n] == 93 and b.startswith(pb[:n]):  # "," where "]" was
                    # an ASCII history decodes whole faster than its string is sliced and joined to the tail
                    # (about 2x, measured); any other is joined (decoding it whole is 2-3x slower)
                    text = b.decode() if ps.isascii() else ps[:-1] + b[n:].decode()
                    extends[key] = ps
                else:
                    text = b.decode()
            values[key] = (b, text)
            out[key] = text
    return out


def _pb_value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "string_value":  # by far the most common: checked first
        s = v.string_value
        return s if s.__class__ is str else s.decode()
    if kind is None:
        return None
    if kind == "array_value":
        return [_pb_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _pb_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def protobuf_response(rejected: int, message: str) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    resp = ExportTraceServiceResponse()
    if rejected or message:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = message
    return bytes(resp.SerializeToString())


# --- JSON (OTLP/JSON: hex ids, lowerCamelCase or snake_case field names) -----


def _get(d: dict[str, Any], camel: str, snake: str, default: Any = None) -> Any:
    if camel in d:
        return d[camel]
    return d.get(snake, default)


def _array(value: Any, where: str) -> list[dict[str, Any]]:
    """An OTLP/JSON array of objects (absent or null: none); anything else is a 400 naming the field."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        got = type(value).__name__ if not isinstance(value, list) else "an array holding something other than objects"
        raise OtlpError(f"body does not follow the OTLP JSON encoding: {where} must be an array of objects, not {got}")
    return value


def parse_json(data: bytes | memoryview, max_spans: int | None = None) -> list[dict[str, Any]]:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise OtlpError(f"body is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise OtlpError("body must be an OTLP ExportTraceServiceRequest object with resourceSpans")
    spans: list[dict[str, Any]] = []
    try:
        resource_spans = _array(_get(doc, "resourceSpans", "resource_spans"), "resourceSpans")
        if max_spans is not None:  # before any span becomes a dict (and a problem, if it is invalid)
            count = sum(
                len(_array(ss.get("spans"), "resourceSpans[].scopeSpans[].spans"))
                for rs in resource_spans
                for ss in _array(_get(rs, "scopeSpans", "scope_spans"), "resourceSpans[].scopeSpans")
            )
            if count > max_spans:
                raise too_many(count, max_spans, "spans")
        for rs in resource_spans:
            resource = _resource(_json_attrs((rs.get("resource") or {}).get("attributes")))
            for ss in _array(_get(rs, "scopeSpans", "scope_spans"), "resourceSpans[].scopeSpans"):
                for sp in _array(ss.get("spans"), "resourceSpans[].scopeSpans[].spans"):
                    status = sp.get("status") or {}
                    spans.append(
                        {
                            "trace_id": _json_id(_get(sp, "traceId", "trace_id", ""), 16),
                            "span_id": _json_id(_get(sp, "spanId", "span_id", ""), 8),
                            "parent_span_id": _parent(_json_id(_get(sp, "parentSpanId", "parent_span_id", ""), 8)),
                            "name": str(sp.get("name") or ""),
                            "kind": _enum(sp.get("kind", 0)),
                            "start_ns": _time(_get(sp, "startTimeUnixNano", "start_time_unix_nano", 0)),
                            "end_ns": _time(_get(sp, "endTimeUnixNano", "end_time_unix_nano", 0)),
                            "attributes": _json_attrs(sp.get("attributes")),
                            "events": [
                                {
                                    "name": str(ev.get("name") or ""),
                                    "time_ns": _time(_get(ev, "timeUnixNano", "time_unix_nano", 0)),
                                    "attributes": _json_attrs(ev.get("attributes")),
                                }
                                for ev in sp.get("events") or []
                            ],
                            "status": {
                                "code": _enum(status.get("code", 0)),
                                "message": str(status.get("message") or ""),
                            },
                            "resource": resource,
                        }
                    )
    except (AttributeError, TypeError, ValueError) as exc:
        raise OtlpError(f"body does not follow the OTLP JSON encoding: {exc}") from exc
    return spans


def parse_logs_json(data: bytes | memoryview, max_records: int | None = None) -> list[dict[str, Any]]:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise OtlpError(f"body is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise OtlpError("body must be an OTLP ExportLogsServiceRequest object with resourceLogs")
    out: list[dict[str, Any]] = []
    try:
        resource_logs = _array(_get(doc, "resourceLogs", "resource_logs"), "resourceLogs")
        if max_records is not None:  # before any record becomes a dict
            count = sum(
                len(_array(_get(sl, "logRecords", "log_records"), "resourceLogs[].scopeLogs[].logRecords"))
                for rl in resource_logs
                for sl in _array(_get(rl, "scopeLogs", "scope_logs"), "resourceLogs[].scopeLogs")
            )
            if count > max_records:
                raise too_many(count, max_records, "log records")
        for rl in resource_logs:
            resource = _resource(_json_attrs((rl.get("resource") or {}).get("attributes")))
            for sl in _array(_get(rl, "scopeLogs", "scope_logs"), "resourceLogs[].scopeLogs"):
                for lr in _array(_get(sl, "logRecords", "log_records"), "resourceLogs[].scopeLogs[].logRecords"):
                    attrs = _json_attrs(lr.get("attributes"))
                    time_ns = _get(lr, "timeUnixNano", "time_unix_nano", 0) or _get(
                        lr, "observedTimeUnixNano", "observed_time_unix_nano", 0
                    )
                    out.append(
                        {
                            "trace_id": _json_id(_get(lr, "traceId", "trace_id", ""), 16),
                            "span_id": _json_id(_get(lr, "spanId", "span_id", ""), 8) or None,
                            "name": str(_get(lr, "eventName", "event_name", "") or attrs.get("event.name") or ""),
                            "time_ns": _time(time_ns),
                            "attributes": attrs,
                            "body": _json_value(lr.get("body") or {}),
                            "resource": resource,
                        }
                    )
    except (AttributeError, TypeError, ValueError) as exc:
        raise OtlpError(f"body does not follow the OTLP JSON encoding: {exc}") from exc
    return out


def parse_logs(
    body: bytes | memoryview, content_type: str | None, max_records: int | None = None
) -> tuple[list[dict[str, Any]], str]:
    """Log records of a request and the media type to answer in; raises :class:`OtlpError`."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == PROTOBUF:
        return parse_logs_protobuf(body, max_records), PROTOBUF
    if media in (JSON, ""):
        return parse_logs_json(body, max_records), JSON
    raise OtlpError(f"Content-Type {content_type!r} is not supported: send {PROTOBUF} or {JSON}", 415)


_ENUMS = {
    "STATUS_CODE_UNSET": 0,
    "STATUS_CODE_OK": 1,
    "STATUS_CODE_ERROR": 2,
    "SPAN_KIND_UNSPECIFIED": 0,
    "SPAN_KIND_INTERNAL": 1,
    "SPAN_KIND_SERVER": 2,
    "SPAN_KIND_CLIENT": 3,
    "SPAN_KIND_PRODUCER": 4,
    "SPAN_KIND_CONSUMER": 5,
}


def _enum(v: Any) -> int:
    return _ENUMS.get(v, 0) if isinstance(v, str) and not v.isdigit() else _in_range(v, -(2**31), 2**31 - 1, "enum")


def _in_range(v: Any, low: int, high: int, what: str) -> int:
    """An integer of the OTLP JSON encoding (a number or a decimal string) within its protobuf type's range:
    one beyond it is not OTLP (400, kept as a dead letter), and no column or JSON writer could hold it."""
    n = int(v)
    if not low <= n <= high:
        raise ValueError(f"{what} {str(v)[:40]} is out of range")
    return n


def _time(v: Any) -> int:
    return _in_range(v or 0, 0, 2**64 - 1, "a time in nanoseconds")


def _json_id(v: Any, size: int) -> str:
    """An id (``size`` bytes) as lowercase hex. Some producers send the proto3-JSON form (base64) rather than
    OTLP's hex: one that decodes to ``size`` bytes is read so. Anything else is kept as sent (its span is
    rejected for invalid ids, naming the id the producer sent, not some decoding of it)."""
    s = str(v or "").strip()
    if s and not re.fullmatch(r"[0-9a-fA-F]+", s):
        try:
            raw = base64.b64decode(s, validate=True)
        except ValueError:
            return s
        return raw.hex() if len(raw) == size else s
    return s.lower()


# An attribute value nested deeper than this (arrays and key-value lists in one another) is not OTLP any
# exporter sends: protobuf parsing stops at 100 message levels (50 of these), and the stored span's JSON
# writer at 255.
MAX_VALUE_DEPTH = 32


def _json_attrs(items: Any, depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in items or []:
        if not isinstance(kv, dict):
            raise ValueError(f"an attribute must be an object with a key and a value, not {_shown(kv)}")
        key = kv.get("key")
        if not isinstance(key, str):  # a number would reach the store's JSON writer, which takes string keys only
            told = "has no key" if key is None else f"has key {_shown(key)}, not a string"
            raise ValueError(f"an attribute {told}")
        out[key] = _json_value(kv.get("value") or {}, depth)
    return out


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else f"{text[:60]}..."


def _json_value(v: dict[str, Any], depth: int = 0) -> Any:
    if "stringValue" in v or "string_value" in v:
        return _get(v, "stringValue", "string_value")
    if "boolValue" in v or "bool_value" in v:
        return bool(_get(v, "boolValue", "bool_value"))
    if "intValue" in v or "int_value" in v:
        return _in_range(_get(v, "intValue", "int_value"), -(2**63), 2**63 - 1, "intValue")
    if "doubleValue" in v or "double_value" in v:
        return float(_get(v, "doubleValue", "double_value"))
    nested = "arrayValue" in v or "array_value" in v or "kvlistValue" in v or "kvlist_value" in v
    if nested and depth >= MAX_VALUE_DEPTH:
        raise ValueError(f"an attribute value is nested deeper than {MAX_VALUE_DEPTH} levels")
    if "arrayValue" in v or "array_value" in v:
        values = (_get(v, "arrayValue", "array_value") or {}).get("values") or []
        return [_json_value(x, depth + 1) for x in values]
    if "kvlistValue" in v or "kvlist_value" in v:
        return _json_attrs((_get(v, "kvlistValue", "kvlist_value") or {}).get("values"), depth + 1)
    if "bytesValue" in v or "bytes_value" in v:
        return base64.b64decode(_get(v, "bytesValue", "bytes_value")).hex()
    return None


def _resource(attrs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attrs.items() if k.startswith(("service.", "deployment."))}


NO_SPAN = bytes(8)  # a parent span id of all zeros is no parent, as an empty one


def _parent(hex_id: str) -> str | None:
    return hex_id if hex_id and hex_id != "0" * 16 else None


STORED_NS = 2**63  # times are stored as signed 64-bit integers: up to the year 2262


def valid_times(span: dict[str, Any]) -> bool:
    """Whether a span's times fit the store (a fixed64 may hold what no signed 64-bit column can)."""
    return bool(0 <= span["start_ns"] < STORED_NS and 0 <= span["end_ns"] < STORED_NS)


def valid_ids(span: dict[str, Any]) -> bool:
    parent = span.get("parent_span_id")
    return bool(
        HEX_TRACE.match(span["trace_id"])
        and HEX_SPAN.match(span["span_id"])
        and span["trace_id"] != "0" * 32
        and span["span_id"] != "0" * 16  # all zeros is no span id (OTLP), as all zeros is no trace id
        and (parent is None or HEX_SPAN.match(parent))
    )


def parse(
    body: bytes | memoryview, content_type: str | None, max_spans: int | None = None
) -> tuple[list[dict[str, Any]], str]:
    """Spans of a request and the media type to answer in; raises :class:`OtlpError`."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == PROTOBUF:
        return parse_protobuf(body, max_spans), PROTOBUF
    if media in (JSON, ""):
        return parse_json(body, max_spans), JSON
    raise OtlpError(f"Content-Type {content_type!r} is not supported: send {PROTOBUF} or {JSON}", 415)
