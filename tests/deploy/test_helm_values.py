"""values.schema.json refuses bad values at install time, with a message naming the value."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.support.helm_chart import CHART, helm, load_values, render

BASE = {
    "database": {"existingSecret": "vigil-db"},
    "api": {"replicas": 1},
    "kafka": {"bootstrapServers": "kafka:9092"},
}


def merged(patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


BAD = [
    ({"database": {"existingSecret": ""}}, "/database/existingSecret", "minLength"),
    (
        {"database": {"existingSecret": "vigil-db", "url": "postgresql://vigil:pw@db/vigil"}},
        "/database",
        "'url' not allowed",
    ),
    (
        {"config": {"VIGIL_DATABASE_URL": "postgresql://vigil:pw@db/vigil"}},
        "/config/VIGIL_DATABASE_URL",
        "never inline: use database.existingSecret",
    ),
    ({"config": {"VIGIL_API_KEYS": "ops:admin:k"}}, "/config/VIGIL_API_KEYS", "never inline"),
    ({"extraEnv": [{"name": "VIGIL_API_KEYS", "value": "ops:admin:k"}]}, "/extraEnv/0/value", "never inline"),
    ({"config": {"judge_concurrency": 4}}, "/config", "'judge_concurrency' not allowed"),
    ({"config": {"VIGIL_JUDGE_CONCURENCY": 4}}, "/config", "'VIGIL_JUDGE_CONCURENCY' not allowed"),
    ({"config": {"VIGIL_KAFKA_GROUP_ID": "other"}}, "/config/VIGIL_KAFKA_GROUP_ID", "use kafka.groupId"),
    ({"config": {"VIGIL_PORT": 9000}}, "/config/VIGIL_PORT", "set by the chart"),
    ({"consumer": {"replicas": "three"}}, "/consumer/replicas", "want integer"),
    ({"consumer": {"replicas": -1}}, "/consumer/replicas", "minimum"),
    ({"image": {"repository": "vigil", "pullPolicy": "Sometimes"}}, "/image/pullPolicy", "IfNotPresent"),
    ({"kafka": {"bootstrapServers": "kafka"}}, "/kafka/bootstrapServers", "does not match pattern"),
    ({"kafka": {"partitions": 0}}, "/kafka/partitions", "minimum"),
    ({"rules": {"packs": ["../../etc/passwd"]}}, "/rules/packs/0", "does not match pattern"),
    ({"detector": {"replicas": 2}}, "/detector", "'replicas' not allowed"),
    ({"apiKey": "ops:admin:k"}, "", "'apiKey' not allowed"),
    ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "/metrics/serviceMonitor/interval", "pattern"),
    ({"api": {"resources": {"requests": {"cpu": "lots"}}}}, "/api/resources/requests/cpu", ""),
]


@pytest.mark.parametrize(("patch", "where", "says"), BAD, ids=[b[1] or b[2] for b in BAD])
def test_schema_refuses_bad_values(patch: dict[str, Any], where: str, says: str) -> None:
    h = helm()
    with h.Chart.load(CHART) as chart, pytest.raises(h.HelmValuesError) as caught:
        chart.validate_schema(merged(patch))
    message = str(caught.value)
    assert f"at '{where}" in message and says in message, message


def test_lint_reports_schema_errors() -> None:
    report = helm().lint(CHART, merged({"consumer": {"replicas": "three"}}))
    text = " ".join(report["errors"] + [m["error"] for m in report["messages"]])
    assert "/consumer/replicas" in text


@pytest.mark.parametrize(
    ("patch", "says"),
    [
        ({"consumer": {"replicas": 7}}, "consumer.replicas (7) exceeds kafka.partitions (6)"),
        ({"kafka": {"bootstrapServers": ""}}, "kafka.bootstrapServers is required"),
        ({"api": {"replicas": 2}}, "review.sessionSecret.existingSecret"),
        ({"rules": {"packs": ["missing.yaml"]}}, '"missing.yaml" matches no rule pack of the chart'),
    ],
)
def test_template_checks_explain_themselves(patch: dict[str, Any], says: str) -> None:
    h = helm()
    with pytest.raises(h.HelmRenderError) as caught:
        render(merged(patch))
    assert says in str(caught.value)


def test_several_api_replicas_need_shared_api_keys() -> None:
    """Each pod would otherwise generate its own admin key, and a load-balanced client fails on the others."""
    h = helm()
    shared_ui = {"review": {"sessionSecret": {"existingSecret": "vigil-ui"}}}
    with pytest.raises(h.HelmRenderError) as caught:
        render(merged({"api": {"replicas": 2}, **shared_ui}))
    message = str(caught.value)
    assert "api.replicas > 1 needs apiKeys.existingSecret" in message and "own admin key" in message
    with pytest.raises(h.HelmRenderError) as caught:
        render(merged({"api": {"replicas": 3}}))
    assert "apiKeys.existingSecret" in str(caught.value) and "review.sessionSecret" in str(caught.value)
    assert render(merged({"api": {"replicas": 2}, "apiKeys": {"existingSecret": "vigil-api-keys"}, **shared_ui}))
    from_extra = [{"name": "VIGIL_API_KEYS", "secretName": "keys", "key": "k"}]
    assert render(merged({"api": {"replicas": 2}, "extraSecretEnv": from_extra, **shared_ui}))
    assert render(merged({"api": {"replicas": 2, "enabled": False}}))
    assert render(merged({"api": {"replicas": 1}}))


def test_good_values_pass() -> None:
    assert render(merged({}))
    assert render(load_values(CHART / "ci" / "minimal-values.yaml"))


def test_judging_off_runs_no_judge_workers() -> None:
    docs = render(merged({"judges": {"enabled": False}}))
    names = [d["metadata"]["name"] for d in docs if d["kind"] in ("Deployment", "PodDisruptionBudget")]
    assert not [n for n in names if "judge" in n]
    env = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-env"))
    assert env["data"]["VIGIL_JUDGE_ENABLED"] == "false"


def test_config_takes_every_setting_by_its_exact_name() -> None:
    """`config` accepted any VIGIL_[A-Z0-9_]+ name: a typo (VIGIL_JUDGE_CONCURENCY) was installed and
    silently ignored by Vigil, and a name the chart sets itself (VIGIL_KAFKA_GROUP_ID, VIGIL_PORT) was
    written a second time into the ConfigMap. The schema lists every setting: the chart's own are refused
    naming the value to use instead, secrets are refused, any other is accepted."""
    import json

    from vigil.settings import Settings

    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["config"]
    names = {"VIGIL_" + name.upper() for name in Settings.model_fields}
    assert set(schema["properties"]) == names and schema["additionalProperties"] is False
    refused = {k for k, v in schema["properties"].items() if "const" in v}
    rendered = render(merged({}))
    (env,) = [d for d in rendered if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-env")]
    assert {k for k in env["data"] if k.startswith("VIGIL_")} <= refused
