"""``vigil rules evaluate`` and ``GET /v1/rules/quality`` on real τ² runs, from files and from stored traffic."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import REVIEWER, make_client, make_settings
from tests.support.cli import cli_runner
from tests.support.services import shared_data
from vigil.app.cli import app
from vigil.app.runtime import build_runtime
from vigil.evaluation import quality
from vigil.ingest.importers import load_file
from vigil.settings import PROJECT_ROOT

AIRLINE = ("tau2", "trajectories", "sierra_gpt-4.1_airline_default_gpt-4.1_1trials.json")
RETAIL = ("tau2", "trajectories", "sierra_gpt-4.1_retail_defautl_gpt-4.1_1trials.json")
PACKS = PROJECT_ROOT / "rules"


def _json(result) -> dict:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output
    return orjson.loads(result.stdout)


def _by_hand(path: Path, pack: str, hit) -> tuple[int, int, int, int]:  # type: ignore[no-untyped-def]
    """(flagged failures, failures, flagged successes, successes) of a pack, computed here without the stage."""
    from vigil.rules import RuleEngine

    engine = RuleEngine.from_paths(sorted(PACKS.glob("*.yaml")))
    a = f = b = g = 0
    for conv in load_file(path):
        if pack not in {r.pack for r in engine.rules_for(conv.agent_id, conv.agent_version)}:
            continue
        findings = [x for x in engine.evaluate(conv) if next(r.pack for r in engine.rules if r.id == x.rule_id) == pack]
        failed = conv.outcomes[0].value < 1
        flagged = any(hit(x) for x in findings)
        f += failed
        g += not failed
        a += failed and flagged
        b += flagged and not failed
    return a, f, b, g


def test_evaluate_files_per_pack_rule_and_severity() -> None:
    path = shared_data(*AIRLINE)
    runner = cli_runner()
    report = _json(
        runner.invoke(
            app,
            [
                "rules",
                "evaluate",
                str(path),
                "--json",
                "--packs",
                str(PACKS / "tau2_airline.yaml"),
                "--packs",
                str(PACKS / "default.yaml"),
            ],
        )
    )
    assert report["outcome"] == "task_success" and report["review_threshold"] == "medium"
    assert report["conversations"] == 20 and report["failures"] == 10
    packs = {p["pack"]: p for p in report["packs"]}
    assert set(packs) == {"default", "tau2-airline"}
    airline = packs["tau2-airline"]
    a, f, b, g = _by_hand(path, "tau2-airline", lambda x: x.severity in ("medium", "high", "critical"))
    review = airline["review"]
    assert (review["firing_at_failure"]["x"], review["firing_at_failure"]["n"]) == (a, f)
    assert (review["firing_at_success"]["x"], review["firing_at_success"]["n"]) == (b, g)
    assert review["recall"] == review["firing_at_failure"]
    assert review["precision"]["n"] == a + b
    medium = next(lv for lv in airline["at_or_above"] if lv["severity"] == "medium")
    assert medium["firing_at_failure"] == review["firing_at_failure"]  # the default policy queues medium and up
    rule_ids = {r["rule_id"] for r in airline["rules"]}
    assert {r["rule_id"] for r in airline["rules"]} >= {"airline-confirm-before-write"} and rule_ids
    for r in airline["rules"]:
        e = r["firing_rate"]
        assert e["n"] == 20 and (e["value"] is None or e["low"] <= e["value"] <= e["high"])

    text = runner.invoke(app, ["rules", "evaluate", str(path), "--packs", str(PACKS / "tau2_airline.yaml")])
    assert text.exit_code == 0, text.output
    assert "pack tau2-airline" in text.stdout and "queues for review" in text.stdout and "lift" in text.stdout


def test_lift_and_intervals() -> None:
    m = quality.measure([True] * 6 + [False] * 4 + [True] * 2 + [False] * 8, [True] * 10 + [False] * 10)
    assert m["recall"]["value"] == pytest.approx(0.6) and m["firing_at_success"]["value"] == pytest.approx(0.2)
    assert m["precision"]["value"] == pytest.approx(6 / 8)
    lift = m["lift"]
    assert lift["value"] == pytest.approx(3.0)
    se = math.sqrt(1 / 6 - 1 / 10 + 1 / 2 - 1 / 10)
    assert lift["low"] == pytest.approx(3 * math.exp(-1.959964 * se), rel=1e-4)
    assert lift["high"] == pytest.approx(3 * math.exp(1.959964 * se), rel=1e-4)
    # no firing at success: an infinite point, a finite interval from the corrected cells
    never = quality.lift(4, 10, 0, 10)
    assert never["value"] is None and never["infinite"] and 0 < never["low"] < 9 < never["high"] < math.inf
    # Wilson at the edges stays inside [0, 1]
    w = quality.wilson(0, 10)
    assert w["value"] == 0 and w["low"] == 0 and 0.2 < w["high"] < 0.35


def test_evaluate_stored_traffic_matches_files_and_api(sqlite_url: str) -> None:
    path = shared_data(*RETAIL)
    packs = f"{PACKS / 'tau2_retail.yaml'},{PACKS / 'default.yaml'}"
    settings = make_settings(sqlite_url, rule_packs=packs)
    rt = build_runtime(settings, CollectorRegistry(), migrate=True)
    rt.pipeline.process(list(load_file(path)), "test")
    runner = cli_runner()
    from_file = _json(
        runner.invoke(
            app,
            [
                "rules",
                "evaluate",
                str(path),
                "--json",
                "--packs",
                str(PACKS / "tau2_retail.yaml"),
                "--packs",
                str(PACKS / "default.yaml"),
            ],
        )
    )
    env = {"VIGIL_DATABASE_URL": sqlite_url, "VIGIL_RULE_PACKS": packs}
    stored = _json(runner.invoke(app, ["rules", "evaluate", "--stored", "--json"], env=env))
    assert stored["conversations"] == from_file["conversations"] == 40
    assert stored["packs"] == from_file["packs"]
    # a bad outcome (the flagging policy flags it when it happens) that never happened: nobody failed
    bad = _json(runner.invoke(app, ["rules", "evaluate", "--stored", "--json", "--outcome", "escalation"], env=env))
    assert bad["conversations"] == 40 and bad["failures"] == 0 and bad["without_outcome"] == 0
    nobody = runner.invoke(app, ["rules", "evaluate", "--stored", "--agent", "nobody"], env=env)
    assert nobody.exit_code == 2, nobody.output
    # the filter that matched nothing is named: the outcome itself is recorded
    assert "no conversation of agent 'nobody' has the outcome 'task_success'" in nobody.output
    agent = next(iter(load_file(path))).agent_id
    args = ["rules", "evaluate", "--stored", "--outcome", "task_success", "--agent", agent, "--version", "v9"]
    unknown_version = runner.invoke(app, args, env=env)
    assert unknown_version.exit_code == 2, unknown_version.output
    assert f"no conversation of agent {agent!r} at version 'v9' has the outcome 'task_success'" in (
        unknown_version.output
    )
    future = runner.invoke(app, ["rules", "evaluate", "--stored", "--since", "2999-01-01T00:00:00"], env=env)
    assert future.exit_code == 2 and "no conversation since 2999-01-01T00:00:00" in future.output, future.output
    with make_client(rt) as client:
        r = client.get("/v1/rules/quality", params={"outcome": "task_success"}, headers=REVIEWER)
        assert r.status_code == 200, r.text
        assert r.json()["packs"] == from_file["packs"]
        # since is an instant: an hour ago written at +14:00 or -12:00 covers the same traffic
        hour_ago = datetime.now(UTC) - timedelta(hours=1)
        for offset in (14, -12):
            at = hour_ago.astimezone(timezone(timedelta(hours=offset))).isoformat()
            got = client.get("/v1/rules/quality", params={"outcome": "task_success", "since": at}, headers=REVIEWER)
            assert got.status_code == 200 and got.json()["conversations"] == 40, (at, got.text[:200])
        assert client.get("/v1/rules/quality").status_code == 401
        assert client.get("/v1/rules/quality", params={"outcome": "csat"}, headers=REVIEWER).status_code == 404


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    runner = cli_runner()
    r = runner.invoke(app, ["rules", "evaluate", str(tmp_path / "absent.json")])
    assert r.exit_code == 2 and "no such file" in r.output
    junk = tmp_path / "junk.jsonl"
    junk.write_text("{not json\n")
    r = runner.invoke(app, ["rules", "evaluate", str(junk)])
    assert r.exit_code == 2 and "junk.jsonl" in r.output
    r = runner.invoke(app, ["rules", "evaluate", str(shared_data(*AIRLINE)), "--outcome", "csat"])
    assert r.exit_code == 2 and "no conversation has the outcome 'csat'" in r.output
    r = runner.invoke(app, ["rules", "evaluate"])
    assert r.exit_code == 2 and "FILES or --stored" in r.output


def test_evaluate_counts_every_signal_as_a_scan_per_signal_would() -> None:
    """The one-pass count per pack gives every signal the figures of a separate scan per signal."""
    import random

    from vigil.schema import SEVERITY_RANK

    rng = random.Random(7)
    severities = ["info", "low", "medium", "high", "critical"]
    rules = [quality.RuleInfo(f"p{i % 3}", f"r{i}", rng.choice(severities), "t") for i in range(12)]
    obs = []
    for k in range(600):
        fired = tuple(
            quality.Fired(r.pack, r.rule_id, r.severity, rng.random() < 0.3) for r in rules if rng.random() < 0.08
        )
        packs = frozenset(p for p in ("p0", "p1", "p2") if rng.random() < 0.8) | {f.pack for f in fired}
        obs.append(quality.Observation(f"c{k}", None, rng.random() < 0.35, packs, fired))
    report = quality.evaluate(obs, rules, "task_success", "medium").as_dict()

    def by_scan(scope, hit):  # type: ignore[no-untyped-def]
        return quality.measure([hit(o) for o in scope], [o.failed for o in scope])

    assert [p["pack"] for p in report["packs"]] == ["p0", "p1", "p2"]
    for p in report["packs"]:
        pack = p["pack"]
        scope = [o for o in obs if pack in o.packs]
        assert p["any"] == by_scan(scope, lambda o, pack=pack: any(f.pack == pack for f in o.findings))
        assert p["review"] == by_scan(scope, lambda o, pack=pack: any(f.pack == pack and f.queues for f in o.findings))
        for level in p["at_or_above"]:
            rank = SEVERITY_RANK[level["severity"]]
            expected = by_scan(
                scope,
                lambda o, pack=pack, rank=rank: any(
                    f.pack == pack and SEVERITY_RANK[f.severity] >= rank for f in o.findings
                ),
            )
            assert {k: v for k, v in level.items() if k != "severity"} == expected
        for rule in p["rules"]:
            expected = by_scan(scope, lambda o, rid=rule["rule_id"]: any(f.rule_id == rid for f in o.findings))
            assert {k: v for k, v in rule.items() if k not in ("rule_id", "rule_type", "severity")} == expected
        assert p["any"]["flagged"] > 0 and len(p["rules"]) == 4
