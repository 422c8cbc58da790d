"""How long the console's reads take as stored history grows (Postgres on 127.0.0.1:5432).

Fills a scratch database with ``--n`` conversations spread over a week (two versions), 5% of them in the
review queue, the detector's hourly counts and two active alerts, all written straight by SQL; then times
the home page's snapshot, the quality charts of a week and the alerts page's evidence (median of
``--repeat`` runs) and prints the plans of the home page's window queries.

    python -m bench.bench_console --n 1000000
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from tests.support.console import AGENT, BASELINE, CANDIDATE, console_runtime
from tests.support.services import postgres_database
from vigil.app.home import now, quality
from vigil.detector.api import list_alerts
from vigil.detector.pages import evidence

SIGNALS = [f"rule:r{i}" for i in range(12)] + ["forbidden_tool", "tool_error", "outcome:escalation"]


def fill(rt: Any, n: int, at: datetime) -> None:
    week = 7 * 24 * 3600
    params = {"n": n, "start": at - timedelta(seconds=week), "week": week}
    with rt.engine.begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO conversations (conversation_id, revision, schema_version, agent_id, agent_version,
                    status, started_at, received_at, message_count, tool_call_count, tool_error_count,
                    finding_count, document)
                SELECT 'c' || g, 1, 1, :agent, CASE WHEN g % 2 = 0 THEN :base ELSE :cand END, 'completed',
                    :start + (g::float / :n * :week) * interval '1 second',
                    :start + (g::float / :n * :week) * interval '1 second', 12, 4, 0, 0, '{}'
                FROM generate_series(1, :n) g
                """
            ),
            {**params, "agent": AGENT, "base": BASELINE, "cand": CANDIDATE},
        )
        conn.execute(
            text(
                """
                INSERT INTO review_items (conversation_id, agent_id, agent_version, priority, status,
                    required_reviews, review_count, sampled, created_at, updated_at)
                SELECT conversation_id, agent_id, agent_version, 10, 'open', 1, 0, false, received_at, received_at
                FROM conversations WHERE conversation_id LIKE 'c%' AND substr(conversation_id, 2)::int % 20 = 0
                """
            )
        )
        conn.execute(
            text(
                """
                INSERT INTO quality_counts (agent_id, agent_version, signal, hour, n, x)
                SELECT :agent, v, s, date_trunc('hour', :start) + h * interval '1 hour', :per_hour, :per_hour / 25
                FROM unnest(CAST(:versions AS text[])) v, unnest(CAST(:signals AS text[])) s,
                     generate_series(0, 168) h
                """
            ),
            {
                **params,
                "agent": AGENT,
                "versions": [BASELINE, CANDIDATE],
                "signals": SIGNALS,
                "per_hour": max(1, n // 336),
            },
        )
        for signal in ("forbidden_tool", "rule:r1"):
            conn.execute(
                text(
                    """
                    INSERT INTO detections (agent_id, agent_version, signal, baseline, baseline_rate, rate,
                        observations, statistic, threshold, started_at)
                    VALUES (:agent, :cand, :signal, :baseline, 0.02, 0.3, 1000, 13.0, 12.9, :at)
                    """
                ),
                {"agent": AGENT, "cand": CANDIDATE, "signal": signal, "baseline": f"version:{BASELINE}", "at": at},
            )
        conn.execute(text("ANALYZE"))


def timed(fn: Callable[[], object], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="conversations stored over the week")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    at = datetime.now(UTC)
    with postgres_database() as url:
        rt = console_runtime(url)
        t = time.perf_counter()
        fill(rt, args.n, at)
        print(f"stored {args.n:,} conversations, {args.n // 20:,} queue items in {time.perf_counter() - t:.1f} s")

        def alerts_page() -> None:
            with rt.sessions() as s:
                for a in list_alerts(s, active=True)["active"]:
                    evidence(s, a)

        week = (at - timedelta(days=7), at)
        print(f"home snapshot (/ui)            {timed(lambda: now.snapshot(rt), args.repeat):8.1f} ms")
        charts = timed(lambda: quality.quality(rt, AGENT, CANDIDATE, *week), args.repeat)
        print(f"quality charts, 7 days          {charts:8.1f} ms")
        print(f"alerts page evidence            {timed(alerts_page, args.repeat):8.1f} ms")
        with rt.engine.connect() as conn:
            for name, sql in (
                (
                    "last hour's conversations",
                    "SELECT agent_id, agent_version, count(*) FROM conversations "
                    "WHERE received_at >= now() - interval '1 hour' GROUP BY 1, 2",
                ),
                (
                    "last day's flagged items",
                    "SELECT agent_id, agent_version, count(*) FROM review_items "
                    "WHERE created_at >= now() - interval '1 day' AND agent_id IS NOT NULL GROUP BY 1, 2",
                ),
            ):
                plan = [r[0] for r in conn.execute(text(f"EXPLAIN {sql}"))]
                print(f"plan of {name}: " + " | ".join(p.strip() for p in plan if "Scan" in p))
        rt.close()


if __name__ == "__main__":
    main()
