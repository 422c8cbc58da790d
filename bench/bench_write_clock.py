"""What stamping the write path on the database's clock costs: one read of it per batch's transaction.

    python -m bench.bench_write_clock [--batches 12] [--size 1000]

needs Postgres on 127.0.0.1:5432. Stores batches of new simulated conversations (checked by the rules
beforehand, outside the timing) through the pipeline's store transaction (conversations, findings,
outcomes, and every downstream stage), alternating two variants batch by batch so that drift in the
machine's load hits both alike: as shipped (``received_at`` and the rest stamped by one read of
Postgres' ``now()`` per transaction) and with that read replaced by the host's clock (what Vigil did
before). Prints the median wall and CPU milliseconds per batch of each, and the clock read alone.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=12, help="batches per variant")
    ap.add_argument("--size", type=int, default=1000, help="conversations per batch")
    args = ap.parse_args()

    from tests.support.services import postgres_database
    from vigil.app.runtime import build_runtime
    from vigil.ingest.simulate import Simulator, parse_versions
    from vigil.schema import Conversation
    from vigil.settings import Settings
    from vigil.store import db as vigil_db

    shipped = vigil_db.clock  # what write_clock reads, once per transaction

    def host(_session: Any) -> datetime:
        return datetime.now(UTC)

    with postgres_database() as url:
        vigil_db.upgrade(url)
        rt = build_runtime(
            Settings(database_url=url, metrics_port=0, otlp_grpc_port=0),  # type: ignore[arg-type]
            registry=CollectorRegistry(),
        )
        try:
            sim = Simulator(parse_versions("v1:0.05,v2:0.15"), 11)
            timings: dict[str, list[tuple[float, float]]] = {"database clock": [], "host clock": []}
            for k in range(2 * args.batches + 2):  # the first two warm up
                variant = "database clock" if k % 2 == 0 else "host clock"
                convs = [Conversation.model_validate(c) for c in sim.stream(args.size)]
                checked = [rt.pipeline.check(c) for c in convs]
                vigil_db.clock = shipped if variant == "database clock" else host  # type: ignore[assignment]
                w0, c0 = time.perf_counter(), time.process_time()
                result = rt.pipeline.store(checked, [], "bench")
                w1, c1 = time.perf_counter(), time.process_time()
                assert len(result.stored) == args.size
                if k >= 2:
                    timings[variant].append(((w1 - w0) * 1000, (c1 - c0) * 1000))
            vigil_db.clock = shipped
            reads = []
            for _ in range(500):
                with rt.sessions.begin() as s:
                    s.connection()
                    t0 = time.perf_counter()
                    vigil_db.write_clock(s)
                    reads.append((time.perf_counter() - t0) * 1000)
        finally:
            vigil_db.clock = shipped
            rt.close()

    print(f"{args.batches} batches of {args.size} new conversations per variant, alternating")
    print("| variant | wall ms per batch: median (min-max) | CPU ms per batch: median |")
    print("|---|---:|---:|")
    med = {}
    for variant, rows in timings.items():
        walls = [r[0] for r in rows]
        med[variant] = (statistics.median(walls), statistics.median(r[1] for r in rows))
        print(f"| {variant} | {med[variant][0]:.1f} ({min(walls):.1f}-{max(walls):.1f}) | {med[variant][1]:.1f} |")
    read = statistics.median(reads)
    base = med["host clock"][0]
    print(f"one read of the database's clock: median {read:.3f} ms, {100 * read / base:.2f}% of a batch's store")
    print(
        f"difference of the medians: {med['database clock'][0] - base:+.1f} ms wall "
        f"({100 * (med['database clock'][0] - base) / base:+.1f}%), "
        f"{med['database clock'][1] - med['host clock'][1]:+.1f} ms CPU"
    )


if __name__ == "__main__":
    main()
