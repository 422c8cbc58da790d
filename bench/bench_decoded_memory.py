"""Memory a ``POST /v1/conversations`` body takes once decoded, per format, as a multiple of its bytes.

    python -m bench.bench_decoded_memory [conversations|outcomes|otlp]

The τ² results files in ``../shared/data`` are sent as they are (``?format=tau2``) and, converted, as
Vigil's schema (no ``format``), OpenAI chat records, Anthropic Messages requests and LangSmith run
trees. Each body goes through the handler's own work (``ingest_body`` or ``ingest_formatted``: JSON
parse, format conversion, validation, rules and storing, on SQLite) under ``tracemalloc``; printed is
the peak of what Python allocated meanwhile plus the body itself, over the body's size: measured 14.6
to 20.3, held as ``vigil.ingest.http.DECODED_BYTES_PER_BODY_BYTE``.

``outcomes``: batches of 500 and 5,000 outcomes for each file's conversations through ``POST
/v1/outcomes``'s work (read, validate, store): 20.3 to 21.8, held as
``vigil.outcomes.api.DECODED_BYTES_PER_BODY_BYTE``. ``otlp``: the first OTLP request (512 GenAI spans)
made from each file's conversations, and the same messages as log records, protobuf and JSON, through
``POST /v1/traces`` / ``/v1/logs``'s work (parse, assemble, store): spans 2.5 to 3.5 (protobuf) and 14.6
to 16.8 (JSON), log records 6.2 to 11.5 and 16.3 to 17.6, held as
``vigil.ingest.otlp.api.DECODED_BYTES_PER_BODY_BYTE``. (tracemalloc does not see what protobuf's parser
allocates outside Python's allocator.)
"""

from __future__ import annotations

import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.decode import encode_conversation
from vigil.ingest.http import ingest_body, ingest_formatted
from vigil.ingest.importers import read_file
from vigil.settings import Settings

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tau2" / "trajectories"
WARM = orjson.dumps(
    {"conversation_id": "warm", "agent_id": "a", "agent_version": "v", "messages": [{"role": "user", "content": "hi"}]}
)
KEEP = ("role", "content", "tool_calls", "tool_call_id", "name")


def _openai_message(m: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in m.items() if k in KEEP}
    if "tool_calls" in out:
        out["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {**c["function"], "arguments": orjson.dumps(c["function"]["arguments"]).decode()},
            }
            for c in out["tool_calls"]
        ]
    return out


def _anthropic(doc: dict[str, Any]) -> dict[str, Any]:
    system = "\n".join(m["content"] for m in doc["messages"] if m["role"] == "system")
    turns: list[dict[str, Any]] = []
    for m in doc["messages"]:
        if m["role"] == "system":
            continue
        if m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m.get("content") or ""}
            role, blocks = "user", [block]
        elif m["role"] == "assistant":
            blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            blocks += [
                {"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": c["function"]["arguments"]}
                for c in m.get("tool_calls") or ()
            ]
            role = "assistant"
        else:
            role, blocks = "user", [{"type": "text", "text": m.get("content") or ""}]
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += blocks
        else:
            turns.append({"role": role, "content": blocks})
    return {"model": "gpt-4.1", "system": system, "messages": turns}


def _langsmith(doc: dict[str, Any], i: int) -> dict[str, Any]:
    msgs = [_openai_message(m) for m in doc["messages"]]
    run_id = f"00000000-0000-4000-8000-{i:012x}"
    return {
        "id": run_id,
        "trace_id": run_id,
        "name": "agent",
        "run_type": "chain",
        "inputs": {},
        "outputs": {"messages": msgs},
        "child_runs": [],
    }


def bodies(path: Path) -> dict[str, bytes]:
    docs = [orjson.loads(encode_conversation(c)) for c in read_file(path, "tau2").conversations]
    return {
        "native": orjson.dumps(docs),
        "tau2": path.read_bytes(),
        "openai": orjson.dumps([{"messages": [_openai_message(m) for m in d["messages"]]} for d in docs]),
        "anthropic": orjson.dumps([_anthropic(d) for d in docs]),
        "langsmith": orjson.dumps([_langsmith(d, i) for i, d in enumerate(docs)]),
    }


def peak(work: Callable[[], Any]) -> tuple[int, Any]:
    tracemalloc.start()
    try:
        answer = work()
        return tracemalloc.get_traced_memory()[1], answer
    finally:
        tracemalloc.stop()


def measure(fmt: str, body: bytes) -> tuple[int, Any]:
    """The peak over a fresh SQLite database (nothing stored as a duplicate of an earlier run), once warm."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            database_url=f"sqlite:///{tmp}/v.db", metrics_port=0, otlp_grpc_port=0, judge_mode="offline"
        )
        rt = wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})
        try:
            ingest_body(rt, WARM)  # imports, compiled statements, caches: what every process already holds
            if fmt == "native":
                return peak(lambda: ingest_body(rt, body))
            return peak(lambda: ingest_formatted(rt, body, fmt, None, None))
        finally:
            rt.close()


def conversations_main() -> None:
    print(f"{'file':<42} {'format':<10} {'body bytes':>11} {'status':>6} {'held':>6}")
    for path in sorted(DATA.iterdir()):
        for fmt, body in bodies(path).items():
            size, answer = measure(fmt, body)
            note = "" if answer.status == 202 else str(answer.body)[:200]
            held = (size + len(body)) / len(body)
            print(f"{path.name[:42]:<42} {fmt:<10} {len(body):>11,} {answer.status:>6} {held:>5.1f}x {note}")


def outcome_bodies(path: Path) -> dict[str, bytes]:
    """Outcomes for a τ² file's conversations as a client posts them: one of each outcome type per
    conversation, in batches up to the endpoint's 5,000 items (from ``vigil.outcomes.api``)."""
    from vigil.outcomes.api import MAX_BATCH

    ids = [c.conversation_id for c in read_file(path, "tau2").conversations]
    kinds = ("escalation", "refund_reversal", "csat", "reopened_ticket", "task_success")
    items = [
        {
            "conversation_id": f"{cid}-{n}",
            "type": kind,
            "value": 4.0 if kind == "csat" else 1.0,
            "occurred_at": "2026-12-01T12:00:00+00:00",
            "idempotency_key": f"{cid}-{n}-{kind}",
        }
        for n in range(MAX_BATCH // (len(ids) * len(kinds)) + 1)
        for cid in ids
        for kind in kinds
    ]
    return {"5000 items": orjson.dumps(items[:MAX_BATCH]), "500 items": orjson.dumps(items[:500])}


def _runtime(tmp: str) -> Any:
    settings = Settings(database_url=f"sqlite:///{tmp}/v.db", metrics_port=0, otlp_grpc_port=0, judge_mode="offline")
    return wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})


def measure_outcomes(body: bytes) -> tuple[int, Any]:
    """``POST /v1/outcomes``'s work on ``body`` (read, validate, store on SQLite), the conversations unknown."""
    from vigil.outcomes.ingest import OutcomeStore
    from vigil.schema import read_items

    with tempfile.TemporaryDirectory() as tmp:
        rt = _runtime(tmp)
        try:
            store = rt.get(OutcomeStore)
            warm, refused = read_items(b'[{"conversation_id": "warm", "type": "escalation"}]')
            store.ingest(warm, "http", None, refused)

            def work() -> Any:
                items, refused = read_items(body)
                return store.ingest(items, "http", None, refused)

            return peak(work)
        finally:
            rt.close()


def outcomes_main() -> None:
    print(f"{'file':<42} {'body':<10} {'body bytes':>11} {'stored':>6} {'held':>6}")
    for path in sorted(DATA.iterdir()):
        for name, body in outcome_bodies(path).items():
            size, result = measure_outcomes(body)
            held = (size + len(body)) / len(body)
            print(f"{path.name[:42]:<42} {name:<10} {len(body):>11,} {result.stored:>6} {held:>5.1f}x")


def _otlp_json(doc: dict[str, Any], spans: str) -> bytes:
    """OTLP/JSON as the specification writes it: hex trace and span ids (``MessageToDict`` writes base64)."""
    import base64

    for res in doc.get(f"resource{spans[0].upper()}{spans[1:]}", []):
        for scope in res.get(f"scope{spans[0].upper()}{spans[1:]}", []):
            for item in scope.get("spans" if spans == "spans" else "logRecords", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in item:
                        item[k] = base64.b64decode(item[k]).hex()
    return orjson.dumps(doc)


def _logs_of(spans_body: bytes) -> tuple[bytes, bytes]:
    """A traces request made the way ``opentelemetry-instrumentation-openai-v2`` exports content: spans
    without it, and a log record per message (``gen_ai.{role}.message``, ``gen_ai.choice``) for each
    chat span, joined by trace and span id. Returns (spans without content, logs request)."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue, KeyValueList
    from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

    def value(v: Any) -> AnyValue:
        if isinstance(v, dict):
            return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=value(x)) for k, x in v.items()]))
        if isinstance(v, list):
            from opentelemetry.proto.common.v1.common_pb2 import ArrayValue

            return AnyValue(array_value=ArrayValue(values=[value(x) for x in v]))
        return AnyValue(string_value="" if v is None else str(v))

    req = ExportTraceServiceRequest.FromString(spans_body)
    logs = ExportLogsServiceRequest()
    for rs in req.resource_spans:
        rl = logs.resource_logs.add()
        rl.resource.CopyFrom(rs.resource)
        sl = rl.scope_logs.add()
        for ss in rs.scope_spans:
            for span in ss.spans:
                attrs = {kv.key: kv.value.string_value for kv in span.attributes}
                if "gen_ai.input.messages" not in attrs:
                    continue
                turn = [(p["role"], p) for p in orjson.loads(attrs["gen_ai.input.messages"])]
                system = orjson.loads(attrs.get("gen_ai.system_instructions") or "[]")
                records = [("system", {"content": "\n".join(p["content"] for p in system)})] if system else []
                for role, m in turn:
                    text = "".join(p.get("content") or "" for p in m["parts"] if p["type"] == "text")
                    calls = [p for p in m["parts"] if p["type"] == "tool_call"]
                    body: dict[str, Any] = {"content": text}
                    if calls:
                        body["tool_calls"] = [
                            {
                                "id": c["id"],
                                "type": "function",
                                "function": {"name": c["name"], "arguments": c["arguments"]},
                            }
                            for c in calls
                        ]
                    if role == "tool":
                        r = m["parts"][0]
                        body = {"id": r.get("id"), "content": r.get("response")}
                    records.append((role, body))
                out = orjson.loads(attrs["gen_ai.output.messages"])[0]
                choice_text = "".join(p.get("content") or "" for p in out["parts"] if p["type"] == "text")
                for i, (role, body) in enumerate(records):
                    sl.log_records.append(
                        LogRecord(
                            time_unix_nano=span.start_time_unix_nano + i,
                            event_name=f"gen_ai.{role}.message",
                            trace_id=span.trace_id,
                            span_id=span.span_id,
                            body=value(body),
                            attributes=[KeyValue(key="gen_ai.provider.name", value=AnyValue(string_value="openai"))],
                        )
                    )
                sl.log_records.append(
                    LogRecord(
                        time_unix_nano=span.end_time_unix_nano,
                        event_name="gen_ai.choice",
                        trace_id=span.trace_id,
                        span_id=span.span_id,
                        body=value(
                            {
                                "index": "0",
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": choice_text},
                            }
                        ),
                    )
                )
                keep = [
                    kv
                    for kv in span.attributes
                    if not kv.key.startswith(("gen_ai.input", "gen_ai.output", "gen_ai.system_"))
                ]
                del span.attributes[:]
                span.attributes.extend(keep)
    return req.SerializeToString(), logs.SerializeToString()


def otlp_bodies(path: Path) -> dict[str, tuple[bytes, bytes | None]]:
    """The first OTLP requests (512 spans each, as the SDK batches them) for a τ² file's conversations,
    as traced agents send them: GenAI spans carrying their messages, or spans without them and the
    messages as log records; protobuf and JSON. Values are (body, spans to store first or None)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from bench.bench_otlp import whole_traces

    docs = [orjson.loads(encode_conversation(c)) for c in read_file(path, "tau2").conversations]
    traces = whole_traces(docs)[0]
    bare, logs = _logs_of(traces)
    as_json = lambda msg, cls, key: _otlp_json(MessageToDict(cls.FromString(msg)), key)  # noqa: E731
    return {
        "traces pb": (traces, None),
        "traces json": (as_json(traces, ExportTraceServiceRequest, "spans"), None),
        "logs pb": (logs, bare),
        "logs json": (as_json(logs, ExportLogsServiceRequest, "logs"), bare),
    }


def measure_otlp(kind: str, body: bytes, first: bytes | None) -> tuple[int, Any]:
    """``POST /v1/traces`` or ``/v1/logs``'s work on ``body`` (parse, assemble, store on SQLite); for logs,
    the spans they belong to stored first (outside the measure)."""
    from vigil.ingest.otlp.ingest import TraceIngest
    from vigil.ingest.otlp.otlp import JSON, PROTOBUF, parse, parse_logs

    ctype = PROTOBUF if kind.endswith("pb") else JSON
    with tempfile.TemporaryDirectory() as tmp:
        rt = _runtime(tmp)
        try:
            ingest = rt.get(TraceIngest)
            if first is not None:
                ingest.ingest(parse(first, PROTOBUF)[0])
            if kind.startswith("logs"):
                return peak(lambda: ingest.ingest_logs(parse_logs(body, ctype, None)[0]))
            return peak(lambda: ingest.ingest(parse(body, ctype, None)[0]))
        finally:
            rt.close()


def otlp_main() -> None:
    print(f"{'file':<42} {'request':<12} {'body bytes':>11} {'held':>6}")
    for path in sorted(DATA.iterdir()):
        for kind, (body, first) in otlp_bodies(path).items():
            size, result = measure_otlp(kind, body, first)
            held = (size + len(body)) / len(body)
            print(f"{path.name[:42]:<42} {kind:<12} {len(body):>11,} {held:>5.1f}x {result.message()[:100]}")


def main() -> None:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("endpoint", nargs="?", default="conversations", choices=("conversations", "outcomes", "otlp"))
    {"conversations": conversations_main, "outcomes": outcomes_main, "otlp": otlp_main}[p.parse_args().endpoint]()


if __name__ == "__main__":
    main()
