"""The offline judge on real τ²-bench conversations: stop turns of the simulated user are not "no reply"."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.support.services import shared_data
from vigil.app.runtime import build_runtime
from vigil.ingest.importers import load_file
from vigil.judge.definitions import Judge, load_judges
from vigil.judge.offline import final_message, offline_verdict
from vigil.schema import Conversation
from vigil.settings import PROJECT_ROOT, Settings


@pytest.fixture(scope="module")
def judged() -> list[tuple[Conversation, float, str, str]]:
    """(conversation, reward, offline verdict, rationale) for every τ² conversation in the shared data."""
    settings = Settings(database_url="sqlite://", rule_packs=str(PROJECT_ROOT / "rules" / "*.yaml"))
    rt = build_runtime(settings, registry=CollectorRegistry())
    judges = load_judges(settings)
    out = []
    for path in sorted(shared_data("tau2", "trajectories").glob("*.json")):
        for conv in load_file(path):
            reward = next(o.value for o in conv.outcomes if o.type == "task_success")
            judge = next(j for j in judges.values() if j.applies(conv.agent_id, conv.agent_version))
            findings = [(f.rule_id, f.rule_type, f.severity, f.message) for f in rt.pipeline.check(conv).findings]
            v = offline_verdict(judge, conv, findings)
            out.append((conv, reward, v.verdict, v.rationale or ""))
    rt.close()
    return out


def test_user_stop_turns_are_not_a_missing_reply(judged: list[tuple[Conversation, float, str, str]]) -> None:
    assert len(judged) == 120
    stopped = [j for j in judged if j[0].metadata.get("termination_reason") == "user_stop"]
    assert len(stopped) == 100 and all(j[0].messages[-1].role == "user" for j in stopped)
    assert not [j[0].conversation_id for j in stopped if "no final assistant reply" in j[3]]
    tally = Counter((reward >= 1, verdict) for _, reward, verdict, _ in judged)
    won = tally[(True, "pass")] + tally[(True, "fail")]
    agree = tally[(True, "pass")] + tally[(False, "fail")]
    print(
        f"offline judge vs reward on {len(judged)} τ² conversations: agreement {agree}/{len(judged)}, "
        f"reward-1 passed {tally[(True, 'pass')]}/{won}, reward<1 failed {tally[(False, 'fail')]}/{len(judged) - won}"
    )
    assert tally[(True, "pass")] >= 0.75 * won  # it failed every reward-1 run with a user stop turn


def _judge(tmp_path: Path) -> Judge:
    from tests.support.judge_fakes import judge_dir
    from vigil.judge.definitions import load_judge

    return load_judge(judge_dir(tmp_path) / "tj", {}, 1.0)


def _conv(*messages: tuple[str, str], **extra: object) -> Conversation:
    return Conversation.model_validate(
        {
            "conversation_id": "c",
            "agent_id": "a",
            "agent_version": "v1",
            "messages": [{"role": r, "content": t} for r, t in messages],
            **extra,
        }
    )


@pytest.mark.parametrize("closing", ["###STOP###", "Thanks, that's all! ###TRANSFER###", "###OUT-OF-SCOPE###"])
def test_a_closing_stop_turn_is_skipped(tmp_path: Path, closing: str) -> None:
    conv = _conv(("user", "Cancel my order"), ("assistant", "Done, it is cancelled."), ("user", closing))
    assert final_message(conv).role == "assistant"
    assert offline_verdict(_judge(tmp_path), conv, []).verdict == "pass"


def test_termination_reason_user_stop_and_real_missing_replies(tmp_path: Path) -> None:
    judge = _judge(tmp_path)
    bye = _conv(("user", "hi"), ("assistant", "Hello!"), ("user", "bye"), metadata={"termination_reason": "user_stop"})
    assert offline_verdict(judge, bye, []).verdict == "pass"
    # without the marker or the metadata a trailing user turn is still an unanswered question
    unanswered = _conv(("user", "hi"), ("assistant", "Hello!"), ("user", "Where is my refund?"))
    got = offline_verdict(judge, unanswered, [])
    assert got.verdict == "fail" and "no final assistant reply" in (got.rationale or "")
    # a stop turn after an empty assistant message does not hide the missing reply
    silent = _conv(("user", "hi"), ("assistant", ""), ("user", "###STOP###"))
    assert offline_verdict(judge, silent, []).verdict == "fail"


def test_a_rule_firing_many_times_is_named_once_with_its_count(tmp_path: Path) -> None:
    judge = _judge(tmp_path)
    conv = _conv(("user", "hi"), ("user", "hi"), ("assistant", "Hello!"))
    findings = [("user-repeated", "user_repetition", "medium", f"repeat {i}") for i in range(1450)]
    findings.append(("pii-in-reply", "pii_leak", "high", "an email"))
    got = offline_verdict(judge, conv, findings)
    assert got.verdict == "fail"
    # it listed "user-repeated (medium)" 1,450 times, cut at 2,000 characters, before the other rule
    assert got.rationale is not None and got.rationale.endswith(
        "fails on pii-in-reply (high); user-repeated (medium) ×1450"
    )
