"""`GET /v1/compare`, `GET /v1/quality` and `vigil compare` on stored data (SQLite and Postgres)."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import INGEST, REVIEWER, make_client, make_settings
from tests.support.cli import cli_runner
from tests.support.services import shared_data
from tests.support.traffic import cheaper, clean, with_defect
from vigil.app.runtime import build_runtime
from vigil.store.models import VerdictRow

TAU2_4X5 = "sierra_testrun1_gpt-4.1-2025-04-14_telecom_no-user_gpt-4.1-2025-04-14_4trials_5tasks.json"


def verdict_row(
    cid: str, version: str, verdict: str, reason: str = "sampled", revision: int = 1, offline: bool = False
) -> VerdictRow:
    return VerdictRow(
        offline=offline,
        judge="helpful",
        judge_version="1",
        conversation_id=cid,
        revision=revision,
        agent_id="support-bot",
        agent_version=version,
        verdict=verdict,
        categories=[],
        model="m",
        prompt_hash="h",
        reason=reason,
        created_at=datetime.now(UTC),
    )


@pytest.fixture
def loaded(db_url):  # type: ignore[no-untyped-def]
    """v1: 300 clean conversations; v2: cheaper and faster, but 8% cancel delivered orders (forbidden)."""
    # the escalations are posted right after their conversations: every conversation counts for outcomes
    # (test_outcome_rates_wait_for_their_outcomes is about the settle time)
    settings = make_settings(db_url, compare_bootstrap_resamples=300, compare_outcome_settle_hours=0)
    rt = build_runtime(settings, registry=CollectorRegistry())
    with make_client(rt) as c:
        base = clean(300, "v1", 1)
        cand = cheaper(clean(276, "v2", 2) + with_defect(24, "v2", "cancel_delivered", 3))
        for batch in (base, cand):
            assert c.post("/v1/conversations", json=batch, headers=INGEST).status_code == 202
        esc = [
            {"conversation_id": x["conversation_id"], "type": "escalation", "idempotency_key": f"e{i}"}
            for i, x in enumerate(cand[-24:])
        ]
        c.post("/v1/outcomes", json=esc, headers=INGEST)
        with rt.sessions.begin() as s:
            s.add_all([verdict_row(x["conversation_id"], "v1", "pass") for x in base[:40]])
            s.add_all(
                [
                    verdict_row(x["conversation_id"], "v2", "fail" if i % 4 == 0 else "pass")
                    for i, x in enumerate(cand[:40])
                ]
            )
            s.add(verdict_row(cand[41]["conversation_id"], "v2", "unscored"))
            # not part of the judge's failure rate: flagged conversations, and a re-judged revision
            s.add_all([verdict_row(x["conversation_id"], "v1", "fail", reason="flagged") for x in base[40:60]])
            s.add_all([verdict_row(x["conversation_id"], "v1", "fail", revision=2) for x in base[:10]])
            # the offline judge is another instrument: its own row, never pooled with the model's
            s.add_all([verdict_row(x["conversation_id"], "v2", "fail", offline=True) for x in cand[50:55]])
        yield rt, c
    rt.close()


def test_compare_table_verdicts_and_red_flag(loaded) -> None:
    rt, c = loaded
    r = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["agent_id"] == "support-bot" and body["candidate"]["conversations"] == 300
    rows = {s["signal"]: s for s in body["signals"]}
    forbidden = rows["forbidden_tool"]
    assert forbidden["baseline"]["value"] == 0.0 and forbidden["candidate"]["x"] == 24
    assert forbidden["difference"]["low"] > 0 and forbidden["verdict"] == "worse" and forbidden["red_flag"]
    tested = sum(1 for row in rows.values() if row["p_value"] is not None)
    assert body["multiplicity"]["method"] == "holm" and body["multiplicity"]["signals"] == tested
    assert forbidden["p_value"] <= forbidden["p_adjusted"] < 0.05
    assert rows["rule:no-cancel-delivered-order"]["verdict"] == "worse"
    assert rows["cost_usd"]["verdict"] == "better" and rows["cost_usd"]["difference"]["high"] < 0
    assert rows["latency_p95_ms"]["verdict"] == "better" and not rows["latency_p95_ms"]["red_flag"]
    assert rows["outcome:escalation"]["candidate"]["x"] == 24 and rows["outcome:escalation"]["verdict"] == "worse"
    judge = rows["judge:helpful"]
    assert (judge["baseline"]["n"], judge["candidate"]["n"], judge["candidate"]["x"]) == (40, 40, 10)
    offline = rows["judge:helpful:offline"]
    assert offline["candidate"]["x"] == 5 and "offline judge" in offline["label"]
    assert rows["tool_error"]["verdict"] == "not yet distinguishable"
    lo, hi = rows["rule:pii-in-reply"]["difference"]["low"], rows["rule:pii-in-reply"]["difference"]["high"]
    assert lo < 0 < hi
    assert any("forbidden tool call rate got worse (0.0% → 8.0%)" in f for f in body["red_flags"])


def test_compare_errors_are_clear(loaded) -> None:
    _, c = loaded
    r = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v9"}, headers=REVIEWER)
    assert r.status_code == 404 and "no agent has conversations of both 'v1' and 'v9'" in r.json()["detail"]
    r = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2", "agent": "nobody"}, headers=REVIEWER)
    assert r.status_code == 404 and "no finished conversations" in r.json()["detail"]
    assert c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=INGEST).status_code == 403


def test_ambiguous_agent_must_be_named(sqlite_url) -> None:
    rt = build_runtime(make_settings(sqlite_url, compare_bootstrap_resamples=100), registry=CollectorRegistry())
    with make_client(rt) as c:
        for seed, (agent, v) in enumerate(itertools.product(("a", "b"), ("v1", "v2"))):
            batch = [dict(x, agent_id=agent) for x in clean(5, v, 100 + seed)]
            c.post("/v1/conversations", json=batch, headers=INGEST)
        r = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER)
        assert r.status_code == 404 and "several agents (a, b)" in r.json()["detail"]
        r = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2", "agent": "b"}, headers=REVIEWER)
        assert r.status_code == 200 and r.json()["agent_id"] == "b"


def test_only_rules_that_apply_to_the_agent_are_rows(sqlite_url) -> None:
    """With every shipped pack loaded, support-bot's table has no airline, retail or telecom rules."""
    from vigil.settings import PROJECT_ROOT

    settings = make_settings(
        sqlite_url, rule_packs=str(PROJECT_ROOT / "rules" / "*.yaml"), compare_bootstrap_resamples=100
    )
    rt = build_runtime(settings, registry=CollectorRegistry())
    with make_client(rt) as c:
        for v, seed in (("v1", 1), ("v2", 2)):
            c.post("/v1/conversations", json=clean(20, v, seed), headers=INGEST)
        body = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER).json()
        quality = c.get("/v1/quality", params={"agent": "support-bot", "version": "v1"}, headers=REVIEWER).json()
    applicable = {f"rule:{r.id}" for r in rt.rules.rules_for("support-bot", "v1")}
    assert len(rt.rules.rules) > len(applicable) > 0
    for signals in (body["signals"], quality["signals"]):
        assert {s["signal"] for s in signals if s["signal"].startswith("rule:")} == applicable
    rt.close()


def test_cli_compare_json_and_table(loaded, monkeypatch) -> None:
    rt, _ = loaded
    from vigil.app.cli import app

    monkeypatch.setenv("VIGIL_DATABASE_URL", rt.settings.database_url_str)
    monkeypatch.setenv("VIGIL_RULE_PACKS", rt.settings.rule_packs)
    monkeypatch.setenv("VIGIL_COMPARE_BOOTSTRAP_RESAMPLES", "200")
    monkeypatch.setenv("VIGIL_COMPARE_OUTCOME_SETTLE_HOURS", "0")
    monkeypatch.setenv("COLUMNS", "200")
    runner = cli_runner()
    result = runner.invoke(app, ["compare", "--baseline", "v1", "--candidate", "v2", "--json"])
    assert result.exit_code == 0, result.output
    body = orjson.loads(result.stdout)
    assert {s["signal"]: s["verdict"] for s in body["signals"]}["forbidden_tool"] == "worse"
    assert body["window"]["since"].endswith("Z"), body["window"]  # as GET /v1/compare writes it
    table = runner.invoke(app, ["compare", "--baseline", "v1", "--candidate", "v2", "--agent", "support-bot"])
    assert table.exit_code == 0 and "forbidden tool call rate" in table.stdout and "red flag" in table.stdout
    assert table.stdout.startswith("v2 vs v1: 4 signals worse, 2 better, 4 red flags")
    missing = runner.invoke(app, ["compare", "--baseline", "v1", "--candidate", "nope"])
    assert missing.exit_code == 2 and "no agent has conversations" in missing.output


def test_outcome_rates_wait_for_their_outcomes(db_url, monkeypatch) -> None:
    """A baseline of two days ago whose outcomes are in against a canary of this hour whose outcomes are
    not: the canary's outcome rows say "no data" (not a drop to zero, a "worse" verdict and a red flag),
    and the answer says which conversations the outcome rates count."""
    from sqlalchemy import update

    from vigil.store.models import ConversationRow

    rt = build_runtime(make_settings(db_url, compare_bootstrap_resamples=200), registry=CollectorRegistry())
    assert rt.settings.compare_outcome_settle_hours == 6
    with make_client(rt) as c:
        base, cand = clean(200, "v1", 1), clean(200, "v2", 2)
        for batch in (base, cand):
            assert c.post("/v1/conversations", json=batch, headers=INGEST).status_code == 202
        outcomes = [
            {"conversation_id": x["conversation_id"], "type": kind, "idempotency_key": f"{kind}{i}"}
            for kind, share in (("thumbs_up", base[:80]), ("escalation", base[80:100]))
            for i, x in enumerate(share)
        ]
        assert c.post("/v1/outcomes", json=outcomes, headers=INGEST).status_code == 202
        two_days_ago = datetime.now(UTC) - timedelta(days=2)
        with rt.sessions.begin() as s:
            s.execute(
                update(ConversationRow).where(ConversationRow.agent_version == "v1").values(received_at=two_days_ago)
            )
        r = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER)
        assert r.status_code == 200, r.text
        body = r.json()
        rows = {x["signal"]: x for x in body["signals"]}
        for signal, x in (("outcome:thumbs_up", 80), ("outcome:escalation", 20)):
            assert rows[signal]["baseline"]["x"] == x and rows[signal]["baseline"]["n"] == 200
            assert rows[signal]["candidate"]["n"] == 0 and rows[signal]["verdict"] == "no data"
        assert not any("thumbs_up" in note for note in body["red_flags"])
        window = body["outcomes"]
        assert window["baseline_conversations"] == 200 and window["candidate_conversations"] == 0
        for version, counted in (("v1", 200), ("v2", 0)):  # one version's quality cuts the same way
            q = c.get("/v1/quality", params={"agent": "support-bot", "version": version}, headers=REVIEWER).json()
            assert q["outcomes"] == {"received_before": window["received_before"], "conversations": counted}
            escalation = {x["signal"]: x for x in q["signals"]}["outcome:escalation"]  # a row always shown
            assert escalation["n"] == counted and escalation["x"] == (20 if counted else 0)
        # the conversations behind a row are the ones it counts: the canary's fresh escalation is not listed
        fresh = cand[0]["conversation_id"]
        escalated = {"conversation_id": fresh, "type": "escalation", "idempotency_key": "fresh-escalation"}
        assert c.post("/v1/outcomes", json=[escalated], headers=INGEST).status_code == 202
        for version, expected in (("v1", 20), ("v2", 0)):
            params = {"agent": "support-bot", "version": version, "signal": "outcome:escalation"}
            behind = c.get("/v1/compare/conversations", params=params, headers=REVIEWER).json()
            assert behind["total"] == expected and "received before" in behind["what"], behind
        assert datetime.fromisoformat(window["received_before"]) <= datetime.now(UTC) - timedelta(hours=6)
        login = c.get("/ui/login").text
        token = re.search(r'name="csrf" value="([^"]+)"', login)
        assert token
        c.post("/ui/login", data={"csrf": token.group(1), "api_key": "rita-key", "next": "/ui/compare"})
        page = c.get("/ui/compare", params={"baseline": "v1", "candidate": "v2"}).text
        assert 'id="outcome-window"' in page and "none of the candidate's yet" in page

        monkeypatch.setenv("VIGIL_DATABASE_URL", rt.settings.database_url_str)
        monkeypatch.setenv("COLUMNS", "200")
        table = cli_runner().invoke(_cli(), ["compare", "--baseline", "v1", "--candidate", "v2"])
        assert table.exit_code == 0, table.output
        assert "Outcome rates count conversations received before" in table.stdout
        assert "none of the candidate's yet" in table.stdout

    # with no settle time the canary's missing outcomes read as a drop: what the default prevents
    rt.settings.compare_outcome_settle_hours = 0
    with make_client(rt) as c:
        body = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER).json()
    rows = {x["signal"]: x for x in body["signals"]}
    assert rows["outcome:thumbs_up"]["verdict"] == "worse" and rows["outcome:thumbs_up"]["candidate"]["n"] == 200
    assert body["outcomes"]["received_before"] is None
    rt.close()


def test_task_success_is_graded_only_where_both_sides_are_tasks(sqlite_url) -> None:
    """A baseline without task ids beside a candidate of tasks: task success is the share of each side's
    conversations that succeeded (of those old enough), not "no data" for the side without tasks; a window
    that starts after the cut has no conversation old enough, and its outcome rows say so, unfolded."""
    from sqlalchemy import update

    from vigil.compare import present
    from vigil.store.models import ConversationRow

    rt = build_runtime(make_settings(sqlite_url, compare_bootstrap_resamples=200), registry=CollectorRegistry())
    with make_client(rt) as c:
        base, cand = clean(100, "v1", 1), clean(100, "v2", 2)
        for conv in base:
            conv.pop("task_id", None)
        assert all(conv.get("task_id") for conv in cand)
        for batch in (base, cand):
            assert c.post("/v1/conversations", json=batch, headers=INGEST).status_code == 202
        graded = [
            {"conversation_id": x["conversation_id"], "type": "task_success", "value": float(ok), "idempotency_key": k}
            for side, wins in ((base, 90), (cand, 50))
            for i, x in enumerate(side)
            for ok, k in [(i < wins, f"ts-{x['conversation_id']}")]
        ]
        assert c.post("/v1/outcomes", json=graded, headers=INGEST).status_code == 202
        with rt.sessions.begin() as s:
            s.execute(update(ConversationRow).values(received_at=datetime.now(UTC) - timedelta(days=2)))
        body = c.get("/v1/compare", params={"baseline": "v1", "candidate": "v2"}, headers=REVIEWER).json()
        row = {x["signal"]: x for x in body["signals"]}["outcome:task_success"]
        assert (row["baseline"]["x"], row["baseline"]["n"]) == (90, 100)
        assert (row["candidate"]["x"], row["candidate"]["n"]) == (50, 100) and row["verdict"] == "worse"

        # the window of the last hour: conversations, none old enough for outcomes
        fresh = clean(50, "v3", 3) + clean(50, "v4", 4)
        assert c.post("/v1/conversations", json=fresh, headers=INGEST).status_code == 202
        escalations = [
            {
                "conversation_id": x["conversation_id"],
                "type": "escalation",
                "idempotency_key": f"e-{x['conversation_id']}",
            }
            for x in fresh[::5]
        ]
        assert c.post("/v1/outcomes", json=escalations, headers=INGEST).status_code == 202
        since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
        r = c.get("/v1/compare", params={"baseline": "v3", "candidate": "v4", "since": since}, headers=REVIEWER)
        assert r.status_code == 200, r.text
        body = r.json()
    rows = [x for x in body["signals"] if x["signal"].startswith("outcome:") and x["kind"] == "rate"]
    assert rows and all(x["verdict"] == "no data" for x in rows)
    shown, folded = present.ordered(body["signals"])
    assert {x["signal"] for x in rows} <= {x["signal"] for x in shown}
    assert not any(x["signal"].startswith("outcome:") for x in folded)
    rt.close()


def test_outcome_settle_hours_are_bounded() -> None:
    from pydantic import ValidationError

    from vigil.settings import Settings

    for name in ("compare_outcome_settle_hours", "detector_outcome_settle_hours"):
        with pytest.raises(ValidationError, match="less than or equal to 8760"):
            Settings(**{name: 1e9})


def _cli():  # type: ignore[no-untyped-def]
    from vigil.app.cli import app

    return app


def independent_pass_hat(path) -> dict[int, float]:  # type: ignore[no-untyped-def]
    """pass^k straight from the results file: enumerate every k-subset of each task's trials."""
    data = orjson.loads(path.read_bytes())
    trials: dict[str, list[bool]] = {}
    for sim in data["simulations"]:
        trials.setdefault(str(sim["task_id"]), []).append(sim["reward_info"]["reward"] == 1.0)
    out = {}
    for k in range(1, min(len(t) for t in trials.values()) + 1):
        per_task = []
        for t in trials.values():
            subsets = list(itertools.combinations(t, k))
            per_task.append(sum(all(s) for s in subsets) / len(subsets))
        out[k] = sum(per_task) / len(per_task)
    return out


def test_tau2_replay_pass_hat_k_end_to_end(sqlite_url, monkeypatch) -> None:
    path = shared_data("tau2", "trajectories", TAU2_4X5)
    from vigil.app.cli import app

    monkeypatch.setenv("VIGIL_DATABASE_URL", sqlite_url)
    runner = cli_runner()
    result = runner.invoke(app, ["replay", str(path), "--agent-version", "run-a"])
    assert result.exit_code == 0, result.output
    expected = independent_pass_hat(path)
    assert sorted(expected) == [1, 2, 3, 4]
    rt = build_runtime(make_settings(sqlite_url, compare_bootstrap_resamples=100), registry=CollectorRegistry())
    with make_client(rt) as c:
        q = c.get("/v1/quality", params={"agent": "tau2-telecom", "version": "run-a"}, headers=REVIEWER).json()
        assert q["conversations"] == 20 and q["pass_k"]["tasks"] == 5
        got = {int(k): v for k, v in q["pass_k"]["pass_hat_k"].items()}
        assert got == pytest.approx(expected)
        success = {s["signal"]: s for s in q["signals"]}["outcome:task_success"]
        assert success["x"] == 16 and success["n"] == 20
        assert "per_task" not in q["pass_k"]  # thousands of rows at volume: only when asked
        params = {"agent": "tau2-telecom", "version": "run-a", "per_task": "true"}
        rows = c.get("/v1/quality", params=params, headers=REVIEWER).json()["pass_k"]["per_task"]
        assert len(rows) == 5 and sum(r["pass_hat_k"]["4"] for r in rows) / 5 == pytest.approx(expected[4])
        assert c.get("/v1/quality", params={"agent": "x", "version": "y"}, headers=REVIEWER).status_code == 404
