"""The Helm chart lints and renders with every CI values file; every manifest is valid Kubernetes."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer.main
import yaml

from tests.support.helm_chart import CHART, CI_VALUES, KUBE_VERSION, by_kind, helm, load_values, one, render
from vigil.app.cli import app
from vigil.settings import PROJECT_ROOT, Settings

CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}  # checked in tests/test_helm_files.py and below
SECRET_VARS = {"VIGIL_DATABASE_URL", "VIGIL_API_KEYS", "VIGIL_REVIEW_SESSION_SECRET"}


@pytest.fixture(params=CI_VALUES, ids=[p.stem for p in CI_VALUES])
def values_file(request: pytest.FixtureRequest) -> Path:
    return request.param


def test_ci_values_files_exist() -> None:
    assert {p.stem for p in CI_VALUES} >= {"minimal-values", "production-values", "everything-values"}


def test_lint_is_clean(values_file: Path) -> None:
    report = helm().lint(
        CHART, load_values(values_file), strict=True, namespace="vigil", kube_version=f"v{KUBE_VERSION}"
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, (report["errors"], problems)


def test_every_manifest_validates(values_file: Path) -> None:
    docs = render(load_values(values_file))
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount"} <= kinds
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        clean = {k: v for k, v in doc.items() if k != "_template"}
        try:
            kubernetes_validate.validate(clean, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{doc['_template']} {doc['kind']}/{doc['metadata']['name']}: {exc.message} "
                f"at {'.'.join(str(p) for p in exc.path)}"
            )
    assert not by_kind(docs, "Secret"), "the chart must reference Secrets, never create them"


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return doc["spec"]["template"]["spec"]["containers"]


def test_pods_are_locked_down_and_probed(values_file: Path) -> None:
    for doc in render(load_values(values_file)):
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        tmp = [v for v in pod["volumes"] if v["name"] == "tmp"]
        assert tmp and "emptyDir" in tmp[0]
        for c in containers(doc):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert {"mountPath": "/tmp", "name": "tmp"} in c["volumeMounts"]
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
            for env in c.get("env", []):
                if env["name"] in SECRET_VARS:
                    assert "secretKeyRef" in env.get("valueFrom", {}), f"{env['name']}: not from a Secret"
            if doc["kind"] == "Deployment":
                assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
                if doc["metadata"]["labels"]["app.kubernetes.io/component"] != "api":  # its loop's heartbeat
                    assert c["livenessProbe"]["httpGet"]["port"] == "metrics"
                if doc["metadata"]["labels"]["app.kubernetes.io/component"] == "api":
                    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_every_role_runs_a_vigil_command() -> None:
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    docs = render(load_values(CHART / "ci" / "production-values.yaml"))
    roles = {}
    for doc in by_kind(docs, "Deployment") + by_kind(docs, "Job"):
        args = containers(doc)[0]["args"]
        roles[doc["metadata"]["name"]] = args[0]
    assert set(roles.values()) == {"serve", "consume", "judge-worker", "detector", "db"}
    missing_commands = {name: cmd for name, cmd in roles.items() if cmd not in commands}
    assert not missing_commands, f"not vigil commands: {missing_commands} (have {sorted(commands)})"


def secret_refs(doc: dict[str, Any]) -> set[str]:
    return {e["secretRef"]["name"] for c in containers(doc) for e in c.get("envFrom", []) if "secretRef" in e}


def test_llm_key_reaches_only_roles_that_call_a_provider() -> None:
    """Judge workers judge; the API runs pairwise comparisons and calibration (POST /v1/judges/...) itself."""
    values = load_values(CHART / "ci" / "production-values.yaml")
    llm = values["llm"]["existingSecret"]
    docs = render(values)
    api = one(docs, "Deployment", "-api")
    assert containers(api)[0]["args"] == ["serve", "--no-workers"]
    pods = by_kind(docs, "Deployment")
    holders = {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in pods if llm in secret_refs(d)}
    assert len(pods) == 4
    assert holders == {"api", "judge-worker"}
    assert not [d["metadata"]["name"] for d in by_kind(docs, "Job") if llm in secret_refs(d)]
    off = render({**values, "judges": {"enabled": False}})
    assert not [d["metadata"]["name"] for d in by_kind(off, "Deployment") if llm in secret_refs(d)]


def test_docs_role_table_matches_the_chart() -> None:
    from vigil.settings import PROJECT_ROOT

    values = load_values(CHART / "values.yaml")
    page = (PROJECT_ROOT / "docs" / "kubernetes.md").read_text()
    section = page.split("<!-- section:kubernetes -->", 1)[1]
    api_row = next(line for line in section.splitlines() if line.startswith("| API"))
    assert f"`{' '.join(['vigil', *values['api']['args']])}`" in api_row, api_row


def test_env_config_map_holds_only_real_settings(values_file: Path) -> None:
    docs = render(load_values(values_file))
    env = one(docs, "ConfigMap", "-env")["data"]
    fields = {f"VIGIL_{name.upper()}" for name in Settings.model_fields}
    unknown = sorted(k for k in env if k.startswith("VIGIL_") and k not in fields)
    assert not unknown, f"VIGIL_ variables that are no setting: {unknown}"
    assert not SECRET_VARS & set(env)


def test_replicas_detector_and_consumers() -> None:
    values = load_values(CHART / "ci" / "production-values.yaml")
    docs = render(values)
    assert one(docs, "Deployment", "-detector")["spec"]["replicas"] == 1
    assert one(docs, "Deployment", "-consumer")["spec"]["replicas"] == values["consumer"]["replicas"]
    assert one(docs, "Deployment", "-api")["spec"]["replicas"] == 3
    everything = render(load_values(CHART / "ci" / "everything-values.yaml"))
    consumer = one(everything, "Deployment", "-consumer")
    assert "replicas" not in consumer["spec"], "the HPA owns the replica count"
    hpa = one(everything, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == consumer["metadata"]["name"]
    assert {p["metadata"]["name"].rsplit("-", 1)[-1] for p in by_kind(everything, "PodDisruptionBudget")} == {
        "api",
        "consumer",
        "worker",
    }


def test_consumers_beyond_partitions_are_refused() -> None:
    h = helm()
    values = copy.deepcopy(load_values(CHART / "ci" / "production-values.yaml"))
    values["consumer"]["replicas"] = 13
    with pytest.raises(h.HelmRenderError, match=r"consumer.replicas \(13\) exceeds kafka.partitions \(12\)"):
        render(values)
    values["consumer"]["replicas"] = 2
    values["consumer"]["autoscaling"] = {"enabled": True, "maxReplicas": 20}
    with pytest.raises(h.HelmRenderError, match=r"maxReplicas \(20\) exceeds kafka.partitions \(12\)"):
        render(values)


def test_an_autoscaler_whose_minimum_exceeds_its_maximum_is_refused() -> None:
    h = helm()
    values = copy.deepcopy(load_values(CHART / "ci" / "production-values.yaml"))
    values["consumer"]["autoscaling"] = {"enabled": True, "minReplicas": 5, "maxReplicas": 2}
    with pytest.raises(h.HelmRenderError, match=r"minReplicas \(5\) exceeds maxReplicas \(2\)"):
        render(values)


def test_no_disruption_budget_blocks_a_node_drain() -> None:
    """minAvailable 1 of a single replica (the minimal install) allows no voluntary disruption: kubectl
    drain waits for ever. Such a budget is not rendered; with more replicas it is."""
    minimal = render(load_values(CHART / "ci" / "minimal-values.yaml"))
    assert not [p for p in by_kind(minimal, "PodDisruptionBudget") if p["metadata"]["name"].endswith("-api")]
    for docs in (minimal, render(load_values(CHART / "ci" / "production-values.yaml"))):
        replicas = {d["metadata"]["name"]: d["spec"].get("replicas") for d in by_kind(docs, "Deployment")}
        for pdb in by_kind(docs, "PodDisruptionBudget"):
            spec = pdb["spec"]
            n = replicas.get(pdb["metadata"]["name"])
            if "minAvailable" in spec and n is not None:
                assert spec["minAvailable"] < n, pdb["metadata"]["name"]
    production = render(load_values(CHART / "ci" / "production-values.yaml"))
    assert one(production, "PodDisruptionBudget", "-api")["spec"]["minAvailable"] == 1


def test_service_monitor_scrapes_the_services_the_chart_makes() -> None:
    docs = render(load_values(CHART / "ci" / "production-values.yaml"))
    monitor = one(docs, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [s for s in by_kind(docs, "Service") if selector.items() <= s["metadata"]["labels"].items()]
    ports = {p["name"] for s in services for p in s["spec"]["ports"]} - {"otlp-grpc"}  # OTLP in, not metrics
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == ports == {"http", "metrics"}
    workers = one(docs, "Service", "-workers")["spec"]["selector"]
    for d in by_kind(docs, "Deployment"):
        labels = d["spec"]["template"]["metadata"]["labels"]
        is_worker = d["metadata"]["labels"]["app.kubernetes.io/component"] != "api"
        assert (workers.items() <= labels.items()) == is_worker
        if is_worker:
            assert containers(d)[0]["ports"][0]["name"] == "metrics"


def test_service_monitor_targets_get_the_jobs_the_target_alerts_select() -> None:
    """Prometheus Operator names a target's job after its Service (``RELEASE-vigil``, ``RELEASE-vigil-workers``)
    unless the ServiceMonitor's ``jobLabel`` names a label of the Service: VigilTargetDown and
    VigilTargetsAbsent select jobs ``vigil`` and ``vigil-workers``, which only a release named ``vigil`` got."""
    rules = yaml.safe_load((PROJECT_ROOT / "dashboards" / "alerts.yaml").read_text())["groups"]
    exprs = [r["expr"] for g in rules for r in g["rules"] if r["alert"] in ("VigilTargetDown", "VigilTargetsAbsent")]
    assert len(exprs) == 2
    (selector,) = {m for e in exprs for m in re.findall(r'job=~"([^"]+)"', e)}
    production = load_values(CHART / "ci" / "production-values.yaml")
    overridden = {**production, "fullnameOverride": "agents-watch"}
    for release, values in (("vigil", production), ("prod", production), ("vigil-prod", production), ("x", overridden)):
        docs = render(values, name=release)
        monitor = one(docs, "ServiceMonitor")
        selected = [
            s
            for s in by_kind(docs, "Service")
            if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        ]
        # the operator's relabelling: the Service's name, replaced by its jobLabel label where that is set
        jobs = {
            s["metadata"]["labels"].get(monitor["spec"].get("jobLabel", ""), s["metadata"]["name"]) for s in selected
        }
        assert jobs == {"vigil", "vigil-workers"}, (release, jobs)
        assert all(re.fullmatch(selector, job) for job in jobs)


def test_ingress_routes_to_the_api_service() -> None:
    docs = render(load_values(CHART / "ci" / "everything-values.yaml"))
    ingress = one(docs, "Ingress")
    api = one(docs, "Service", "watch")
    backends = {p["backend"]["service"]["name"] for r in ingress["spec"]["rules"] for p in r["http"]["paths"]}
    assert backends == {api["metadata"]["name"]}
    assert ingress["spec"]["tls"][0]["secretName"] == "vigil-tls"


def test_ingress_exposes_only_the_api_and_the_ui() -> None:
    for name in ("production-values", "everything-values"):
        ingress = one(render(load_values(CHART / "ci" / f"{name}.yaml")), "Ingress")
        paths = [p["path"] for r in ingress["spec"]["rules"] for p in r["http"]["paths"]]
        assert all(p == "/v1" or p == "/ui" or p.startswith(("/v1/", "/ui/")) for p in paths), paths
    defaults = load_values(CHART / "values.yaml")
    assert [p["path"] for p in defaults["ingress"]["hosts"][0]["paths"]] == ["/v1", "/ui"]
    h = helm()
    for path in ("/", "/metrics", "/docs", "/openapi.json", "/v10"):
        values = {**load_values(CHART / "ci" / "minimal-values.yaml")}
        values["ingress"] = {
            "enabled": True,
            "hosts": [{"host": "v.example.com", "paths": [{"path": path, "pathType": "Prefix"}]}],
        }
        with h.Chart.load(CHART) as chart, pytest.raises(Exception, match="pattern|does not match"):
            chart.validate_schema(values)


def test_network_policies_limit_who_reaches_the_pods() -> None:
    docs = render(load_values(CHART / "ci" / "everything-values.yaml"))
    policies = {d["metadata"]["name"]: d for d in by_kind(docs, "NetworkPolicy")}
    assert sorted(n.rsplit("-", 1)[1] for n in policies) == ["api", "egress", "workers"]
    api = next(p for n, p in policies.items() if n.endswith("-api"))
    [rule] = api["spec"]["ingress"]
    assert {p["port"] for p in rule["ports"]} == {"http", "otlp-grpc"}
    assert rule["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ingress-nginx"}
    api_pods = one(docs, "Deployment", "-api")["spec"]["template"]["metadata"]["labels"]
    assert api["spec"]["podSelector"]["matchLabels"].items() <= api_pods.items()
    workers = next(p for n, p in policies.items() if n.endswith("-workers"))
    assert [p["port"] for p in workers["spec"]["ingress"][0]["ports"]] == ["metrics"]
    egress = next(p for n, p in policies.items() if n.endswith("-egress"))
    assert egress["spec"]["policyTypes"] == ["Egress"] and egress["spec"]["egress"][0]["ports"]
    for doc in policies.values():
        clean = {k: v for k, v in doc.items() if k != "_template"}
        kubernetes_validate.validate(clean, KUBE_VERSION, strict=True)
    assert not by_kind(render(load_values(CHART / "ci" / "minimal-values.yaml")), "NetworkPolicy")  # off by default


def test_the_api_serves_otlp_grpc_on_the_standard_port() -> None:
    docs = render(load_values(CHART / "ci" / "production-values.yaml"))
    service = one(docs, "Service", "vigil")
    assert {
        "name": "otlp-grpc",
        "port": 4317,
        "targetPort": "otlp-grpc",
        "protocol": "TCP",
        "appProtocol": "grpc",
    } in service["spec"]["ports"]
    ports = containers(one(docs, "Deployment", "-api"))[0]["ports"]
    assert {"name": "otlp-grpc", "containerPort": 4317, "protocol": "TCP"} in ports
    env = one(docs, "ConfigMap", "-env")["data"]
    assert env["VIGIL_OTLP_GRPC_PORT"] == "4317"
