"""Judge worker memory over a long steady feed: does it level off, and where does it grow?

The worker runs in this process as ``vigil judge-worker`` runs it (its runtime built, the heap settled,
the offline judge, its loop with housekeeping every 2 s). A child process feeds conversations into the
same database through the ingest pipeline at ``--rate`` a second (simulated, and a quarter real τ²
conversations under new ids), with every judge's sample rate raised to 1 so each one is judged. Every
``--every`` seconds it prints the verdicts stored, RSS, what the C allocator has handed out ("malloc")
and holds free ("free", glibc's ``mallinfo2``, every arena), the objects the collector tracks, threads,
and the sizes of the worker's own collections and caches (tasks, outbox, probes, SQLAlchemy's compiled
statements, metric series, live ``Conversation`` objects). At the end: the figures since the first
sample after ``--warmup``, and RSS before and after ``malloc_trim(0)``. With ``--trace``, tracemalloc
also reports the Python heap and the allocations that grew the most since that sample, by traceback
(it slows the worker several times over).

    python -m bench.bench_judge_memory --minutes 16 --db postgres            # RSS, malloc, sizes
    python -m bench.bench_judge_memory --minutes 10 --db postgres --trace    # and the Python heap
    MALLOC_ARENA_MAX=2 python -m bench.bench_judge_memory --db postgres     # fewer glibc arenas
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.bench_judge import database
from bench.bench_pipeline import rss_mb

ROOT = Path(__file__).resolve().parent.parent


def judges_every_conversation(target: Path) -> Path:
    """The shipped judges, sampling every conversation."""
    shutil.copytree(ROOT / "judges", target)
    for f in target.glob("*/judge.yaml"):
        f.write_text(re.sub(r"(?m)^(\s+rate:) [0-9.]+", r"\1 1.0", f.read_text()))
    return target


def settings(url: str, judges: Path) -> Any:
    from vigil.settings import Settings

    return Settings(  # type: ignore[call-arg]
        database_url=url,
        api_keys="a:admin:k",
        metrics_port=0,
        judges_dir=str(judges),
        judge_mode="offline",
        rule_packs=str(ROOT / "rules" / "default.yaml"),
        log_level="WARNING",
    )


# --- the feed (a child process) ---------------------------------------------------------------------


def feed(url: str, judges: Path, rate: float) -> None:
    import orjson

    from bench.soak import tau2
    from vigil.app.runtime import build_runtime
    from vigil.app.wiring import wire
    from vigil.ingest.simulate import Simulator, parse_versions
    from vigil.schema import Conversation

    rt = wire(build_runtime(settings(url, judges), roles=("consume",)))
    sim = Simulator(parse_versions("v1.4.0:0.04,v1.5.0:0.12"), 11)
    tau = tau2()
    n = itertools.count()
    batch = 10
    nxt = time.monotonic()
    while True:
        convs = []
        for _ in range(batch):
            i = next(n)
            if i % 4 == 0:
                c = dict(tau[i // 4 % len(tau)])
                c["conversation_id"] = f"{c['conversation_id']}:mem{i}"
                now = datetime.now(UTC)
                c["started_at"], c["ended_at"] = (now - timedelta(seconds=60)).isoformat(), now.isoformat()
                c["metadata"] = {**(c.get("metadata") or {}), "simulated_defect": None}
            else:
                c = sim.conversation(sim.profiles[i % len(sim.profiles)], datetime.now(UTC))
            convs.append(Conversation.model_validate(orjson.loads(orjson.dumps(c))))
        rt.pipeline.process(convs, "bench")
        nxt += batch / rate
        time.sleep(max(0.0, nxt - time.monotonic()))


# --- the worker (this process) ----------------------------------------------------------------------


_MALLINFO2 = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2]  # noqa: RUF012 (ctypes' own declaration)


def malloc_mb() -> tuple[float, float]:
    """What the C allocator has handed out and still holds free (MB, every arena), from glibc's mallinfo2."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return (0.0, 0.0)
    fn.restype = _MallInfo2
    m = fn()
    return ((m.uordblks + m.hblkhd) / 2**20, m.fordblks / 2**20)


def malloc_trim() -> bool:
    """Hand the C allocator's free memory back to the system (glibc); False where there is no such call."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def sizes(worker: Any, rt: Any) -> dict[str, int]:
    """The worker's own collections and the caches a leak would most likely sit in."""
    from vigil.judge.stage import JudgeStage
    from vigil.schema import Conversation

    eng = rt.get(JudgeStage).engine
    out = {
        "tasks": len(worker._tasks),
        "outbox": len(worker._outbox),
        "probes": len(worker._probes),
        "sql_cache": len(rt.engine._compiled_cache) if getattr(rt.engine, "_compiled_cache", None) else 0,
        "series": sum(len(m.samples) for fam in rt.metrics.registry.collect() for m in [fam]),
        "conversations": sum(1 for o in gc.get_objects() if isinstance(o, Conversation)),
    }
    for name, value in vars(eng).items():
        if isinstance(value, dict | list | set):
            out[f"engine.{name}"] = len(value)
    return out


def top_growth(first: tracemalloc.Snapshot, last: tracemalloc.Snapshot, n: int) -> list[str]:
    flt = [tracemalloc.Filter(False, tracemalloc.__file__)]
    diff = last.filter_traces(flt).compare_to(first.filter_traces(flt), "traceback")
    out = []
    for stat in sorted((d for d in diff if d.size_diff > 0), key=lambda d: -d.size_diff)[:n]:
        frames = [f for f in stat.traceback.format(limit=6, most_recent_first=True) if f.startswith("  File")]
        where = " <- ".join(
            f.strip().replace(str(ROOT) + "/", "").replace(sys.prefix + "/", "")[5:] for f in frames[:4]
        )
        out.append(f"{stat.size_diff / 1024:+9.1f} kB {stat.count_diff:+7d} blocks  {where}")
    return out


def run(url: str, minutes: float, rate: float, every: float, warmup: float, top: int, trace: bool) -> None:
    from prometheus_client import CollectorRegistry

    from vigil.app.runtime import build_runtime, settle_heap
    from vigil.app.wiring import wire
    from vigil.judge.stage import JudgeStage

    work = Path(tempfile.mkdtemp(prefix="vigil-judge-mem-"))
    judges = judges_every_conversation(work / "judges")
    s = settings(url, judges)
    from vigil.store import db

    db.upgrade(url)
    rt = wire(build_runtime(s, registry=CollectorRegistry(), migrate=False, roles=("judge-worker",)))
    settle_heap(long_running=True)
    worker = rt.get(JudgeStage).worker
    assert worker is not None
    feeder = subprocess.Popen(
        [sys.executable, "-m", "bench.bench_judge_memory", "--feed", url, str(judges), str(rate)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "service"), str(ROOT)])},
    )
    if trace:
        tracemalloc.start(25)

    async def main() -> None:
        await worker.start()
        t0 = time.monotonic()
        base: tracemalloc.Snapshot | None = None
        base_row: tuple[int, float, float, int] | None = None
        base_malloc = 0.0
        print(
            f"{'min':>5} {'verdicts':>8} {'RSS MB':>7} {'heap MB':>7} {'malloc':>7} {'free':>6} {'gc objs':>8} "
            f"{'thr':>3}  sizes",
            flush=True,
        )
        while time.monotonic() - t0 < minutes * 60:
            await asyncio.sleep(every)
            elapsed = time.monotonic() - t0
            if feeder.poll() is not None:
                raise RuntimeError("the feed stopped")
            if trace:  # the heap's live objects only (the worker's own runs collect as they go)
                gc.collect()
            heap = tracemalloc.get_traced_memory()[0] / 2**20
            objs = len(gc.get_objects())
            row = (worker.judged, rss_mb(), heap, objs)
            used, free = malloc_mb()
            shown = f"{heap:7.2f}" if trace else "      -"
            print(
                f"{elapsed / 60:5.1f} {row[0]:8d} {row[1]:7.1f} {shown} {used:7.1f} {free:6.1f} {row[3]:8d} "
                f"{threads():3d}  {sizes(worker, rt)}",
                flush=True,
            )
            if base_row is None and elapsed >= warmup * 60:
                base_row, base_malloc = row, used
                base = tracemalloc.take_snapshot() if trace else None
        await worker.stop()
        if base_row is not None:
            gc.collect()
            heap = tracemalloc.get_traced_memory()[0] / 2**20
            judged = worker.judged - base_row[0]
            print(
                f"\nafter warm-up: {judged} verdicts, RSS {base_row[1]:.1f} -> {rss_mb():.1f} MB, "
                f"malloc in use {base_malloc:.1f} -> {malloc_mb()[0]:.1f} MB, "
                + (
                    f"traced heap {base_row[2]:.2f} -> {heap:.2f} MB "
                    f"({(heap - base_row[2]) * 2**20 / max(1, judged):.0f} bytes a verdict), "
                    if trace
                    else ""
                )
                + f"gc objects {base_row[3]} -> {len(gc.get_objects())}"
            )
            before = rss_mb()
            if malloc_trim():
                print(f"malloc_trim(0): RSS {before:.1f} -> {rss_mb():.1f} MB (memory the allocator held free)")
            if base is not None:
                print(f"largest growth by traceback (top {top}):")
                for line in top_growth(base, tracemalloc.take_snapshot(), top):
                    print("  " + line)

    try:
        asyncio.run(main())
    finally:
        feeder.kill()
        feeder.wait()
        tracemalloc.stop()
        rt.close()
        shutil.rmtree(work, ignore_errors=True)


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=20.0, help="conversations fed a second")
    p.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=2.0, help="minutes before the baseline snapshot")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--trace", action="store_true", help="tracemalloc: the Python heap and its growth by traceback")
    p.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--feed", nargs=3, metavar=("URL", "JUDGES", "RATE"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.feed:
        feed(a.feed[0], Path(a.feed[1]), float(a.feed[2]))
        return
    with database(a.db) as url:
        run(url, a.minutes, a.rate, a.every, a.warmup, a.top, a.trace)


if __name__ == "__main__":
    cli()
