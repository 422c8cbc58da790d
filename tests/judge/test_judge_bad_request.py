"""A provider's 400 that only one request gets must not stop the judge; one that every request gets must.

Replies are scripted at the client boundary (:class:`tests.support.judge_fakes.Scripted`, raising litellm's
own ``BadRequestError``), as in ``test_judge_worker.py``; the worker runs until idle, bounded by a deadline.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.judge.test_judge_worker import metric, requests, setup, verdicts
from tests.support.judge_fakes import PASS, Scripted, litellm_error
from tests.support.waiting import scaled
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.judge import store
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


def feed(rt: Any, n: int, poisoned: int | None, seed: int = 1) -> list[str]:
    convs = [Conversation.model_validate(c) for c in Simulator(parse_versions("v1:0.2"), seed).stream(n)]
    if poisoned is not None:
        convs[poisoned].intent = POISON
    rt.pipeline.process(convs, "test")
    return [c.conversation_id for c in convs]


def run(stage: Any, timeout: float = 20.0) -> int:
    return asyncio.run(stage.worker.run_until_idle(scaled(timeout)))


def errors(rt: Any, cls: str) -> float:
    return metric(rt, "vigil_judge_errors_total", judge="tj", **{"class": cls})


@pytest.mark.parametrize("concurrency", [1, 16])
def test_one_request_the_provider_refuses_with_a_400_does_not_stop_the_judge(tmp_path: Path, concurrency: int) -> None:
    """The poisoned conversation is claimed first; it stopped the judge for all six, and after a resume
    stopped it again. Now another request is tried: it succeeds, so the 400 is that request's own."""
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
    assert len(client.calls) == 6  # the poisoned request was sent once, not retried
    assert errors(rt, "bad_request") == 1 and errors(rt, "config") == 0
    assert metric(rt, "vigil_judge_state", judge="tj", state="stopped_config_error") == 0


def test_a_400_for_every_request_stops_the_judge_after_a_second_request_confirms_it(tmp_path: Path) -> None:
    """A wrong api_base path or a parameter the model does not take fails every request: the judge stops
    (as before) after one more request, and every request waits unjudged, its attempt not counted."""
    client = Scripted(default=lambda messages: bad_request("Unrecognized request argument supplied: frobnicate"))
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, limits={"concurrency": 16})
    feed(rt, 5, poisoned=None)
    assert run(stage) == 0
    lane = stage.engine.lanes["tj"]
    assert lane.state == "stopped_config_error" and lane.detail.startswith("bad_request:"), lane.detail
    assert "frobnicate" in lane.detail
    assert len(client.calls) == 2 and verdicts(rt) == []
    assert [(r.status, r.attempts) for r in requests(rt)] == [("pending", 0)] * 5
    assert errors(rt, "config") == 2 and errors(rt, "bad_request") == 0


def test_a_poisoned_request_alone_stops_the_judge_and_is_rejected_after_a_resume(tmp_path: Path) -> None:
    """With nothing else queued no other request can tell the request from the configuration: the judge
    stops. Once more requests wait and an operator resumes, the same request goes first again; it no
    longer stops the judge: another request succeeds and it alone is rejected."""
    client = Scripted(default=refuse_poisoned)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, limits={"concurrency": 4})
    first = feed(rt, 1, poisoned=0)
    assert run(stage) == 0
    lane = stage.engine.lanes["tj"]
    assert lane.state == "stopped_config_error" and REFUSED in lane.detail
    assert "no other request" in lane.detail
    later = feed(rt, 4, poisoned=None, seed=2)
    with rt.sessions.begin() as s:
        store.request_resume(s, "tj", datetime.now(UTC) + timedelta(seconds=1))
    assert run(stage) == 5
    assert lane.state == "running", lane.detail
    by_id = {v.conversation_id: v for v in verdicts(rt)}
    assert (by_id[first[0]].verdict, by_id[first[0]].unscored_reason) == ("unscored", "bad_request")
    assert [by_id[i].verdict for i in later] == ["pass"] * 4
