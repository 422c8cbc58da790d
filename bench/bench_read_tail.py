"""What compare's counts cost while traffic is written: the rollup catch-up a read used to run, against the
bounded tail a read counts now (on a database loaded by ``bench.bench_reads``).

    python -m bench.bench_read_tail --writes 100 --gap 3            # the tail (reads never run the job)
    python -m bench.bench_read_tail --writes 100 --gap 3 --catch-up # the catch-up each read used to run

A thread stores conversations at ``--writes`` a second and the rollup job runs every
``rollup_interval_seconds`` beside it (serve's upkeep; a read that finds a tail wakes it, as compare's
reads do); every ``--gap`` seconds the canary's two versions
are counted as compare counts them (their signals and pass^k tasks). Prints p50/p95 in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

from prometheus_client import CollectorRegistry

from bench.bench_reads import DEFAULT_URL, write_traffic
from vigil.settings import Settings
from vigil.store import rollups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=os.environ.get("VIGIL_BENCH_URL", DEFAULT_URL))
    ap.add_argument("--writes", type=float, default=100.0, help="conversations stored per second")
    ap.add_argument("--gap", type=float, default=3.0, help="seconds between reads")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--catch-up", action="store_true", help="run the rollup catch-up in the read, as before")
    args = ap.parse_args()

    from vigil.app.runtime import build_runtime
    from vigil.store.maintenance import Maintenance, refresh_rollups

    settings = Settings(database_url=args.url, metrics_port=0, otlp_grpc_port=0)  # type: ignore[call-arg]
    rt = build_runtime(settings, registry=CollectorRegistry(), migrate=False)
    stop = threading.Event()
    writer = threading.Thread(target=write_traffic, args=(args.url, args.writes, stop), daemon=True)
    writer.start()
    job = Maintenance(settings, rt.sessions)
    upkeep = job.thread(stop)
    took, tails = [], []
    for _ in range(args.repeat + 1):
        stop.wait(args.gap)
        t0 = time.perf_counter()
        if args.catch_up:
            refresh_rollups(settings, rt.sessions, only_if_behind=True)
        with rt.sessions() as s:
            if not args.catch_up:
                from vigil.store import rollup_tail

                tails.append(rollup_tail.attach(s, settings.rollup_read_tail_rows).rows)
                if tails[-1]:
                    job.wake()  # as compare's reads do where the job runs in-process
            for version in ("v3", "v4"):
                rollups.version_counts(s, "support-bot", version)
                rollups.task_counts(s, "support-bot", version, min_trials=1)
        took.append((time.perf_counter() - t0) * 1000)
    stop.set()
    writer.join()
    upkeep.join()
    rt.close()
    took = took[1:]
    how = "catch-up in the read" if args.catch_up else "bounded tail"
    p95 = statistics.quantiles(took, n=20)[-1]
    print(f"{how}: p50 {statistics.median(took):,.0f} ms p95 {p95:,.0f} ms over {len(took)} reads")
    if tails:
        print(f"tail rows per read: median {statistics.median(tails):,.0f}, most {max(tails):,}")


if __name__ == "__main__":
    main()
