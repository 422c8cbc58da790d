"""Read latency at production volume: bulk-load N simulated conversations with COPY straight into the
tables (conversations, findings, outcomes and their links, verdicts, review items, reasons and labels,
dead letters), build the rollups with the real job, then time every API read and UI page.

    python -m bench.bench_reads --rows 1000000            # Postgres on 127.0.0.1:5432, database vigil_bench_reads
    python -m bench.bench_reads --rows 10000000 --repeat 20
    python -m bench.bench_reads --reuse                   # time the reads again on the loaded database
    python -m bench.bench_reads --reuse --writes 20 --only compare   # while 20 conversations/s are stored
    python -m bench.bench_reads --reuse --writes 100 --gap 5 --only compare   # a read every 5 s meanwhile

With ``--writes`` a thread stores conversations (with findings and verdicts) at that rate while the reads
are timed, and the rollup job runs every ``rollup_interval_seconds`` beside them as serve's or the
detector's upkeep does: the rollups' watermark is then behind at every read, as in production.

Prints a p50/p95 table (milliseconds, in-process ASGI client, one request at a time).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
from prometheus_client import CollectorRegistry

from vigil.settings import Settings
from vigil.store import db, rollup_job

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/vigil_bench_reads"
KEY = "bench-key"
DAYS = 30
TASKS = 20_000
DOC = orjson.dumps(
    {"messages": [{"role": "user", "content": "Where is my order?"}, {"role": "assistant", "content": "Let me check."}]}
).decode()


def _plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def create_database(url: str) -> None:
    base, name = _plain(url).rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def version_of(i: int, n: int) -> tuple[str, str]:
    """Two agents; versions follow each other in time, the last 15% a canary of two versions side by side."""
    frac = i / n
    if i % 10 >= 7:
        return "sales-bot", "s1" if frac < 0.6 else "s2"
    if frac < 0.5:
        return "support-bot", "v1"
    if frac < 0.85:
        return "support-bot", "v2"
    return "support-bot", "v3" if i % 2 else "v4"


def load(url: str, n: int, chunk: int = 200_000) -> dict[str, int]:
    """COPY n conversations and what hangs off them; returns rows per table."""
    now = datetime.now(UTC)
    start = now - timedelta(days=DAYS)
    step = timedelta(days=DAYS) / n
    counts = dict.fromkeys(
        [
            "conversations",
            "findings",
            "outcomes",
            "outcome_links",
            "verdicts",
            "review_items",
            "review_reasons",
            "review_labels",
            "dead_letters",
        ],
        0,
    )
    cols = {
        "conversations": "conversation_id, revision, schema_version, agent_id, agent_version, task_id, intent, status, "
        "started_at, ended_at, received_at, message_count, tool_call_count, tool_error_count, tokens, cost_usd, "
        "latency_ms, finding_count, max_severity, document",
        "findings": "conversation_id, revision, agent_id, agent_version, rule_id, rule_type, severity, message, "
        "evidence, details, created_at",
        "outcomes": "id, idempotency_key, conversation_id, type, value, occurred_at, received_at, source",
        "outcome_links": "outcome_id, conversation_id, agent_id, agent_version, type, value, happened, attributed, "
        "conversation_received_at, linked_at",
        "verdicts": "judge, judge_version, conversation_id, revision, agent_id, agent_version, verdict, score, "
        "categories, model, offline, prompt_hash, attempts, reason, created_at",
        "review_items": "conversation_id, agent_id, agent_version, priority, status, required_reviews, review_count, "
        "sampled, created_at, updated_at",
        "review_reasons": "conversation_id, kind, key, weight, detail, created_at",
        "review_labels": "conversation_id, revision, reviewer, label, category, notes, expected_behavior, version, "
        "is_current, created_at",
    }
    with psycopg.connect(_plain(url)) as conn:
        outcome_id = 0
        for lo in range(0, n, chunk):
            rows: dict[str, list[tuple[Any, ...]]] = {k: [] for k in cols}
            for i in range(lo, min(n, lo + chunk)):
                cid = f"c{i:010d}"
                agent, version = version_of(i, n)
                at = start + step * i
                finished = "in_progress" if i % 97 == 0 else "finished"
                forbidden, pii = i % 23 == 0, i % 7 == 0
                rare = i < n // 20 and i % 7 == 3  # a rule found only in the oldest 5% (0.7% of those)
                nf = int(forbidden) + int(pii) + int(rare)
                errors = 1 if i % 17 == 0 else 0
                rows["conversations"].append(
                    (cid, 1, 1, agent, version, f"task-{i % TASKS}", "order_status", finished,
                     at - timedelta(minutes=2), at, at, 6 + i % 9, 2, errors, 2000 + i % 900,
                     0.004 + (i % 50) / 10_000, 900.0 + i % 4000, nf,
                     "high" if forbidden else ("medium" if pii or rare else None), DOC)
                )  # fmt: skip
                if pii:
                    rows["findings"].append(
                        (cid, 1, agent, version, "pii-email", "pii", "medium", "email address in reply", "[]", "{}", at)
                    )
                if rare:
                    rows["findings"].append(
                        (cid, 1, agent, version, "refund-over-limit", "regex", "medium", "refund above the limit",
                         "[]", "{}", at)
                    )  # fmt: skip
                if forbidden:
                    rows["findings"].append(
                        (cid, 1, agent, version, "forbidden-cancel-delivered", "forbidden_tool", "high",
                         "cancel_order on a delivered order", "[]", "{}", at)
                    )  # fmt: skip
                for kind, every, value in (("escalation", 11, 1.0), ("task_success", 3, float(i % 4 > 0))):
                    if i % every == 0:
                        outcome_id += 1
                        rows["outcomes"].append((outcome_id, f"{cid}:{kind}", cid, kind, value, at, at, "api"))
                        rows["outcome_links"].append(
                            (outcome_id, cid, agent, version, kind, value, value > 0, True, at, at)
                        )
                if i % 20 == 0:
                    verdict = "fail" if i % 60 == 0 else "pass"
                    rows["verdicts"].append(
                        ("helpful", "1", cid, 1, agent, version, verdict, None, "[]", "m", False, "h", 1, "sampled", at)
                    )
                if i % 25 == 0:
                    done = i / n < 0.9
                    rows["review_items"].append(
                        (cid, agent, version, float(i % 100), "done" if done else "open", 1, int(done), False, at, at)
                    )
                    rows["review_reasons"].append((cid, "finding", "pii-email", 10.0, "medium", at))
                    if done:
                        label = "confirmed_failure" if i % 3 == 0 else "not_a_failure"
                        rows["review_labels"].append((cid, 1, f"rev{i % 7}", label, None, "", "", 1, True, at))
            for table, data in rows.items():
                if not data:
                    continue
                with conn.cursor() as cur, cur.copy(f"COPY {table} ({cols[table]}) FROM STDIN") as copy:
                    for r in data:
                        copy.write_row(r)
                counts[table] += len(data)
            conn.commit()
            print(f"  loaded {min(n, lo + chunk):,} conversations", flush=True)
        dead = [
            ("kafka", "conversations", 0, k, None, "invalid_json", "bad", b"{", 1, now - timedelta(hours=k % 600))
            for k in range(max(1000, n // 1000))
        ]
        with (
            conn.cursor() as cur,
            cur.copy(
                'COPY dead_letters (source, topic, partition, "offset", key, reason, detail, raw, raw_size, '
                "created_at) FROM STDIN"
            ) as copy,
        ):
            for r in dead:
                copy.write_row(r)
        counts["dead_letters"] = len(dead)
        conn.execute("SELECT setval('outcomes_id_seq', %s)", (outcome_id + 1,))
        conn.commit()
    return counts


def vacuum(url: str) -> None:
    with psycopg.connect(_plain(url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def table_sizes(url: str) -> list[tuple[str, int, int]]:
    q = (
        "SELECT c.relname, c.reltuples::bigint, pg_total_relation_size(c.oid) FROM pg_class c "
        "JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = 'public' AND c.relkind IN ('r', 'p') "
        "ORDER BY 3 DESC"
    )
    with psycopg.connect(_plain(url)) as conn:
        return [(name, int(rows), int(size)) for name, rows, size in conn.execute(q).fetchall()]


def reads(n: int) -> Iterator[tuple[str, str, dict[str, Any]]]:
    month = (datetime.now(UTC) - timedelta(days=DAYS + 1)).isoformat()
    yield (
        "GET /v1/compare (canary, default 7-day window)",
        "/v1/compare",
        {
            "agent": "support-bot",
            "baseline": "v3",
            "candidate": "v4",
        },
    )
    yield (
        "GET /v1/compare (v1 vs v2, 31 days)",
        "/v1/compare",
        {
            "agent": "support-bot",
            "baseline": "v1",
            "candidate": "v2",
            "since": month,
        },
    )
    yield "GET /v1/quality", "/v1/quality", {"agent": "support-bot", "version": "v4"}
    yield "GET /v1/conversations", "/v1/conversations", {}
    yield "GET /v1/conversations (agent+version)", "/v1/conversations", {"agent": "support-bot", "version": "v2"}
    yield "GET /v1/conversations (rule)", "/v1/conversations", {"rule": "forbidden-cancel-delivered"}
    yield (
        "GET /v1/conversations (rule found only in old conversations)",
        "/v1/conversations",
        {"rule": "refund-over-limit"},
    )
    yield "GET /v1/conversations (severity high)", "/v1/conversations", {"severity": "high"}
    yield "GET /v1/conversations (severity critical, none stored)", "/v1/conversations", {"severity": "critical"}
    yield (
        "GET /ui/conversations (rule found only in old conversations)",
        "/ui/conversations",
        {"rule": "refund-over-limit"},
    )
    yield "GET /v1/conversations/{id}", f"/v1/conversations/c{n // 2:010d}", {}
    yield "GET /v1/review/queue", "/v1/review/queue", {}
    yield "GET /v1/review/queue (done)", "/v1/review/queue", {"status": "done"}
    yield "GET /v1/review/queue (agent, reason)", "/v1/review/queue", {"agent": "sales-bot", "reason": "finding"}
    yield "GET /v1/review/progress", "/v1/review/progress", {}
    yield "GET /v1/rules/quality", "/v1/rules/quality", {}
    yield "GET /v1/alerts", "/v1/alerts", {}
    yield "GET /v1/dead-letters", "/v1/dead-letters", {}
    yield "GET /v1/verdicts", "/v1/verdicts", {}
    yield "GET /ui/compare", "/ui/compare", {}
    yield "GET /ui/compare (v1 vs v2)", "/ui/compare", {"agent": "support-bot", "baseline": "v1", "candidate": "v2"}
    yield "GET /ui/queue", "/ui/queue", {}
    yield "GET /ui/queue (done, page 50)", "/ui/queue", {"status": "done", "page": 50}
    yield "GET /ui/progress", "/ui/progress", {}
    yield "GET /ui/calibration", "/ui/calibration", {}
    yield "GET /ui (home)", "/ui", {}
    yield "GET /ui/alerts", "/ui/alerts", {}
    yield "GET /ui/quality (7 days)", "/ui/quality", {"agent": "support-bot", "version": "v2"}
    yield "GET /v1/overview", "/v1/overview", {}


def write_traffic(url: str, per_second: float, stop: threading.Event) -> int:
    """Store canary conversations (a finding every 7th, a verdict every 5th) at ``per_second`` until stopped."""
    done = 0
    with psycopg.connect(_plain(url), autocommit=True) as conn:
        t0 = time.monotonic()
        while not stop.is_set():
            due = int((time.monotonic() - t0) * per_second)
            for i in range(done, due):
                cid, version = f"w{os.getpid()}-{i:08d}", "v3" if i % 2 else "v4"
                conn.execute(
                    "INSERT INTO conversations (conversation_id, revision, schema_version, agent_id, agent_version, "
                    "task_id, intent, status, started_at, ended_at, received_at, message_count, tool_call_count, "
                    "tool_error_count, tokens, cost_usd, latency_ms, finding_count, max_severity, document) VALUES "
                    "(%s, 1, 1, 'support-bot', %s, %s, 'order_status', 'finished', now(), now(), now(), 8, 2, "
                    "%s, 2000, 0.005, 1200, %s, %s, %s)",
                    (cid, version, f"task-{i % TASKS}", int(i % 17 == 0), int(i % 7 == 0),
                     "medium" if i % 7 == 0 else None, DOC),
                )  # fmt: skip
                if i % 7 == 0:
                    conn.execute(
                        "INSERT INTO findings (conversation_id, revision, agent_id, agent_version, rule_id, rule_type, "
                        "severity, message, evidence, details, created_at) VALUES (%s, 1, 'support-bot', %s, "
                        "'pii-email', 'pii', 'medium', 'email address in reply', '[]', '{}', now())",
                        (cid, version),
                    )
                if i % 5 == 0:
                    conn.execute(
                        "INSERT INTO verdicts (judge, judge_version, conversation_id, revision, agent_id, "
                        "agent_version, verdict, categories, model, offline, prompt_hash, attempts, reason, "
                        "created_at) VALUES "
                        "('helpful', '1', %s, 1, 'support-bot', %s, %s, '[]', 'm', false, 'h', 1, 'sampled', now())",
                        (cid, version, "fail" if i % 15 == 0 else "pass"),
                    )
            done = max(done, due)
            stop.wait(0.05)
    return done


def time_reads(
    url: str, n: int, repeat: int, only: str | None, writes: float = 0.0, gap: float = 0.0
) -> list[tuple[str, int, float, float]]:
    from fastapi.testclient import TestClient

    from vigil.app.runtime import build_runtime, settle_heap
    from vigil.app.server import build_app
    from vigil.app.wiring import wire

    settings = Settings(database_url=url, api_keys=f"bench:admin:{KEY}", metrics_port=0, otlp_grpc_port=0)  # type: ignore[arg-type]
    rt = build_runtime(settings, registry=CollectorRegistry(), migrate=False)
    wire(rt, {"api"})
    settle_heap(long_running=True)  # as `vigil serve` does once built: full collections then skip the start-up heap
    headers = {"Authorization": f"Bearer {KEY}"}
    out = []
    stop = threading.Event()
    upkeep: list[threading.Thread] = []
    if writes:  # production: traffic arrives, and serve's or the detector's upkeep runs the rollup job
        from vigil.store.maintenance import Maintenance

        upkeep.append(threading.Thread(target=write_traffic, args=(url, writes, stop), daemon=True))
        job = Maintenance(settings, rt.sessions)
        rt.provide(job)  # as `vigil serve` wires it: reads find it
        upkeep.append(job.thread(stop))
        upkeep[0].start()
    with TestClient(build_app(rt, [])) as c:
        page = c.get("/ui/login")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token, "no login form"
        c.post("/ui/login", data={"csrf": token.group(1), "api_key": KEY})
        first = c.get("/v1/conversations", headers=headers).json()
        cases = list(reads(n))
        cases.insert(
            4, ("GET /v1/conversations (cursor, page 2)", "/v1/conversations", {"cursor": first["next_cursor"]})
        )
        for name, path, params in cases:
            if only and only not in name:
                continue
            took = []
            status = 0
            for _ in range(repeat + 1):  # the first request warms caches and is not counted
                stop.wait(gap)  # a reader's pause: what is written meanwhile, the next read finds
                t0 = time.perf_counter()
                r = c.get(path, params=params, headers=headers, follow_redirects=False)
                took.append((time.perf_counter() - t0) * 1000)
                status = r.status_code
            took = took[1:]
            p95 = statistics.quantiles(took, n=20)[-1] if len(took) >= 2 else took[0]
            out.append((name, status, statistics.median(took), p95))
            print(f"  {name}: {status} p50 {statistics.median(took):,.0f} ms p95 {p95:,.0f} ms", flush=True)
    stop.set()
    for t in upkeep:
        t.join()
    rt.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000, help="conversations to load (default 10M)")
    ap.add_argument(
        "--url", default=os.environ.get("VIGIL_BENCH_URL", DEFAULT_URL), help="Postgres database (dropped!)"
    )
    ap.add_argument("--repeat", type=int, default=10, help="timed requests per read")
    ap.add_argument("--reuse", action="store_true", help="keep the loaded database; only time the reads")
    ap.add_argument("--only", help="time only reads whose name contains this")
    ap.add_argument("--writes", type=float, default=0.0, help="conversations stored per second while timing")
    ap.add_argument("--gap", type=float, default=0.0, help="seconds between timed requests")
    args = ap.parse_args()
    if not args.reuse:
        create_database(args.url)
        db.upgrade(args.url)
        t0 = time.perf_counter()
        counts = load(args.url, args.rows)
        took = time.perf_counter() - t0
        print(f"loaded in {took:,.0f} s: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
        vacuum(args.url)
        engine = db.make_engine(args.url)
        t0 = time.perf_counter()
        result = rollup_job.refresh(db.make_sessionmaker(engine))
        print(f"rollups built from scratch by the job in {time.perf_counter() - t0:,.1f} s ({result.added:,} counted)")
        t0 = time.perf_counter()
        again = rollup_job.refresh(db.make_sessionmaker(engine))
        print(f"incremental run with nothing new: {(time.perf_counter() - t0) * 1000:,.0f} ms (added {again.added})")
        engine.dispose()
        vacuum(args.url)
    print("\ntable sizes:")
    for name, rows, size in table_sizes(args.url)[:14]:
        per = f"{size / rows:,.0f} B/row" if rows > 0 else ""
        print(f"  {name:24} {rows:>12,} rows {size / 2**20:>10,.1f} MiB  {per}")
    print(f"\nreads at {args.rows:,} conversations ({args.repeat} requests each, after one warm-up):")
    results = time_reads(args.url, args.rows, args.repeat, args.only, args.writes, args.gap)
    print("\n| read | status | p50 ms | p95 ms |\n|---|---|---|---|")
    for name, status, p50, p95 in results:
        print(f"| {name} | {status} | {p50:,.0f} | {p95:,.0f} |")


if __name__ == "__main__":
    main()
