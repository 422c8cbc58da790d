"""Replies that cannot be read: asked again a bounded number of times, then unscored, every call's spend counted.

Two kinds: a completion whose text is not the verdict object (scripted at the client boundary,
:class:`tests.support.judge_fakes.Scripted`), and a 200 whose body litellm itself cannot read (an
OpenAI-compatible endpoint, :mod:`tests.support.fake_openai`, through the real ``LiteLLMClient``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.judge.test_judge_bad_request import POISON, feed, run
from tests.judge.test_judge_worker import metric, requests, setup, verdicts
from tests.support.fake_openai import Script, fake_openai
from tests.support.judge_fakes import FAIL, PASS, Scripted
from vigil.judge.client import LiteLLMClient

PROSE = "I think the agent did fine, so: pass."


def parse_errors(rt: Any) -> float:
    return metric(rt, "vigil_judge_errors_total", judge="tj", **{"class": "parse"})


def prose_for_poisoned(messages: list[dict[str, str]]) -> str:
    """A model that always answers the poisoned conversation in prose, never with the object asked for."""
    return PROSE if POISON in messages[-1]["content"] else PASS


def test_a_reply_that_is_not_the_verdict_object_is_asked_again_then_unscored_with_every_calls_spend(
    tmp_path: Path,
) -> None:
    """A conversation whose replies are always prose: one call and an ``invalid_json`` verdict, never asked
    again. Now it is asked once more (``VIGIL_JUDGE_REASKS``, 1), then unscored with the last reply stored,
    the rationale saying what each reply was, and both calls' tokens and cost stored."""
    client = Scripted(default=prose_for_poisoned)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, limits={"concurrency": 1})
    ids = feed(rt, 4, poisoned=0)
    assert run(stage) == 4
    by_id = {v.conversation_id: v for v in verdicts(rt)}
    v = by_id[ids[0]]
    assert (v.verdict, v.unscored_reason, v.raw_reply) == ("unscored", "invalid_json", PROSE)
    assert "asked 2 times" in (v.rationale or "") and "(invalid_json, invalid_json)" in (v.rationale or "")
    assert (v.prompt_tokens, v.completion_tokens, v.cost_usd) == (240, 60, pytest.approx(0.002))
    assert [by_id[i].verdict for i in ids[1:]] == ["pass"] * 3
    assert len(client.calls) == 4 + 1 and parse_errors(rt) == 2
    assert {(r.status, r.attempts) for r in requests(rt)} == {("done", 1)}
    assert stage.engine.lanes["tj"].budget.spent == pytest.approx(0.005)  # every call, the re-ask too


def test_a_reply_that_slipped_once_is_judged_from_the_reask(tmp_path: Path) -> None:
    """A model that wraps its object in prose once and answers properly when asked again: the verdict is
    the second reply's, and the spend both calls'."""
    client = Scripted([PROSE, FAIL])
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=1)
    assert run(stage) == 1
    [v] = verdicts(rt)
    assert (v.verdict, v.unscored_reason, v.raw_reply) == ("fail", None, FAIL)
    assert (v.cost_usd, v.prompt_tokens) == (pytest.approx(0.002), 240)
    assert len(client.calls) == 2 and client.calls[0][2] == client.calls[1][2]  # the same request, as it was
    assert parse_errors(rt) == 1


def test_no_reasks_when_set_to_zero(tmp_path: Path) -> None:
    client = Scripted(default=PROSE)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=1, settings={"judge_reasks": 0})
    assert run(stage) == 1
    [v] = verdicts(rt)
    assert (v.unscored_reason, v.rationale, v.cost_usd) == ("invalid_json", None, 0.001)
    assert len(client.calls) == 1


def _completion(content: Any) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 40, "total_tokens": 940},
        }
    )


UNREADABLE = {
    "content_parts": _completion([{"type": "text", "text": PASS}]),
    "content_object": _completion(json.loads(PASS)),
    "no_choices": b'{"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini"}',
    "not_json": b"<html><body>upstream sent garbage</body></html>",
    "cut_body": _completion(PASS)[:60],
    "a_list": b"[1, 2]",
}


@pytest.mark.parametrize("body", sorted(UNREADABLE))
def test_a_200_the_client_cannot_read_is_asked_again_then_unscored_and_opens_no_circuit(
    tmp_path: Path, body: str
) -> None:
    """An endpoint answers one conversation with a 200 whose body litellm cannot read (raised as a 500 of
    its own). It was retried as an outage: 5 calls for that conversation, each with backoff, the circuit
    opened for every conversation of the judge after 3 in a row, and with the circuit out of the way
    VIGIL_JUDGE_MAX_ATTEMPTS (6) calls, then ``gave_up`` with no reply stored. Now: asked once more, then
    ``unscored`` (``unreadable_reply``, litellm's words as rationale); the judge runs on."""
    script = Script(calls=[], answer=PASS)
    sent: list[bool] = []

    def fault(request: dict[str, Any]) -> bytes | None:
        poisoned = POISON in orjson.dumps(request).decode()
        sent.append(poisoned)
        return UNREADABLE[body] if poisoned else None

    script.fault_for = fault
    with fake_openai(script) as (url, _):
        extra = {"extra_params": {"api_base": url, "api_key": "sk-test"}}
        rt, stage = setup(
            f"sqlite:///{tmp_path / 'v.db'}", tmp_path, LiteLLMClient(), limits={"concurrency": 1}, **extra
        )
        ids = feed(rt, 5, poisoned=0)
        assert run(stage) == 5
    lane = stage.engine.lanes["tj"]
    assert lane.state == "running", lane.detail
    by_id = {v.conversation_id: v for v in verdicts(rt)}
    v = by_id[ids[0]]
    assert (v.verdict, v.unscored_reason) == ("unscored", "unreadable_reply")
    assert "asked 2 times" in (v.rationale or "") and "InternalServerError" in (v.rationale or "")
    assert v.cost_usd is None  # litellm read no usage from it: unknown, not $0
    assert [by_id[i].verdict for i in ids[1:]] == ["pass"] * 4
    assert sum(sent) == 2 and len(sent) == 6
    assert {(r.status, r.attempts) for r in requests(rt)} == {("done", 1)}
    assert parse_errors(rt) == 2
    assert metric(rt, "vigil_judge_errors_total", judge="tj", **{"class": "retryable"}) == 0


def test_a_pairwise_reply_the_client_cannot_read_is_unscored_not_a_provider_error(tmp_path: Path) -> None:
    """Pairwise: each order's unreadable reply was retried and counted toward the circuit (4 calls, 502).
    Now each order is asked once and the comparison is unscored."""
    from tests.judge.test_judge_api import runtime
    from tests.support.app import REVIEWER, make_client

    script = Script(calls=[], answer=PASS)
    script.fault = lambda: UNREADABLE["content_parts"]
    with fake_openai(script) as (url, _):
        rt = runtime(
            tmp_path,
            LiteLLMClient(),
            mode="live",
            extra_params={"api_base": url, "api_key": "sk-test"},
        )
        with make_client(rt, {"api"}) as c:
            r = c.post(
                "/v1/judges/tj/pairwise", json={"input": "q", "answer_a": "a", "answer_b": "b"}, headers=REVIEWER
            )
    assert r.status_code == 200, r.text
    assert (r.json()["result"], r.json()["unscored_reason"]) == ("unscored", "unreadable_reply")
    rt.close()
