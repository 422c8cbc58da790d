"""``vigil judge ...`` and ``vigil judge-worker --once`` against a real database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from tests.support.cli import cli_runner
from tests.support.judge_fakes import judge_dir
from vigil.app.cli import app
from vigil.app.runtime import build_runtime
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.judge.stage import JudgeStage
from vigil.schema import Conversation
from vigil.settings import Settings


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    jd = judge_dir(tmp_path / "judges", sampling={"rate": 0.0, "always_judge_severity": None})
    values = {
        "VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}",
        "VIGIL_JUDGES_DIR": str(jd),
        "VIGIL_JUDGE_MODE": "offline",
        "VIGIL_API_KEYS": "a:admin:k",
        "VIGIL_METRICS_PORT": "0",
        "VIGIL_LOG_LEVEL": "WARNING",
        "COLUMNS": "200",  # rich tables wrap at 80 columns otherwise
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return Settings()


def test_validate_list_run_and_worker_once(env: Settings, tmp_path: Path) -> None:
    runner = cli_runner()
    out = runner.invoke(app, ["judge", "validate"])
    assert out.exit_code == 0 and "ok: tj v3" in out.output
    rt = build_runtime(env, registry=CollectorRegistry())
    convs = [Conversation.model_validate(c) for c in Simulator(parse_versions("v1:1.0"), 4).stream(3)]
    rt.pipeline.process(convs, "test")
    rt.close()
    rt = build_runtime(env, registry=CollectorRegistry())
    from vigil.judge.wiring import wire

    rt.roles = frozenset({"api"})
    with rt.sessions.begin() as s:
        wire(rt).sampler.enqueue_manual(s, rt.get(JudgeStage).engine.judges["tj"], convs[1].conversation_id)
    rt.close()
    ran = runner.invoke(app, ["judge", "run", "tj", convs[0].conversation_id])
    assert ran.exit_code == 0, ran.output
    verdict = orjson.loads(ran.stdout[ran.stdout.index("{") :])
    assert verdict["conversation_id"] == convs[0].conversation_id and verdict["judge_label"] == "offline judge"
    assert verdict["reason"] == "manual"
    assert verdict["created_at"].endswith("Z")  # as GET /v1/verdicts writes it
    assert f"tj v3 (offline judge): {verdict['verdict']}" in ran.output  # said in words, not only in the JSON
    again = runner.invoke(app, ["judge", "run", "tj", convs[0].conversation_id])
    assert again.exit_code == 0, again.output
    # the revision is judged once: the same verdict, and said so rather than passed off as a new judgement
    assert orjson.loads(again.stdout[again.stdout.index("{") :])["id"] == verdict["id"]
    assert f"revision {convs[0].revision} was already queued or judged by tj" in again.output
    assert "already" not in ran.output
    listed = runner.invoke(app, ["judge", "list"])
    assert listed.exit_code == 0 and "offline judge" in listed.output and "tj" in listed.output
    assert runner.invoke(app, ["judge", "run", "nope", "x"]).exit_code == 2
    assert runner.invoke(app, ["judge", "run", "tj", "missing-id"]).exit_code == 2
    worker = runner.invoke(app, ["judge-worker", "--once"])  # the other queued conversation only
    assert worker.exit_code == 0 and "1 verdicts stored" in worker.output


def test_invalid_definition_fails_with_file_and_field(env: Settings, tmp_path: Path) -> None:
    judge_dir(tmp_path / "judges", name="broken", limits={"rpm": 0})
    out = cli_runner().invoke(app, ["judge", "validate"])
    assert out.exit_code == 2 and "broken/judge.yaml: limits.rpm" in out.output.replace("\n", "")


def test_worker_once_does_not_wait_for_an_open_circuit(
    env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live judge whose self-hosted model refuses connections (the real litellm call): ``--once`` stops
    when the circuit opens instead of waiting out its cooldown."""
    import time

    from tests.support.services import free_port

    model = {"model": "hosted_vllm/llama", "extra_params": {"api_base": f"http://127.0.0.1:{free_port()}/v1"}}
    jd = judge_dir(tmp_path / "live", sampling={"rate": 1.0}, **model)
    for k, v in {
        "VIGIL_JUDGES_DIR": str(jd),
        "VIGIL_JUDGE_MODE": "live",
        "VIGIL_JUDGE_CIRCUIT_FAILURES": "2",
        "VIGIL_JUDGE_CIRCUIT_COOLDOWN_SECONDS": "3600",
        "VIGIL_JUDGE_RETRY_BASE_SECONDS": "0.01",
        "VIGIL_JUDGE_MAX_ATTEMPTS": "50",
        "VIGIL_JUDGE_POLL_INTERVAL_SECONDS": "0.05",
    }.items():
        monkeypatch.setenv(k, v)
    rt = build_runtime(Settings(), registry=CollectorRegistry())
    from vigil.judge.wiring import wire

    rt.roles = frozenset({"api"})
    wire(rt)
    rt.pipeline.process(
        [Conversation.model_validate(c) for c in Simulator(parse_versions("v1:0.0"), 4).stream(2)], "test"
    )
    rt.close()
    t0 = time.monotonic()
    out = cli_runner().invoke(app, ["judge-worker", "--once"])
    assert out.exit_code == 3, out.output  # work is blocked: a scheduled run must not look successful
    assert time.monotonic() - t0 < 60  # not the hour-long cooldown
    assert "0 verdicts stored" in out.output and "judge tj is circuit_open" in out.output
    assert "(2 requests wait)" in out.output


def test_worker_once_exits_non_zero_when_a_configuration_error_blocks_work(
    env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live judge without its provider key stops at start: ``--once`` says so and exits 3 while requests wait."""
    jd = judge_dir(tmp_path / "live", sampling={"rate": 1.0})
    monkeypatch.setenv("VIGIL_JUDGES_DIR", str(jd))
    monkeypatch.setenv("VIGIL_JUDGE_MODE", "live")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    rt = build_runtime(Settings(), registry=CollectorRegistry())
    from vigil.judge.wiring import wire

    rt.roles = frozenset({"api"})
    wire(rt)
    rt.pipeline.process(
        [Conversation.model_validate(c) for c in Simulator(parse_versions("v1:0.0"), 4).stream(2)], "test"
    )
    rt.close()
    out = cli_runner().invoke(app, ["judge-worker", "--once"])
    assert out.exit_code == 3, out.output
    assert "judge tj is stopped_config_error" in out.output and "(2 requests wait)" in out.output
    monkeypatch.setenv("VIGIL_JUDGE_MODE", "offline")  # nothing blocks: the same queue is judged, exit 0
    out = cli_runner().invoke(app, ["judge-worker", "--once"])
    assert out.exit_code == 0 and "2 verdicts stored" in out.output, out.output


def _queue_for_a_proxied_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, n: int) -> list[str]:
    """A live judge behind an OpenAI-compatible endpoint at ``url``, and ``n`` conversations queued for it; the
    first has intent ``poisoned-image-part``."""
    model = {"model": "openai/gpt-4o-mini", "extra_params": {"api_base": url, "api_key": "sk-test"}}
    monkeypatch.setenv("VIGIL_JUDGES_DIR", str(judge_dir(tmp_path / "live", sampling={"rate": 1.0}, **model)))
    monkeypatch.setenv("VIGIL_JUDGE_MODE", "live")
    monkeypatch.setenv("VIGIL_JUDGE_POLL_INTERVAL_SECONDS", "0.05")
    rt = build_runtime(Settings(), registry=CollectorRegistry())
    from vigil.judge.wiring import wire

    rt.roles = frozenset({"api"})
    wire(rt)
    convs = [Conversation.model_validate(c) for c in Simulator(parse_versions("v1:0.0"), 4).stream(n)]
    convs[0].intent = "poisoned-image-part"
    rt.pipeline.process(convs, "test")
    rt.close()
    return [c.conversation_id for c in convs]


def test_worker_once_rejects_the_one_request_a_provider_refuses_and_judges_the_rest(
    env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider answers 400 to one conversation's content only (through litellm, a BadRequestError): it
    stopped the judge, ``--once`` exited 3 and the same request stopped it again after each resume. Now
    it alone is rejected (``bad_request``, with the provider's message) and the others are judged."""
    from tests.support.fake_openai import Script, fake_openai
    from tests.support.judge_fakes import PASS

    refused = "Invalid image_url: the image could not be decoded"
    script = Script(calls=[], answer=PASS)
    script.fault_for = lambda body: (400, refused) if "poisoned-image-part" in orjson.dumps(body).decode() else None
    with fake_openai(script) as (url, _):
        ids = _queue_for_a_proxied_model(tmp_path, monkeypatch, url, 4)
        out = cli_runner().invoke(app, ["judge-worker", "--once"])
    assert out.exit_code == 0, out.output
    assert "4 verdicts stored" in out.output
    rt = build_runtime(Settings(), registry=CollectorRegistry())
    from vigil.judge import store

    with rt.sessions() as s:
        rejected = store.verdicts_for(s, ids[0])
        assert [(v.verdict, v.unscored_reason) for v in rejected] == [("unscored", "bad_request")]
        assert refused in (rejected[0].rationale or "")
        assert [v.verdict for i in ids[1:] for v in store.verdicts_for(s, i)] == ["pass"] * 3
    rt.close()


def test_worker_once_exits_3_when_a_400_comes_back_for_every_request(
    env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parameter the endpoint does not take fails every request: a configuration error, found with the judge's
    check request; the judge stops, ``--once`` exits 3 and every request waits."""
    from tests.support.fake_openai import Script, fake_openai

    refused: list[dict[str, Any]] = []
    script = Script(calls=[])
    script.fault_for = lambda body: refused.append(body) or (400, "Unrecognized request argument supplied: frobnicate")
    with fake_openai(script) as (url, _):
        _queue_for_a_proxied_model(tmp_path, monkeypatch, url, 3)
        out = cli_runner().invoke(app, ["judge-worker", "--once"])
    assert len(refused) == 2 and script.requests == []  # the check request confirmed it; no third was sent
    assert out.exit_code == 3, out.output
    assert "judge tj is stopped_config_error" in out.output and "(3 requests wait)" in out.output
    assert "frobnicate" in out.output


def test_worker_once_exits_non_zero_while_the_daily_budget_is_reached(
    env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Today's stored spend has reached a live judge's daily cap: ``--once`` (a fresh process) reads it from
    the database, makes no call, says the judge is paused by its budget and exits 3 while requests wait."""
    import asyncio

    from tests.support.judge_fakes import Scripted
    from tests.support.services import free_port
    from vigil.judge.client import ClientOverride

    # any call the CLI makes goes to a port that refuses it (a circuit, not a budget pause), never to a provider
    model = {"extra_params": {"api_base": f"http://127.0.0.1:{free_port()}/v1"}}
    jd = judge_dir(
        tmp_path / "live", sampling={"rate": 1.0}, limits={"concurrency": 1, "daily_budget_usd": 0.01}, **model
    )
    monkeypatch.setenv("VIGIL_JUDGES_DIR", str(jd))
    monkeypatch.setenv("VIGIL_JUDGE_MODE", "live")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    monkeypatch.setenv("VIGIL_JUDGE_POLL_INTERVAL_SECONDS", "0.05")
    rt = build_runtime(Settings(), registry=CollectorRegistry())
    from vigil.judge.wiring import wire

    rt.roles = frozenset({"judge-worker"})
    client = Scripted(cost=0.004)
    rt.provide(ClientOverride(client))
    stage = wire(rt)
    rt.pipeline.process(
        [Conversation.model_validate(c) for c in Simulator(parse_versions("v1:0.0"), 4).stream(5)], "test"
    )
    assert asyncio.run(stage.worker.run_until_idle(20)) == 2  # $0.008 spent today: a third call would pass $0.01
    assert stage.engine.lanes["tj"].state == "paused_budget" and len(client.calls) == 2
    rt.close()
    out = cli_runner().invoke(app, ["judge-worker", "--once"])
    assert out.exit_code == 3, out.output  # work is blocked: a scheduled run must not look successful
    assert "0 verdicts stored" in out.output
    assert "judge tj is paused_budget: spent $0.008 of $0.01 today (3 requests wait)" in out.output


def test_judge_list_shows_a_budget_under_a_cent(env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jd = judge_dir(tmp_path / "cheap", limits={"rpm": 60, "concurrency": 2, "daily_budget_usd": 0.004})
    monkeypatch.setenv("VIGIL_JUDGES_DIR", str(jd))
    out = cli_runner().invoke(app, ["judge", "list"])
    assert out.exit_code == 0, out.output
    assert "$0.004" in out.output  # the cap; today's spend (none) is $0.00


def test_judge_list_json(env: Settings) -> None:
    out = cli_runner().invoke(app, ["judge", "list", "--json"])
    assert out.exit_code == 0, out.output
    [j] = orjson.loads(out.stdout)
    assert j["name"] == "tj" and j["mode"] and "queue_depth" in j and "spent_today_usd" in j


def test_a_negative_outcome_outside_the_vocabulary_is_refused(
    env: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`negative_outcomes: {types: [escalaton]}` or `below: {reward: 0.5}` validated clean and never
    triggered: an outcome of a type outside the vocabulary is never stored. Refused like the flagging
    policy's, naming the file and field; a type declared in VIGIL_OUTCOME_TYPES is accepted."""
    for field, value, says in (
        ("types", ["escalaton"], "'escalaton' not an outcome type Vigil knows"),
        ("below", {"reward": 0.5}, "'reward' not an outcome type Vigil knows (benchmark importers write"),
    ):
        judge_dir(tmp_path / "judges", name="typo", sampling={"negative_outcomes": {field: value}})
        out = cli_runner().invoke(app, ["judge", "validate"])
        assert out.exit_code == 2, out.output
        assert f"typo/judge.yaml: sampling.negative_outcomes.{field}: {says}" in out.output.replace("\n", "")
    monkeypatch.setenv("VIGIL_OUTCOME_TYPES", "reward:good")
    out = cli_runner().invoke(app, ["judge", "validate"])
    assert out.exit_code == 0 and "ok: typo v3" in out.output, out.output


def test_worker_once_says_which_requests_wait_for_a_removed_judge(env: Settings, tmp_path: Path) -> None:
    """Requests queued for a judge whose definition was then removed or renamed stayed pending for good, in no
    metric, and ``--once`` exited 0 as if nothing waited."""
    from prometheus_client import generate_latest

    from vigil.judge.wiring import wire
    from vigil.judge.worker import JudgeWorker

    rt = build_runtime(env, registry=CollectorRegistry())
    rt.roles = frozenset({"api"})
    convs = [Conversation.model_validate(c) for c in Simulator(parse_versions("v1:1.0"), 4).stream(2)]
    rt.pipeline.process(convs, "test")
    with rt.sessions.begin() as s:
        judges = wire(rt)
        for c in convs:
            judges.sampler.enqueue_manual(s, rt.get(JudgeStage).engine.judges["tj"], c.conversation_id)
    rt.close()
    judge_dir(tmp_path / "judges", name="renamed")  # tj's definition is now another judge's
    import shutil

    shutil.rmtree(tmp_path / "judges" / "tj")
    out = cli_runner().invoke(app, ["judge-worker", "--once"])
    assert out.exit_code == 3, out.output
    assert "2 requests wait for judge tj, which no definition" in out.output.replace("\n", " ")
    registry = CollectorRegistry()
    rt = build_runtime(Settings(), registry=registry)
    rt.roles = frozenset({"judge-worker"})
    worker = JudgeWorker(wire(rt).engine)
    worker._housekeeping()
    assert 'vigil_judge_queue_depth{judge="tj"} 2.0' in generate_latest(registry).decode()
    rt.close()
