"""What the queue search's trigram index (migration 0011) costs the writer and saves the search, on Postgres.

Stores the same conversations into a fresh table with and without ``ix_conversations_document_trgm``
(alternated, best of each) and times a queue search on what was stored, with the index and with it
dropped; prints ratios.

    python -m bench.bench_search_index --n 3000       # needs Postgres on 127.0.0.1:5432
"""

from __future__ import annotations

import argparse
import time
import uuid

import orjson
import psycopg
from prometheus_client import CollectorRegistry

import vigil.review.wiring as review_wiring
from bench.bench_pipeline import simulated, tau2_messages
from vigil.app.runtime import build_runtime
from vigil.review.insights import list_queue
from vigil.review.queue import QueueFilter
from vigil.runtime import Envelope
from vigil.settings import Settings

ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
INDEX = "CREATE INDEX IF NOT EXISTS ix_conversations_document_trgm ON conversations USING gin (document gin_trgm_ops)"


def fresh_ids(raws: list[bytes], tag: str) -> list[Envelope]:
    out = []
    for i, raw in enumerate(raws):
        doc = orjson.loads(raw)
        doc["conversation_id"] = f"{tag}-{i}"
        if i % 100 == 7:  # a rare term, as a reviewer searches for a ticket or an order
            doc.setdefault("metadata", {})["ticket"] = f"TK-{i}-QUARTZ"
        out.append(Envelope(orjson.dumps(doc), "bench", key=doc["conversation_id"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    raws = (tau2_messages() + simulated(args.n))[: args.n]
    name = f"vigil_bench_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(ADMIN, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    rt = build_runtime(Settings(database_url=url, metrics_port=0, otlp_grpc_port=0), registry=CollectorRegistry())
    review_wiring.wire(rt)  # the flagger: flagged conversations become queue items
    raw_conn = psycopg.connect(url.replace("+psycopg", ""), autocommit=True)
    try:
        timings: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.rounds):
            for indexed in (False, True):
                raw_conn.execute("TRUNCATE conversations, findings, review_items, review_reasons")
                raw_conn.execute(INDEX if indexed else "DROP INDEX IF EXISTS ix_conversations_document_trgm")
                envs = fresh_ids(raws, f"r{r}{indexed}")
                t0 = time.perf_counter()
                for k in range(0, len(envs), 200):
                    rt.pipeline.process_raw(envs[k : k + 200])
                timings[indexed].append(time.perf_counter() - t0)
        size = sum(map(len, raws)) / len(raws)
        store = min(timings[True]) / min(timings[False])
        print(f"store {len(raws)} conversations ({size:,.0f} bytes each): with/without the trigram index {store:.2f}x")
        raw_conn.execute("VACUUM ANALYZE")
        search: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for indexed in (True, False):
                raw_conn.execute(INDEX if indexed else "DROP INDEX IF EXISTS ix_conversations_document_trgm")
                with rt.sessions() as s:
                    t0 = time.perf_counter()
                    found = list_queue(s, QueueFilter(search="7-quartz"), "all", 20)
                    search[indexed].append(time.perf_counter() - t0)
        fast, slow = min(search[True]) * 1000, min(search[False]) * 1000
        print(
            f"queue search over {len(raws)} conversations ({found['counts']['all']} items match): "
            f"{slow / fast:.1f}x faster with the index ({fast:.1f} ms vs {slow:.1f} ms)"
        )
    finally:
        raw_conn.close()
        rt.close()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


if __name__ == "__main__":
    main()
