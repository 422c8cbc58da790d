"""The regression detector on a real database: detection, no false alarms, lease, replicas, recovery."""

from __future__ import annotations

import math
import random
import threading
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select, update

from tests.support.app import INGEST, REVIEWER, make_client, make_settings
from tests.support.cli import cli_runner
from tests.support.traffic import clean, mixed
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.detector.counts import range_counts
from vigil.detector.cusum import Cusum, kl_bernoulli, threshold, upper_bound
from vigil.detector.models import DetectionRow, DetectorSeriesRow, QualityCountRow
from vigil.detector.wiring import build_detector
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.schema import Conversation
from vigil.settings import PROJECT_ROOT
from vigil.store.models import ConversationRow, VerdictRow

FAST = {"detector_min_baseline": 200, "detector_settle_seconds": 0.0, "detector_outcome_settle_hours": 1.0}


def store(rt, convs: list[dict]) -> None:  # type: ignore[no-untyped-def]
    rt.pipeline.process([Conversation.model_validate(c) for c in convs], "test")


def active(rt) -> dict[str, DetectionRow]:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        rows = s.scalars(select(DetectionRow).where(DetectionRow.ended_at.is_(None))).all()
        return {f"{r.agent_version}/{r.signal}": r for r in rows}


# --- the statistic alone ----------------------------------------------------------------------------


def test_cusum_batches_equal_sum_of_single_steps_without_resets() -> None:
    c = Cusum.design(0.05, [1.5, 2.0], 0.005, 1e5)
    assert c.h == pytest.approx(math.log(2e5))
    one = [0.0, 0.0]
    for x in [1, 1, 0, 1, 1, 1]:
        one = c.update(one, 1, x)
    assert c.update([0.0, 0.0], 6, 5) == pytest.approx(one)
    assert c.update([3.0, 3.0], 1000, 0) == [0.0, 0.0]
    assert max(c.update([0.0, 0.0], 100, 100)) == pytest.approx(c.cap)
    with pytest.raises(ValueError):  # failures without their observations: the late-outcome bug
        c.update([0.0, 0.0], 0, 2)


def test_cusum_delay_and_false_alarms_on_bernoulli_streams() -> None:
    rng = random.Random(7)
    c = Cusum.design(0.05, [1.5, 2.0], 0.005, 1e5)
    stats = [0.0, 0.0]
    for _ in range(100_000):
        stats = c.update(stats, 1, int(rng.random() < 0.05))
        assert not c.alarmed(stats)
    delays = []
    for _ in range(20):
        stats, t = [0.0, 0.0], 0
        while not c.alarmed(stats):
            t += 1
            stats = c.update(stats, 1, int(rng.random() < 0.10))
        delays.append(t)
    theory = threshold(1e5, 1) / kl_bernoulli(0.10, 0.05)
    assert 0.7 * theory < sum(delays) / len(delays) < 1.6 * theory


def test_cautious_baseline_is_above_the_estimate() -> None:
    assert 0.05 < upper_bound(50, 1000, 0.9) < 0.06
    assert 0 < upper_bound(0, 500, 0.9) < 0.01


# --- the detector on a database ---------------------------------------------------------------------


@pytest.fixture
def rt(db_url):  # type: ignore[no-untyped-def]
    runtime = build_runtime(make_settings(db_url, **FAST), registry=CollectorRegistry())
    yield runtime
    runtime.close()


def test_detects_the_regressed_signal_only_and_exports_it(rt) -> None:
    det = build_detector(rt)
    store(rt, clean(300, "v1", 1))
    assert det.tick() is True
    seen = 0
    for i in range(12):
        store(rt, mixed(50, "v2", "cancel_delivered", 0.25, 100 + i))
        seen += 50
        det.tick()
        if active(rt):
            break
    got = active(rt)
    assert set(got) == {"v2/forbidden_tool", "v2/rule:no-cancel-delivered-order"}, got
    d = got["v2/forbidden_tool"]
    assert d.baseline == "version:v1" and d.baseline_rate < 0.01 and d.rate > 0.1 and d.observations <= seen
    with make_client(rt) as c:
        alerts = c.get("/v1/alerts", headers=REVIEWER).json()
        assert {a["signal"] for a in alerts["active"]} == {"forbidden_tool", "rule:no-cancel-delivered-order"}
        assert alerts["active"][0]["started_at"] and alerts["past"] == []
        det.refresh()
        text = c.get("/metrics").text
    labels = 'agent="support-bot",agent_version="v2",signal="forbidden_tool"'
    assert f"vigil_regression_detected{{{labels}}} 1.0" in text
    assert 'vigil_regression_detected{agent="support-bot",agent_version="v2",signal="rule:pii-in-reply"} 0.0' in text
    rate = float(text.split(f"vigil_quality_rate{{{labels}}} ")[1].split("\n")[0])
    low = float(text.split(f"vigil_quality_rate_lower{{{labels}}} ")[1].split("\n")[0])
    high = float(text.split(f"vigil_quality_rate_upper{{{labels}}} ")[1].split("\n")[0])
    assert low < rate < high and rate == pytest.approx(d.rate, abs=0.05)
    assert "vigil_detector_threshold " in text and f"vigil_detector_statistic{{{labels}}}" in text
    assert 'vigil_detections_total{agent="support-bot",agent_version="v2",signal="forbidden_tool"} 1.0' in text


def test_same_quality_raises_nothing_and_recovery_ends_a_detection(rt) -> None:
    det = build_detector(rt)
    store(rt, mixed(400, "v1", "pii_leak", 0.05, 1))
    det.tick()
    for i in range(8):
        store(rt, mixed(100, "v2", "pii_leak", 0.05, 50 + i))
        det.tick()
    assert active(rt) == {}
    for i in range(6):
        store(rt, mixed(50, "v3", "pii_leak", 0.6, 200 + i))
        det.tick()
    assert "v3/rule:pii-in-reply" in active(rt)
    for i in range(40):
        store(rt, clean(100, "v3", 300 + i))
        det.tick()
        if "v3/rule:pii-in-reply" not in active(rt):
            break
    with rt.sessions() as s:
        ended = s.scalars(select(DetectionRow).where(DetectionRow.signal == "rule:pii-in-reply")).one()
    assert ended.end_reason == "recovered" and ended.ended_at is not None
    with make_client(rt) as c:
        past = c.get("/v1/alerts", params={"active": "false"}, headers=REVIEWER).json()["past"]
    assert any(p["signal"] == "rule:pii-in-reply" and p["ended_at"] for p in past)


def test_own_older_traffic_is_the_baseline_of_a_first_version(rt) -> None:
    store(rt, clean(300, "v1", 1))
    with rt.sessions.begin() as s:  # that traffic is two days old
        s.execute(update(ConversationRow).values(received_at=datetime.now(UTC) - timedelta(days=2)))
    det = build_detector(rt)
    det.tick()
    for i in range(10):
        store(rt, mixed(50, "v1", "cancel_delivered", 0.3, 400 + i))
        det.tick()
    assert active(rt)["v1/forbidden_tool"].baseline == "self"


def test_one_leader_takeover_on_release_and_expiry(rt) -> None:
    a, b = build_detector(rt), build_detector(rt)
    assert a.tick() is True and b.tick() is False
    assert rt.metrics.registry.get_sample_value("vigil_detector_leader") == 0  # b's pass set it last
    a.release()
    assert b.tick() is True and a.tick() is False
    later = datetime.now(UTC) + timedelta(seconds=rt.settings.detector_lease_seconds + 1)
    assert a.tick(later) is True  # b stopped renewing: its lease ran out
    assert b.tick(later) is False


def test_counts_are_exact_with_concurrent_writers_and_detectors(pg_url) -> None:
    """Two writer replicas and two detector replicas at once: every conversation is counted once."""
    settings = make_settings(pg_url, **FAST)
    replicas = [build_runtime(settings, registry=CollectorRegistry(), migrate=(i == 0)) for i in range(2)]
    detectors = [build_detector(r) for r in replicas]
    stop = threading.Event()
    written = [0, 0]

    def write(i: int) -> None:
        for j in range(10):
            store(replicas[i], mixed(30, "v1", "pii_leak", 0.2, 1000 * i + 10 * j))
            written[i] += 30

    def detect(d) -> None:  # type: ignore[no-untyped-def]
        while not stop.is_set():
            d.tick()

    writers = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    watchers = [threading.Thread(target=detect, args=(d,)) for d in detectors]
    for t in writers + watchers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in watchers:
        t.join()
    # two hours on: the lease has expired, the tail is folded and the closed hour recounted
    detectors[0].tick(datetime.now(UTC) + timedelta(hours=2))
    with replicas[0].sessions() as s:
        n = s.scalar(select(func.sum(QualityCountRow.n)).where(QualityCountRow.signal == "tool_error"))
        x = s.scalar(select(func.sum(QualityCountRow.x)).where(QualityCountRow.signal == "rule:pii-in-reply"))
        truth = s.scalar(select(func.count()).select_from(ConversationRow))
        leaks = s.scalar(
            select(func.count()).select_from(ConversationRow).where(ConversationRow.max_severity == "critical")
        )
        assert s.scalar(select(func.count()).select_from(DetectorSeriesRow)) > 0
    assert n == truth == sum(written) == 600
    assert x == leaks
    for r in replicas:
        r.close()


def test_detector_command_runs_one_pass(sqlite_url, monkeypatch) -> None:
    from vigil.app.cli import app

    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    store(rt, clean(20, "v1", 1))
    monkeypatch.setenv("VIGIL_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("VIGIL_DETECTOR_SETTLE_SECONDS", "0")
    result = cli_runner().invoke(app, ["detector", "--once"])
    assert result.exit_code == 0 and "leader" in result.output
    with rt.sessions() as s:
        assert s.scalar(select(func.sum(QualityCountRow.n)).where(QualityCountRow.signal == "tool_error")) == 20
    listed = cli_runner().invoke(app, ["alerts", "--json"])
    assert listed.exit_code == 0 and '"active": []' in listed.stdout.replace("\n", "").replace("  ", " ")


def test_versions_seen_together_compare_in_name_order(rt) -> None:
    """A canary that starts with the detector (as in `vigil serve --demo`): v1.10.0 is after v1.9.0."""
    det = build_detector(rt)
    for i in range(12):
        store(rt, clean(40, "v1.9.0", 600 + i) + mixed(40, "v1.10.0", "cancel_delivered", 0.3, 700 + 10 * i))
        det.tick()
    got = active(rt)
    assert got["v1.10.0/forbidden_tool"].baseline == "version:v1.9.0"
    assert not [k for k in got if k.startswith("v1.9.0/")]


def test_all_shipped_rule_packs_export_every_signal_under_its_own_name(sqlite_url) -> None:
    """Rule ids and signals are bounded by the loaded packs, not by the traffic label budget."""
    settings = make_settings(sqlite_url, rule_packs=str(PROJECT_ROOT / "rules" / "*.yaml"), **FAST)
    rt = build_runtime(settings, registry=CollectorRegistry())
    assert len(rt.rules.rules) > settings.max_label_values / 2
    with make_client(rt) as c:
        sim = Simulator(parse_versions("v1:0.5"), 9)
        convs = list(sim.stream(200))
        assert c.post("/v1/conversations", json=convs, headers=INGEST).status_code == 202
        outcomes = [o for conv in convs for o in sim.outcomes_for(conv)]
        assert c.post("/v1/outcomes", json=outcomes, headers=INGEST).status_code in (200, 202)
        build_detector(rt).tick(datetime.now(UTC) + timedelta(hours=2))
        text = c.get("/metrics").text
    assert 'signal="other"' not in text and 'rule="other"' not in text
    base = 'agent="support-bot",agent_version="v1"'
    for signal in ("outcome:escalation", "outcome:refund_reversal", "forbidden_tool", "rule:pii-in-reply"):
        assert f'vigil_quality_rate{{{base},signal="{signal}"}}' in text, signal
    findings = [line for line in text.splitlines() if line.startswith("vigil_findings_total{")]
    fired = {line.split('rule="')[1].split('"')[0] for line in findings}
    assert "pii-in-reply" in fired and fired <= {r.id for r in rt.rules.rules}
    # only the rules that apply to support-bot have series; the tau2 packs name their own agents
    applicable = {f"rule:{r.id}" for r in rt.rules.rules_for("support-bot", "v1")}
    with rt.sessions() as s:
        series = set(s.scalars(select(DetectorSeriesRow.signal).where(DetectorSeriesRow.signal.like("rule:%"))))
    assert series == applicable and len(applicable) < len(rt.rules.rules)
    rt.close()


def verdict(cid: str, verdict: str, reason: str = "sampled", revision: int = 1, judge_version: str = "1") -> VerdictRow:
    return VerdictRow(
        judge="helpful",
        judge_version=judge_version,
        conversation_id=cid,
        revision=revision,
        agent_id="support-bot",
        agent_version="v1",
        verdict=verdict,
        categories=[],
        model="m",
        prompt_hash="h",
        reason=reason,
        created_at=datetime.now(UTC),
    )


def test_judge_rate_counts_sampled_verdicts_once_per_conversation_and_judge_version(db_url) -> None:
    """Flagged requests pick likely failures and a re-judged revision would count twice: neither counts."""
    rt = wire(build_runtime(make_settings(db_url, **FAST), registry=CollectorRegistry()), {"api"})
    convs = clean(40, "v1", 3)
    ids = [c["conversation_id"] for c in convs]
    store(rt, convs)
    rows = [verdict(cid, "fail" if i < 5 else "pass") for i, cid in enumerate(ids[:20])]
    rows += [verdict(cid, "fail", reason="flagged") for cid in ids[20:30]]
    rows += [verdict(cid, "fail", revision=2) for cid in ids[5:10]]  # a newer revision judged again
    rows += [verdict(cid, "unscored") for cid in ids[30:33]]
    rows += [verdict(cid, "pass", judge_version="2") for cid in ids[:4]]  # a new judge version: its own rate
    with rt.sessions.begin() as s:
        for batch in (rows[:20], rows[20:]):  # as the judge worker stores and announces them
            s.add_all(batch)
            s.flush()
            for listener in rt.hooks.verdict_listeners:
                listener(s, batch)
    with rt.sessions() as s:
        counts = range_counts(s, None, datetime.now(UTC) + timedelta(hours=1), lambda a, v: [])
    assert counts[("support-bot", "v1", "judge:helpful")] == (24, 5)
    sample = rt.metrics.registry.get_sample_value
    labels = {"judge": "helpful", "agent": "support-bot", "agent_version": "v1", "offline": "false"}
    assert sample("vigil_judge_sampled_verdicts_total", {**labels, "judge_version": "1", "verdict": "fail"}) == 5
    assert sample("vigil_judge_sampled_verdicts_total", {**labels, "judge_version": "1", "verdict": "pass"}) == 15
    assert sample("vigil_judge_sampled_verdicts_total", {**labels, "judge_version": "2", "verdict": "pass"}) == 4
    rt.close()


def escalations(convs: list[dict], share: float, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"conversation_id": c["conversation_id"], "type": "escalation", "idempotency_key": f"e:{c['conversation_id']}"}
        for c in convs
        if rng.random() < share
    ]


def run_late_outcomes(rt, v2_share: float, batches: int) -> tuple[dict[str, DetectionRow], list[str]]:  # type: ignore[no-untyped-def]
    """v1 with its outcomes on time, then 600 conversations of v2 in ``batches`` detector passes, each
    batch's escalations arriving one pass after it. Returns the active detections at the end and any
    outcome detection seen while the outcomes were still arriving."""
    det = build_detector(rt)
    before_settled: list[str] = []
    with make_client(rt) as c:
        v1 = clean(600, "v1", 1)
        c.post("/v1/conversations", json=v1, headers=INGEST)
        c.post("/v1/outcomes", json=escalations(v1, 0.05, 2), headers=INGEST)
        det.tick()
        late: list[dict] = []
        for i in range(batches + 1):
            batch = clean(600 // batches, "v2", 100 + i) if i < batches else []
            if batch:
                c.post("/v1/conversations", json=batch, headers=INGEST)
            if late:
                c.post("/v1/outcomes", json=late, headers=INGEST)
            det.tick()
            before_settled += [k for k in active(rt) if k.startswith("v2/outcome:")]
            late = escalations(batch, v2_share, 200 + i)
        det.tick(datetime.now(UTC) + timedelta(hours=3))  # every hour of this traffic has settled
    return active(rt), before_settled


@pytest.mark.parametrize("batches", [1, 6])
def test_late_outcomes_at_the_same_rate_raise_nothing(rt, batches: int) -> None:
    """The reviewer's case: both versions escalate 5%, v2's outcomes arrive one pass after its conversations."""
    got, _ = run_late_outcomes(rt, 0.05, batches)
    assert not [k for k in got if k.startswith("v2/")], got
    with rt.sessions() as s:
        series = s.get(DetectorSeriesRow, ("support-bot", "v2", "outcome:escalation"))
        assert series is not None and series.baseline == "version:v1" and series.state == "monitoring"
        n, x = s.execute(
            select(func.sum(QualityCountRow.n), func.sum(QualityCountRow.x)).where(
                QualityCountRow.agent_version == "v2", QualityCountRow.signal == "outcome:escalation"
            )
        ).one()
    assert n == 600 and 12 <= x <= 50  # every late escalation is credited to its conversation's hour


def test_late_outcomes_at_a_higher_rate_are_detected_once_settled(rt) -> None:
    got, before_settled = run_late_outcomes(rt, 0.25, 1)
    assert "v2/outcome:escalation" in got
    assert before_settled == []  # nothing is concluded from an hour whose outcomes may still arrive
    assert got["v2/outcome:escalation"].baseline == "version:v1"
