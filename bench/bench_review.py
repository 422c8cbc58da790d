"""Review stage figures: (a) what the flagger adds to storing a batch, (b) claim + label throughput with
concurrent reviewers (and a check that no item is handed out twice), (c) queue listing latency.

    python -m bench.bench_review --n 5000 --reviewers 16     # Postgres on 127.0.0.1:5432 and SQLite
    python -m bench.bench_review --db sqlite
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from vigil.app.runtime import build_runtime
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.review import insights, queue
from vigil.review.stage import ReviewStage
from vigil.schema import Conversation
from vigil.settings import Settings
from vigil.store.models import ReviewItemRow

ROOT = Path(__file__).resolve().parent.parent


def runtime(url: str, review: bool):  # type: ignore[no-untyped-def]
    import vigil.ingest.wiring as ingest_wiring
    import vigil.review.wiring as review_wiring

    rt = build_runtime(Settings(database_url=url, api_keys="a:admin:k"), registry=CollectorRegistry())  # type: ignore[arg-type]
    ingest_wiring.wire(rt)
    if review:
        review_wiring.wire(rt)
    return rt


def conversations(n: int, seed: int) -> list[Conversation]:
    return [Conversation.model_validate(c) for c in Simulator(parse_versions("v1:0.1,v2:0.3"), seed).stream(n)]


def store_rate(url_factory, n: int, batch: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    out = {}
    for review in (False, True, False, True):  # twice each: the first runs warm the caches
        with url_factory() as url:
            rt = runtime(url, review)
            convs = conversations(n, seed=3)
            t0 = time.perf_counter()
            for i in range(0, n, batch):
                rt.pipeline.process(convs[i : i + batch], "bench")
            out["with flagger" if review else "without"] = n / (time.perf_counter() - t0)
            rt.close()
    return out


def claim_label(url_factory, n: int, reviewers: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    with url_factory() as url:
        rt = runtime(url, True)
        for i in range(0, n, 500):
            rt.pipeline.process(conversations(n, seed=5)[i : i + 500], "bench")
        policy = rt.get(ReviewStage).policy
        with rt.sessions() as s:
            items = insights.list_queue(s, queue.QueueFilter(), "available", 1)["counts"]["available"]
            expected = s.scalar(select(func.sum(ReviewItemRow.required_reviews)))
        latencies: list[float] = []
        got: list[tuple[str, str]] = []
        lock = threading.Lock()
        barrier = threading.Barrier(reviewers)

        def work(i: int) -> None:
            barrier.wait()
            while True:
                t0 = time.perf_counter()
                with rt.sessions.begin() as s:
                    cid = queue.claim_next(s, f"r{i}", 600)
                dt = time.perf_counter() - t0
                if cid is None:
                    return
                with rt.sessions.begin() as s:
                    queue.label(s, cid, f"r{i}", queue.LabelIn("not_a_failure"), policy)
                with lock:
                    latencies.append(dt)
                    got.append((cid, f"r{i}"))

        t0 = time.perf_counter()
        threads = [threading.Thread(target=work, args=(i,)) for i in range(reviewers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        dupes = sum(c - 1 for c in Counter(got).values() if c > 1)
        with rt.sessions() as s:
            t1 = time.perf_counter()
            for _ in range(20):
                insights.list_queue(s, queue.QueueFilter(), "done", 50)
            list_ms = (time.perf_counter() - t1) / 20 * 1000
        rt.close()
    lat = sorted(latencies)
    return {
        "items": items,
        "labels due": expected,
        "labelled": len(got),
        "same reviewer twice": dupes,
        "claim+label/s": len(got) / wall,
        "claim p50 ms": 1000 * statistics.median(lat),
        "claim p95 ms": 1000 * lat[int(0.95 * (len(lat) - 1))],
        "queue list ms": list_ms,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--reviewers", type=int, default=16)
    ap.add_argument("--db", choices=["both", "sqlite", "postgres"], default="both")
    a = ap.parse_args()
    import contextlib

    @contextlib.contextmanager
    def sqlite():  # type: ignore[no-untyped-def]
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/bench.db"

    from tests.support.services import postgres_database

    dbs = {"sqlite": sqlite, "postgres": postgres_database}
    for name in ("sqlite", "postgres") if a.db == "both" else (a.db,):
        rates = store_rate(dbs[name], a.n, a.batch)
        print(
            f"[{name}] store {a.n} conversations in batches of {a.batch}: "
            + ", ".join(f"{k} {v:,.0f}/s" for k, v in rates.items())
            + f" (flagger adds {1000 / rates['with flagger'] - 1000 / rates['without']:.3f} ms/conversation)"
        )
        r = claim_label(dbs[name], a.n, a.reviewers)
        print(
            f"[{name}] {a.reviewers} reviewers: "
            + ", ".join(f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items())
        )


if __name__ == "__main__":
    main()
