"""What rolls over and what grows: rows per table per 1M conversations, stored and left after retention.

Stores N simulated conversations through the real write path (rules, flagger, judge sampler, the offline
judge, outcomes: most after their conversation, some before it, some for conversations that never come),
runs a detector pass and the rollup job, counts every table; then runs the retention job as if a year had
passed (every retention's cutoff behind everything stored) and counts again. What is left then grows with
traffic and never rolls over.

    python -m bench.bench_retention --conversations 20000     # Postgres on 127.0.0.1:5432, database dropped

Run it with an older checkout's ``service`` on ``PYTHONPATH`` to see what that one left.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from bench.bench_reads import create_database
from vigil.app.runtime import build_runtime
from vigil.app.wiring import metadata, wire
from vigil.detector.wiring import build_detector
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.judge.stage import JudgeStage
from vigil.judge.worker import JudgeWorker
from vigil.outcomes.ingest import OutcomeStore
from vigil.schema import Conversation
from vigil.settings import PROJECT_ROOT, Settings
from vigil.store import retention, rollup_job

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/vigil_bench_retention"
BATCH = 500
EARLY = 0.10  # share of conversations whose outcomes arrive before them
NEVER = 0.01  # outcomes for conversations that never come, per conversation stored


def counts(rt) -> dict[str, tuple[int, int | None]]:  # type: ignore[no-untyped-def]
    """Rows per table, and of them the rows of conversations nothing keeps (tables with a conversation id)."""
    out: dict[str, tuple[int, int | None]] = {}
    with rt.sessions() as s:
        for t in sorted(metadata().sorted_tables, key=lambda t: t.name):
            rows = int(s.scalar(select(func.count()).select_from(t)) or 0)
            cid = t.c.get("conversation_id")
            loose = None
            if cid is not None:
                kept = retention.kept_where(lambda col, cid=cid: col == cid)
                loose = int(s.scalar(select(func.count()).select_from(t).where(~kept)) or 0)
            out[t.name] = (rows, loose)
    return out


def load(rt, n: int, seed: int) -> None:  # type: ignore[no-untyped-def]
    sim = Simulator(parse_versions("v1:0.05,v2:0.10"), seed)
    outcomes = rt.get(OutcomeStore)
    rng = random.Random(seed)
    stream = sim.stream(n, datetime.now(UTC) - timedelta(hours=6))
    done = 0
    while done < n:
        convs = [next(stream) for _ in range(min(BATCH, n - done))]
        early, late = [], []
        for c in convs:
            (early if rng.random() < EARLY else late).extend(sim.outcomes_for(c))
        never = [
            {"conversation_id": f"never-{seed}-{done}-{i}", "type": "escalation"}
            for i in range(int(len(convs) * NEVER))
        ]
        outcomes.ingest(early + never, "api")
        rt.pipeline.process([Conversation.model_validate(c) for c in convs], "bench")
        outcomes.ingest(late, "api")
        done += len(convs)
    stage = rt.get(JudgeStage)
    asyncio.run(JudgeWorker(stage.engine, rt.hooks.verdict_listeners).run_until_idle(timeout=1800))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=20_000)
    ap.add_argument(
        "--url", default=os.environ.get("VIGIL_BENCH_URL", DEFAULT_URL), help="Postgres database (dropped!)"
    )
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    create_database(args.url)
    settings = Settings(  # type: ignore[call-arg]
        database_url=args.url,
        rule_packs=str(PROJECT_ROOT / "rules" / "default.yaml"),
        metrics_port=0,
        otlp_grpc_port=0,
        api_keys="bench:admin:bench-key",
        detector_settle_seconds=0.0,
    )
    rt = build_runtime(settings, registry=CollectorRegistry())
    wire(rt, {"api"})
    t0 = time.perf_counter()
    load(rt, args.conversations, args.seed)
    build_detector(rt).tick()
    rollup_job.refresh(rt.sessions, lag_seconds=0)
    print(f"stored {args.conversations:,} conversations in {time.perf_counter() - t0:,.0f} s")
    stored = counts(rt)
    later = datetime.now(UTC) + timedelta(days=365)
    t0 = time.perf_counter()
    result = retention.run(rt.sessions, settings, now=later)
    print(f"retention a year later: {result.deleted} in {time.perf_counter() - t0:,.1f} s")
    left = counts(rt)
    rt.close()
    scale = 1_000_000 / args.conversations
    print(
        "\n| table | rows per 1M conversations | left a year later | of them, of conversations nothing keeps |"
        "\n|---|---|---|---|"
    )
    for name, (rows, _) in stored.items():
        after, loose = left[name]
        if rows or after:
            of_none = "" if loose is None else f"{loose * scale:,.0f}"
            print(f"| {name} | {rows * scale:,.0f} | {after * scale:,.0f} | {of_none} |")


if __name__ == "__main__":
    main()
