"""OTLP ingest against native ingest of the same conversations, in CPU-seconds per 1,000 (part (c) of
``bench.bench_tracing``; see its docstring).

    python -m bench.bench_tracing --only otlp [--copies 17] [--rounds 4]
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from prometheus_client import CollectorRegistry

from vigil.app.runtime import build_runtime
from vigil.app.server import build_app
from vigil.app.wiring import wire
from vigil.settings import Settings

SPANS_PER_REQUEST = 512  # the OpenTelemetry SDK's BatchSpanProcessor max_export_batch_size
NATIVE_BATCH = 50
IN_FLIGHT = 100
KEY = {"Authorization": "Bearer bench-key"}


def conversations(copies: int) -> list[dict[str, Any]]:
    from bench.bench_pipeline import tau2_messages

    base = [orjson.loads(r) for r in tau2_messages()]
    out = []
    for i in range(copies):
        for c in base:
            out.append({**c, "conversation_id": f"{c['conversation_id']}-{i}"})
    return out


def _parts(m: dict[str, Any]) -> dict[str, Any]:
    """A Vigil (OpenAI) message in the GenAI ``parts`` form instrumentations send."""
    parts: list[dict[str, Any]] = []
    if m["role"] == "tool":
        return {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": m.get("tool_call_id"), "response": m.get("content")}],
        }
    if m.get("content"):
        parts.append({"type": "text", "content": m["content"]})
    for c in m.get("tool_calls") or []:
        fn = c.get("function") or {}
        parts.append({"type": "tool_call", "id": c.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")})
    return {"role": m["role"], "parts": parts}


def _kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def trace_spans(conv: dict[str, Any], n: int) -> list[Span]:
    """The spans an instrumented agent emits for ``conv``: a chat span per model turn, the root last."""
    trace_id = n.to_bytes(16, "big")
    root_id = (n * 1000).to_bytes(8, "big")
    msgs = conv["messages"]
    system = [{"type": "text", "content": m["content"]} for m in msgs if m["role"] == "system"]
    history = [m for m in msgs if m["role"] != "system"]
    t0 = 1_700_000_000_000_000_000 + n * 10**9
    spans: list[Span] = []
    for i, m in enumerate(history):
        if m["role"] != "assistant":
            continue
        attrs = [
            _kv("gen_ai.operation.name", "chat"),
            _kv("gen_ai.request.model", "gpt-4.1"),
            _kv("gen_ai.provider.name", "openai"),
            _kv("gen_ai.conversation.id", conv["conversation_id"]),
            _kv("gen_ai.usage.input_tokens", 100 + i),
            _kv("gen_ai.usage.output_tokens", 20),
            _kv("gen_ai.input.messages", orjson.dumps([_parts(h) for h in history[:i]]).decode()),
            _kv("gen_ai.output.messages", orjson.dumps([_parts(m)]).decode()),
        ]
        if system:
            attrs.append(_kv("gen_ai.system_instructions", orjson.dumps(system).decode()))
        spans.append(
            Span(
                trace_id=trace_id,
                span_id=(n * 1000 + len(spans) + 1).to_bytes(8, "big"),
                parent_span_id=root_id,
                name="chat gpt-4.1",
                kind=Span.SPAN_KIND_CLIENT,
                start_time_unix_nano=t0 + i * 10**6,
                end_time_unix_nano=t0 + i * 10**6 + 500_000,
                attributes=attrs,
            )
        )
    spans.append(
        Span(
            trace_id=trace_id,
            span_id=root_id,
            name="invoke_agent",
            kind=Span.SPAN_KIND_INTERNAL,
            start_time_unix_nano=t0,
            end_time_unix_nano=t0 + len(history) * 10**6,
            attributes=[
                _kv("gen_ai.operation.name", "invoke_agent"),
                _kv("gen_ai.agent.name", conv["agent_id"]),
                _kv("gen_ai.conversation.id", conv["conversation_id"]),
            ],
        )
    )
    return spans


def _requests(spans: Iterator[tuple[str, Span]]) -> list[bytes]:
    out: list[bytes] = []
    batch: list[tuple[str, Span]] = []

    def flush() -> None:
        by_service: dict[str, list[Span]] = {}
        for service, sp in batch:
            by_service.setdefault(service, []).append(sp)
        req = ExportTraceServiceRequest(
            resource_spans=[
                ResourceSpans(
                    resource=Resource(attributes=[_kv("service.name", svc), _kv("service.version", "1.0")]),
                    scope_spans=[ScopeSpans(spans=group)],
                )
                for svc, group in by_service.items()
            ]
        )
        out.append(req.SerializeToString())
        batch.clear()

    for item in spans:
        batch.append(item)
        if len(batch) >= SPANS_PER_REQUEST:
            flush()
    if batch:
        flush()
    return out


def whole_traces(convs: list[dict[str, Any]]) -> list[bytes]:
    return _requests((c["agent_id"], sp) for n, c in enumerate(convs, 1) for sp in trace_spans(c, n))


def interleaved(convs: list[dict[str, Any]], in_flight: int = IN_FLIGHT) -> list[bytes]:
    """Spans of about ``in_flight`` traces at a time, one span from each in turn (the root of each last)."""

    def spans() -> Iterator[tuple[str, Span]]:
        pending = [(c["agent_id"], trace_spans(c, n)) for n, c in enumerate(convs, 1)]
        active: list[tuple[str, list[Span]]] = []
        while pending or active:
            while pending and len(active) < in_flight:
                active.append(pending.pop(0))
            for agent, queue in list(active):
                yield agent, queue.pop(0)
                if not queue:
                    active.remove((agent, queue))

    return _requests(spans())


def _client(tmp: Path, label: str) -> Any:
    from fastapi.testclient import TestClient

    settings = Settings(
        database_url=f"sqlite:///{tmp / f'{label}.db'}",  # type: ignore[arg-type]
        api_keys="bench:admin:bench-key",  # type: ignore[arg-type]
        metrics_port=0,
        otlp_grpc_port=0,
        judge_mode="offline",
    )
    rt = wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})
    return TestClient(build_app(rt)), rt


def run_native(convs: list[dict[str, Any]], tmp: Path, label: str) -> float:
    bodies = [orjson.dumps(convs[i : i + NATIVE_BATCH]) for i in range(0, len(convs), NATIVE_BATCH)]
    client, rt = _client(tmp, label)
    headers = {**KEY, "content-type": "application/json"}
    gc.collect()  # every variant starts from the same collector state (a full collection costs ~0.1 s here)
    t0 = time.process_time()
    for body in bodies:
        r = client.post("/v1/conversations", content=body, headers=headers)
        assert r.status_code < 300, r.text[:300]
    cpu = time.process_time() - t0
    rt.close()
    return cpu


def run_otlp(requests: list[bytes], n: int, tmp: Path, label: str) -> float:
    client, rt = _client(tmp, label)
    headers = {**KEY, "content-type": "application/x-protobuf"}
    gc.collect()
    t0 = time.process_time()
    for body in requests:
        r = client.post("/v1/traces", content=body, headers=headers)
        assert r.status_code == 200, r.text[:300]
    cpu = time.process_time() - t0
    from sqlalchemy import func, select

    from vigil.store.models import ConversationRow

    with rt.sessions() as s:
        finished = s.scalar(select(func.count()).where(ConversationRow.status == "finished"))
    assert finished == n, f"{label}: {finished} of {n} conversations finished"
    rt.close()
    return cpu


def compare_otlp_native(copies: int, rounds: int) -> dict[str, float]:
    convs = conversations(copies)
    n = len(convs)
    whole, mixed = whole_traces(convs), interleaved(convs)
    spans = sum(len(c["messages"]) for c in convs)  # an upper bound; printed for scale only
    results: dict[str, list[float]] = {"native": [], "otlp": [], "otlp-interleaved": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        warm = convs[:60]  # first calls import and compile what every later run reuses: not measured
        run_native(warm, tmp, "warm-native")
        run_otlp(whole_traces(warm), len(warm), tmp, "warm-otlp")
        for r in range(rounds):  # interleave the variants so drift in machine load hits each alike
            results["native"].append(run_native(convs, tmp, f"native{r}"))
            results["otlp"].append(run_otlp(whole, n, tmp, f"otlp{r}"))
            results["otlp-interleaved"].append(run_otlp(mixed, n, tmp, f"mixed{r}"))
    best = {k: min(v) / n * 1000 for k, v in results.items()}
    median = {k: statistics.median(v) / n * 1000 for k, v in results.items()}
    ratio = {  # each round's OTLP run against the native run beside it
        k: statistics.median(o / nat for o, nat in zip(results[k], results["native"], strict=True))
        for k in ("otlp", "otlp-interleaved")
    }
    print(
        f"(c) ingest of {n:,} τ² conversations ({spans / n:.0f} messages each), CPU-seconds per 1,000, "
        f"{rounds} rounds: best, median, and the median of each round's ratio to native:"
    )
    native = f"native POST /v1/conversations (batches of {NATIVE_BATCH})"
    print(f"    {native:<50} {best['native']:6.2f} {median['native']:6.2f}")
    for k, label in (
        ("otlp", f"OTLP, whole traces ({len(whole)} requests)"),
        ("otlp-interleaved", f"OTLP, ~{IN_FLIGHT} traces interleaved ({len(mixed)} requests)"),
    ):
        print(f"    {label:<50} {best[k]:6.2f} {median[k]:6.2f}   {ratio[k]:.2f}× native")
    return {**best, **{f"{k} ratio": v for k, v in ratio.items()}}
