"""Rubric criteria graded by a model, in both harnesses: a task only a grader can fail (its findings give no
criterion the checks decide) fails when the grader finds its rubric unmet and passes when met. Run by
Inspect AI itself (``eval`` with a scripted ``mockllm`` grader in the ``grader`` role, and ``inspect eval``
with a scripted OpenAI-compatible grader) and by verifiers itself (``vf-eval`` with a scripted judge).
A task no reviewer wrote an expected behaviour for gets a rubric derived from the confirmed failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from tests.export.test_export import TELECOM, TELECOM_ALL, _export, _label, world  # noqa: F401 (the fixture)
from tests.export.test_export_harness import ROOT, _inspect_eval, _vf_eval, env_path
from tests.support.app import make_client, make_settings
from tests.support.fake_openai import Script
from tests.support.services import shared_data
from vigil.export.checks import checkable
from vigil.export.harness import INSPECT_TASK
from vigil.export.tasks import Source, build
from vigil.ingest.importers import load_file
from vigil.schema import Conversation
from vigil.settings import PROJECT_ROOT


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    return sqlite_url


@pytest.fixture(autouse=True)
def offline_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inspect counts tokens with tiktoken, which downloads its encodings; litellm ships them (o200k_base)."""
    import litellm

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(Path(litellm.__file__).parent / "litellm_core_utils" / "tokenizers"))


AIRLINE = ("tau2", "trajectories", "sierra_gpt-4.1_airline_default_gpt-4.1_1trials.json")
RETAIL = ("tau2", "trajectories", "sierra_gpt-4.1_retail_defautl_gpt-4.1_1trials.json")
UNMET = "The reply asks nothing and sends nothing.\n\nGRADE: I"
MET = "The reply writes to the user with the balance.\n\nGRADE: C"


def test_every_task_of_the_tau2_conversations_has_a_criterion_a_grader_can_fail(sqlite_url: str) -> None:
    """All 120 τ² conversations confirmed, with no reviewer's expected behaviour: most tasks had no criterion
    the checks decide (findings below the criterion severity, or rules needing several turns) and so nothing
    any harness could fail. Each such task now carries a rubric derived from the confirmed failure, counted
    in ``X-Vigil-Model-Graded``."""
    from vigil.app.runtime import build_runtime
    from vigil.export.checks import model_graded

    settings = make_settings(sqlite_url, rule_packs=str(PROJECT_ROOT / "rules" / "*.yaml"))
    rt = build_runtime(settings, registry=CollectorRegistry())
    convs = [
        c for part in (AIRLINE, RETAIL, TELECOM, TELECOM_ALL) for c in load_file(shared_data(*part), "auto", None, None)
    ]
    assert len(convs) == 120
    with make_client(rt) as client:
        rt.pipeline.process(convs, "test")
        with rt.sessions.begin() as s:
            s.add_all(_label(c.conversation_id, "confirmed_failure") for c in convs)
        tasks, headers = _export(client)
    rt.close()
    only_graded = [t for t in tasks if not checkable(t["grading"])]
    assert tasks and all(checkable(t["grading"]) or model_graded(t["grading"]) for t in tasks)
    assert headers["x-vigil-model-graded"] == str(sum(model_graded(t["grading"]) for t in tasks))
    assert headers["x-vigil-checkable"] == str(len(tasks) - len(only_graded))
    assert len(only_graded) > len(tasks) // 2  # the finding that made this necessary: most need a grader
    for t in only_graded:
        [rubric] = [g for g in t["grading"] if g["type"] == "rubric"]
        assert rubric["derived"] is True and rubric["text"].startswith("The reply must not repeat the failure")
        assert "policy_violation" in rubric["text"]  # the category reviewers confirmed
    # a derived rubric quotes what the rules that flagged the conversation said (info-level ones are no failure)
    with_rules = [t for t in only_graded if any(r["severity"] != "info" for r in t["failure"]["rules"])]
    assert with_rules
    for t in with_rules:
        [rubric] = [g for g in t["grading"] if g["type"] == "rubric"]
        assert "rules" in rubric["derived_from"]
        said = [r["message"] for r in t["failure"]["rules"] if r["severity"] != "info"]
        assert " ".join(said[0].split())[:100] in rubric["text"]


def _conversation() -> Conversation:
    return Conversation.model_validate(
        {
            "conversation_id": "c1",
            "agent_id": "a",
            "agent_version": "1",
            "messages": [
                {"role": "user", "content": "Where is my refund?"},
                {"role": "assistant", "content": "I can't help with that."},
                {"role": "user", "content": "Please transfer me."},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "k", "type": "function", "function": {"name": "transfer_to_human", "arguments": "{}"}}
                    ],
                },
            ],
        }
    )


def test_a_rubric_is_derived_only_where_neither_a_reviewer_nor_a_check_gives_a_criterion() -> None:
    conv = _conversation()
    handoff = {"rule_id": "escalated", "rule_type": "escalation", "severity": "info", "message": "Handed off.",
               "evidence": [{"message_index": 3}], "details": {}}  # fmt: skip
    refusal = {"rule_id": "refused", "rule_type": "regex", "severity": "low", "message": "Refused to help.",
               "evidence": [{"message_index": 1}], "details": {}}  # fmt: skip
    verdict = {"judge": "resolution", "judge_version": "1", "verdict": "fail", "categories": ["unresolved"],
               "rationale": "The agent never looked the refund up."}  # fmt: skip
    labels = [{"label": "confirmed_failure", "severity": "high", "notes": "Should have checked the refund."}]
    [rubric] = build(Source(conv, "unresolved", [handoff, refusal], labels, [verdict]), {})["grading"]
    assert rubric["derived"] is True
    assert rubric["derived_from"] == ["category", "notes", "rules", "judges", "failed_turn"]
    text = rubric["text"]
    assert "(unresolved)" in text and "Should have checked the refund." in text and "Refused to help." in text
    assert "never looked the refund up" in text and "I can't help with that." in text  # the turn "refused" marks
    assert "Handed off." not in text  # an info-level hand-off is no failure
    # located only by an info-level rule (or by nothing: the last turn), the failing turn is not quoted
    [rubric] = build(Source(conv, "unresolved", [handoff], [], []), {})["grading"]
    assert rubric["derived_from"] == ["category"] and "transfer_to_human" not in rubric["text"]
    # a reviewer's expected behaviour is the rubric; a checked criterion needs none derived
    expected = [{**labels[0], "expected_behavior": "Look the refund up."}]
    assert build(Source(conv, "unresolved", [refusal], expected, []), {})["grading"] == [
        {"type": "rubric", "text": "Look the refund up."}
    ]
    forbidden = {**handoff, "severity": "high"}
    grading = build(Source(conv, "unresolved", [forbidden], [], []), {})["grading"]
    assert [g["type"] for g in grading] == ["must_not_escalate"]


def _rubric_only_sample(client: Any, ids: dict[str, str], tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """The export's task whose only criterion is the reviewer's expected behaviour (its findings are info)."""
    samples, _ = _export(client, format="inspect")
    sample = next(s for s in samples if s["metadata"]["source"]["conversation_id"] == ids["clean"])
    assert [g["type"] for g in sample["metadata"]["grading"]] == ["rubric"]
    assert not checkable(sample["metadata"]["grading"])
    path = tmp_path / "rubric.jsonl"
    path.write_bytes(orjson.dumps(sample) + b"\n")
    return path, sample


@pytest.mark.slow
def test_inspect_fails_a_rubric_only_task_when_the_grader_finds_the_rubric_unmet(world, tmp_path: Path) -> None:  # noqa: F811
    from inspect_ai.model import ModelOutput

    _, client, ids, _, _ = world
    path, sample = _rubric_only_sample(client, ids, tmp_path)
    reply = ModelOutput.from_content("mockllm/model", "Is there anything else I can help with?")

    failed = _inspect_eval(path, sample["id"], reply, tmp_path / "unmet", grader=UNMET)
    [score] = failed.scores.values()
    assert score.value == "I", score.explanation
    [graded] = score.metadata["rubrics"]
    assert graded["met"] is False and graded["derived"] is False and graded["grader"] == "mockllm/grader"
    # the grader was shown the rubric, the replayed conversation and the reply
    from inspect_ai.log import resolve_sample_attachments

    [_, grading] = [e for e in resolve_sample_attachments(failed).events if e.event == "model"]
    prompt = grading.input[0].text
    assert sample["target"] in prompt and "Is there anything else I can help with?" in prompt
    assert sample["input"][0]["content"][:80] in prompt

    passed = _inspect_eval(path, sample["id"], reply, tmp_path / "met", grader=MET)
    [score] = passed.scores.values()
    assert score.value == "C", score.explanation and score.metadata["rubrics"][0]["met"] is True

    # a grader reply with no verdict decides nothing: the sample is unscored, not passed
    unsure = _inspect_eval(path, sample["id"], reply, tmp_path / "unsure", grader="It depends.")
    [score] = unsure.scores.values()
    assert score.value != score.value and score.metadata["rubrics"][0]["met"] is None  # NaN: unscored


@pytest.mark.slow
def test_inspect_eval_command_asks_the_grader_model_named_by_the_task_argument(world, tmp_path: Path) -> None:  # noqa: F811
    """``inspect eval`` itself, the grader named by ``-T grader_model`` (Inspect's scripted models take their
    replies only from Python: ``mockllm`` here answers its default text, which holds no verdict). The grader
    is asked with the rubric and the reply, and, finding no verdict in its answer, the sample is left
    unscored: neither passed (as it was whatever the model did) nor failed."""
    _, client, ids, _, _ = world
    path, sample = _rubric_only_sample(client, ids, tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "service"), env_path()])}
    cmd = [sys.executable, "-m", "inspect_ai", "eval", INSPECT_TASK.name, "-T", f"dataset={path}"]
    cmd += ["-T", "grader_model=mockllm/grader", "--model", "mockllm/model", "--sample-id", sample["id"]]
    cmd += ["--log-dir", str(tmp_path / "logs"), "--log-format", "json", "--display", "none"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=INSPECT_TASK.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [log_file] = (tmp_path / "logs").glob("*.json")
    [s] = json.loads(log_file.read_bytes())["samples"]  # Inspect writes an unscored value as NaN
    [score] = s["scores"].values()
    assert score["value"] != score["value"], score  # NaN: unscored
    assert score["metadata"]["rubrics"][0]["grader"] == "mockllm/grader"
    graded = [e for e in s["events"] if e["event"] == "model" and e["model"] == "mockllm/grader"]
    assert len(graded) == 1  # one rubric, one grader call


def _judge(verdict: str) -> Script:
    reason = "The reply does not write to the user." if verdict == "no" else "It writes to the user."
    return Script([], json.dumps({"verdicts": [{"name": "rubric_1", "reason": reason, "verdict": verdict}]}))


@pytest.mark.slow
def test_verifiers_fails_a_rubric_only_task_when_the_judge_finds_the_rubric_unmet(world, tmp_path: Path) -> None:  # noqa: F811
    _, client, ids, _, _ = world
    rows, _ = _export(client, format="verifiers")
    row = next(r for r in rows if r["info"]["source"]["conversation_id"] == ids["clean"])
    assert [c["type"] for c in row["criteria"]] == ["rubric"]
    path = tmp_path / "rubric.verifiers.jsonl"
    path.write_bytes(orjson.dumps(row) + b"\n")
    answer = "Is there anything else I can help with?"

    unmet = _vf_eval(path, Script([], answer, relative=True), tmp_path / "unmet", judge=_judge("no"))
    assert unmet["reward"] == 0.0
    assert unmet["info"]["vigil"] == {"passed": False, "broken": [], "turns": 1, "rubrics": {"rubric_1": 0.0},
                                      "unmet": ["rubric_1"]}  # fmt: skip
    [request] = unmet["judged"]  # verifiers' judge client called the judge endpoint, with the rubric and the reply
    assert request["model"] == "scripted-judge"
    prompt = request["messages"][0]["content"]
    assert " ".join(row["criteria"][0]["text"].split()) in prompt and answer in prompt
    assert unmet["info"]["judge_calls"]  # verifiers recorded the call on the trace

    met = _vf_eval(path, Script([], answer, relative=True), tmp_path / "met", judge=_judge("yes"))
    assert met["reward"] == 1.0 and met["info"]["vigil"]["rubrics"] == {"rubric_1": 1.0}

    # no judge set: the rubric is listed as not graded, and nothing fails the task
    ungraded = _vf_eval(path, Script([], answer, relative=True), tmp_path / "ungraded")
    assert ungraded["reward"] == 1.0 and ungraded["info"]["vigil"]["ungraded"] == ["rubric"]
