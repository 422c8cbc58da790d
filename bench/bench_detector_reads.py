"""The detector's reads against a long history: S series with D days of hourly counts each, then a detector
pass over a few new conversations, the gauges' refresh on a follower, ``/ui/alerts``, ``/ui/quality`` and the
home page, each timed; ``--explain`` also prints, for every statement they send, the rows it read from
``quality_counts`` (``EXPLAIN ANALYZE``: rows returned plus rows a filter removed, and pages touched).

    python -m bench.bench_detector_reads                    # 50 series x 2 years; Postgres on 127.0.0.1:5432
    python -m bench.bench_detector_reads --reuse --explain  # time again on the loaded database

Run it with an older checkout's ``service`` on ``PYTHONPATH`` (and ``--reuse``) to time that one.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry
from sqlalchemy import event

from bench.bench_reads import DOC, _plain, create_database
from vigil.settings import PROJECT_ROOT, Settings
from vigil.store import db

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/vigil_bench_detector_reads"
KEY = "bench-key"
AGENTS = ("support-bot", "sales-bot")
VERSIONS = ("v1", "v2", "v3", "v4", "v5")
SIGNALS = ("tool_error", "forbidden_tool", "rule:pii-in-reply", "rule:no-cancel-delivered-order", "judge:helpful")
ALERTS = 5  # active detections on the newest version, each shown with its evidence on /ui/alerts


def load(url: str, series: int, days: int) -> int:
    """COPY ``days`` of hourly counts for ``series`` series (agents x versions x signals), their detector
    rows and a few active detections; the lease's cursor an hour back. Returns the rows of counts."""
    keys = [(a, v, sig) for a in AGENTS for v in VERSIONS for sig in SIGNALS][:series]
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = now - timedelta(days=days)
    rng = random.Random(7)
    rows = 0
    with psycopg.connect(_plain(url)) as conn:
        with (
            conn.cursor() as cur,
            cur.copy("COPY quality_counts (agent_id, agent_version, signal, hour, n, x) FROM STDIN") as copy,
        ):
            hour = start
            while hour < now:
                for a, v, sig in keys:
                    n = rng.randint(10, 40)
                    copy.write_row((a, v, sig, hour, n, sum(rng.random() < 0.05 for _ in range(n))))
                    rows += 1
                hour += timedelta(hours=1)
        for a, v, sig in keys:
            conn.execute(
                "INSERT INTO detector_series (agent_id, agent_version, signal, statistics, baseline, baseline_rate, "
                "state, first_seen, last_seen) VALUES (%s, %s, %s, '[0.0, 0.0]', %s, 0.06, 'monitoring', %s, %s)",
                (a, v, sig, "self", start + timedelta(hours=VERSIONS.index(v)), now),
            )
        newest = [k for k in keys if k[1] == VERSIONS[-1]][:ALERTS]
        for a, v, sig in newest:
            det = conn.execute(
                "INSERT INTO detections (agent_id, agent_version, signal, baseline, baseline_rate, rate, "
                "observations, statistic, threshold, started_at) "
                "VALUES (%s, %s, %s, %s, 0.05, 0.12, 900, 13.1, 12.9, %s) RETURNING id",
                (a, v, sig, f"version:{VERSIONS[-2]}", now - timedelta(hours=5)),
            ).fetchone()
            assert det is not None
            conn.execute(
                "UPDATE detector_series SET detection_id = %s, state = 'regressed' "
                "WHERE agent_id = %s AND agent_version = %s AND signal = %s",
                (det[0], a, v, sig),
            )
        conn.execute(
            "INSERT INTO detector_lease (name, holder, lease_until, cursor) VALUES ('detector', 'nobody', %s, %s)",
            (now - timedelta(hours=1), datetime.now(UTC) - timedelta(minutes=5)),
        )
        conn.commit()
    return rows


def add_conversations(url: str, count: int) -> None:
    """``count`` finished conversations of the newest versions, stored just now (what the next pass folds)."""
    at = datetime.now(UTC)
    with psycopg.connect(_plain(url)) as conn, conn.cursor() as cur:
        cols = (
            "conversation_id, revision, schema_version, agent_id, agent_version, status, started_at, ended_at, "
            "received_at, message_count, tool_call_count, tool_error_count, finding_count, document"
        )
        with cur.copy(f"COPY conversations ({cols}) FROM STDIN") as copy:
            for i in range(count):
                a = AGENTS[i % len(AGENTS)]
                copy.write_row(
                    (str(uuid.uuid4()), 1, 1, a, VERSIONS[-1], "finished", at, at, at, 6, 2, int(i % 9 == 0), 0, DOC)
                )
        conn.commit()


def vacuum(url: str) -> None:
    with psycopg.connect(_plain(url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    took = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        took.append((time.perf_counter() - t0) * 1000)
    return statistics.median(took), max(took)


def read_rows(plan: dict[str, Any], table: str) -> tuple[int, int]:
    """Rows the plan's scans of ``table`` produced or filtered out, and the pages they (and their indexes)
    touched: an index condition on a later column of a key skips rows without counting them, not pages."""
    if plan.get("Relation Name") == table:
        loops = plan.get("Actual Loops", 1)
        rows = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
        return rows, plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)
    below = [read_rows(p, table) for p in plan.get("Plans", [])]
    return sum(r for r, _ in below), sum(b for _, b in below)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=50)
    ap.add_argument("--days", type=int, default=730)
    ap.add_argument(
        "--url", default=os.environ.get("VIGIL_BENCH_URL", DEFAULT_URL), help="Postgres database (dropped!)"
    )
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--reuse", action="store_true", help="keep the loaded database")
    ap.add_argument("--explain", action="store_true", help="rows each statement read from quality_counts")
    args = ap.parse_args()
    if not args.reuse:
        create_database(args.url)
        db.upgrade(args.url)
        t0 = time.perf_counter()
        rows = load(args.url, args.series, args.days)
        took = time.perf_counter() - t0
        print(f"loaded {rows:,} hourly count rows ({args.series} series x {args.days} days) in {took:,.0f} s")
        vacuum(args.url)
    else:
        db.upgrade(args.url)  # the checkout's own schema (a newer one's tables are left alone by an older one)
        with psycopg.connect(_plain(args.url)) as conn:  # the last run's detector is gone: its lease with it
            conn.execute("UPDATE detector_lease SET holder = 'nobody', lease_until = now()")

    from fastapi.testclient import TestClient

    from vigil.app.runtime import build_runtime
    from vigil.app.server import build_app
    from vigil.app.wiring import wire
    from vigil.detector.wiring import build_detector

    settings = Settings(  # type: ignore[call-arg]
        database_url=args.url,
        api_keys=f"bench:admin:{KEY}",
        rule_packs=str(PROJECT_ROOT / "rules" / "default.yaml"),
        metrics_port=0,
        otlp_grpc_port=0,
        detector_settle_seconds=0.0,
    )
    rt = build_runtime(settings, registry=CollectorRegistry(), migrate=False)
    wire(rt, {"api"})
    statements: dict[str, Any] = {}

    def record(_conn, _cursor, statement, parameters, _context, executemany):  # type: ignore[no-untyped-def]
        if "quality_counts" in statement and statement.lstrip().upper().startswith("SELECT"):
            statements.setdefault(statement, parameters)

    leader, follower = build_detector(rt), build_detector(rt)
    leader.tick()  # takes the lease: a first pass (a newer checkout may do one-off work on taking it)

    def one_pass() -> None:
        add_conversations(args.url, 100)
        assert leader.tick()

    results = []
    event.listen(rt.engine, "before_cursor_execute", record)
    results.append(("detector pass (leader, 100 new conversations)", *timed(one_pass, args.repeat)))
    results.append(("gauges refresh (any replica, every pass)", *timed(follower.refresh, args.repeat)))
    headers = {"Authorization": f"Bearer {KEY}"}
    with TestClient(build_app(rt, [])) as c:
        page = c.get("/ui/login")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token, "no login form"
        c.post("/ui/login", data={"csrf": token.group(1), "api_key": KEY})
        pages = [
            (f"GET /ui/alerts ({ALERTS} active, with evidence)", "/ui/alerts", {}),
            ("GET /ui/quality (7 days)", "/ui/quality", {"agent": AGENTS[0], "version": VERSIONS[-1]}),
            ("GET /ui (home)", "/ui", {}),
            ("GET /v1/alerts", "/v1/alerts", {}),
        ]
        for name, path, params in pages:
            assert c.get(path, params=params, headers=headers).status_code == 200, path
            results.append((name, *timed(lambda p=path, q=params: c.get(p, params=q, headers=headers), args.repeat)))
    event.remove(rt.engine, "before_cursor_execute", record)
    print(f"\n| read ({args.series} series x {args.days} days of hours) | median ms | max ms |\n|---|---|---|")
    for name, med, top in results:
        print(f"| {name} | {med:,.0f} | {top:,.0f} |")
    if args.explain:
        print("\n| rows read from quality_counts | pages | statement |\n|---|---|---|")
        raw = rt.engine.raw_connection()
        try:
            cur = raw.cursor()
            for sql, params in statements.items():
                cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
                plan = cur.fetchone()[0][0]["Plan"]  # type: ignore[index]
                rows, pages = read_rows(plan, "quality_counts")
                print(f"| {rows:,} | {pages:,} | `{' '.join(sql.split())[:160]}` |")
            raw.rollback()
        finally:
            raw.close()
    rt.close()


if __name__ == "__main__":
    main()
