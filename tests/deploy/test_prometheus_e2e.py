"""End to end: a real Prometheus scrapes `vigil serve`, a new version regresses, the alert fires; then the
process stops, and its target is down where VigilTargetDown looks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.services import free_port, missing, scrape, wait_port
from tests.support.waiting import scaled, wait_for
from vigil.settings import PROJECT_ROOT

pytestmark = pytest.mark.prometheus

KEY = "e2e-admin-key"
ALERTS = PROJECT_ROOT / "dashboards" / "alerts.yaml"


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(args, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


def simulate(env: dict[str, str], url: str, versions: str, count: int, seed: int) -> None:
    vigil = [sys.executable, "-m", "vigil.app.cli"]
    result = subprocess.run(
        [
            *vigil,
            "simulate",
            "--url",
            url,
            "--api-key",
            KEY,
            "--versions",
            versions,
            "--count",
            str(count),
            "--seed",
            str(seed),
            "--batch",
            "100",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def alerts_in(prom: str, state: str = "firing") -> dict[str, list[dict]]:
    alerts = httpx.get(f"{prom}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    out: dict[str, list[dict]] = {}
    for a in alerts:
        if a["state"] == state:
            out.setdefault(a["labels"]["alertname"], []).append(a["labels"])
    return out


def query(prom: str, expr: str) -> list[dict]:
    """The instant vector ``expr`` evaluates to now, as Prometheus' query API returns it."""
    answer = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=5).json()
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def alert_expr(name: str) -> str:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    (expr,) = [r["expr"] for g in groups for r in g["rules"] if r["alert"] == name]
    return str(expr)


def test_regression_reaches_firing_in_prometheus(tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if not prometheus:
        missing("prometheus (Debian package prometheus)")
    vigil_port, prom_port = free_port(), free_port()
    env = dict(os.environ)
    env.update(
        {
            "VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'vigil.db'}",
            "VIGIL_API_KEYS": f"admin:admin:{KEY}",
            "VIGIL_PORT": str(vigil_port),
            "VIGIL_RULE_PACKS": str(PROJECT_ROOT / "rules" / "default.yaml"),
            "VIGIL_DETECTOR_INTERVAL_SECONDS": "1",
            "VIGIL_DETECTOR_SETTLE_SECONDS": "0",
            "VIGIL_DETECTOR_MIN_BASELINE": "300",
            "VIGIL_LOG_LEVEL": "WARNING",
            "VIGIL_OTLP_GRPC_PORT": "0",  # the standard port may be another Vigil's (a demo, a parallel test)
        }
    )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{ALERTS}']\n"
        "scrape_configs:\n"
        f"  - job_name: vigil\n    static_configs: [{{targets: ['127.0.0.1:{vigil_port}']}}]\n"
    )
    serve = start([sys.executable, "-m", "vigil.app.cli", "serve"], env, tmp_path / "serve.log")
    prom = start(
        [
            prometheus,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        env,
        tmp_path / "prometheus.log",
    )
    url, prom_url = f"http://127.0.0.1:{vigil_port}", f"http://127.0.0.1:{prom_port}"
    try:
        assert wait_port(vigil_port, 60), (tmp_path / "serve.log").read_text()[-3000:]
        assert wait_port(prom_port, 30), (tmp_path / "prometheus.log").read_text()[-3000:]
        simulate(env, url, "v1.4.0:0.0", 400, seed=1)
        # the detector folds v1.4.0 first (two ticks after it is stored): it becomes v1.5.0's baseline
        ticks = scrape(vigil_port, "vigil_detector_ticks_total") or 0
        wait_for(lambda: (scrape(vigil_port, "vigil_detector_ticks_total") or 0) >= ticks + 2, 30, 0.2, "two ticks")
        simulate(env, url, "v1.5.0:0.6", 600, seed=2)
        deadline = time.monotonic() + scaled(90)
        got: dict[str, list[dict]] = {}
        while time.monotonic() < deadline:
            got = alerts_in(prom_url)
            if "ForbiddenToolCallsRising" in got and "RegressionDetected" in got:
                break
            time.sleep(1)
        assert "ForbiddenToolCallsRising" in got, (got, httpx.get(f"{url}/metrics").text[-2000:])
        assert got["ForbiddenToolCallsRising"][0]["agent_version"] == "v1.5.0"
        assert "VigilLoopStalled" not in got, got  # serve's loops all turn, as Prometheus scrapes them
        loops = httpx.get(f"{prom_url}/api/v1/query", params={"query": "vigil_worker_loop_up"}).json()["data"]
        assert {r["metric"]["loop"] for r in loops["result"]} >= {"judge", "detector", "maintenance"}, loops
        assert all(r["value"][1] == "1" for r in loops["result"]), loops
        groups = httpx.get(f"{prom_url}/api/v1/rules").json()["data"]["groups"]
        failing = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] == "err"]
        assert not failing, failing
        assert all(a["agent_version"] == "v1.5.0" for alerts in got.values() for a in alerts)
        alerts = httpx.get(f"{url}/v1/alerts", headers={"Authorization": f"Bearer {KEY}"}).json()
        assert {a["agent_version"] for a in alerts["active"]} == {"v1.5.0"}
        assert "forbidden_tool" in {a["signal"] for a in alerts["active"]}
        # while serve answers, neither target alert's expression selects anything (not merely not yet firing)
        assert not query(prom_url, alert_expr("VigilTargetDown")), got
        assert not query(prom_url, alert_expr("VigilTargetsAbsent")), got

        # the process is gone: its target stays discovered, down, and VigilTargetDown's expression selects it
        # (its `for` is minutes: the alert is pending, which says the rule Prometheus loaded sees it too)
        stop(serve)
        down = wait_for(lambda: query(prom_url, alert_expr("VigilTargetDown")), 60, 0.2, "the stopped target down")
        assert [(r["metric"]["job"], r["metric"]["instance"]) for r in down] == [("vigil", f"127.0.0.1:{vigil_port}")]
        pending = wait_for(
            lambda: alerts_in(prom_url, "pending").get("VigilTargetDown"), 30, 0.2, "VigilTargetDown pending"
        )
        assert [(a["job"], a["instance"], a["severity"]) for a in pending] == [
            ("vigil", f"127.0.0.1:{vigil_port}", "critical")
        ]
        assert not query(prom_url, alert_expr("VigilTargetsAbsent"))  # a target that is down is no absent one
    finally:
        stop(prom)
        stop(serve)
