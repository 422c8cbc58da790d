"""The review queue's reads while a large retention pass runs, in a thread of the same process as ``serve``
runs it (or in a process of its own with ``--separate``), and right after it: is a read slower because of
the deletes (planner statistics, dead tuples, locks), or because of the run beside it?

Bulk-loads N conversations with ``bench.bench_reads`` (a review item per 25, every one open and unlabelled:
a queue nobody reviews), then runs retention with every window at 15 days (half of the 30 loaded days) and
times ``/v1/review/queue`` and ``/ui/queue`` one after the other: before, during and right after the run,
and samples ``pg_stat_activity`` for what the database's sessions wait on meanwhile.

    python -m bench.bench_retention_reads --conversations 300000   # Postgres on 127.0.0.1:5432, database dropped
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter

import psycopg
from prometheus_client import CollectorRegistry

from bench.bench_reads import KEY, _plain, create_database, load, vacuum
from vigil.settings import Settings
from vigil.store import db, retention

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/vigil_bench_retention_reads"
WINDOWS = ("conversations", "open_review", "findings", "verdicts", "unjoined_outcomes")
PAGES = ("/v1/review/queue", "/ui/queue")


def settings_for(url: str) -> Settings:
    windows = {f"retention_{w}_days": 15.0 for w in WINDOWS}
    return Settings(database_url=url, api_keys=f"bench:admin:{KEY}", metrics_port=0, otlp_grpc_port=0, **windows)  # type: ignore[arg-type]


def seed(url: str, n: int) -> None:
    create_database(url)
    db.upgrade(url)
    load(url, n)
    with psycopg.connect(_plain(url)) as conn:  # nobody reviews: every item open, no labels
        conn.execute("UPDATE review_items SET status = 'open', review_count = 0")
        conn.execute("DELETE FROM review_labels")
        conn.commit()
    vacuum(url)


def sample_waits(url: str, stop: threading.Event, into: Counter[str]) -> None:
    name = _plain(url).rsplit("/", 1)[1]
    with psycopg.connect(_plain(url), autocommit=True) as conn:
        while not stop.is_set():
            rows = conn.execute(
                "SELECT wait_event_type || ':' || wait_event FROM pg_stat_activity WHERE datname = %s "
                "AND state = 'active' AND wait_event_type IS NOT NULL AND pid <> pg_backend_pid()",
                (name,),
            ).fetchall()
            into.update(r[0] for r in rows)
            stop.wait(0.05)


def time_pages(c, label: str, seconds: float = 0.0, until: threading.Thread | None = None) -> None:  # type: ignore[no-untyped-def]
    took: dict[str, list[float]] = {p: [] for p in PAGES}
    end = time.monotonic() + seconds
    while (until is not None and until.is_alive()) or (until is None and time.monotonic() < end):
        for path in PAGES:
            t0 = time.perf_counter()
            assert c.get(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
            took[path].append((time.perf_counter() - t0) * 1000)
    for path, ms in took.items():
        if ms:
            print(
                f"  {label:18} {path:18} {len(ms):4} reads,"
                f" p50 {statistics.median(ms):6,.0f} ms, max {max(ms):6,.0f} ms"
            )


def main() -> None:
    from fastapi.testclient import TestClient

    from vigil.app.runtime import build_runtime
    from vigil.app.server import build_app
    from vigil.app.wiring import wire

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=300_000)
    ap.add_argument(
        "--url", default=os.environ.get("VIGIL_BENCH_URL", DEFAULT_URL), help="Postgres database (dropped!)"
    )
    ap.add_argument("--separate", action="store_true", help="run retention in a process of its own")
    args = ap.parse_args()
    seed(args.url, args.conversations)
    settings = settings_for(args.url)
    rt = build_runtime(settings, registry=CollectorRegistry(), migrate=False)
    wire(rt, {"api"})
    waits: Counter[str] = Counter()
    with TestClient(build_app(rt, [])) as c:
        token = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/login").text)
        assert token, "no login form"
        c.post("/ui/login", data={"csrf": token.group(1), "api_key": KEY})
        time_pages(c, "before", seconds=8)
        stop = threading.Event()
        sampler = threading.Thread(target=sample_waits, args=(args.url, stop, waits))
        sampler.start()
        t0 = time.perf_counter()
        if args.separate:
            code = f"from bench.bench_retention_reads import alone; alone({args.url!r})"
            proc = subprocess.Popen([sys.executable, "-c", code])
            worker = threading.Thread(target=proc.wait)
        else:
            worker = threading.Thread(target=lambda: print("  ", retention.run(rt.sessions, settings).deleted))
        worker.start()
        time_pages(c, "during retention", until=worker)
        worker.join()
        print(f"  retention ran {time.perf_counter() - t0:,.1f} s ({'own process' if args.separate else 'a thread'})")
        stop.set()
        sampler.join()
        time_pages(c, "right after", seconds=8)
    rt.close()
    print("  waits sampled during the run:", dict(waits.most_common(6)))


def alone(url: str) -> None:
    settings = settings_for(url)
    engine = db.make_engine(url)
    print("  ", retention.run(db.make_sessionmaker(engine), settings).deleted, flush=True)
    engine.dispose()


if __name__ == "__main__":
    main()
