"""OTLP ingest against native ingest of the same conversations, in CPU-seconds per 1,000 (part (c) of
``bench.bench_tracing``; see its docstring).

    python -m bench.bench_tracing --only otlp [--copies 17] [--rounds 4]
"""

from __future__ import annotations

import gc
import hashlib
import os
import resource
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from prometheus_client import CollectorRegistry

from vigil.app.runtime import build_runtime, settle_heap
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
    # random-looking ids, as SDKs make them (W3C trace context): ids in order would keep each index on them
    # appended at its end, which no exporter's traffic does
    ids = hashlib.blake2b(n.to_bytes(8, "big"), digest_size=24).digest()
    trace_id, root_id = ids[:16], ids[16:]
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
                span_id=hashlib.blake2b(ids + len(spans).to_bytes(4, "big"), digest_size=8).digest(),
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


WARM_IDS = 50_000_000  # warm-up traces' ids start here: a server warmed up by them must not see their ids again


def whole_traces(convs: list[dict[str, Any]], first: int = 1) -> list[bytes]:
    """Each trace whole, in order; trace (and span) ids are numbered from ``first``."""
    return _requests((c["agent_id"], sp) for n, c in enumerate(convs, first) for sp in trace_spans(c, n))


INTERLEAVED_IDS = 10_000_000  # interleaved traces' ids start here: see interleaved()


def interleaved(
    convs: list[dict[str, Any]], in_flight: int = IN_FLIGHT, first: int = INTERLEAVED_IDS + 1
) -> list[bytes]:
    """Spans of about ``in_flight`` traces at a time, one span from each in turn (the root of each last).

    Their trace ids differ from :func:`whole_traces`': side by side, both Vigils run in one process and
    share its cache of recent attribute values (``RECENT_VALUES``, keyed by trace id), which two
    exporters never do in production (trace ids are random); with the same ids, each whole-traces
    request dropped the interleaved traces' cached values as its own traces ended."""

    def spans() -> Iterator[tuple[str, Span]]:
        pending = [(c["agent_id"], trace_spans(c, n)) for n, c in enumerate(convs, first)]
        active: list[tuple[str, list[Span]]] = []
        while pending or active:
            while pending and len(active) < in_flight:
                active.append(pending.pop(0))
            for agent, queue in list(active):
                yield agent, queue.pop(0)
                if not queue:
                    active.remove((agent, queue))

    return _requests(spans())


class Usage:
    """CPU and minor page faults of this process: user and system seconds apart, because OTLP's extra
    cost is partly kernel time (zero-filled pages for its multi-MB request bodies and strings)."""

    __slots__ = ("user", "system", "faults")

    def __init__(self, user: float = 0.0, system: float = 0.0, faults: int = 0) -> None:
        self.user, self.system, self.faults = user, system, faults

    @classmethod
    def now(cls) -> Usage:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return cls(r.ru_utime, r.ru_stime, r.ru_minflt)

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.user - other.user, self.system - other.system, self.faults - other.faults)

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.user + other.user, self.system + other.system, self.faults + other.faults)

    @property
    def cpu(self) -> float:
        return self.user + self.system


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
    app = build_app(rt)
    if os.environ.get("VIGIL_BENCH_SETTLE_HEAP", "1") != "0":
        settle_heap(long_running=True)  # as `vigil serve` does once built (VIGIL_BENCH_SETTLE_HEAP=0: defaults)
    return TestClient(app), rt


def native_bodies(convs: list[dict[str, Any]]) -> list[bytes]:
    return [orjson.dumps(convs[i : i + NATIVE_BATCH]) for i in range(0, len(convs), NATIVE_BATCH)]


def run_native(bodies: list[bytes], tmp: Path, label: str) -> Usage:
    client, rt = _client(tmp, label)
    headers = {**KEY, "content-type": "application/json"}
    gc.collect()  # every variant starts from the same collector state (a full collection costs ~0.1 s here)
    t0 = Usage.now()
    for body in bodies:
        r = client.post("/v1/conversations", content=body, headers=headers)
        assert r.status_code < 300, r.text[:300]
    used = Usage.now() - t0
    rt.close()
    return used


def run_otlp(requests: list[bytes], n: int, tmp: Path, label: str) -> Usage:
    client, rt = _client(tmp, label)
    headers = {**KEY, "content-type": "application/x-protobuf"}
    gc.collect()
    t0 = Usage.now()
    for body in requests:
        r = client.post("/v1/traces", content=body, headers=headers)
        assert r.status_code == 200, r.text[:300]
    used = Usage.now() - t0
    finished = _finished(rt)
    assert finished == n, f"{label}: {finished} of {n} conversations finished"
    rt.close()
    return used


def _finished(rt: Any) -> int:
    from sqlalchemy import func, select

    from vigil.store.models import ConversationRow

    with rt.sessions() as s:
        return int(s.scalar(select(func.count()).where(ConversationRow.status == "finished")) or 0)


def run_side_by_side(
    native: list[bytes], whole: list[bytes], mixed: list[bytes], n: int, tmp: Path, label: str
) -> dict[str, Usage]:
    """The three ways in at once, each into its own Vigil: their requests are sent in turn (the variant
    furthest behind in its share of requests goes next) and the process CPU time of each request is added
    to its variant, so a change in the machine's load (which moves CPU time by 10-20% on a shared machine)
    hits all three alike instead of whichever ran at that moment."""
    plans = {
        "native": ("/v1/conversations", "application/json", native),
        "otlp": ("/v1/traces", "application/x-protobuf", whole),
        "otlp-interleaved": ("/v1/traces", "application/x-protobuf", mixed),
    }
    apps = {k: _client(tmp, f"{label}-{k}") for k in plans}
    used = {k: Usage() for k in plans}
    sent = dict.fromkeys(plans, 0)
    gc.collect()  # every round starts from the same collector state
    while True:
        left = [k for k, (_, _, bodies) in plans.items() if sent[k] < len(bodies)]
        if not left:
            break
        k = min(left, key=lambda k: sent[k] / len(plans[k][2]))
        path, ctype, bodies = plans[k]
        t0 = Usage.now()
        r = apps[k][0].post(path, content=bodies[sent[k]], headers={**KEY, "content-type": ctype})
        used[k] += Usage.now() - t0
        assert r.status_code < 300, r.text[:300]
        sent[k] += 1
    for k in ("otlp", "otlp-interleaved"):
        finished = _finished(apps[k][1])
        assert finished == n, f"{k}: {finished} of {n} conversations finished"
    for _, rt in apps.values():
        rt.close()
    return used


def compare_otlp_native(copies: int, rounds: int) -> dict[str, float]:
    """Each round measures the three ways in twice: one after the other, each into a Vigil of its own with
    a freshly collected heap (``alone``), and side by side (:func:`run_side_by_side`), where a change in the
    machine's load hits all three alike and each pays for the full garbage collections its own
    allocations trigger in a heap it shares with the others."""
    convs = conversations(copies)
    n = len(convs)
    native, whole, mixed = native_bodies(convs), whole_traces(convs), interleaved(convs)
    warm = convs[:60]  # first calls import and compile what every later run reuses: not measured
    warm_requests = native_bodies(warm), whole_traces(warm), interleaved(warm), len(warm)
    spans = sum(len(c["messages"]) for c in convs)  # an upper bound; printed for scale only
    # only the requests' bytes stay: the conversations as Python objects would enlarge every full garbage
    # collection of the process (which a server does not hold), and OTLP's requests trigger more of them
    del convs, warm
    gc.collect()
    ways = ("native", "otlp", "otlp-interleaved")
    results: dict[str, dict[str, list[Usage]]] = {m: {k: [] for k in ways} for m in ("alone", "side by side")}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run_side_by_side(*warm_requests, tmp, "warm")
        for r in range(rounds):
            alone = results["alone"]
            runs = [
                ("native", lambda r=r: run_native(native, tmp, f"native{r}")),
                ("otlp", lambda r=r: run_otlp(whole, n, tmp, f"otlp{r}")),
                ("otlp-interleaved", lambda r=r: run_otlp(mixed, n, tmp, f"mixed{r}")),
            ]
            # each round starts with another way in: a run costs more the later it comes in a round (the
            # process's heap grows), which fixed order charged to interleaved traces every time
            for k, run in runs[r % 3 :] + runs[: r % 3]:
                alone[k].append(run())
            for k, used in run_side_by_side(native, whole, mixed, n, tmp, f"round{r}").items():
                results["side by side"][k].append(used)
    print(
        f"(c) ingest of {n:,} τ² conversations ({spans / n:.0f} messages each), CPU-seconds per 1,000 over "
        f"{rounds} rounds: best, median, and the median of each round's ratio to native; then the medians "
        "of user and system CPU-seconds and of minor page faults per 1,000"
    )
    out: dict[str, float] = {}
    for mode, res in results.items():
        cpu = {k: [u.cpu for u in v] for k, v in res.items()}
        best = {k: min(v) / n * 1000 for k, v in cpu.items()}
        median = {k: statistics.median(v) / n * 1000 for k, v in cpu.items()}

        def split(runs: list[Usage]) -> str:
            user = statistics.median(u.user for u in runs) / n * 1000
            system = statistics.median(u.system for u in runs) / n * 1000
            faults = statistics.median(u.faults for u in runs) / n * 1000
            return f"user {user:5.2f} sys {system:5.2f} faults {faults:8,.0f}"

        print(f"  {mode}:")
        title = f"native POST /v1/conversations (batches of {NATIVE_BATCH})"
        print(f"    {title:<50} {best['native']:6.2f} {median['native']:6.2f}   {'':12}{split(res['native'])}")
        for k, label in (
            ("otlp", f"OTLP, whole traces ({len(whole)} requests)"),
            ("otlp-interleaved", f"OTLP, ~{IN_FLIGHT} traces interleaved ({len(mixed)} requests)"),
        ):
            ratio = statistics.median(o / nat for o, nat in zip(cpu[k], cpu["native"], strict=True))
            print(f"    {label:<50} {best[k]:6.2f} {median[k]:6.2f}   {ratio:.2f}× native  {split(res[k])}")
            out[f"{mode} {k} ratio"] = ratio
    # the peak resident set of the whole process (every Vigil of the run, the requests' bytes included)
    print(f"  peak resident set of the process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")
    return out
