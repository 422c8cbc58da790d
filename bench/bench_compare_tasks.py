"""How long the compare table's per-task rows and protocol take, beside the whole comparison.

    python -m bench.bench_compare_tasks [--per-version 10000] [--postgres]
    python -m bench.bench_compare_tasks --pass-k-only   # the pass@k / pass^k table of heavily run tasks

Stores simulated traffic for two versions (task ids repeat, every conversation has a task_success
outcome), then times ``load_tasks`` (the per-task and metadata reads, both sides) and the full
``run_compare``. Prints figures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry

from vigil.app.runtime import build_runtime
from vigil.compare.api import run_compare
from vigil.compare.tasks import load_tasks
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.schema import Conversation
from vigil.store.maintenance import refresh_rollups


@contextlib.contextmanager
def database(postgres: bool) -> Iterator[str]:
    if postgres:
        from tests.support.services import postgres_database

        with postgres_database() as url:
            yield url
    else:
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/bench.db"


def pass_k_table_cost() -> None:
    """CPU of one side's pass@k / pass^k table: 100 tasks of 20k-40k trials each (a month of a busy task
    set), where exact binomial integers have thousands of digits."""
    import random

    from vigil.compare.stats import pass_k_table

    rng = random.Random(1)
    tasks = {f"t{i}": (n, rng.randint(0, n)) for i in range(100) for n in [rng.randint(20_000, 40_000)]}
    t0 = time.process_time()
    out = pass_k_table(tasks, per_task=False)
    print(f"pass@k / pass^k table, 100 tasks of 20k-40k trials, ks {out['ks']}: {time.process_time() - t0:.3f} s CPU")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-version", type=int, default=10_000)
    ap.add_argument("--postgres", action="store_true")
    ap.add_argument("--pass-k-only", action="store_true", help="Only time the pass@k table of heavily run tasks.")
    args = ap.parse_args()
    pass_k_table_cost()
    if args.pass_k_only:
        return
    from tests.support.app import INGEST, make_client, make_settings

    with database(args.postgres) as url:
        rt = build_runtime(make_settings(url, compare_bootstrap_resamples=200), registry=CollectorRegistry())
        sim = Simulator(parse_versions("v1.4.0:0.05,v1.5.0:0.2"), 5)
        t0 = time.perf_counter()
        left = 2 * args.per_version
        with make_client(rt) as client:
            while left:
                batch = list(sim.stream(min(1000, left)))
                left -= len(batch)
                rt.pipeline.process([Conversation.model_validate(c) for c in batch], "bench")
                outcomes = [o for c in batch for o in sim.outcomes_for(c) if o["type"] == "task_success"]
                client.post("/v1/outcomes", json=outcomes, headers=INGEST).raise_for_status()
        print(f"stored {2 * args.per_version} conversations in {time.perf_counter() - t0:.1f} s")
        s = rt.settings
        refresh_rollups(rt.settings, rt.sessions)  # the task rollups, as the job brings them up to date
        for _ in range(2):
            t0 = time.perf_counter()
            with rt.sessions() as session:
                for v in ("v1.4.0", "v1.5.0"):
                    d = load_tasks(session, "support-bot", v, s.compare_metadata_sample)
            tasks_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            result = run_compare(rt, "v1.4.0", "v1.5.0")
            total_s = time.perf_counter() - t0
            print(
                f"per-task and metadata reads (both sides): {tasks_s * 1000:.0f} ms; whole compare: "
                f"{total_s * 1000:.0f} ms; {len(d.tasks)} tasks, ks {result['tasks']['ks']}"
            )
        rt.close()


if __name__ == "__main__":
    main()
