"""Every query the write path, the API, the rollup job, the detector and retention issue has an index to use.

The test records each statement sent to Postgres while it ingests (new and replaced conversations,
outcomes before and after their conversation), flags, reads every list and aggregate, reviews, runs the
rollup job, detector passes (a fold and a recount), the alerts, quality and home pages, and retention;
then it asks Postgres to plan each one again with sequential scans priced out (``enable_seqscan = off``).
A plan that still scans a growing table sequentially has no index to use: it would slow down as the
table grows. Small, bounded tables (state, leases, definitions) may be scanned.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from sqlalchemy import event

from tests.support.app import ADMIN, INGEST, REVIEWER, make_client, make_settings
from tests.support.traffic import clean, with_defect
from vigil.app.runtime import build_runtime
from vigil.app.server import build_app
from vigil.detector.models import DetectionRow
from vigil.detector.wiring import build_detector
from vigil.ingest.pipeline import Envelope
from vigil.store import retention, rollup_job

GROWING = {
    "conversations",
    "findings",
    "outcomes",
    "outcome_links",
    "dead_letters",
    "verdicts",
    "pairwise_comparisons",
    "review_items",
    "review_reasons",
    "review_labels",
    "review_skips",
    "review_audit",
    "judge_requests",
    "exported_tasks",
    "rollup_members",
    "rollup_hourly",
    "rollup_tasks",
    "otel_spans",
    "otel_events",
    "otel_conversations",
    "otel_conversation_traces",
    "otel_values",
    "quality_counts",
}
SKIP = re.compile(r"^\s*(COPY|CREATE|TRUNCATE|SET|SHOW|BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE|SELECT pg_)", re.I)


def _seq_scans(plan: dict[str, Any]) -> list[str]:
    found = [plan["Relation Name"]] if plan.get("Node Type") == "Seq Scan" else []
    for child in plan.get("Plans", []):
        found += _seq_scans(child)
    return found


def _explainable(sql: str) -> bool:
    if SKIP.match(sql) or "vigil_conversations_stage" in sql:
        return False
    head = sql.lstrip().upper()
    return not (head.startswith("INSERT") and " SELECT " not in head)


@pytest.fixture
def recorded(pg_url):  # type: ignore[no-untyped-def]
    settings = make_settings(pg_url, compare_bootstrap_resamples=100, detector_settle_seconds=0.0)
    rt = build_runtime(settings, registry=CollectorRegistry())
    statements: dict[str, Any] = {}

    def record(_conn, _cursor, statement, parameters, _context, executemany):  # type: ignore[no-untyped-def]
        if _explainable(statement):
            statements.setdefault(statement, parameters[0] if executemany else parameters)

    with make_client(rt) as c:
        v1, v2 = clean(40, "v1", 1), with_defect(30, "v2", "cancel_delivered", 2) + clean(10, "v2", 3)
        early = v2[:5]  # their outcomes arrive first: the review items wait for the conversation
        c.post("/v1/conversations", json=v1, headers=INGEST)
        rollup_job.refresh(rt.sessions, lag_seconds=0)  # the first run rebuilds from scratch: not recorded
        detector = build_detector(rt)
        detector.tick()  # takes the lease: counts the history and sums it once, not recorded
        with rt.sessions.begin() as s:  # an alert, for the alerts page's evidence
            s.add(
                DetectionRow(
                    agent_id="support-bot", agent_version="v1", signal="tool_error", baseline="self",
                    baseline_rate=0.01, rate=0.2, observations=40, statistic=13.0, threshold=12.9,
                    started_at=datetime.now(UTC),
                )
            )  # fmt: skip
        event.listen(rt.engine, "before_cursor_execute", record)
        outcomes = [
            {"conversation_id": x["conversation_id"], "type": "escalation", "idempotency_key": f"e{i}"}
            for i, x in enumerate(early)
        ] + [{"conversation_id": "never-stored", "type": "escalation"}]  # waits in vain: retention drops it
        c.post("/v1/outcomes", json=outcomes, headers=INGEST)
        for offset in (7, 3):  # a consumer's bad message, and one before it: is it recorded already?
            rt.pipeline.process_raw([Envelope(b"{not json", "kafka", "conversations", 0, offset, "k")])
        c.post("/v1/conversations", json=v2, headers=INGEST)
        again = [dict(x, revision=2, status="finished") for x in v1[:10]]
        c.post("/v1/conversations", json=again, headers=INGEST)  # replaced: findings deleted and written again
        c.post(
            "/v1/outcomes",
            json=[
                {"conversation_id": x["conversation_id"], "type": "escalation", "idempotency_key": "late"}
                for x in v2[5:6]
            ],
            headers=INGEST,
        )
        rollup_job.refresh(rt.sessions, lag_seconds=0)
        r = c.get("/v1/conversations", params={"limit": 5}, headers=REVIEWER).json()
        c.get("/v1/conversations", params={"limit": 5, "cursor": r["next_cursor"]}, headers=REVIEWER)
        c.get(
            "/v1/conversations", params={"agent": "support-bot", "version": "v2", "severity": "high"}, headers=REVIEWER
        )
        c.get("/v1/conversations", params={"rule": "forbidden-cancel-delivered"}, headers=REVIEWER)
        c.get(f"/v1/conversations/{v2[0]['conversation_id']}", headers=REVIEWER)
        assert c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER).status_code == 200
        c.get("/v1/quality", params={"agent": "support-bot", "version": "v2"}, headers=REVIEWER)
        q = c.get("/v1/review/queue", params={"limit": 3}, headers=REVIEWER).json()
        c.get("/v1/review/queue", params={"limit": 3, "cursor": q["next_cursor"]}, headers=REVIEWER)
        c.get("/v1/review/queue", params={"status": "done"}, headers=REVIEWER)
        c.get("/v1/review/queue", params={"reason": "outcome", "agent": "support-bot"}, headers=REVIEWER)
        claimed = c.post("/v1/review/claim", json={}, headers=REVIEWER)
        if claimed.status_code == 200:
            cid = claimed.json()["conversation_id"]
            labelled = c.post(
                f"/v1/review/items/{cid}/labels",
                json={"label": "confirmed_failure", "category": "wrong_action"},
                headers=REVIEWER,
            )
            assert labelled.status_code == 201, labelled.text
            c.get(f"/v1/review/items/{cid}", headers=REVIEWER)
        assert c.get("/v1/review/clusters", headers=REVIEWER).status_code == 200  # with what is blind to them
        assign = {"action": "assign", "assignee": "raj", "conversation_ids": [q["items"][-1]["conversation_id"]]}
        assert c.post("/v1/review/bulk", json=assign, headers=ADMIN).json()["done"]  # released by retention below
        exported = c.post("/v1/exports", headers=ADMIN)  # what each confirmed conversation had exported before
        assert exported.status_code == 200
        assert c.post(exported.headers["x-vigil-export-ack"], headers=ADMIN).status_code == 200
        assert c.get("/v1/overview", headers=REVIEWER).status_code == 200  # the console's home page
        assert (
            c.get("/v1/conversations", params={"agent": "support-bot", "version": "v1"}, headers=REVIEWER).status_code
            == 200
        )
        assert c.get("/v1/review/progress", headers=REVIEWER).status_code == 200
        assert c.get("/v1/calibration", headers=REVIEWER).status_code == 200
        assert c.get("/v1/judges", headers=REVIEWER).status_code == 200
        for params in ({}, {"reason": "malformed_json"}, {"source": "http"}):  # the dead-letter list, filtered
            assert c.get("/v1/dead-letters", params=params, headers=ADMIN).status_code == 200
        assert c.get("/v1/rules/quality", params={"outcome": "escalation"}, headers=REVIEWER).status_code == 200
        series = c.get("/v1/quality/series", params={"agent": "support-bot", "version": "v2"}, headers=REVIEWER)
        assert series.status_code == 200
        detector.tick()  # folds v2: baselines, statistics, gauges
        detector.tick(datetime.now(UTC) + timedelta(hours=2))  # and recounts the hours that closed
        ui = TestClient(build_app(rt))
        token = re.search(r'name="csrf" value="([^"]+)"', ui.get("/ui/login").text)
        assert token
        ui.post("/ui/login", data={"csrf": token.group(1), "api_key": "rita-key", "next": "/ui"})
        assert "tool_error" in ui.get("/ui/alerts").text  # with the alert's evidence
        assert ui.get("/ui/quality", params={"agent": "support-bot", "version": "v2"}).status_code == 200
        assert ui.get("/ui").status_code == 200  # the home page: a day's traffic from the detector's hours
        retention.run(rt.sessions, rt.settings)
        retention.run(rt.sessions, rt.settings, now=datetime.now(UTC) + timedelta(days=400))  # everything past it
        retention.run(rt.sessions, rt.settings, now=datetime.now(UTC) + timedelta(days=800))  # and expired records
        _traced(rt)
        event.remove(rt.engine, "before_cursor_execute", record)
        yield rt, statements
    rt.close()


def _traced(rt: Any) -> None:
    """OTLP: conversations in spans, named and not, a trace whose conversation is named later, two
    conversations sending the same instructions, a resent span, a read-back, the idle finisher and a purge."""
    from datetime import UTC, datetime, timedelta

    from tests.ingest.test_otel_shared_values import _conversation, _copy
    from vigil.ingest.otlp.ingest import TraceIngest, purge_conversations

    traces = rt.get(TraceIngest)
    traces.ingest(_copy(_conversation(1)))
    traces.ingest(_copy(_conversation(2)))  # the instructions become a stored value
    unnamed = _conversation(3)
    traces.ingest(_copy([{**s, "attributes": {"gen_ai.operation.name": "chat"}} for s in unnamed[:1]]))
    traces.ingest(_copy(unnamed[1:2]))  # names it: the first span moves under the conversation
    traces.ingest(_copy(_conversation(1)[:1]))  # resent
    traces._forget(["conv-3"])
    traces.ingest(_copy(unnamed[2:]))  # read back from the rows
    traces.ingest(_copy(_conversation(4)[:1]))
    raw = rt.engine.raw_connection()  # the test's own statement: not recorded
    try:
        raw.cursor().execute(
            "UPDATE otel_conversations SET last_seen_at = %s", (datetime.now(UTC) - timedelta(hours=1),)
        )
        raw.commit()
    finally:
        raw.close()
    traces.finish_idle("plans")
    purge_conversations(rt.sessions, datetime.now(UTC))


def test_no_hot_query_scans_a_growing_table(recorded) -> None:  # type: ignore[no-untyped-def]
    rt, statements = recorded
    assert len(statements) > 60, len(statements)  # the flows above ran
    assert any("UPDATE review_items" in s and "agent_id IS NULL" in s for s in statements)  # the flagger's fill-in
    assert any("FROM dead_letters" in s and "coalesce" in s for s in statements)  # what a batch recorded before
    assert any("FROM exported_tasks" in s and "min(" in s for s in statements)  # revisions exported before
    assert any(s.startswith("DELETE FROM outcomes") for s in statements)  # retention, unjoined and not
    assert any("FROM quality_counts" in s and "hour >=" in s for s in statements)  # a baseline's newest hours
    assert any("FROM quality_totals" in s for s in statements)  # every series' counts: one row each
    assert any(s.startswith("DELETE FROM review_items") for s in statements)  # items that waited in vain
    assert any("FROM dead_letters" in s and "dead_letters.reason =" in s for s in statements)  # by reason
    assert any(s.startswith("DELETE FROM review_items") and "review_count" in s for s in statements)  # expired
    assert any(s.startswith("UPDATE review_items") and "assigned_at <" in s for s in statements)  # assignment timeout
    assert any(s.startswith("DELETE FROM review_audit") and "actor" in s for s in statements)  # expired records
    offenders: list[str] = []
    raw = rt.engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("SET enable_seqscan = off")
        for sql, params in statements.items():
            cur.execute("SAVEPOINT p")
            try:
                cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
            except Exception as exc:  # a statement of a temp table or a since-dropped row: not a plan
                cur.execute("ROLLBACK TO SAVEPOINT p")
                pytest.fail(f"could not plan {sql[:200]}: {exc}")
            plan = cur.fetchone()[0][0]["Plan"]
            scans = sorted(set(_seq_scans(plan)) & GROWING)
            if scans:
                offenders.append(f"{scans}: {' '.join(sql.split())[:400]}")
        raw.rollback()
    finally:
        raw.close()
    assert offenders == [], "\n\n".join(offenders)
