"""Hostile or broken provider replies: impossible usage figures, huge replies, ambiguous JSON.

Replies are scripted at the client boundary (the ``complete`` of :class:`tests.support.judge_fakes.Scripted`
shape), as in ``test_judge_worker.py``; the worker runs until idle, bounded by a deadline, never a sleep.
"""

from __future__ import annotations

import asyncio
import math
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tests.judge.test_judge_worker import metric, requests, setup, verdicts
from tests.support.judge_fakes import PASS, Scripted
from tests.support.waiting import scaled
from vigil.judge.client import Reply
from vigil.judge.limits import Budget
from vigil.judge.parse import parse_pairwise, parse_verdict
from vigil.store.models import PairwiseRow

CATEGORIES = ["wrong_action", "other"]
PRICE = {"input_per_1k_usd": 1.0, "output_per_1k_usd": 1.0}
CAP = {"rpm": 100_000, "concurrency": 4, "daily_budget_usd": 1.0}


class Usage:
    """Answers every call with ``text`` and the given usage figures, however impossible."""

    def __init__(self, prompt: Any, completion: Any, cost: Any, text: str = PASS) -> None:
        self.prompt, self.completion, self.cost, self.text = prompt, completion, cost, text
        self.calls = 0

    async def complete(self, model: str, messages: list[dict[str, str]], **params: Any) -> Reply:
        self.calls += 1
        return Reply(self.text, self.prompt, self.completion, self.cost)


def run(stage: Any, timeout: float = 15.0) -> int:
    return asyncio.run(stage.worker.run_until_idle(scaled(timeout)))


def anomalies(rt: Any) -> float:
    return metric(rt, "vigil_judge_errors_total", judge="tj", **{"class": "usage_anomaly"})


# --- usage figures ------------------------------------------------------------------------------


def test_negative_cost_and_tokens_are_unknown_one_call_per_request(tmp_path: Path) -> None:
    client = Usage(-10, -5, -50.0)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=3, limits=CAP)
    assert run(stage) == 3
    assert client.calls == 3  # no retry loop after a paid call
    vs = verdicts(rt)
    assert [v.verdict for v in vs] == ["pass"] * 3
    assert all((v.prompt_tokens, v.completion_tokens, v.cost_usd, v.attempts) == (None, None, None, 1) for v in vs)
    assert {(r.status, r.attempts) for r in requests(rt)} == {("done", 1)}
    budget = stage.engine.lanes["tj"].budget
    assert budget.spent == 0 and budget.estimate == 0 and budget.reserved == 0
    assert metric(rt, "vigil_judge_budget_used_usd", judge="tj") == 0
    assert metric(rt, "vigil_judge_cost_usd_total", judge="tj", model="openai/gpt-4o-mini") == 0
    assert metric(rt, "vigil_judge_tokens_total", judge="tj", kind="prompt") == 0
    assert anomalies(rt) == 3  # one per reply
    lane = stage.engine.lanes["tj"]  # honest about the spend: unknown, not $0, and why
    assert lane.state == "budget_unknown" and "impossible cost (cost_usd=-50.0)" in (lane.detail or "")


def test_negative_tokens_with_a_price_cost_nothing_not_a_negative_spend(tmp_path: Path) -> None:
    client = Usage(-1000, -1000, None)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=3, limits=CAP, price=PRICE)
    assert run(stage) == 3 and client.calls == 3
    assert all(v.verdict == "pass" and v.cost_usd is None and v.prompt_tokens is None for v in verdicts(rt))
    assert stage.engine.lanes["tj"].budget.spent == 0
    assert metric(rt, "vigil_judge_budget_used_usd", judge="tj") == 0
    assert anomalies(rt) == 3


def test_negative_cost_falls_back_to_the_price_from_valid_tokens(tmp_path: Path) -> None:
    client = Usage(100, 50, -50.0)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=2, limits=CAP, price=PRICE)
    assert run(stage) == 2 and client.calls == 2
    assert [v.cost_usd for v in verdicts(rt)] == [pytest.approx(0.15)] * 2
    assert stage.engine.lanes["tj"].budget.spent == pytest.approx(0.3)
    assert metric(rt, "vigil_judge_budget_used_usd", judge="tj") == pytest.approx(0.3)
    assert anomalies(rt) == 2


@pytest.mark.parametrize("cost", [math.nan, math.inf, -math.inf])
def test_non_finite_cost_is_unknown_and_the_budget_stays_a_number(tmp_path: Path, cost: float) -> None:
    client = Scripted(cost=cost)  # 120 prompt and 30 completion tokens, a cost of ``cost``
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=3, limits=CAP, price=PRICE)
    assert run(stage) == 3 and len(client.calls) == 3
    vs = verdicts(rt)
    assert [v.cost_usd for v in vs] == [pytest.approx(0.15)] * 3  # priced from the tokens instead
    budget = stage.engine.lanes["tj"].budget
    assert budget.spent == pytest.approx(0.45) and math.isfinite(budget.estimate)
    assert metric(rt, "vigil_judge_budget_used_usd", judge="tj") == pytest.approx(0.45)
    assert anomalies(rt) == 3


def test_nan_cost_spend_still_reaches_the_cap(tmp_path: Path) -> None:
    # each call costs 0.15 by the price; with a NaN spend the cap would never be reached
    client = Scripted(cost=math.nan)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=20, limits=CAP, price=PRICE)
    run(stage)
    lane = stage.engine.lanes["tj"]
    assert lane.state == "paused_budget" and lane.budget.exhausted
    assert len(client.calls) < 20 and lane.budget.spent <= 1.0 + 4 * 0.15


def test_budget_settle_never_goes_negative_or_nan() -> None:
    b = Budget(1.0)
    day = date(2025, 1, 1)
    b.roll(day)
    b.settle(0.0, 0.1)
    for bad in (-100.0, math.nan, math.inf, -math.inf):
        b.settle(0.0, bad)
        assert b.spent == pytest.approx(0.1) and b.estimate == pytest.approx(0.1)
    b.observe(day, math.nan)
    b.observe(day, -5.0)
    assert b.spent == pytest.approx(0.1) and not b.exhausted
    b.settle(0.0, 0.95)
    assert b.exhausted


# --- the worker's catch-all -----------------------------------------------------------------------


def test_an_unexpected_error_is_retried_at_most_max_attempts_then_gave_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(text: str | None, categories: list[str]) -> Any:
        raise RuntimeError("parser bug")

    monkeypatch.setattr("vigil.judge.attempt.parse_verdict", broken)
    client = Scripted()
    rt, stage = setup(
        f"sqlite:///{tmp_path / 'v.db'}",
        tmp_path,
        client,
        n=1,
        settings={"judge_max_attempts": 3, "judge_circuit_failures": 100},
    )
    assert run(stage) == 1
    assert len(client.calls) == 3
    [r] = requests(rt)
    assert (r.status, r.attempts) == ("done", 3)
    [v] = verdicts(rt)
    assert (v.verdict, v.unscored_reason, v.attempts) == ("unscored", "gave_up", 3)
    assert "gave up after 3 attempts" in (v.rationale or "") and "parser bug" in (v.rationale or "")
    assert metric(rt, "vigil_judge_errors_total", judge="tj", **{"class": "gave_up"}) == 1


# --- the reply itself -------------------------------------------------------------------------------


def test_a_huge_reply_keeps_its_verdict_and_stores_a_capped_raw_reply(tmp_path: Path) -> None:
    big = '{"verdict":"fail","score":0.5,"categories":[],"rationale":"' + "A" * 10_000_000 + '"}'
    client = Scripted([big])
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=1)
    assert run(stage) == 1
    [v] = verdicts(rt)
    assert (v.verdict, v.score) == ("fail", 0.5) and len(v.rationale or "") == 2000
    raw = v.raw_reply or ""
    assert 64 * 1024 <= len(raw) <= 64 * 1024 + 200
    assert raw.startswith(big[: 64 * 1024]) and "truncated" in raw[64 * 1024 :]
    assert str(len(big)) in raw[64 * 1024 :]


def test_a_small_reply_is_stored_whole(tmp_path: Path) -> None:
    client = Scripted([PASS])
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=1)
    assert run(stage) == 1
    [v] = verdicts(rt)
    assert v.raw_reply == PASS


@pytest.mark.parametrize(
    "text",
    [
        '{"verdict":"pass","score":0.9,"categories":[],"verdict":"fail"}',
        '{"verdict":"fail","score":0.1,"score":0.9,"categories":[]}',
        '```json\n{"verdict":"pass","score":0.9,"rationale":"a","rationale":"b"}\n```',
    ],
)
def test_duplicate_keys_are_refused_as_ambiguous(text: str) -> None:
    p = parse_verdict(text, CATEGORIES)
    assert (p.verdict, p.score, p.unscored_reason) == ("unscored", None, "duplicate_keys")


def test_duplicate_keys_in_a_pairwise_reply_are_refused() -> None:
    c = parse_pairwise('{"winner":"1","rationale":"x","winner":"2"}')
    assert (c.choice, c.unscored_reason) == (None, "duplicate_keys")
    assert parse_pairwise('{"winner":"2","rationale":"x"}').choice == "2"


def test_a_duplicate_key_reply_is_an_unscored_verdict_counted_as_a_parse_error(tmp_path: Path) -> None:
    client = Scripted(default='{"verdict":"pass","score":0.9,"categories":[],"verdict":"fail"}')
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=1)
    assert run(stage) == 1
    [v] = verdicts(rt)
    assert (v.verdict, v.unscored_reason) == ("unscored", "duplicate_keys")
    # asked once more (VIGIL_JUDGE_REASKS), with the same answer: each reply a parse error
    assert len(client.calls) == 2
    assert metric(rt, "vigil_judge_errors_total", judge="tj", **{"class": "parse"}) == 2


# --- what the database cannot hold --------------------------------------------------------------


def test_nul_in_a_reply_is_stored_on_every_database(db_url, tmp_path: Path) -> None:
    """Postgres refuses NUL in text and counts beyond an INTEGER: one such reply used to fail every later
    batch of verdicts, while the worker kept paying for calls whose verdicts it could not write."""
    nul_rationale = '{"verdict":"fail","score":0.1,"categories":["other"],"rationale":"see \\u0000 here"}'
    client = Scripted([nul_rationale, "not json \x00 at all", PASS])
    # one reply each (re-asks are test_judge_unreadable_replies.py's subject)
    rt, stage = setup(db_url, tmp_path, client, n=3, settings={"judge_reasks": 0})
    assert run(stage) == 3
    by_reply = {v.raw_reply: v for v in verdicts(rt)}
    assert by_reply[nul_rationale].rationale == "see \ufffd here" and by_reply[nul_rationale].verdict == "fail"
    assert by_reply["not json \ufffd at all"].verdict == "unscored"
    assert {(r.status, r.attempts) for r in requests(rt)} == {("done", 1)}


def test_a_token_count_beyond_what_a_column_holds_is_unknown(db_url, tmp_path: Path) -> None:
    client = Usage(2**31, 2**40, 0.001)
    rt, stage = setup(db_url, tmp_path, client, n=2, limits=CAP)
    assert run(stage) == 2 and client.calls == 2
    assert all(v.verdict == "pass" and (v.prompt_tokens, v.completion_tokens) == (None, None) for v in verdicts(rt))
    assert anomalies(rt) == 2


def test_a_row_the_database_refuses_is_stored_plain_and_holds_up_no_other(
    pg_url, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever else a reply may hold that the database refuses, the batch is written one outcome at a
    time and the refused one again without what came from outside: every request gets its verdict."""
    monkeypatch.setattr("vigil.judge.engine.sanitize_usage", lambda reply: [])  # let a huge count through
    client = Usage(2**40, 10, 0.002)
    rt, stage = setup(pg_url, tmp_path, client, n=3, limits=CAP)
    assert run(stage) == 3
    assert client.calls == 3  # each request judged once: no lease ran out, no call paid twice
    vs = verdicts(rt)
    assert [(v.verdict, v.unscored_reason, v.raw_reply) for v in vs] == [("unscored", "unstorable_reply", None)] * 3
    assert [v.cost_usd for v in vs] == [0.002] * 3  # the spend is kept
    assert {(r.status, r.attempts) for r in requests(rt)} == {("done", 1)}


@pytest.mark.parametrize(("prompt", "completion"), [(0, 0), (None, None)])
def test_a_reply_without_usage_is_unknown_spend_not_free(tmp_path: Path, prompt: Any, completion: Any) -> None:
    """A provider that reports no usage: litellm fills in zero tokens and prices them at $0.00, so a
    daily cap was never reached (20 of 20 calls under a $0.0001 cap). Zero prompt tokens and a zero cost
    without usage are unknown spend: the judge says so (budget_unknown) instead of counting $0."""
    client = Usage(prompt, completion, 0.0)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=3, limits=CAP)
    assert run(stage) == 3
    vs = verdicts(rt)
    assert all((v.prompt_tokens, v.completion_tokens, v.cost_usd) == (None, None, None) for v in vs)
    lane = stage.engine.lanes["tj"]
    assert lane.state == "budget_unknown" and lane.budget.spent == 0
    assert metric(rt, "vigil_judge_budget_used_usd", judge="tj") == 0
    assert anomalies(rt) == 3
    # a real reply's usage is kept as reported, a free model's $0 with it
    client = Usage(120, 0, 0.0)
    rt, stage = setup(f"sqlite:///{tmp_path / 'w.db'}", tmp_path / "w", client, n=1, limits=CAP)
    assert run(stage) == 1
    [v] = verdicts(rt)
    assert (v.prompt_tokens, v.completion_tokens, v.cost_usd) == (120, 0, 0.0)


@pytest.mark.parametrize(
    "text",
    [
        '{"verdict":"pass","score":0.9,"categories":["wrong_action"],"rationale":"fine, but wrong action"}',
        '{"verdict":"pass","score":0,"categories":[]}',
        '{"verdict":"fail","score":1.0,"categories":[]}',
    ],
)
def test_a_reply_that_contradicts_itself_is_unscored(text: str) -> None:
    """A pass naming failure categories was stored as a pass carrying a failure category; a fail scored 1
    (1 = fully meets the rubric) as a fail. Neither says anything to count."""
    p = parse_verdict(text, CATEGORIES)
    assert (p.verdict, p.score, p.categories, p.unscored_reason) == ("unscored", None, [], "inconsistent")


def test_consistent_replies_are_kept() -> None:
    assert parse_verdict('{"verdict":"pass","score":0.4,"categories":[]}', CATEGORIES).verdict == "pass"
    assert parse_verdict('{"verdict":"fail","score":0.8,"categories":[]}', CATEGORIES).verdict == "fail"
    fail = parse_verdict('{"verdict":"fail","score":0,"categories":["other"]}', CATEGORIES)
    assert (fail.verdict, fail.categories) == ("fail", ["other"])


@pytest.mark.parametrize("price", [None, PRICE], ids=["litellm-price", "judge-yaml-price"])
def test_an_impossible_token_count_makes_the_whole_reports_spend_unknown(tmp_path: Path, price: Any) -> None:
    """-5 prompt tokens and 10 completion tokens: litellm priced the reply from those very counts
    ($5.25e-06 was charged) and the judge stayed `running`; with a price in judge.yaml the 10 completion
    tokens alone were charged. The spend of such a reply is unknown, and the judge says so."""
    client = Usage(-5, 10, 5.25e-06)
    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client, n=2, limits=CAP, price=price)
    assert run(stage) == 2 and client.calls == 2
    vs = verdicts(rt)
    assert all((v.verdict, v.prompt_tokens, v.completion_tokens, v.cost_usd) == ("pass", None, None, None) for v in vs)
    lane = stage.engine.lanes["tj"]
    assert (
        lane.budget.spent == 0 and metric(rt, "vigil_judge_cost_usd_total", judge="tj", model="openai/gpt-4o-mini") == 0
    )
    assert lane.state == "budget_unknown", (lane.state, lane.detail)
    assert anomalies(rt) == 2


# --- pairwise replies -------------------------------------------------------------------------------


def _pairwise_replies(messages: list[dict[str, str]]) -> str:
    """Both orders prefer answer A: one reply with a NUL in its rationale, the other 100 KB long."""
    user = messages[1]["content"]
    if "alpha" in user[user.index("answer-1>") : user.index("answer-2>")]:
        return '{"winner": "1", "rationale": "a \\u0000 b"}'
    return '{"winner": "2", "rationale": "second"}' + " " * 100_000


def test_a_pairwise_reply_the_database_cannot_hold_is_stored_and_answered(db_url: str, tmp_path: Path) -> None:
    """A NUL in a pairwise rationale made Postgres refuse the comparison's row (jsonb holds no NUL): the
    caller got a 500 for two paid calls, and their spend was never stored, so no budget counted it."""
    from prometheus_client import CollectorRegistry

    from tests.support.app import REVIEWER, make_client, make_settings
    from tests.support.judge_fakes import judge_dir
    from vigil.app.runtime import build_runtime
    from vigil.judge import store
    from vigil.judge.client import ClientOverride
    from vigil.store.db import utcnow

    jd = judge_dir(tmp_path / "judges")
    rt = build_runtime(make_settings(db_url, judges_dir=str(jd), judge_mode="live"), registry=CollectorRegistry())
    client = Scripted(default=_pairwise_replies)
    rt.provide(ClientOverride(client))
    body = {"input": "q", "answer_a": "alpha", "answer_b": "beta"}
    with make_client(rt, {"api"}) as c:
        r = c.post("/v1/judges/tj/pairwise", json=body, headers=REVIEWER)
        assert r.status_code == 200, r.text
        got = r.json()
        assert (got["result"], got["cost_usd"]) == ("a", 0.002)
        assert got["rationales"] == ["a \ufffd b", "second"]
        listed = c.get("/v1/judges/tj/pairwise", headers=REVIEWER).json()
        assert listed["total"] == 1 and listed["items"][0]["rationales"][0] == "a \ufffd b"
    with rt.sessions() as s:
        [raw_1, raw_2] = s.scalars(select(PairwiseRow.raw_replies)).one()
        assert store.spend_since(s, utcnow().replace(hour=0, minute=0, second=0, microsecond=0))["tj"] == (0.002, 1)
    assert raw_1 == '{"winner": "1", "rationale": "a \\u0000 b"}'  # the escape is text, kept as sent
    assert 64 * 1024 <= len(raw_2) <= 64 * 1024 + 200 and "truncated" in raw_2  # capped like a verdict's
    assert len(client.calls) == 2
    rt.close()


# --- replies the provider ended early -------------------------------------------------------------


def _openai_reply(content: str | None, finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 200, "total_tokens": 250},
    }


def test_a_reply_cut_short_says_why_not_invalid_json(tmp_path: Path) -> None:
    """A reply cut at max_tokens (cut-off JSON, or nothing at all from a reasoning model that spent its
    tokens thinking) was stored as ``invalid_json`` / ``empty_reply``, blaming the model for the judge's
    max_tokens; one stopped by the provider's content filter likewise. The provider's finish_reason says
    which: ``truncated`` and ``content_filtered``."""
    from tests.support.fake_openai import Script, fake_openai
    from vigil.judge.client import LiteLLMClient

    replies = [
        (PASS[:25], "length"),
        (None, "length"),
        (None, "content_filter"),
        ("not json", "stop"),
    ]
    script = Script()
    script.reply = lambda body: _openai_reply(*replies.pop(0))  # type: ignore[method-assign]
    with fake_openai(script) as (url, _):
        extra = {"extra_params": {"api_base": url, "api_key": "sk-test"}}
        # one reply each (re-asks are test_judge_unreadable_replies.py's subject)
        rt, stage = setup(
            f"sqlite:///{tmp_path / 'v.db'}",
            tmp_path,
            LiteLLMClient(),
            n=4,
            limits=CAP,
            settings={"judge_reasks": 0},
            **extra,
        )
        assert run(stage) == 4
    got = sorted((v.unscored_reason or "", v.rationale or "") for v in verdicts(rt))
    assert [reason for reason, _ in got] == ["content_filtered", "invalid_json", "truncated", "truncated"]
    assert "content filter" in got[0][1] and all("max_tokens (200)" in why for _, why in got[2:])
    assert metric(rt, "vigil_judge_errors_total", judge="tj", **{"class": "rejected"}) == 1
    assert metric(rt, "vigil_judge_errors_total", judge="tj", **{"class": "parse"}) == 3
    assert {(r.status, r.attempts) for r in requests(rt)} == {("done", 1)}  # paid calls: never retried


class CutShort:
    """Answers every call with a reply cut at max_tokens."""

    async def complete(self, model: str, messages: list[dict[str, str]], **params: Any) -> Reply:
        return Reply('{"winner": "1", "rati', 50, 200, 0.001, finish_reason="length")


def test_a_pairwise_reply_cut_short_says_why(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from tests.support.app import REVIEWER, make_client, make_settings
    from tests.support.judge_fakes import judge_dir
    from vigil.app.runtime import build_runtime
    from vigil.judge.client import ClientOverride

    jd = judge_dir(tmp_path / "judges")
    settings = make_settings(f"sqlite:///{tmp_path / 'v.db'}", judges_dir=str(jd), judge_mode="live")
    rt = build_runtime(settings, registry=CollectorRegistry())
    rt.provide(ClientOverride(CutShort()))
    with make_client(rt, {"api"}) as c:
        got = c.post("/v1/judges/tj/pairwise", json={"input": "q", "answer_a": "a", "answer_b": "b"}, headers=REVIEWER)
    assert (got.json()["result"], got.json()["unscored_reason"]) == ("unscored", "truncated")
    rt.close()


AZURE_FILTERED = (
    "The response was filtered due to the prompt triggering Azure OpenAI's content management policy. "
    "Please modify your prompt and retry."
)


def test_a_content_filter_refusal_from_a_compatible_endpoint_does_not_stop_the_judge(tmp_path: Path) -> None:
    """An Azure deployment behind an OpenAI-compatible proxy refuses a prompt its filter flags with a 400,
    which litellm raises as a plain BadRequestError: it was a configuration error, so one conversation
    stopped the judge for all, and after each `vigil judge resume` the same request went first and
    stopped it again. It is the content filter's refusal of that one request: unscored content_filtered."""
    from tests.support.fake_openai import Script, fake_openai
    from vigil.judge.client import LiteLLMClient

    faults: list[Any] = [(400, AZURE_FILTERED)]
    script = Script(fault=lambda: faults.pop(0) if faults else None)
    script.reply = lambda body: _openai_reply(PASS, "stop")  # type: ignore[method-assign]
    with fake_openai(script) as (url, _):
        extra = {"extra_params": {"api_base": url, "api_key": "sk-test"}}
        settings = {"judge_max_attempts": 2}
        rt, stage = setup(
            f"sqlite:///{tmp_path / 'v.db'}", tmp_path, LiteLLMClient(), n=3, limits=CAP, settings=settings, **extra
        )
        assert run(stage) == 3
    lane = stage.engine.lanes["tj"]
    assert lane.state == "running", lane.detail
    assert sorted((v.verdict, v.unscored_reason or "") for v in verdicts(rt)) == [
        ("pass", ""),
        ("pass", ""),
        ("unscored", "content_filtered"),
    ]
    assert {(r.status, r.attempts) for r in requests(rt)} == {("done", 1)}


class _Status400(Exception):
    status_code = 400


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (AZURE_FILTERED, "content_filtered"),
        ('{"code": "content_filter", "message": "blocked"}', "content_filtered"),
        ("Your request was rejected as a result of our safety system.", "content_filtered"),
        ("Unsupported value: 'temperature' does not support 0 with this model.", "bad_request"),
    ],
)
def test_a_400_is_a_content_filter_only_when_it_says_so(message: str, reason: str) -> None:
    from vigil.judge.client import classify

    err = classify(_Status400(message))
    assert err.reason == reason and err.kind == ("rejected" if reason == "content_filtered" else "config")
