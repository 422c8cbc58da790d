"""The detector's running totals: each series' counts over all hours without reading them all.

The gauges, the baselines and the alerts page read ``quality_totals``; these tests check that its rows stay
the sum of every hour stored through late commits, recounts, revisions that move conversations to a later
hour, settled outcomes and a leader that kept no totals, and that a pass and the pages read only the newest
hours of ``quality_counts`` (Postgres' own row counts).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import event, func, select, text, update

from tests.detector.test_detector import FAST, escalations, store
from tests.support.app import INGEST, make_client, make_settings
from tests.support.traffic import clean, mixed
from vigil.app.runtime import build_runtime
from vigil.detector import baselines
from vigil.detector.baselines import Baseline
from vigil.detector.hourly import all_totals, series_totals, set_outcome_counts
from vigil.detector.models import DetectionRow, DetectorLeaseRow, DetectorSeriesRow, QualityCountRow
from vigil.detector.wiring import build_detector
from vigil.store.models import ConversationRow, OutcomeLinkRow
from vigil.store.signals import version_key

C = QualityCountRow


@pytest.fixture
def rt(db_url):  # type: ignore[no-untyped-def]
    runtime = build_runtime(make_settings(db_url, **FAST), registry=CollectorRegistry())
    yield runtime
    runtime.close()


def summed(rt) -> dict[tuple[str, str, str], tuple[int, int]]:  # type: ignore[no-untyped-def]
    """Every series' hours summed, as the detector read them before it kept totals."""
    cols = (C.agent_id, C.agent_version, C.signal)
    with rt.sessions() as s:
        q = select(*cols, func.sum(C.n), func.sum(C.x)).group_by(*cols)
        return {(a, v, sig): (int(n), int(x)) for a, v, sig, n, x in s.execute(q)}


def summed_baselines(rt, now: datetime) -> dict[tuple[str, str, str], Baseline]:  # type: ignore[no-untyped-def]
    """The baselines as the detector chose them before it kept totals: from every hour summed, and every
    hour before the cutoff summed."""
    cols = (C.agent_id, C.agent_version, C.signal)
    cutoff = (now - timedelta(hours=rt.settings.detector_self_baseline_hours)).replace(
        minute=0, second=0, microsecond=0
    )
    with rt.sessions() as s:
        q = select(*cols, func.sum(C.n), func.sum(C.x)).group_by(*cols)
        totals = {(a, v, sig): (int(n), int(x)) for a, v, sig, n, x in s.execute(q)}
        own = {(a, v, sig): (int(n), int(x)) for a, v, sig, n, x in s.execute(q.where(C.hour < cutoff))}
        first = baselines._first_seen(s)
    order: dict[str, list[str]] = {}
    for agent, version in sorted(first, key=lambda av: (first[av], version_key(av[1]))):
        order.setdefault(agent, []).append(version)
    chosen = {
        key: baselines._choose(rt.settings, key, order[key[0]], totals, own) for key in totals if key[:2] in first
    }
    return {key: base for key, base in chosen.items() if base is not None}


def assert_totals_are_the_sum(rt, now: datetime) -> None:  # type: ignore[no-untyped-def]
    full = summed(rt)
    assert full, "nothing counted"
    with rt.sessions() as s:
        assert all_totals(s) == full
        assert {key: series_totals(s, *key) for key in full} == full
        assert baselines.baselines(s, rt.settings, now) == summed_baselines(rt, now)


def stored_at(rt, convs: list[dict], when: datetime) -> None:  # type: ignore[no-untyped-def]
    """Store ``convs`` and date them ``when`` (as if stored then)."""
    store(rt, convs)
    ids = [c["conversation_id"] for c in convs]
    with rt.sessions.begin() as s:
        s.execute(update(ConversationRow).where(ConversationRow.conversation_id.in_(ids)).values(received_at=when))


def test_totals_stay_the_sum_of_every_hour_through_recounts_revisions_and_outcomes(db_url) -> None:
    """The running totals replace summing every hour of a series on each pass: a change to the hourly
    counts that did not reach them would make every rate and baseline drift from what is stored."""
    small = {**FAST, "detector_min_baseline": 10, "detector_self_baseline_hours": 1.0}  # baselines of both kinds
    rt = build_runtime(make_settings(db_url, **small), registry=CollectorRegistry())
    det = build_detector(rt)
    base = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=8)
    minute = timedelta(minutes=1)
    assert det.tick(base)  # takes the lease: nothing stored yet

    first = mixed(60, "v1", "pii_leak", 0.2, 1)
    stored_at(rt, first, base + 10 * minute)
    det.tick(base + 30 * minute)  # folds them into hour 0
    assert_totals_are_the_sum(rt, base + 30 * minute)

    # committed late, dated before the cursor: the recount when hour 0 closes finds them (counts go up)
    stored_at(rt, mixed(20, "v1", "pii_leak", 0.5, 2), base + 20 * minute)
    with make_client(rt) as c:
        assert c.post("/v1/outcomes", json=escalations(first, 0.3, 3), headers=INGEST).status_code == 202
    with rt.sessions.begin() as s:  # joined well before hour 0 settles
        s.execute(update(OutcomeLinkRow).values(linked_at=base + 40 * minute))
    det.tick(base + 65 * minute)
    assert_totals_are_the_sum(rt, base + 65 * minute)

    # folded into hour 1, then every one moved to hour 2 by a newer revision before hour 1 closed: hour 1's
    # recount finds none of them (its rows go to zero) and hour 2 counts them
    moved = clean(30, "v1", 4) + mixed(10, "v2", "cancel_delivered", 0.5, 5)
    stored_at(rt, moved, base + 70 * minute)
    det.tick(base + 80 * minute)
    assert_totals_are_the_sum(rt, base + 80 * minute)
    stored_at(rt, [dict(c, revision=2) for c in moved], base + 130 * minute)
    det.tick(base + 140 * minute)
    with rt.sessions() as s:
        hour1 = s.execute(select(func.sum(C.n)).where(C.hour == base + timedelta(hours=1))).scalar()
    assert hour1 == 0
    assert_totals_are_the_sum(rt, base + 140 * minute)

    det.tick(base + timedelta(hours=5))  # hours 0 to 3 recounted, their outcomes settled and counted
    with rt.sessions() as s:
        settled = s.scalar(select(func.sum(C.x)).where(C.signal == "outcome:escalation"))
    assert settled
    assert_totals_are_the_sum(rt, base + timedelta(hours=5))

    # an hour's outcome counts stored again without a series (its outcome links gone): that one goes to zero
    with rt.sessions.begin() as s:
        set_outcome_counts(s, base, {})
    assert_totals_are_the_sum(rt, base + timedelta(hours=5))
    chosen = summed_baselines(rt, base + timedelta(hours=5))
    assert {b.label for b in chosen.values()} == {"self", "version:v1"}
    rt.close()


def test_a_leader_taking_the_lease_sums_the_hours_again(rt) -> None:
    """A replica of an older version folds counts without keeping totals (a rolling upgrade): the next
    detector to take the lease from it sums every hour again, once; a leader renewing its lease does not."""
    det = build_detector(rt)
    store(rt, clean(40, "v1", 1))
    det.tick()
    assert_totals_are_the_sum(rt, datetime.now(UTC))
    with rt.sessions.begin() as s:  # the older replica's pass: counts moved, totals not, lease its own
        s.execute(update(C).where(C.signal == "tool_error").values(n=C.n + 7))
        s.execute(update(DetectorLeaseRow).values(holder="older-replica", lease_until=datetime.now(UTC)))
    assert summed(rt) != _totals(rt)
    det.tick()
    assert_totals_are_the_sum(rt, datetime.now(UTC))

    with rt.sessions.begin() as s:  # not a fold: only a lease taken from someone else is summed again
        s.execute(update(C).where(C.signal == "tool_error").values(n=C.n + 1))
    det.tick()
    assert summed(rt) != _totals(rt)


def _totals(rt) -> dict[tuple[str, str, str], tuple[int, int]]:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return all_totals(s)


HISTORY_DAYS = 120
SIGNALS = ("tool_error", "forbidden_tool", "rule:pii-in-reply")


def _history(rt, now: datetime) -> int:  # type: ignore[no-untyped-def]
    """Hourly counts of v1 and v2 over HISTORY_DAYS (as a detector that ran that long stored them), their
    series rows, and an active detection of v2 against v1. Returns the hourly rows."""
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(days=HISTORY_DAYS)
    keys = [("support-bot", v, sig) for v in ("v1", "v2") for sig in SIGNALS]
    hours = [start + timedelta(hours=h) for h in range(HISTORY_DAYS * 24)]
    with rt.sessions.begin() as s:
        s.execute(
            C.__table__.insert(),
            [
                {"agent_id": a, "agent_version": v, "signal": sig, "hour": h, "n": 20, "x": 1}
                for a, v, sig in keys
                for h in hours
            ],
        )
        for a, v, sig in keys:
            first = start if v == "v1" else start + timedelta(hours=1)
            s.add(
                DetectorSeriesRow(
                    agent_id=a, agent_version=v, signal=sig, statistics=[0.0, 0.0], baseline=None, baseline_rate=None,
                    state="monitoring", first_seen=first, last_seen=now,
                )
            )  # fmt: skip
        s.add(
            DetectionRow(
                agent_id="support-bot", agent_version="v2", signal="forbidden_tool", baseline="version:v1",
                baseline_rate=0.05, rate=0.2, observations=900, statistic=13.0, threshold=12.9,
                started_at=now - timedelta(hours=3),
            )
        )  # fmt: skip
    return len(keys) * len(hours)


def _rows_read(plan: dict[str, Any]) -> int:
    own = 0
    if plan.get("Relation Name") == "quality_counts":
        own = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * plan.get("Actual Loops", 1)
    return own + sum(_rows_read(p) for p in plan.get("Plans", []))


def test_a_pass_and_the_alert_pages_read_the_newest_hours_not_the_history(pg_url) -> None:
    """A detector pass summed every stored hour three times (baselines twice, the gauges once, on every
    replica), each alert on /ui/alerts its series' hours twice, and the home page every hour of every series
    for one day's count: at 50 series x 2 years a pass read 2.6M rows and took 825 ms
    (bench.bench_detector_reads). They now read the totals and a range of the newest hours."""
    rt = build_runtime(make_settings(pg_url, **FAST), registry=CollectorRegistry())
    history = _history(rt, datetime.now(UTC))
    with rt.engine.begin() as conn:  # as autovacuum would have by now: the planner knows the hours stored
        conn.execute(text("ANALYZE quality_counts"))
    det = build_detector(rt)
    det.tick()  # takes the lease: sums the history, once
    store(rt, clean(50, "v2", 1))
    statements: dict[str, Any] = {}

    def record(_conn, _cursor, statement, parameters, _context, executemany):  # type: ignore[no-untyped-def]
        if "quality_counts" in statement and statement.lstrip().upper().startswith("SELECT"):
            statements.setdefault(statement, parameters)

    event.listen(rt.engine, "before_cursor_execute", record)
    assert det.tick()  # folds the new conversations: baselines, statistics, the gauges
    with make_client(rt) as c:
        token = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/login").text)
        assert token
        c.post("/ui/login", data={"csrf": token.group(1), "api_key": "rita-key", "next": "/ui"})
        page = c.get("/ui/alerts")
        assert page.status_code == 200 and "forbidden_tool" in page.text
        assert c.get("/ui/quality", params={"agent": "support-bot", "version": "v2"}).status_code == 200
        assert c.get("/ui").status_code == 200
    event.remove(rt.engine, "before_cursor_execute", record)
    assert len(statements) >= 4, list(statements)  # the baselines' newest hours, evidence, quality, home

    newest = 6 * 8 * 24  # every series' newest 8 days: the quality page's week is the widest read
    read: dict[str, int] = {}
    raw = rt.engine.raw_connection()
    try:
        cur = raw.cursor()
        for sql, params in statements.items():
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
            read[" ".join(sql.split())[:300]] = _rows_read(cur.fetchone()[0][0]["Plan"])
        raw.rollback()
    finally:
        raw.close()
    rt.close()
    assert history == 6 * HISTORY_DAYS * 24
    assert {sql: n for sql, n in read.items() if n > newest} == {}
