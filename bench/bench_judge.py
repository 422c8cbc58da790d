"""Judge benchmark: (a) worker throughput against a scripted provider that answers after 500 ms with 64
calls in flight, (b) rule pipeline throughput with judging off, and with the sampler on and the worker
busy judging a full queue in the same process.

    python -m bench.bench_judge                      # SQLite file (the embedded default)
    python -m bench.bench_judge --db postgres        # a fresh database on the local Postgres
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry

from tests.support.judge_fakes import Scripted, judge_dir
from vigil.app.runtime import build_runtime
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.judge.client import ClientOverride
from vigil.judge.stage import JudgeStage
from vigil.judge.wiring import wire
from vigil.runtime import Runtime
from vigil.schema import Conversation
from vigil.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def database(kind: str) -> Iterator[str]:
    if kind == "postgres":
        from tests.support.services import postgres_database

        with postgres_database() as url:
            yield url
    else:
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/bench.db"


def make_runtime(url: str, judges: Path | None, client: Scripted | None, concurrency: int = 64) -> Runtime:
    s = Settings(  # type: ignore[call-arg]
        database_url=url,
        api_keys="a:admin:k",
        metrics_port=0,
        judge_enabled=judges is not None,
        judges_dir=str(judges or ROOT / "judges"),
        judge_mode="live",
        judge_concurrency=concurrency,
    )
    rt = build_runtime(s, registry=CollectorRegistry())
    rt.roles = frozenset({"judge-worker"})
    rt.provide(ClientOverride(client))
    wire(rt)
    return rt


def conversations(n: int, seed: int) -> list[Conversation]:
    return [Conversation.model_validate(c) for c in Simulator(parse_versions("v1:0.05,v2:0.15"), seed).stream(n)]


def bench_worker(url: str, jdir: Path, n: int, delay: float) -> float:
    client = Scripted(delay=delay)
    rt = make_runtime(url, jdir / "all", client)
    for i in range(0, n, 500):
        rt.pipeline.process(conversations(min(500, n - i), seed=100 + i), "bench")
    stage = rt.get(JudgeStage)
    t0 = time.perf_counter()
    judged = asyncio.run(stage.worker.run_until_idle(timeout=600))
    took = time.perf_counter() - t0
    print(
        f"(a) judge worker: {judged} judgements in {took:.1f} s = {judged / took:,.1f} judgements/s "
        f"(provider latency {delay * 1000:.0f} ms, max in flight {client.max_in_flight}; "
        f"ceiling {64 / delay:.0f}/s)"
    )
    rt.close()
    return judged / took


def pipeline_rate(rt: Runtime, convs: list[Conversation], batch: int) -> tuple[float, float]:
    """Conversations/s (wall clock) and CPU microseconds per conversation of the pipeline's own thread.

    The CPU figure ignores other processes on the machine, so it stays comparable on a busy host."""
    t0, c0 = time.perf_counter(), time.thread_time()
    for i in range(0, len(convs), batch):
        rt.pipeline.process(convs[i : i + batch], "bench")
    return len(convs) / (time.perf_counter() - t0), (time.thread_time() - c0) / len(convs) * 1e6


class InProcessWorker:
    """The judge worker on its own event loop thread, as ``vigil serve`` runs it beside the API."""

    def __init__(self, rt: Runtime) -> None:
        self.worker = rt.get(JudgeStage).worker
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self.worker.start(), self.loop).result()

    def stop(self) -> int:
        asyncio.run_coroutine_threadsafe(self.worker.stop(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        return int(self.worker.judged)


VARIANTS = [
    "judging off",
    "sampler on (2%), worker in another process",
    "sampler on, in-process worker judging the 2% sample",
    "sampler on, in-process worker busy on a 4000 backlog",
]


def bench_pipeline(urls: list[str], jdir: Path, n: int, batch: int, delay: float, rounds: int) -> list[float]:
    """Median conversations/s of the rule pipeline in each of VARIANTS, rounds interleaved."""
    client = Scripted(delay=delay)
    rts = [make_runtime(urls[0], None, None)] + [make_runtime(u, jdir / "sampled", client) for u in urls[1:]]
    backlog = make_runtime(urls[3], jdir / "all", client)
    for i in range(0, 4000, 500):
        backlog.pipeline.process(conversations(500, seed=10_000 + i), "bench")
    workers = [InProcessWorker(rts[2]), InProcessWorker(rts[3])]
    rates: list[list[float]] = [[] for _ in rts]
    cpu: list[list[float]] = [[] for _ in rts]
    for r in range(rounds):  # interleaved in a rotating order: drift and other load hit every variant alike
        for k in [(r + j) % len(rts) for j in range(len(rts))]:
            rate, us = pipeline_rate(rts[k], conversations(n, seed=r * 10 + k + 1), batch)
            rates[k].append(rate)
            cpu[k].append(us)
    judged = [w.stop() for w in workers]
    medians = [statistics.median(x) for x in rates]
    cpus = [statistics.median(x) for x in cpu]
    print(f"(b) rule pipeline, batches of {batch}, median of {rounds} rounds of {n} conversations:")
    for k, (label, rate) in enumerate(zip(VARIANTS, medians, strict=True)):
        extra = f", {judged[k - 2]} judgements during the run" if k >= 2 else ""
        print(
            f"    {label:55s} {rate:7,.0f} conversations/s = {rate / medians[0]:6.1%}; pipeline thread "
            f"{cpus[k]:5.0f} µs CPU/conversation = {cpus[k] / cpus[0]:6.1%}{extra}"
        )
    for rt in (*rts, backlog):
        rt.close()
    return medians


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    ap.add_argument("--n", type=int, default=3000, help="judgements for (a)")
    ap.add_argument("--delay", type=float, default=0.5, help="scripted provider latency, seconds")
    ap.add_argument("--pipeline-n", type=int, default=3000, help="conversations per round for (b)")
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, load {load:.1f}, "
        f"Python {platform.python_version()}, db {args.db}"
    )
    with tempfile.TemporaryDirectory() as d:
        jdir = Path(d)
        unlimited = {"rpm": 1_000_000, "concurrency": 64, "daily_budget_usd": 1000.0}
        judge_dir(jdir / "all", sampling={"rate": 1.0}, limits=unlimited)
        judge_dir(jdir / "sampled", sampling={"rate": 0.02}, limits=unlimited)
        with database(args.db) as url:
            bench_worker(url, jdir, args.n, args.delay)
        with contextlib.ExitStack() as stack:
            urls = [stack.enter_context(database(args.db)) for _ in VARIANTS]
            bench_pipeline(urls, jdir, args.pipeline_n, args.batch, args.delay, args.rounds)


if __name__ == "__main__":
    main()
