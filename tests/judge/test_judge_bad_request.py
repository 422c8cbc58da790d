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
    """Whether ``messages`` are the judge's check request."""
    from vigil.judge.prompt import CHECK_CONVERSATION

    return f"agent: {CHECK_CONVERSATION.agent_id} " in messages[-1]["content"]


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
