"""Per-task rows of `GET /v1/compare` and `vigil compare`: paired over shared tasks, clustered by task,
pass^k where tasks repeat, error and truncation rates, and each side's protocol (SQLite and Postgres)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from tests.support.app import INGEST, REVIEWER, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.store.models import VerdictRow


def conversation(
    version: str, task: str, rollout: int, success: bool, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    cid = f"{version}:{task}:{rollout}"
    return {
        "conversation_id": cid,
        "revision": 1,
        "status": "finished",
        "agent_id": "bench-bot",
        "agent_version": version,
        "task_id": task,
        "messages": [{"role": "user", "content": f"task {task}"}, {"role": "assistant", "content": "done"}],
        "metadata": metadata or {},
        "outcomes": [{"type": "task_success", "value": 1.0 if success else 0.0, "idempotency_key": f"{cid}:ok"}],
    }


def store(c: Any, batch: list[dict[str, Any]]) -> None:
    for i in range(0, len(batch), 200):
        r = c.post("/v1/conversations", json=batch[i : i + 200], headers=INGEST)
        assert r.status_code == 202, r.text


def rows_of(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["signal"]: s for s in body["signals"]}


@pytest.fixture
def eighty_to_ninety(db_url):  # type: ignore[no-untyped-def]
    """200 tasks, one rollout each: the baseline solves the first 80, the candidate the first 90."""
    rt = build_runtime(make_settings(db_url, compare_bootstrap_resamples=100), registry=CollectorRegistry())
    with make_client(rt) as c:
        store(c, [conversation("v1", f"t{i:03d}", 0, i < 80) for i in range(200)])
        store(c, [conversation("v2", f"t{i:03d}", 0, i < 90) for i in range(200)])
        yield rt, c
    rt.close()


def test_80_to_90_of_200_paired_through_the_api(eighty_to_ninety) -> None:
    _, c = eighty_to_ninety
    r = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tasks"]["shared"] == 200 and body["tasks"]["paired"]
    success = rows_of(body)["tasks:success"]
    assert success["paired"] and "paired over 200 shared tasks" in success["label"]
    d = success["difference"]
    assert d["value"] == pytest.approx(0.05) and d["n"] == 200
    assert d["se"] == pytest.approx(0.0155, abs=0.0005)
    assert d["low"] == pytest.approx(0.02, abs=0.002) and d["high"] == pytest.approx(0.08, abs=0.002)
    assert success["verdict"] == "better"
    assert success["baseline"]["value"] == pytest.approx(0.40) and success["candidate"]["value"] == pytest.approx(0.45)
    # the unpaired rate row over conversations cannot tell the same improvement apart
    assert rows_of(body)["outcome:task_success"]["verdict"] == "not yet distinguishable"
    # one rollout per task: all-pass equals success, no pass^k beyond k = 1
    assert rows_of(body)["tasks:all_pass"]["informational"]
    assert not [s for s in rows_of(body) if s.startswith("tasks:pass")]


def test_80_to_90_of_200_paired_through_the_cli(eighty_to_ninety, monkeypatch) -> None:
    rt, _ = eighty_to_ninety
    from vigil.app.cli import app

    monkeypatch.setenv("VIGIL_DATABASE_URL", rt.settings.database_url_str)
    monkeypatch.setenv("VIGIL_COMPARE_BOOTSTRAP_RESAMPLES", "100")
    monkeypatch.setenv("COLUMNS", "220")
    runner = CliRunner()
    result = runner.invoke(app, ["compare", "--baseline", "v1", "--candidate", "v2", "--json"])
    assert result.exit_code == 0, result.output
    d = rows_of(orjson.loads(result.stdout))["tasks:success"]["difference"]
    assert d["value"] == pytest.approx(0.05) and d["se"] == pytest.approx(0.0155, abs=0.0005)
    table = runner.invoke(app, ["compare", "--baseline", "v1", "--candidate", "v2"])
    assert table.exit_code == 0, table.output
    assert "task success (paired over 200 shared tasks)" in table.stdout
    assert "+5.0 pp [+2.0, +8.0]" in table.stdout and "SE 1.5 pp" in table.stdout
    same = runner.invoke(app, ["compare", "--baseline", "v1", "--candidate", "v1"])
    assert same.exit_code == 2 and "compared with itself" in same.output


def test_multi_rollout_tasks_cluster_and_pass_hat_k(sqlite_url) -> None:
    """20 tasks x 4 rollouts: tasks are the sample; pass^2 and pass^4 appear; all-pass/all-fail fractions."""
    rt = build_runtime(make_settings(sqlite_url, compare_bootstrap_resamples=100), registry=CollectorRegistry())
    # baseline: tasks 0-9 always pass, 10-19 always fail; candidate: tasks 0-9 pass on 3 of 4 rollouts
    base = [conversation("v1", f"t{t}", r, t < 10) for t in range(20) for r in range(4)]
    cand = [conversation("v2", f"t{t}", r, t < 10 and r < 3) for t in range(20) for r in range(4)]
    with make_client(rt) as c:
        store(c, base + cand)
        body = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER).json()
    rows = rows_of(body)
    assert body["tasks"]["ks"] == [2, 4] and body["tasks"]["baseline"]["repeated"] == 20
    success = rows["tasks:success"]
    assert success["difference"]["value"] == pytest.approx(-0.125) and success["difference"]["n"] == 20
    # clustered by task: the baseline's SE is that of 20 task means (0 or 1), not of 80 rollouts
    assert success["baseline"]["se"] == pytest.approx(0.5 * (20 / 19) ** 0.5 / 20**0.5, rel=1e-6)
    assert rows["tasks:pass^4"]["baseline"]["value"] == pytest.approx(0.5)
    assert rows["tasks:pass^4"]["candidate"]["value"] == pytest.approx(0.0)
    assert rows["tasks:pass^4"]["verdict"] == "worse" and rows["tasks:pass^4"]["paired"]
    assert rows["tasks:pass^2"]["candidate"]["value"] == pytest.approx(0.5 * 3 / 6)
    assert rows["tasks:pass@4"]["informational"] and rows["tasks:pass@4"]["candidate"]["value"] == pytest.approx(0.5)
    assert rows["tasks:all_pass"]["candidate"]["value"] == 0.0 and rows["tasks:all_fail"]["baseline"]["value"] == 0.5
    assert rows["tasks:all_pass"]["p_adjusted"] is None  # informational rows are not tested
    rt.close()


def test_task_success_counts_each_task_once_on_both_sides_and_in_the_difference(sqlite_url) -> None:
    """Each task has the same success rate in both versions, only run more often in one: no change."""
    rt = build_runtime(make_settings(sqlite_url, compare_bootstrap_resamples=100), registry=CollectorRegistry())
    trials = {"v1": {"a": 6, "b": 1, "c": 1, "d": 1}, "v2": {"a": 1, "b": 6, "c": 1, "d": 1}}
    batch = [
        conversation(v, task, r, task == "a")
        for v, counts in trials.items()
        for task, n in counts.items()
        for r in range(n)
    ]
    with make_client(rt) as c:
        store(c, batch)
        body = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER).json()
    success = rows_of(body)["tasks:success"]
    # pooled over trials the sides read 6/9 and 1/9 beside a paired difference of 0
    assert success["paired"] and success["difference"]["value"] == pytest.approx(0.0)
    assert success["baseline"]["value"] == pytest.approx(0.25) and success["candidate"]["value"] == pytest.approx(0.25)
    assert success["verdict"] == "not yet distinguishable"
    rt.close()


def test_error_and_truncation_rates_are_their_own_rows(sqlite_url) -> None:
    rt = build_runtime(make_settings(sqlite_url, compare_bootstrap_resamples=100), registry=CollectorRegistry())

    def ended(i: int, version: str, errors: int, truncations: int) -> dict[str, Any]:
        reason = "agent_error" if i < errors else "max_steps" if i < errors + truncations else "user_stop"
        return conversation(version, f"t{i}", 0, reason == "user_stop", {"termination_reason": reason})

    with make_client(rt) as c:
        store(c, [ended(i, "v1", 2, 3) for i in range(60)] + [ended(i, "v2", 20, 3) for i in range(60)])
        body = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER).json()
    rows = rows_of(body)
    err, trunc = rows["error_rate"], rows["truncation_rate"]
    assert err["baseline"]["value"] == pytest.approx(2 / 60) and err["candidate"]["value"] == pytest.approx(20 / 60)
    assert err["verdict"] == "worse" and err["paired"]
    assert trunc["baseline"]["value"] == trunc["candidate"]["value"] == pytest.approx(3 / 60)
    assert trunc["verdict"] == "not yet distinguishable"
    rt.close()


def test_protocol_differences_and_a_changed_grader(db_url) -> None:
    """Model and grader differ; the judge's version differs: those rows say "grader changed", not worse."""
    rt = build_runtime(make_settings(db_url, compare_bootstrap_resamples=100), registry=CollectorRegistry())
    meta_b = {"model": "gpt-4.1", "temperature": 0.0, "harness": "runner 1", "grader": "exact-match v1"}
    meta_c = {"model": "gpt-5", "temperature": 0.0, "harness": "runner 1", "grader": "llm-rubric v2"}
    with make_client(rt) as c:
        # the candidate looks far worse on success, but under another grader
        store(c, [conversation("v1", f"t{i}", 0, i < 45, meta_b) for i in range(50)])
        store(c, [conversation("v2", f"t{i}", 0, i < 5, meta_c) for i in range(50)])
        with rt.sessions.begin() as s:
            for version, judge_version, fails in (("v1", "1", 0), ("v2", "2", 30)):
                s.add_all(
                    VerdictRow(
                        judge="helpful",
                        judge_version=judge_version,
                        conversation_id=f"{version}:t{i}:0",
                        revision=1,
                        agent_id="bench-bot",
                        agent_version=version,
                        verdict="fail" if i < fails else "pass",
                        categories=[],
                        model="judge-model",
                        prompt_hash="h",
                        reason="sampled",
                    )
                    for i in range(50)
                )
        body = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER).json()
        q = {"agent": "bench-bot", "version": "v2", "signal": "judge:helpful"}
        failing = c.get("/v1/compare/conversations", params=q, headers=REVIEWER).json()
        assert failing["total"] == 30 and failing["what"] == "the judge helpful failed"
    proto = {p["key"]: p for p in body["protocol"]}
    assert not body["comparable"]
    assert not proto["model"]["same"] and proto["model"]["baseline"] == [{"value": "gpt-4.1", "conversations": 50}]
    assert proto["sampling"]["same"] and proto["harness"]["same"]
    assert not proto["grader"]["same"] and not proto["judge:helpful"]["same"]
    assert proto["rule_packs"]["same"]
    rows = rows_of(body)
    for signal in ("tasks:success", "outcome:task_success", "judge:helpful"):
        assert rows[signal]["verdict"] == "grader changed", signal
        assert rows[signal]["grader_changed"] and rows[signal]["p_adjusted"] is None
        assert not rows[signal]["red_flag"]
    assert set(body["graders_changed"]) >= {"tasks:success", "outcome:task_success", "judge:helpful"}
    rt.close()


def test_a_quiet_judge_keeps_its_protocol_row_beside_a_busy_one(db_url) -> None:
    """Each judge's versions come from its own newest verdicts: a judge with more recent verdicts than the
    protocol's sample does not push another judge's version change out of the comparison."""
    from datetime import timedelta

    from vigil.store.db import utcnow

    settings = make_settings(db_url, compare_bootstrap_resamples=100, compare_metadata_sample=10)
    rt = build_runtime(settings, registry=CollectorRegistry())
    now = utcnow()
    with make_client(rt) as c:
        store(c, [conversation(v, f"t{i}", 0, True) for v in ("v1", "v2") for i in range(30)])
        with rt.sessions.begin() as s:
            for version, quiet_version in (("v1", "1"), ("v2", "2")):
                for judge, judge_version, age in (("quiet", quiet_version, 60), ("busy", "1", 0)):
                    s.add_all(
                        VerdictRow(
                            judge=judge,
                            judge_version=judge_version,
                            conversation_id=f"{version}:t{i}:0",
                            revision=1,
                            agent_id="bench-bot",
                            agent_version=version,
                            verdict="pass",
                            categories=[],
                            model="judge-model",
                            prompt_hash="h",
                            reason="sampled",
                            created_at=now - timedelta(minutes=age + i),
                        )
                        for i in range(30)
                    )
        body = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER).json()
    proto = {p["key"]: p for p in body["protocol"]}
    assert proto["judge:busy"]["same"]
    assert not proto["judge:quiet"]["same"], proto.get("judge:quiet")
    assert proto["judge:quiet"]["baseline"][0]["value"] == "quiet v1 (judge-model)"
    assert rows_of(body)["judge:quiet"]["verdict"] == "grader changed"
    rt.close()


def test_a_rule_that_applies_to_one_side_only_is_a_changed_grader(sqlite_url, tmp_path) -> None:
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "pack: newer\n"
        "rules:\n"
        "  - id: no-done\n"
        "    type: regex\n"
        "    severity: medium\n"
        "    applies_to: {versions: [v2]}\n"
        "    args: {pattern: done, mode: must_not_match}\n"
    )
    settings = make_settings(sqlite_url, rule_packs=str(pack), compare_bootstrap_resamples=100)
    rt = build_runtime(settings, registry=CollectorRegistry())
    with make_client(rt) as c:
        store(c, [conversation(v, f"t{i}", 0, True) for v in ("v1", "v2") for i in range(30)])
        body = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER).json()
    row = rows_of(body)["rule:no-done"]
    assert row["candidate"]["value"] == 1.0 and row["verdict"] == "grader changed"
    assert "applies to the candidate only" in row["grader_changed"]
    assert not {p["key"]: p for p in body["protocol"]}["rule_packs"]["same"]
    rt.close()


def test_a_version_compared_with_itself_is_refused(eighty_to_ninety) -> None:
    """A 422, as the API's other refused parameters are, with the sentence saying why."""
    _, c = eighty_to_ninety
    r = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v1"}, headers=REVIEWER)
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == (
        "baseline and candidate are both 'v1': a version compared with itself shows no difference; "
        "pick two different versions"
    )


def test_the_conversations_behind_a_row(db_url) -> None:
    rt = build_runtime(make_settings(db_url, compare_bootstrap_resamples=100), registry=CollectorRegistry())

    def ended(i: int, version: str) -> dict[str, Any]:
        reason = "agent_error" if i < 3 else "user_stop"
        return conversation(version, f"t{i}", 0, i >= 7, {"termination_reason": reason})

    with make_client(rt) as c:
        store(c, [ended(i, v) for v in ("v1", "v2") for i in range(60)])

        def behind(signal: str, **params: Any) -> Any:
            q = {"agent": "bench-bot", "version": "v2", "signal": signal, **params}
            return c.get("/v1/compare/conversations", params=q, headers=REVIEWER)

        failed = behind("tasks:success").json()
        assert failed["total"] == 7 and {x["task_id"] for x in failed["conversations"]} == {f"t{i}" for i in range(7)}
        assert all(x["agent_version"] == "v2" for x in failed["conversations"])
        errors = behind("error_rate").json()
        assert errors["total"] == 3 and errors["what"] == "that ended in an error"
        steps = behind("steps", offset=50).json()
        assert len(steps["conversations"]) == 10 and not steps["more"]
        assert behind("rule:no-such-thing").json()["total"] == 0
        assert behind("judge:helpful").json()["total"] == 0
        r = behind("nonsense")
        assert r.status_code == 404 and "no compare signal 'nonsense'" in r.json()["detail"]
        for empty in ("judge:", "rule:", "judge::offline", "outcome: "):  # answered 200 "the judge  failed"
            r = behind(empty)
            assert r.status_code == 404 and "after the colon" in r.json()["detail"], (empty, r.text)
        # a window that ends before it starts is a 422 saying so, not "no conversations" (404)
        later, earlier = "2026-06-02T00:00:00Z", "2026-06-01T00:00:00Z"
        assert behind("steps", since=later, until=earlier).status_code == 422
        q = {"agent": "bench-bot", "version": "v2", "since": later, "until": earlier}
        r = c.get("/v1/quality", params=q, headers=REVIEWER)
        assert r.status_code == 422 and "must be before until" in r.json()["detail"], r.text
        q = {"baseline": "v1", "candidate": "v2", "since": later, "until": earlier}
        assert c.get("/v1/compare", params=q, headers=REVIEWER).status_code == 422
    rt.close()


def test_the_demo_traffic_shows_pass_hat_k(sqlite_url) -> None:
    """The demo's task ids repeat and every simulated conversation says whether its task got done."""
    from vigil.ingest.simulate import Simulator, parse_versions

    rt = build_runtime(make_settings(sqlite_url, compare_bootstrap_resamples=100), registry=CollectorRegistry())
    sim = Simulator(parse_versions("v1.4.0:0.05,v1.5.0:0.4"), 11)
    convs = list(sim.stream(600))
    with make_client(rt) as c:
        store(c, convs)
        outcomes = [o for conv in convs for o in sim.outcomes_for(conv)]
        assert c.post("/v1/outcomes", json=outcomes, headers=INGEST).status_code in (200, 202)
        body = c.get("/v1/compare", params={"baseline": "v1.4.0", "candidate": "v1.5.0"}, headers=REVIEWER).json()
    rows = rows_of(body)
    assert body["tasks"]["paired"] and body["tasks"]["shared"] >= 45 and body["tasks"]["ks"][0] == 2
    assert rows["tasks:success"]["verdict"] == "worse" and rows["tasks:success"]["paired"]
    for k in body["tasks"]["ks"]:
        assert rows[f"tasks:pass^{k}"]["candidate"]["value"] < rows[f"tasks:pass^{k}"]["baseline"]["value"]
    assert body["headline"]["text"].startswith("v1.5.0 vs v1.4.0: ")
    rt.close()


def test_the_compare_page_shows_the_paired_rows(sqlite_url) -> None:
    from fastapi.testclient import TestClient

    from tests.compare.test_compare_ui import logged_in
    from vigil.app.server import build_app
    from vigil.app.wiring import wire

    rt = wire(
        build_runtime(make_settings(sqlite_url, compare_bootstrap_resamples=100), registry=CollectorRegistry()),
        {"api"},
    )
    with TestClient(build_app(rt)) as ui:
        store(ui, [conversation("v1", f"t{i:03d}", r, i < 80) for i in range(200) for r in range(2)])
        store(ui, [conversation("v2", f"t{i:03d}", r, i < 90) for i in range(200) for r in range(2)])
        html = logged_in(ui).get("/ui/compare", params={"baseline": "v1", "candidate": "v2"}).text
    assert ">v2 vs v1: 0 signals worse, 2 better, 0 red flags<" in html and "200 tasks are shared" in html
    row = html[html.index('data-signal="tasks:success"') :].split("</tr>", 1)[0]
    assert 'data-verdict="better"' in row and "+5.0 pp" in row and "SE 1.5 pp, paired" in row
    info = html[html.index('data-signal="tasks:pass@2"') :].split("</tr>", 1)[0]
    assert "better · not tested" in info
    assert 'id="pass-k-baseline"' not in html  # pass^k is a row of the table, with its interval
    rt.close()


def test_without_shared_tasks_the_sides_are_clustered_not_paired(sqlite_url) -> None:
    rt = build_runtime(make_settings(sqlite_url, compare_bootstrap_resamples=100), registry=CollectorRegistry())
    with make_client(rt) as c:
        store(c, [conversation("v1", f"a{i}", r, i < 10) for i in range(40) for r in range(2)])
        store(c, [conversation("v2", f"b{i}", r, i < 30) for i in range(40) for r in range(2)])
        body = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER).json()
    assert body["tasks"]["shared"] == 0 and not body["tasks"]["paired"]
    success = rows_of(body)["tasks:success"]
    assert not success["paired"] and "no shared tasks" in success["label"]
    b, cand, d = success["baseline"], success["candidate"], success["difference"]
    assert d["value"] == pytest.approx(0.5)
    assert d["se"] == pytest.approx((b["se"] ** 2 + cand["se"] ** 2) ** 0.5)
    assert success["verdict"] == "better"
    assert rows_of(body)["tasks:pass^2"]["paired"] is False
    rt.close()
