"""Alert rules and the Grafana dashboard: promtool checks, unit tests, and only metrics Vigil exposes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml
from prometheus_client import CollectorRegistry

from tests.support.services import missing
from vigil.metrics import Metrics
from vigil.settings import PROJECT_ROOT

DASHBOARDS = PROJECT_ROOT / "dashboards"
RUNBOOK = PROJECT_ROOT / "docs" / "runbook.md"
REQUIRED_ALERTS = {
    "RegressionDetected",
    "ForbiddenToolCallsRising",
    "JudgeFailRateHigh",
    "OutcomeRateRising",
    "DeadLettersRising",
    "ConsumerLagHigh",
    "IngestStoreFailing",
    "JudgeBudgetExhausted",
    "JudgeErrors",
    "VigilLoopStalled",
    "VigilTargetDown",
    "VigilTargetsAbsent",
    "VigilClockSkew",
}
SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}
METRIC = re.compile(r"\bvigil_[a-z0-9_]+\b")


def exposed_metric_names() -> set[str]:
    """Every sample name a real ``Metrics`` registry can expose, labelled or not."""
    registry = CollectorRegistry()
    Metrics(registry)
    names = set()
    for family in registry.collect():
        for suffix in SAMPLE_SUFFIXES[family.type]:
            names.add(family.name + suffix)
    return names


def alert_rules() -> list[dict]:
    doc = yaml.safe_load((DASHBOARDS / "alerts.yaml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def dashboard() -> dict:
    return json.loads((DASHBOARDS / "vigil.json").read_text())


def dashboard_queries(d: dict) -> list[str]:
    out = []
    for panel in d["panels"]:
        out += [t["expr"] for t in panel.get("targets", [])]
    out += [v["query"]["query"] for v in d["templating"]["list"] if isinstance(v.get("query"), dict)]
    out += [a["expr"] for a in d["annotations"]["list"] if "expr" in a]
    return out


def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        missing("promtool (Debian package prometheus)")
    return str(found)


def test_exposed_names_come_from_the_registry() -> None:
    names = exposed_metric_names()
    assert {
        "vigil_findings_total",
        "vigil_regression_detected",
        "vigil_processing_seconds_bucket",
        "vigil_quality_rate_lower",
    } <= names
    assert "vigil_findings" not in names and "vigil_nonexistent_total" not in names
    # DeadLettersRising reads the process's start (a counter born since is new, whoever scrapes it)
    assert "process_start_time_seconds" in names
    assert any("process_start_time_seconds" in r["expr"] for r in alert_rules())


def test_alerts_and_dashboard_name_only_exposed_metrics() -> None:
    exposed = exposed_metric_names()
    texts = [r["expr"] + " " + " ".join(r.get("annotations", {}).values()) for r in alert_rules()]
    texts += dashboard_queries(dashboard())
    unknown = {name for t in texts for name in METRIC.findall(t)} - exposed
    assert not unknown, f"alerts or dashboard name metrics Vigil does not expose: {sorted(unknown)}"


def test_every_alert_has_severity_summary_and_a_runbook_section() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= REQUIRED_ALERTS
    headings = {h.strip().lower() for h in re.findall(r"^## (.+)$", RUNBOOK.read_text(), re.M)}
    for r in rules:
        assert r["labels"]["severity"] in ("critical", "warning", "info"), r["alert"]
        assert r["annotations"]["summary"], r["alert"]
        assert r["annotations"]["runbook_url"] == f"docs/runbook.md#{r['alert'].lower()}"
        assert r["alert"].lower() in headings, f"docs/runbook.md has no section for {r['alert']}"


def test_the_dashboard_charts_every_metric_the_runbook_names() -> None:
    """The runbook says the dashboard shows every metric it names: an on-call engineer told to check
    ``vigil_ingest_errors_total`` or ``vigil_judge_state`` finds a panel for it (6 of 12 had none)."""
    queries = " ".join(dashboard_queries(dashboard()))
    charted = {re.sub(r"_(bucket|count|sum)$", "", name) for name in METRIC.findall(queries)}
    named = set(METRIC.findall(RUNBOOK.read_text()))
    assert "shows every metric named below" in RUNBOOK.read_text()
    assert len(named) >= 10
    assert not named - charted, f"metrics the runbook names without a panel: {sorted(named - charted)}"


# Gauges each replica reads from the shared database: every worker exports the same value.
DATABASE_WIDE_GAUGES = (
    "vigil_judge_queue_depth",
    "vigil_review_queue_open_items",
    "vigil_judge_budget_used_usd",
    "vigil_judge_budget_usd",
    "vigil_detector_threshold",
    "vigil_regression_detected",
)


def test_database_wide_gauges_are_not_summed_across_replicas() -> None:
    """Summing a gauge that every replica reads from the database multiplies it by the replica count."""
    texts = [r["expr"] for r in alert_rules()] + dashboard_queries(dashboard())
    summed = [
        (name, t)
        for t in texts
        for name in DATABASE_WIDE_GAUGES
        if re.search(rf"\b(sum|count)\s*(by\s*\([^)]*\)\s*)?\(\s*{name}\b", t)
    ]
    assert not summed, summed


def test_dashboard_is_provisionable_and_covers_the_topics() -> None:
    d = dashboard()
    assert d["uid"] == "vigil-overview" and d["schemaVersion"] >= 30 and "id" not in d
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
    queries = " ".join(dashboard_queries(d))
    for metric in (
        "vigil_conversations_processed_total",
        "vigil_quality_rate_lower",
        "vigil_quality_rate_upper",
        "vigil_findings_total",
        "vigil_judge_verdicts_total",
        "vigil_judge_cost_usd_total",
        "vigil_outcomes_total",
        "ALERTS",
        "vigil_consumer_lag_messages",
        "vigil_dead_letters_total",
        "vigil_review_queue_open_items",
        "vigil_regression_detected",
    ):
        assert metric in queries, metric
    provider = yaml.safe_load((DASHBOARDS / "provisioning" / "dashboards.yaml").read_text())
    assert provider["providers"][0]["type"] == "file"


@pytest.mark.prometheus
def test_the_active_alerts_panel_lists_every_alert() -> None:
    """The dashboard's table of firing alerts names each alert rule; one left out of its filter never shows."""
    filters = [
        set(m.group(1).split("|"))
        for q in dashboard_queries(dashboard())
        if q.startswith("ALERTS{")
        for m in [re.search(r'alertname=~"([^"]+)"', q)]
        if m
    ]
    assert filters, "no panel lists firing alerts"
    every = {r["alert"] for r in alert_rules()}
    for names in filters:
        assert names == every, f"left out: {sorted(every - names)}; unknown: {sorted(names - every)}"


def test_the_target_alerts_select_the_example_scrape_jobs() -> None:
    """VigilTargetDown and VigilTargetsAbsent read ``up`` of Vigil's jobs only: each job of the example
    configuration (the chart's ServiceMonitor gives the same, see tests/deploy/test_helm.py), no other."""
    rules = {r["alert"]: r for r in alert_rules()}
    selectors = {
        m for a in ("VigilTargetDown", "VigilTargetsAbsent") for m in re.findall(r'job=~"([^"]+)"', rules[a]["expr"])
    }
    assert len(selectors) == 1, selectors
    (selector,) = selectors
    config = yaml.safe_load((DASHBOARDS / "prometheus.yml").read_text())
    jobs = {c["job_name"] for c in config["scrape_configs"]}
    assert jobs == {"vigil", "vigil-workers"}
    assert all(re.fullmatch(selector, job) for job in jobs)
    for other in ("node-exporter", "vigil-exporter", "prod-vigil", "prometheus"):
        assert not re.fullmatch(selector, other), other


def test_promtool_checks_rules_and_config() -> None:
    tool = promtool()
    for args in (["check", "rules", "alerts.yaml"], ["check", "config", "prometheus.yml"]):
        result = subprocess.run([tool, *args], cwd=DASHBOARDS, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
def test_promtool_rule_unit_tests_cover_every_alert() -> None:
    tool = promtool()
    result = subprocess.run(
        [tool, "test", "rules", "alerts_test.yaml"],
        cwd=DASHBOARDS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    tests = yaml.safe_load((DASHBOARDS / "alerts_test.yaml").read_text())["tests"]
    fired = {c["alertname"] for t in tests for c in t["alert_rule_test"] if c["exp_alerts"]}
    quiet = {c["alertname"] for t in tests for c in t["alert_rule_test"] if not c["exp_alerts"]}
    names = {r["alert"] for r in alert_rules()}
    assert fired == names and quiet == names


@pytest.mark.prometheus
def test_regression_annotation_marks_a_signals_first_detection(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A labelled counter appears when first incremented, already at 1: `changes()` never saw the first
    detection of a signal and version (in a demo, 4 detections in 30 minutes, 0 annotations). The
    annotation marks a detection counter that appears as well as one that grows, and only near the time."""
    (expr,) = [a["expr"] for a in dashboard()["annotations"]["list"] if a.get("name") == "Regressions"]
    expr = expr.replace('"$namespace"', '".*"')  # what Grafana sends for the variable's default, All
    labels = 'agent="a",agent_version="v2",signal="rule:x"'
    cases = {"4m": "first", "9m": None, "11m": "second", "20m": None}
    tests = {
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": f"vigil_detections_total{{{labels}}}", "values": "_x3 1x7 2x10"}],
                "promql_expr_test": [
                    {
                        "expr": f"count({expr})",
                        "eval_time": at,
                        "exp_samples": [{"labels": "{}", "value": 1}] if what else [],
                    }
                    for at, what in cases.items()
                ],
            }
        ]
    }
    path = tmp_path / "annotation_test.yaml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_dashboard_query_is_scoped_to_the_chosen_namespace() -> None:
    """Two releases in one Prometheus (staging and production) summed into one chart: the dashboard's
    namespace variable (all by default, which also matches series without the label) scopes every query."""
    d = dashboard()
    names = [v["name"] for v in d["templating"]["list"]]
    assert names.index("namespace") < names.index("agent")
    for query in dashboard_queries(d):
        if query == "label_values(vigil_conversations_processed_total, namespace)":
            continue
        for name in re.findall(r"\b(?:vigil_[a-z_]+|ALERTS)\b(?:\{[^}]*\})?", query):
            assert 'namespace=~"$namespace"' in name, (name, query)
