"""The chart's copies of rules, judges, alert rules and the dashboard cannot drift from the repository's."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.support.app import make_settings
from tests.support.helm_chart import CHART, load_values, one, render
from tests.support.services import missing
from vigil.rules import RuleEngine
from vigil.settings import PROJECT_ROOT


def sync_module():  # type: ignore[no-untyped-def]
    path = PROJECT_ROOT / "helm" / "sync_chart_files.py"
    spec = importlib.util.spec_from_file_location("sync_chart_files", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_chart_copies_match_the_repository() -> None:
    problems = sync_module().drift()
    assert not problems, "run `python helm/sync_chart_files.py`:\n" + "\n".join(problems)


ABSENT = 'absent(up{job=~"vigil|vigil-workers"})'


def scoped(groups: list[dict], namespace: str) -> list[dict]:  # type: ignore[type-arg]
    """dashboards/alerts.yaml's groups as the chart renders them: VigilTargetsAbsent asks for the release's
    namespace only, the rest as written."""
    found = 0
    for group in groups:
        for rule in group["rules"]:
            if rule.get("alert") == "VigilTargetsAbsent":
                assert rule["expr"] == ABSENT
                rule["expr"] = f'absent(up{{namespace="{namespace}", job=~"vigil|vigil-workers"}})'
                rule["annotations"]["description"] = (
                    f"No target of job vigil or vigil-workers in namespace {namespace} has been discovered"
                    " for 5 minutes: nothing of this Vigil install is monitored."
                )
                found += 1
    assert found == 1
    return groups


def test_prometheus_rule_is_dashboards_alerts(tmp_path: Path) -> None:
    source = PROJECT_ROOT / "dashboards" / "alerts.yaml"
    assert source.exists(), "dashboards/alerts.yaml is missing"
    docs = render(load_values(CHART / "ci" / "production-values.yaml"))
    rule = one(docs, "PrometheusRule")
    assert rule["spec"]["groups"] == scoped(yaml.safe_load(source.read_text())["groups"], "vigil")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    promtool = shutil.which("promtool")
    if not promtool:
        missing("promtool")
    rendered = tmp_path / "rules.yaml"
    rendered.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    check = subprocess.run([promtool, "check", "rules", str(rendered)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_grafana_dashboard_config_map() -> None:
    source = PROJECT_ROOT / "dashboards" / "vigil.json"
    assert source.exists(), "dashboards/vigil.json is missing"
    docs = render(load_values(CHART / "ci" / "everything-values.yaml"))
    cm = one(docs, "ConfigMap", "-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert json.loads(cm["data"]["vigil.json"]) == json.loads(source.read_text())


def mount(docs: list[dict], name_suffix: str, volume: str, target: Path) -> None:  # type: ignore[type-arg]
    """Write a ConfigMap's keys where the pod spec's volume puts them."""
    cm = one(docs, "ConfigMap", name_suffix)
    api = one(docs, "Deployment", "-api")
    vol = next(v for v in api["spec"]["template"]["spec"]["volumes"] if v["name"] == volume)
    items = vol["configMap"].get("items") or [{"key": k, "path": k} for k in cm["data"]]
    assert {i["key"] for i in items} == set(cm["data"]), "every key of the ConfigMap is mounted"
    for item in items:
        path = target / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(cm["data"][item["key"]])


def test_mounted_rules_and_judges_load_like_the_repository(tmp_path: Path) -> None:
    values = load_values(CHART / "ci" / "everything-values.yaml")
    docs = render(values)
    rules_dir, judges_dir = tmp_path / "rules", tmp_path / "judges"
    extra_dir = tmp_path / "rules-extra"
    mount(docs, "-rules", "rules", rules_dir)
    mount(docs, "-rules-extra", "rules-extra", extra_dir)
    mount(docs, "-judges", "judges", judges_dir)
    env = one(docs, "ConfigMap", "-env")["data"]
    packs = env["VIGIL_RULE_PACKS"].replace("/app/rules-extra", str(extra_dir))
    packs = packs.replace("/app/rules", str(rules_dir))
    engine = RuleEngine.from_paths(make_settings("sqlite://", rule_packs=packs).rule_pack_paths())
    (tmp_path / "local.yaml").write_text(values["rules"]["extra"]["local.yaml"])
    reference = RuleEngine.from_paths(
        [PROJECT_ROOT / "rules" / p for p in values["rules"]["packs"]] + [tmp_path / "local.yaml"]
    )
    assert sorted(r.id for r in engine.rules) == sorted(r.id for r in reference.rules)
    assert "no-internal-hostnames" in {r.id for r in engine.rules}
    for folder in (PROJECT_ROOT / "judges").iterdir():
        if folder.is_dir() and not folder.name.startswith((".", "_")):
            for f in folder.iterdir():
                if f.is_file():
                    assert (judges_dir / folder.name / f.name).read_text() == f.read_text()
    from vigil.judge.definitions import load_judges

    mounted = load_judges(make_settings("sqlite://", judges_dir=str(judges_dir)))
    original = load_judges(make_settings("sqlite://", judges_dir=str(PROJECT_ROOT / "judges")))
    assert mounted.keys() == original.keys() and mounted


def test_alerts_link_to_the_runbook_where_on_call_reads_it() -> None:
    """Each alert's runbook_url was the repository path ``docs/runbook.md#alert``: in a page or chat message
    sent by Alertmanager that is no link anyone can open. ``runbookUrl`` names the page as the team reads it."""
    values = load_values(CHART / "ci" / "production-values.yaml")
    values["metrics"]["prometheusRule"]["runbookUrl"] = "https://docs.example.com/vigil/runbook/"
    rule = one(render(values), "PrometheusRule")
    links = {r["alert"]: r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert links and all(
        url == f"https://docs.example.com/vigil/runbook/#{alert.lower()}" for alert, url in links.items()
    ), links
    source = yaml.safe_load((PROJECT_ROOT / "dashboards" / "alerts.yaml").read_text())["groups"]
    del values["metrics"]["prometheusRule"]["runbookUrl"]
    unset = one(render(values), "PrometheusRule")["spec"]["groups"]
    assert unset == scoped(source, "vigil")  # unset: the rules as written (VigilTargetsAbsent scoped)


def test_targets_absent_is_told_per_install(tmp_path: Path) -> None:
    """With two installs in one Prometheus, the rule each chart renders fires for its own namespace when its
    targets are gone, although the other install's targets are scraped (the rule as written in
    dashboards/alerts.yaml stays quiet then); promtool evaluates both."""
    promtool = shutil.which("promtool")
    if not promtool:
        missing("promtool")
    values = load_values(CHART / "ci" / "production-values.yaml")
    rules = []
    for namespace in ("staging", "production"):
        group = one(render(values, namespace=namespace), "PrometheusRule")["spec"]["groups"]
        absent = next(r for g in group for r in g["rules"] if r.get("alert") == "VigilTargetsAbsent")
        rules.append({"name": f"absent-{namespace}", "rules": [absent]})
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules}))
    (tmp_path / "test.yaml").write_text(
        yaml.safe_dump(
            {
                "rule_files": ["rules.yaml"],
                "evaluation_interval": "1m",
                "tests": [
                    {
                        "interval": "1m",
                        "input_series": [
                            # production is scraped throughout; staging's targets vanish after 2 minutes
                            {"series": 'up{job="vigil", namespace="production", instance="a"}', "values": "1x20"},
                            {"series": 'up{job="vigil", namespace="staging", instance="b"}', "values": "1 1 1"},
                        ],
                        "alert_rule_test": [
                            {"eval_time": "4m", "alertname": "VigilTargetsAbsent", "exp_alerts": []},
                            {
                                "eval_time": "15m",
                                "alertname": "VigilTargetsAbsent",
                                "exp_alerts": [
                                    {
                                        "exp_labels": {"namespace": "staging", "severity": "critical"},
                                        "exp_annotations": next(
                                            {
                                                "summary": r["rules"][0]["annotations"]["summary"],
                                                "description": r["rules"][0]["annotations"]["description"],
                                                "runbook_url": r["rules"][0]["annotations"]["runbook_url"],
                                            }
                                            for r in rules
                                            if r["name"] == "absent-staging"
                                        ),
                                    }
                                ],
                            },
                        ],
                    }
                ],
            }
        )
    )
    check = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
