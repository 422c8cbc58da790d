"""A provider's 400 that only one request gets must not stop the judge; one that every request gets must.

Whose fault a 400 is, the judge's check request tells (a built-in two-message conversation with the
judge's own prompt and parameters). Replies are scripted at the client boundary
(:class:`tests.support.judge_fakes.Scripted`, raising litellm's own ``BadRequestError``), as in
``test_judge_worker.py``; the worker runs until idle, bounded by a deadline.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.judge.test_judge_worker import metric, requests, setup, verdicts
from tests.support.judge_fakes import PASS, Scripted, litellm_error
from tests.support.waiting import scaled
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.schema import Conversation

POISON = "poisoned-image-part"
REFUSED = "Invalid image_url: the image at messages[3].content[1] could not be decoded"


def bad_request(message: str = REFUSED) -> BaseException:
    err = litellm_error("BadRequestError", 400)
    err.message = message  # type: ignore[attr-defined]
    err.args = (f"litellm.BadRequestError: OpenAIException - {message}",)
    return err


def refuse_poisoned(messages: list[dict[str, str]]) -> Any:
    """The provider refuses only the conversation whose content it cannot take."""
    return bad_request() if any(POISON in str(m.get("content")) for m in messages) else PASS


def feed(rt: Any, n: int, poisoned: int | None, seed: int = 1, in_a_row: int = 1) -> list[str]:
    """Queue ``n`` conversations; ``in_a_row`` of them from ``poisoned`` on carry content the provider refuses."""
    convs = [Conversation.model_validate(c) for c in Simulator(parse_versions("v1:0.2"), seed).stream(n)]
    if poisoned is not None:
        for c in convs[poisoned : poisoned + in_a_row]:
            c.intent = POISON
    rt.pipeline.process(convs, "test")
    return [c.conversation_id for c in convs]


def is_check(messages: list[dict[str, str]]) -> bool:
    """Whether ``messages`` are the judge's check request (for a verdict or for a pairwise call)."""
    from vigil.judge.prompt import CHECK_CONVERSATION

    return CHECK_CONVERSATION.messages[0].text in messages[-1]["content"]


def checks(client: Scripted) -> int:
    return sum(1 for _, _, messages, _ in client.calls if is_check(messages))


def run(stage: Any, timeout: float = 20.0) -> int:
    return asyncio.run(stage.worker.run_until_idle(scaled(timeout)))


def errors(rt: Any, cls: str) -> float:
    return metric(rt, "vigil_judge_errors_total", judge="tj", **{"class": cls})


@pytest.mark.parametrize("concurrency", [1, 16])
def test_one_request_the_provider_refuses_with_a_400_does_not_stop_the_judge(tmp_path: Path, concurrency: int) -> None:
    """The poisoned conversation is claimed first; it stopped the judge for all six, and after a resume
    stopped it again. Now the judge's check request is answered, so the 400 is that request's own."""
    client = Scripted(default=refuse_poisoned)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, limits={"concurrency": concurrency})
    ids = feed(rt, 6, poisoned=0)
    assert run(stage) == 6
    lane = stage.engine.lanes["tj"]
    assert lane.state == "running", lane.detail
    by_id = {v.conversation_id: v for v in verdicts(rt)}
    assert sorted(by_id) == sorted(ids)
    poisoned = by_id[ids[0]]
    assert (poisoned.verdict, poisoned.unscored_reason) == ("unscored", "bad_request")
    assert REFUSED in poisoned.rationale and "BadRequestError" in poisoned.rationale
    assert [by_id[i].verdict for i in ids[1:]] == ["pass"] * 5
    assert {(r.status, r.attempts) for r in requests(rt)} == {("done", 1)}
    assert len(client.calls) == 7 and checks(client) == 1  # the poisoned request was sent once, not retried
    assert errors(rt, "bad_request") == 1 and errors(rt, "config") == 0
    assert (poisoned.prompt_tokens, poisoned.cost_usd) == (120, 0.001)  # the check request's spend is stored
    assert metric(rt, "vigil_judge_state", judge="tj", state="stopped_config_error") == 0


def test_a_400_for_every_request_stops_the_judge_once_its_check_request_gets_one_too(tmp_path: Path) -> None:
    """A wrong api_base path or a parameter the model does not take fails every request: the judge stops
    (as before) once its check request gets the 400 too, and every request waits unjudged, its attempt not
    counted."""
    client = Scripted(default=lambda messages: bad_request("Unrecognized request argument supplied: frobnicate"))
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, limits={"concurrency": 16})
    feed(rt, 5, poisoned=None)
    assert run(stage) == 0
    lane = stage.engine.lanes["tj"]
    assert lane.state == "stopped_config_error" and lane.detail.startswith("bad_request:"), lane.detail
    assert "frobnicate" in lane.detail
    assert len(client.calls) == 2 and checks(client) == 1 and verdicts(rt) == []
    assert [(r.status, r.attempts) for r in requests(rt)] == [("pending", 0)] * 5
    assert errors(rt, "config") == 2 and errors(rt, "bad_request") == 0


def test_a_poisoned_request_alone_is_rejected_without_stopping_the_judge(tmp_path: Path) -> None:
    """With nothing else queued (or ``vigil judge run`` on that conversation), no other request could tell
    the request from the configuration: the judge stopped, and after a resume the same request went
    first. The check request needs no other request: the poisoned one alone is rejected."""
    client = Scripted(default=refuse_poisoned)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, limits={"concurrency": 4})
    [first] = feed(rt, 1, poisoned=0)
    assert run(stage) == 1
    lane = stage.engine.lanes["tj"]
    assert lane.state == "running", lane.detail
    assert len(client.calls) == 2 and checks(client) == 1
    [v] = verdicts(rt)
    assert (v.conversation_id, v.verdict, v.unscored_reason) == (first, "unscored", "bad_request")
    later = feed(rt, 4, poisoned=None, seed=2)
    assert run(stage) == 4
    assert [(v.conversation_id, v.verdict) for v in verdicts(rt)[1:]] == [(i, "pass") for i in later]
    assert len(client.calls) == 6


@pytest.mark.parametrize("concurrency", [1, 16])
@pytest.mark.parametrize("in_a_row", [2, 3])
def test_poisoned_requests_in_a_row_do_not_stop_the_judge(tmp_path: Path, concurrency: int, in_a_row: int) -> None:
    """Two (or three) poisoned conversations first among six: the request that was to tell the first 400
    apart got a 400 itself, so the judge stopped as if misconfigured (0 verdicts, 2 calls, all six
    waiting). The check request is answered: each poisoned conversation is rejected, the rest judged."""
    client = Scripted(default=refuse_poisoned)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, limits={"concurrency": concurrency})
    ids = feed(rt, 6, poisoned=0, in_a_row=in_a_row)
    assert run(stage) == 6
    lane = stage.engine.lanes["tj"]
    assert lane.state == "running", lane.detail
    by_id = {v.conversation_id: v for v in verdicts(rt)}
    assert [(by_id[i].verdict, by_id[i].unscored_reason) for i in ids[:in_a_row]] == [
        ("unscored", "bad_request")
    ] * in_a_row
    assert [by_id[i].verdict for i in ids[in_a_row:]] == ["pass"] * (6 - in_a_row)
    assert {(r.status, r.attempts) for r in requests(rt)} == {("done", 1)}
    # each conversation sent once; at most one check request per poisoned one (400s at once share one)
    assert len(client.calls) - checks(client) == 6 and 1 <= checks(client) <= in_a_row
    assert errors(rt, "bad_request") == in_a_row and errors(rt, "config") == 0


def test_a_configuration_turning_bad_mid_run_costs_one_check_request(tmp_path: Path) -> None:
    """A 400 for every request from some point on (a proxy's configuration changed), with up to 16 calls in
    flight: they wait for one check request, which gets the 400 too; the judge stops, nothing more is sent."""
    answered = 0

    def then_refuse(messages: list[dict[str, str]]) -> Any:
        nonlocal answered
        answered += 1
        return PASS if answered <= 10 else bad_request("Unrecognized request argument supplied: frobnicate")

    client = Scripted(default=then_refuse, delay=0.01)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, limits={"concurrency": 16})
    feed(rt, 60, poisoned=None)
    stored = run(stage)
    lane = stage.engine.lanes["tj"]
    assert lane.state == "stopped_config_error" and "frobnicate" in lane.detail, lane.detail
    assert stored == 10 and checks(client) == 1
    assert len(client.calls) <= 10 + 16 + 1  # at most what was in flight when the 400s began, and the check
    assert [r.attempts for r in requests(rt) if r.status == "pending"] == [0] * 50


def pairwise_or_verdict(messages: list[dict[str, str]]) -> Any:
    """Refuses the poisoned content; otherwise answers a pairwise prompt (the first answer wins) or a
    verdict prompt (pass)."""
    if any(POISON in str(m.get("content")) for m in messages):
        return bad_request()
    return '{"winner": "1", "rationale": "first"}' if "answer-1>" in messages[-1]["content"] else PASS


def test_a_pairwise_request_the_provider_refuses_does_not_stop_the_judge(tmp_path: Path) -> None:
    """``vigil serve`` answers pairwise requests and judges conversations in-process. A 400 for one pairwise
    request's content stopped the judge: that request got a 409, every later pairwise request a 409, and no
    conversation was judged until an operator resumed it. Now the check request tells the 400 apart:
    that comparison is stored unscored (``bad_request``), the rest are answered and judged."""
    from tests.judge.test_judge_api import runtime, sim
    from tests.support.app import INGEST, REVIEWER, make_client
    from tests.support.waiting import wait_for

    client = Scripted(default=pairwise_or_verdict)
    rt = runtime(tmp_path, client, mode="live")
    poisoned = {"input": f"Describe the picture ({POISON})", "answer_a": "A cat.", "answer_b": "A dog."}
    fine = {"input": "What is the capital of France?", "answer_a": "Paris.", "answer_b": "Lyon."}
    with make_client(rt, {"serve"}) as c:
        r = c.post("/v1/judges/tj/pairwise", json=poisoned, headers=REVIEWER)
        assert r.status_code == 200, r.text
        got = r.json()
        assert (got["result"], got["unscored_reason"], got["winner"]) == ("unscored", "bad_request", None)
        assert 1 <= checks(client) <= 2 and got["cost_usd"] == pytest.approx(0.001 * checks(client))
        [info] = c.get("/v1/judges", headers=REVIEWER).json()
        assert info["state"] == "running", info["state_detail"]
        for _ in range(2):
            r = c.post("/v1/judges/tj/pairwise", json=fine, headers=REVIEWER)
            assert r.status_code == 200 and r.json()["result"] == "position_bias", r.text
        convs = sim(4)
        assert c.post("/v1/conversations", content=orjson.dumps(convs), headers=INGEST).status_code == 202
        wait_for(lambda: c.get("/v1/verdicts", headers=REVIEWER).json()["total"] == 4)
        listed = c.get("/v1/judges/tj/pairwise", headers=REVIEWER).json()
        assert listed["total"] == 3
        metrics = c.get("/metrics").text
        # each order's call was refused
        assert 'vigil_judge_errors_total{class="bad_request",judge="tj"} 2.0' in metrics
        assert 'vigil_judge_pairwise_total{judge="tj",result="unscored"} 1.0' in metrics
    # the poisoned request's two orders (refused), four calls for the two others, one per conversation
    assert len(client.calls) - checks(client) == 2 + 4 + 4 and checks(client) <= 2
    rt.close()


def test_a_pairwise_400_for_every_request_still_stops_the_judge(tmp_path: Path) -> None:
    """A parameter the model does not take fails pairwise requests and the check request alike: the judge
    stops (409), as a configuration error must."""
    from tests.judge.test_judge_api import runtime
    from tests.support.app import REVIEWER, make_client
    from vigil.judge.stage import JudgeStage

    client = Scripted(default=lambda messages: bad_request("Unrecognized request argument supplied: frobnicate"))
    rt = runtime(tmp_path, client, mode="live")
    with make_client(rt, {"api"}) as c:
        r = c.post("/v1/judges/tj/pairwise", json={"input": "q", "answer_a": "a", "answer_b": "b"}, headers=REVIEWER)
        assert r.status_code == 409 and "frobnicate" in r.json()["detail"], r.text
    lane = rt.get(JudgeStage).engine.lanes["tj"]
    assert lane.state == "stopped_config_error" and "frobnicate" in (lane.detail or "")
    assert checks(client) >= 1 and len(client.calls) <= 4  # both orders and at most one check each
    rt.close()


def test_a_calibration_run_judges_past_a_conversation_the_provider_refuses(tmp_path: Path) -> None:
    """``vigil calibrate`` runs the judge on a labelled set: one conversation it could not send made the
    whole run fail (CalibrationError) and stopped the judge. Now that conversation is unscored and the
    report counts the others."""
    from prometheus_client import CollectorRegistry

    from tests.support.app import make_settings
    from tests.support.judge_fakes import judge_dir
    from vigil.app.runtime import build_runtime
    from vigil.app.wiring import wire
    from vigil.calibration.calibrate import calibrate
    from vigil.calibration.labelsets import LabelledItem, LabelledSet
    from vigil.judge.client import ClientOverride
    from vigil.judge.stage import JudgeStage

    settings = make_settings(
        f"sqlite:///{tmp_path / 'v.db'}",
        judges_dir=str(judge_dir(tmp_path / "judges")),
        judge_mode="live",
        calibration_min_labels=2,
    )
    rt = build_runtime(settings, registry=CollectorRegistry())
    client = Scripted(default=refuse_poisoned)
    rt.provide(ClientOverride(client))
    wire(rt, {"api"})
    convs = [Conversation.model_validate(c) for c in Simulator(parse_versions("v1:0.2"), 3).stream(6)]
    convs[2].intent = POISON
    labels = LabelledSet("inline", [LabelledItem(c.conversation_id, False, conversation=c) for c in convs])
    result = asyncio.run(calibrate(rt, "tj", labels))
    (v,) = result["versions"]
    assert v["unscored"] == 1, v
    assert rt.get(JudgeStage).engine.lanes["tj"].state == "running"
    assert len(client.calls) - checks(client) == 6 and checks(client) == 1
    rt.close()
