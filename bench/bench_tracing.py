"""What Vigil's own tracing costs: nothing measurable when off, a little when on.

(a) one ``span()`` call when tracing is off, in nanoseconds, against a bare ``nullcontext``;
(b) the pipeline (decode, rules, store on SQLite, downstream stages) with tracing off and on
    (spans batched to an in-memory exporter), rounds interleaved, best of each; the share of a
    batch's time the off-path span calls take follows from (a).
(c) what an agent's traces cost to ingest: the same real conversations (the τ² trajectories, repeated
    with fresh ids) sent as OTLP spans to ``POST /v1/traces`` (one chat span per model turn carrying
    the history so far, as instrumentations send them, under one root span) against native ingest at
    ``POST /v1/conversations``, in CPU-seconds per 1,000 conversations measured in the same run; the
    OTLP variants are whole traces per request, and about 100 traces interleaved (a busy agent fleet
    behind one exporter). Requests are 512 spans, the SDK's batch size. Each round measures the three
    one after the other (each alone in a freshly collected heap; which goes first rotates by round) and
    side by side (requests in turn, so load changes hit all three alike); ``--rounds`` is the number of
    rounds with ``--only otlp``.

    python -m bench.bench_tracing [--conversations 4000] [--batch 200] [--only otlp] [--copies 17]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

import orjson
from prometheus_client import CollectorRegistry

from vigil import observability as spans
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.pipeline import Envelope
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.settings import Settings

ROOT = Path(__file__).resolve().parent.parent

SPANS_PER_BATCH = ("vigil.batch", "vigil.decode_rules", "vigil.store", "stage 1", "stage 2", "stage 3")


def per_call_ns() -> tuple[float, float]:
    n = 1_000_000
    off = (
        min(
            timeit.repeat(
                lambda: spans.span("vigil.batch", **{"vigil.source": "kafka"}).__enter__(), number=n, repeat=5
            )
        )
        / n
        * 1e9
    )
    floor = min(timeit.repeat(lambda: contextlib.nullcontext().__enter__(), number=n, repeat=5)) / n * 1e9
    return off, floor


def run_pipeline(raws: list[bytes], batch: int, rounds: int, tmp: Path, label: str) -> float:
    """Best conversations/s over ``rounds`` fresh databases."""
    rates = []
    for i in range(rounds):
        settings = Settings(database_url=f"sqlite:///{tmp / f'{label}-{i}.db'}", metrics_port=0)  # type: ignore[arg-type]
        rt = wire(build_runtime(settings, registry=CollectorRegistry()), {"replay"})
        envs = [Envelope(r, "kafka", "conversations", 0, j) for j, r in enumerate(raws)]
        t0 = time.perf_counter()
        for k in range(0, len(envs), batch):
            rt.pipeline.process_raw(envs[k : k + batch])
        rates.append(len(raws) / (time.perf_counter() - t0))
        rt.close()
    return max(rates)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=4000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=["spans", "otlp"], help="run (a)+(b) or (c) only")
    ap.add_argument("--copies", type=int, default=17, help="(c): copies of the 120 τ² conversations")
    args = ap.parse_args()
    if args.only != "spans":
        from bench.bench_otlp import compare_otlp_native

        compare_otlp_native(args.copies, args.rounds if args.only == "otlp" else max(1, args.rounds // 2))
        if args.only == "otlp":
            return 0
    spans.shutdown()
    off_ns, floor_ns = per_call_ns()
    print(f"(a) span() with tracing off: {off_ns:.0f} ns per call (a bare nullcontext: {floor_ns:.0f} ns)")

    sim = Simulator(parse_versions("v1:0.05,v2:0.15"), 3)
    raws = [orjson.dumps(c) for c in sim.stream(args.conversations)]
    results: dict[str, list[float]] = {"off": [], "on": []}
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    with tempfile.TemporaryDirectory() as tmp:
        # interleave the variants so drift in machine load hits each alike
        for r in range(args.rounds):
            spans.shutdown()
            results["off"].append(run_pipeline(raws, args.batch, 1, Path(tmp), f"off{r}"))
            spans.configure(Settings(), exporter=InMemorySpanExporter())
            results["on"].append(run_pipeline(raws, args.batch, 1, Path(tmp), f"on{r}"))
            spans.shutdown()
    best = {k: max(v) for k, v in results.items()}
    spread = {k: (statistics.pstdev(v) / statistics.mean(v) * 100) for k, v in results.items()}
    calls = len(SPANS_PER_BATCH)
    batch_ms = args.batch / best["off"] * 1000
    print(f"(b) pipeline, {args.conversations:,} conversations in batches of {args.batch}, best of {args.rounds}:")
    for k, label in (("off", "tracing off (default)"), ("on", "tracing on, in-memory export")):
        print(f"    {label:<30} {best[k]:>8,.0f} conversations/s  (run-to-run spread {spread[k]:.1f}%)")
    share = calls * off_ns / 1e6 / batch_ms * 100
    print(
        f"    off: {calls} span calls per {batch_ms:.0f} ms batch = {share:.5f}% of its time; "
        f"on costs {(best['off'] - best['on']) / best['off'] * 100:+.1f}% throughput"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
