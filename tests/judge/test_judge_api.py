"""The judge through the API: verdicts on conversations, /v1/judges, pairwise, manual requests, resume."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import ADMIN, INGEST, REVIEWER, make_client, make_settings
from tests.support.judge_fakes import Scripted, judge_dir
from tests.support.waiting import scaled, wait_for
from vigil.app.runtime import build_runtime
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.judge import store
from vigil.judge.client import ClientOverride
from vigil.judge.models import JudgeRequestRow


def runtime(tmp_path: Path, client: Any = None, mode: str = "offline", **judge: Any):  # type: ignore[no-untyped-def]
    jd = judge_dir(tmp_path / "judges", **{"sampling": {"rate": 1.0}, **judge})
    s = make_settings(
        f"sqlite:///{tmp_path / 'v.db'}",
        judges_dir=str(jd),
        judge_mode=mode,
        judge_poll_interval_seconds=0.05,
    )
    rt = build_runtime(s, registry=CollectorRegistry())
    if client is not None:
        rt.provide(ClientOverride(client))
    return rt


def sim(n: int, versions: str = "v1:0.5", seed: int = 2) -> list[dict[str, Any]]:
    return list(Simulator(parse_versions(versions), seed).stream(n))


def test_serve_judges_in_process_and_shows_offline_verdicts(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    convs = sim(8)
    with make_client(rt, {"serve"}) as c:
        assert c.post("/v1/conversations", content=orjson.dumps(convs), headers=INGEST).status_code == 202
        cid = convs[0]["conversation_id"]

        def judged() -> dict[str, Any] | None:
            body = c.get(f"/v1/conversations/{cid}", headers=REVIEWER).json()
            return body if body.get("verdicts") else None

        body = wait_for(judged)
        [v] = body["verdicts"]
        assert v["judge"] == "tj" and v["judge_version"] == "3" and v["offline"] is True
        assert v["model"] == "offline-judge" and v["judge_label"] == "offline judge"
        assert v["rationale"].startswith("offline judge") and v["verdict"] in ("pass", "fail")
        wait_for(lambda: c.get("/v1/verdicts", headers=REVIEWER).json()["total"] == 8)
        [info] = c.get("/v1/judges", headers=REVIEWER).json()
        assert info["name"] == "tj" and info["mode"] == "offline" and info["judge_label"] == "offline judge"
        assert info["state"] == "running" and info["sample_rate"] == 1.0 and info["budget_usd"] == 100.0
        assert info["spent_today_usd"] == 0.0
        wait_for(lambda: c.get("/v1/judges/tj", headers=REVIEWER).json()["queue_depth"] == 0, 5)
        fails = c.get("/v1/verdicts", params={"verdict": "fail"}, headers=REVIEWER).json()
        assert all(i["verdict"] == "fail" for i in fails["items"])
        assert c.get("/v1/judges", headers=INGEST).status_code == 403
        assert c.get("/v1/judges/nope", headers=REVIEWER).status_code == 404
        metrics = c.get("/metrics").text
        assert 'vigil_judge_state{judge="tj",state="running"} 1.0' in metrics
        assert "vigil_judge_queue_depth" in metrics and "vigil_judge_judged_total" in metrics
        assert 'offline="true"' in metrics


def test_api_process_reports_the_state_a_separate_worker_stored(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    with make_client(rt, {"api"}) as c:
        [info] = c.get("/v1/judges", headers=REVIEWER).json()
        assert info["state"] == "no_worker"
        with rt.sessions.begin() as s:
            store.save_status(s, "tj", "stopped_config_error", "auth: bad key", "host:1", datetime.now(UTC))
        [info] = c.get("/v1/judges", headers=REVIEWER).json()
        assert (info["state"], info["state_detail"], info["worker"]) == (
            "stopped_config_error",
            "auth: bad key",
            "host:1",
        )
        assert c.post("/v1/judges/tj/resume", headers=REVIEWER).status_code == 403
        assert c.post("/v1/judges/tj/resume", headers=ADMIN).json() == {
            "judge": "tj",
            "resume_requested": True,
        }
        with rt.sessions() as s:
            assert store.load_status(s)["tj"].resume_requested_at is not None


def test_manual_request_queues_once(tmp_path: Path) -> None:
    rt = runtime(tmp_path, sampling={"rate": 0.0, "always_judge_severity": None, "negative_outcomes": None})
    conv = sim(1, "v1:0.0")[0]
    with make_client(rt, {"api"}) as c:
        c.post("/v1/conversations", json=conv, headers=INGEST)
        url = "/v1/judges/tj/requests"
        first = c.post(url, json={"conversation_id": conv["conversation_id"]}, headers=ADMIN)
        assert first.status_code == 202 and first.json()["queued"] is True
        assert c.post(url, json={"conversation_id": conv["conversation_id"]}, headers=ADMIN).json()["queued"] is False
        assert c.post(url, json={"conversation_id": "missing"}, headers=ADMIN).status_code == 404
        assert c.post(url, json={"conversation_id": "x"}, headers=REVIEWER).status_code == 403
    with rt.sessions() as s:
        [r] = s.scalars(select(JudgeRequestRow)).all()
        assert r.reason == "manual" and r.status == "pending"


def test_negative_outcome_posted_later_enqueues_a_judgement(tmp_path: Path) -> None:
    rt = runtime(tmp_path, sampling={"rate": 0.0, "always_judge_severity": None})
    conv = sim(1, "v1:0.0")[0]
    with make_client(rt, {"api"}) as c:
        c.post("/v1/conversations", json=conv, headers=INGEST)
        outcome = {
            "conversation_id": conv["conversation_id"],
            "type": "escalation",
            "value": 1.0,
            "idempotency_key": "o-1",
        }
        assert c.post("/v1/outcomes", json=[outcome], headers=INGEST).status_code < 300
    with rt.sessions() as s:
        [r] = s.scalars(select(JudgeRequestRow)).all()
        assert (r.conversation_id, r.reason) == (conv["conversation_id"], "outcome")


def _prefers_word(word: str):  # type: ignore[no-untyped-def]
    def reply(messages: list[dict[str, str]]) -> str:
        user = messages[1]["content"]
        first = user[user.index("answer-1>") : user.index("answer-2>")]
        return orjson.dumps({"winner": "1" if word in first else "2", "rationale": "checked"}).decode()

    return reply


def test_pairwise_reports_position_bias_not_a_winner(tmp_path: Path) -> None:
    always_first = '{"winner": "1", "rationale": "the first one"}'
    client = Scripted([always_first, always_first, _prefers_word("Paris"), _prefers_word("Paris")])
    rt = runtime(tmp_path, client, mode="live")
    body = {
        "input": "What is the capital of France?",
        "answer_a": "Lyon.",
        "answer_b": "Paris.",
        "label_a": "v1",
        "label_b": "v2",
    }
    with make_client(rt, {"api"}) as c:
        biased = c.post("/v1/judges/tj/pairwise", json=body, headers=REVIEWER).json()
        assert biased["result"] == "position_bias" and biased["winner"] is None and biased["position_bias"]
        assert (biased["first_order_choice"], biased["second_order_choice"]) == ("a", "b")
        fair = c.post("/v1/judges/tj/pairwise", json=body, headers=REVIEWER).json()
        assert fair["result"] == "b" and fair["winner"] == "b" and not fair["position_bias"]
        assert fair["cost_usd"] == 0.002 and fair["label_b"] == "v2"
        listed = c.get("/v1/judges/tj/pairwise", headers=REVIEWER).json()
        assert listed["total"] == 2 and listed["position_bias"] == 1
        assert c.post("/v1/judges/tj/pairwise", json=body, headers=INGEST).status_code == 403
        metrics = c.get("/metrics").text
        assert 'vigil_judge_pairwise_total{judge="tj",result="position_bias"} 1.0' in metrics
    # both orders were asked, with the answers swapped
    firsts = [m[2][1]["content"] for m in client.calls[:2]]
    assert sorted("Lyon" in f[f.index("answer-1>") : f.index("answer-2>")] for f in firsts) == [False, True]


def test_pairwise_offline_is_order_independent(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    body = {
        "input": "capital of France",
        "answer_a": "The capital of France is Paris.",
        "answer_b": "No idea",
    }
    with make_client(rt, {"api"}) as c:
        got = c.post("/v1/judges/tj/pairwise", json=body, headers=REVIEWER).json()
    assert got["result"] == "a" and got["offline"] and got["judge_label"] == "offline judge"


def test_pairwise_is_bounded_and_respects_the_circuit_and_concurrency(tmp_path: Path) -> None:
    from vigil.judge.client import _litellm

    jd = judge_dir(tmp_path / "judges", limits={"concurrency": 1})
    s = make_settings(
        f"sqlite:///{tmp_path / 'v.db'}",
        judges_dir=str(jd),
        judge_mode="live",
        judge_retry_base_seconds=300.0,  # the worker's backoff; an HTTP caller must not wait for it
        judge_circuit_failures=4,
        judge_circuit_cooldown_seconds=600,
    )
    rt = build_runtime(s, registry=CollectorRegistry())
    _litellm()
    client = Scripted(default="litellm.InternalServerError", via_litellm=True, delay=0.05)
    rt.provide(ClientOverride(client))
    body = {"input": "q", "answer_a": "a", "answer_b": "b"}
    with make_client(rt, {"api"}) as c:
        t0 = time.monotonic()
        r = c.post("/v1/judges/tj/pairwise", json=body, headers=REVIEWER)
        assert r.status_code == 502 and "server_error" in r.json()["detail"]
        assert time.monotonic() - t0 < scaled(10)  # far under the worker's 300 s backoff
        assert len(client.calls) == 4  # each order: one call and one retry (both orders end before the answer)
        assert client.max_in_flight == 1  # under the judge's concurrency limit, like the worker
        # four failures in a row opened the circuit: the next request is refused at once, with no call
        r = c.post("/v1/judges/tj/pairwise", json=body, headers=REVIEWER)
        assert r.status_code == 503 and "circuit_open" in r.json()["detail"]
        assert 0 < int(r.headers["Retry-After"]) <= 600
        assert len(client.calls) == 4
    rt.close()


def test_offline_verdicts_are_labelled_everywhere_even_by_a_live_api_process(tmp_path: Path) -> None:
    """The worker judged offline; an API process configured live must still say "offline judge"."""
    worker_rt = runtime(tmp_path)  # offline
    worker_rt.roles = frozenset({"judge-worker"})
    from vigil.judge.wiring import wire

    stage = wire(worker_rt)
    convs = sim(3)
    from vigil.schema import Conversation

    worker_rt.pipeline.process([Conversation.model_validate(c) for c in convs], "test")
    import asyncio

    asyncio.run(stage.worker.run_until_idle(20))
    assert stage.engine.lanes["tj"].detail.startswith("offline judge")
    worker_rt.close()
    api_rt = runtime(tmp_path, Scripted(), mode="live")
    with make_client(api_rt, {"api"}) as c:
        [info] = c.get("/v1/judges", headers=REVIEWER).json()
        assert (info["mode"], info["judge_label"], info["state"]) == ("offline", "offline judge", "running")
        assert info["state_detail"].startswith("offline judge")
        listed = c.get("/v1/verdicts", params={"offline": "true"}, headers=REVIEWER).json()
        assert listed["total"] == 3 and {i["judge_label"] for i in listed["items"]} == {"offline judge"}
        assert c.get("/v1/verdicts", params={"offline": "false"}, headers=REVIEWER).json()["total"] == 0
        body = c.get(f"/v1/conversations/{convs[0]['conversation_id']}", headers=REVIEWER).json()
        assert [v["judge_label"] for v in body["verdicts"]] == ["offline judge"]
    api_rt.close()


def test_a_pairwise_request_that_probes_an_open_circuit_gets_its_answer(tmp_path: Path) -> None:
    """The two orders were asked together: with the circuit open (cooled), the first was let through as
    its probe, answered and paid for, while the second was refused, so the caller got a 503 for the very
    call that closed the circuit. The second order now waits for the probe's answer."""
    from vigil.judge.client import _litellm
    from vigil.judge.stage import JudgeStage

    jd = judge_dir(tmp_path / "judges")
    s = make_settings(
        f"sqlite:///{tmp_path / 'v.db'}",
        judges_dir=str(jd),
        judge_mode="live",
        judge_circuit_failures=2,
        judge_circuit_cooldown_seconds=0.5,
    )
    rt = build_runtime(s, registry=CollectorRegistry())
    _litellm()
    client = Scripted(["litellm.InternalServerError"] * 4, default=_prefers_word("Paris"), via_litellm=True)
    # failing until the circuit opens
    rt.provide(ClientOverride(client))
    body = {"input": "What is the capital of France?", "answer_a": "Lyon.", "answer_b": "Paris."}
    with make_client(rt, {"api"}) as c:
        r = c.post("/v1/judges/tj/pairwise", json=body, headers=REVIEWER)
        assert r.status_code in (502, 503), r.text
        lane = rt.get(JudgeStage).engine.lanes["tj"]
        assert lane.state == "circuit_open"
        # how many failures the outage took depends on timing (a retry may be refused once it opened):
        # the provider is back now, whatever is left of them
        client.script.clear()
        assert wait_for(lambda: lane.breaker.remaining() == 0, scaled(10))  # cooled: one probe may go
        calls = len(client.calls)
        r = c.post("/v1/judges/tj/pairwise", json=body, headers=REVIEWER)
        assert r.status_code == 200, r.text
        assert r.json()["result"] == "b" and len(client.calls) == calls + 2  # both orders, once each
        assert lane.state == "running"
    rt.close()


def test_a_request_the_provider_refused_shows_its_reason_and_message_and_the_judge_runs_on(tmp_path: Path) -> None:
    """`vigil serve` judges in-process; the provider answers one conversation's content with a 400. That
    conversation's verdict says so (unscored, `bad_request`, the provider's message) where verdicts show,
    the judge stays `running` and the rest are judged."""
    from tests.judge.test_judge_bad_request import POISON, REFUSED, refuse_poisoned

    rt = runtime(tmp_path, Scripted(default=refuse_poisoned), mode="live")
    convs = sim(5)
    convs[0]["intent"] = POISON
    cid = convs[0]["conversation_id"]
    with make_client(rt, {"serve"}) as c:
        assert c.post("/v1/conversations", content=orjson.dumps(convs), headers=INGEST).status_code == 202
        wait_for(lambda: c.get("/v1/verdicts", headers=REVIEWER).json()["total"] == 5)
        [v] = c.get(f"/v1/conversations/{cid}", headers=REVIEWER).json()["verdicts"]
        assert (v["verdict"], v["unscored_reason"]) == ("unscored", "bad_request")
        assert REFUSED in v["rationale"]
        listed = c.get("/v1/verdicts?verdict=unscored", headers=REVIEWER).json()["items"]
        assert [(i["conversation_id"], i["unscored_reason"]) for i in listed] == [(cid, "bad_request")]
        [info] = c.get("/v1/judges", headers=REVIEWER).json()
        assert info["state"] == "running"
        metrics = c.get("/metrics").text
        assert 'vigil_judge_errors_total{class="bad_request",judge="tj"} 1.0' in metrics
    rt.close()
