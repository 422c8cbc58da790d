"""A failed model call leaves nothing for the garbage collector.

A provider's error, through the client's frames, is in a cycle with the frames it was raised through:
the judge's attempt with its prompt (the whole transcript), the parsed conversation and its document.
Freed only when the collector next ran: a provider down (every call a 5xx or a timeout, retried under
the judge's policy) piled up a prompt for every failed call.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.judge.test_judge_worker import requests, setup
from tests.support.frames import garbage_frames
from tests.support.judge_fakes import PASS, Scripted


def test_a_failed_call_leaves_its_prompt_for_no_one(tmp_path: Path) -> None:
    client = Scripted(default="litellm.InternalServerError", via_litellm=True)
    more = {"judge_max_attempts": 2, "judge_circuit_failures": 100}
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=3, settings=more)
    with garbage_frames() as held:
        asyncio.run(stage.worker.run_until_idle(30))
    assert [(r.status, r.attempts) for r in requests(rt)] == [("done", 2)] * 3 and len(client.calls) == 6
    assert not held, f"frames of Vigil's left for the garbage collector: {held}"


def test_a_call_tried_again_inline_leaves_its_prompt_for_no_one(tmp_path: Path) -> None:
    """Pairwise comparisons and calibration retry inline (``call_with_retries``)."""
    client = Scripted(["litellm.InternalServerError"], default=PASS, via_litellm=True)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, settings={"judge_retry_base_seconds": 0.01})
    lane = stage.engine.lanes["tj"]
    with garbage_frames() as held:
        reply, _ms, attempts = asyncio.run(
            stage.engine.call_with_retries(lane, [{"role": "user", "content": "x" * 100_000}], max_attempts=2)
        )
    assert attempts == 2 and reply.text == PASS
    assert not held, f"frames of Vigil's left for the garbage collector: {held}"


def test_a_reply_asked_again_leaves_its_prompt_for_no_one(tmp_path: Path) -> None:
    """A 200 the client cannot read is asked again (``VIGIL_JUDGE_REASKS``): each unread reply's error held
    the prompt until the collector ran."""
    from tests.judge.test_judge_bad_request import feed, run
    from tests.judge.test_judge_unreadable_replies import UNREADABLE
    from tests.support.fake_openai import Script, fake_openai
    from vigil.judge.client import LiteLLMClient

    script = Script(calls=[], answer=PASS)
    body = UNREADABLE[sorted(UNREADABLE)[0]]
    script.fault_for = lambda _request: body
    with fake_openai(script) as (url, _):
        extra = {"extra_params": {"api_base": url, "api_key": "sk-test"}}
        rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, LiteLLMClient(), **extra)
        feed(rt, 1, poisoned=0)
        with garbage_frames() as held:
            assert run(stage) == 1
    assert {(r.status, r.attempts) for r in requests(rt)} == {("done", 1)}
    assert not held, f"frames of Vigil's left for the garbage collector: {held}"
