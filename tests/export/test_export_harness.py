"""Exported tasks run by the real harnesses: a criterion can fail. A scripted model that calls the forbidden
tool fails the task, one that does not passes; run by Inspect AI itself (``inspect eval`` and its Python
``eval``, with Inspect's scripted ``mockllm`` model) and by verifiers itself (``vf-eval`` against a scripted
OpenAI-compatible server)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.export.test_export import _export, world  # noqa: F401 (the fixture)
from tests.support.fake_openai import Script, fake_openai
from vigil.export.checks import Turn, grade
from vigil.export.harness import INSPECT_TASK
from vigil.export.tasks import Source, build
from vigil.schema import Conversation

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """The harnesses run the exported file: exporting it from each database is tests/export/test_export.py's
    (its Inspect round trip and verifiers rows run on SQLite and Postgres)."""
    return sqlite_url


@pytest.fixture(autouse=True)
def offline_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inspect counts tokens with tiktoken, which downloads its encodings; litellm ships them (o200k_base)."""
    import litellm

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(Path(litellm.__file__).parent / "litellm_core_utils" / "tokenizers"))


def _forbidden_sample(client: Any, ids: dict[str, str], tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    samples, _ = _export(client, format="inspect")
    path = tmp_path / "failures.jsonl"
    path.write_bytes(b"".join(orjson.dumps(s) + b"\n" for s in samples))
    sample = next(s for s in samples if s["metadata"]["source"]["conversation_id"] == ids["forbidden"])
    return path, sample


def _inspect_eval(path: Path, sample_id: str, output: Any, log_dir: Path, grader: str | None = None) -> Any:
    """Inspect's ``eval`` of one sample; the model under test answers ``output``; ``grader``: the grader
    model's reply (Inspect's ``grader`` role, a scripted ``mockllm``), else no rubric is graded."""
    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import ModelOutput, get_model

    from vigil.export.harness.inspect_task import vigil_regression

    model = get_model("mockllm/model", custom_outputs=[output])
    roles = {}
    if grader is not None:
        roles["grader"] = get_model(
            "mockllm/grader", custom_outputs=[ModelOutput.from_content("mockllm/grader", grader)]
        )
    [log] = inspect_eval(
        vigil_regression(dataset=str(path), grader_model=None if grader is not None else "none"),
        model=model,
        model_roles=roles or None,
        sample_id=sample_id,
        log_dir=str(log_dir),
        display="none",
    )
    assert log.status == "success", log.error
    [sample] = log.samples
    return sample


@pytest.mark.slow
def test_inspect_runs_the_export_and_a_forbidden_call_fails_it(world, tmp_path: Path) -> None:  # noqa: F811
    from inspect_ai.model import ModelOutput

    _, client, ids, _, _ = world
    path, sample = _forbidden_sample(client, ids, tmp_path)
    tools = {t["name"] for t in sample["metadata"]["tools"]}
    assert "return_delivered_order_items" in tools and sample["metadata"]["tools_source"] == "calls_seen"
    assert any(g["type"] == "must_not_call" for g in sample["metadata"]["grading"])

    bad = ModelOutput.for_tool_call(
        "mockllm/model",
        "return_delivered_order_items",
        {"order_id": "#W1", "item_ids": ["1"], "payment_method_id": "x"},
    )
    judged = _inspect_eval(path, sample["id"], bad, tmp_path / "bad")
    [score] = judged.scores.values()
    assert score.value == "I" and "retail-return-exchange-only-delivered" in score.metadata["broken"]
    # the model under test was offered the tools: Inspect recorded them on its model call
    [call] = [e for e in judged.events if e.event == "model"]
    assert "return_delivered_order_items" in {t.name for t in call.tools}

    good = ModelOutput.from_content("mockllm/model", "Only delivered orders can be returned; this one is pending.")
    judged = _inspect_eval(path, sample["id"], good, tmp_path / "good")
    [score] = judged.scores.values()
    assert score.value == "C", score.explanation


@pytest.mark.slow
def test_inspect_eval_command_loads_the_task_and_the_tools(world, tmp_path: Path) -> None:  # noqa: F811
    _, client, ids, _, _ = world
    path, sample = _forbidden_sample(client, ids, tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "service"), env_path()])}
    # Inspect resolves a task file relative to the working directory
    cmd = [sys.executable, "-m", "inspect_ai", "eval", INSPECT_TASK.name, "-T", f"dataset={path}"]
    cmd += ["-T", "grader_model=none"]  # the checks alone (test_export_graded.py runs the grader)
    cmd += ["--model", "mockllm/model", "--sample-id", sample["id"], "--log-dir", str(tmp_path / "logs")]
    cmd += ["--log-format", "json", "--display", "none"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=INSPECT_TASK.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [log_file] = (tmp_path / "logs").glob("*.json")
    log = orjson.loads(log_file.read_bytes())
    [s] = log["samples"]
    # mockllm's default reply is text: no forbidden call, so the sample passes
    assert list(s["scores"].values())[0]["value"] == "C"
    model_events = [e for e in s["events"] if e["event"] == "model"]
    assert {t["name"] for t in model_events[0]["tools"]} >= {"return_delivered_order_items"}


def env_path() -> str:
    return os.environ.get("PYTHONPATH", "")


def test_only_criteria_at_or_above_the_severity_become_hard_criteria() -> None:
    conv = Conversation.model_validate(
        {
            "conversation_id": "c1",
            "agent_id": "a",
            "agent_version": "1",
            "messages": [
                {"role": "user", "content": "Cancel #1"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "k1", "type": "function", "function": {"name": "cancel_order", "arguments": '{"id": 1}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "k1", "content": "ok"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "k2", "type": "function", "function": {"name": "transfer_to_human", "arguments": "{}"}}
                    ],
                },
            ],
        }
    )
    findings = [
        {"rule_id": "no-cancel", "rule_type": "forbidden_tool", "severity": "high", "message": "m",
         "evidence": [{"message_index": 1}], "details": {"tool": "cancel_order"}},
        {"rule_id": "escalated", "rule_type": "escalation", "severity": "info", "message": "m",
         "evidence": [{"message_index": 3}], "details": {}},
    ]  # fmt: skip
    task = build(Source(conv, "wrong_action", findings, [], []), {})
    assert [g["type"] for g in task["grading"]] == ["must_not_call"]  # the hand-off is not a criterion
    assert [r["rule_id"] for r in task["failure"]["rules"]] == ["no-cancel", "escalated"]  # still reported
    assert build(Source(conv, "x", findings, [], []), {}, "info")["grading"][1]["type"] == "must_not_escalate"
    # no finding is a criterion at "critical", and no reviewer wrote the expected behaviour: the rubric is
    # derived from what was confirmed, so a grader can still fail the task
    [derived] = build(Source(conv, "x", findings, [], []), {}, "critical")["grading"]
    assert derived["type"] == "rubric" and derived["derived"] is True
    assert derived["derived_from"] == ["category", "rules", "failed_turn"] and "cancel_order" in derived["text"]
    assert [t["function"]["name"] for t in task["tools"]] == ["cancel_order", "transfer_to_human"]
    assert task["tools"][0]["function"]["parameters"]["properties"] == {"id": {"type": "integer"}}


def test_checks_grade_the_next_turn() -> None:
    must_not = {"type": "must_not_call", "tool": "cancel_order", "rule_id": "r1"}
    order = {"type": "must_call_before", "before": ["lookup"], "after": ["cancel_order"], "rule_id": "r2"}
    rubric = {"type": "rubric", "text": "Be kind."}
    assert grade([must_not, rubric], Turn("", [("cancel_order", {})]), [])["broken"] == ["r1"]
    assert grade([must_not, rubric], Turn("No.", []), []) == {"passed": True, "broken": [], "unchecked": ["rubric"]}
    looked_up = [{"role": "assistant", "tool_calls": [{"function": {"name": "lookup"}}]}]
    assert grade([order], Turn("", [("cancel_order", {})]), looked_up)["passed"]
    assert not grade([order], Turn("", [("cancel_order", {})]), [])["passed"]
    pii = {"type": "must_not_disclose", "kinds": ["email"], "rule_id": "p"}
    assert not grade([pii], Turn("mail me at a.b@example.com", []), [])["passed"]


def _vf_eval(rows_path: Path, script: Script, out: Path, judge: Script | None = None) -> dict[str, Any]:
    """``vf-eval`` (verifiers' own eval command) on the exported file: the null harness's chat loop, in a
    subprocess runtime, calling the scripted OpenAI-compatible server, with the toolset serving the tools;
    ``judge``: the rubrics' judge, another scripted server (else no judge is set)."""
    import contextlib
    import shutil

    with fake_openai(script) as (url, _), fake_openai(judge) if judge else contextlib.nullcontext() as judged:
        bin_dir = Path(sys.executable).parent
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "service"), env_path()]),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",  # uv, which the harness runs its loop with
            "VIGIL_TEST_LLM_KEY": "scripted",
        }
        assert shutil.which("uv", path=env["PATH"]), "uv (dev extra) runs the verifiers harness's chat loop"
        cmd = [str(bin_dir / "vf-eval"), "vigil_verifiers", "--env.taskset.path", str(rows_path)]
        cmd += ["--env.agent.harness.id", "null", "--env.agent.runtime.type", "subprocess", "--model", "scripted"]
        cmd += ["--client.base-url", url, "--client.api-key-var", "VIGIL_TEST_LLM_KEY", "--num-rollouts", "1"]
        cmd += ["--push", "false", "--output-dir", str(out)]
        if judged:
            cmd += ["--env.taskset.task.judge.model", "scripted-judge", "--env.taskset.task.judge.base-url", judged[0]]
            cmd += ["--env.taskset.task.judge.api-key-var", "VIGIL_TEST_LLM_KEY"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=out.parent)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        requests = list(script.requests)
    [traces] = list(out.glob("*/traces.jsonl"))
    [episode] = [orjson.loads(line) for line in traces.read_bytes().splitlines() if line.strip()]
    assert episode["ok"], episode.get("errors")
    [trace] = episode["traces"]
    offered = {t["function"]["name"] for t in requests[0].get("tools") or []}
    return {
        "reward": trace["rewards"]["criteria_met"]["score"],
        "info": trace["info"],
        "offered": offered,
        "judged": list(judge.requests) if judge else [],
    }


@pytest.mark.slow
def test_verifiers_runs_the_export_and_a_forbidden_call_fails_it(world, tmp_path: Path) -> None:  # noqa: F811
    _, client, ids, _, _ = world
    rows, _ = _export(client, format="verifiers")
    row = next(r for r in rows if r["info"]["source"]["conversation_id"] == ids["forbidden"])
    path = tmp_path / "forbidden.verifiers.jsonl"
    path.write_bytes(orjson.dumps(row) + b"\n")
    args = {"order_id": "#W1", "item_ids": ["1"], "payment_method_id": "credit_card_1"}
    bad = _vf_eval(path, Script([("return_delivered_order_items", args)], "Done.", relative=True), tmp_path / "bad")
    assert "return_delivered_order_items" in bad["offered"]  # the model under test was given the agent's tools
    assert bad["reward"] == 0.0 and "retail-return-exchange-only-delivered" in bad["info"]["vigil"]["broken"]
    good = _vf_eval(path, Script([], "Only delivered orders can be returned.", relative=True), tmp_path / "good")
    # the reviewer's expected behaviour is a rubric: with no judge set it is listed as not graded
    assert good["reward"] == 1.0
    assert good["info"]["vigil"] == {"passed": True, "broken": [], "turns": 1, "ungraded": ["rubric"]}


STORED_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "description": "Look an order up by its id: status, items, payment.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string", "description": "The order id, e.g. #W1."}},
                "required": ["order_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "cancel_pending_order",
            "description": "Cancel an order that is still pending.",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string", "description": "The order to cancel."},
                    "reason": {"type": "string", "description": "Why the user cancels."},
                },
                "required": ["order_id", "reason"],
            },
        },
    },
    {  # offered but never called in the conversation: only stored definitions know about it
        "type": "function",
        "function": {
            "name": "transfer_to_human_agents",
            "description": "Hand the conversation to a human agent.",
            "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}, "required": []},
        },
    },
]


def _stored_tools_conversation() -> Conversation:
    return Conversation.model_validate(
        {
            "conversation_id": "stored-tools",
            "agent_id": "shop",
            "agent_version": "v1",
            "tools": STORED_TOOLS,
            "messages": [
                {"role": "user", "content": "Cancel order #W1, it was delivered yesterday."},
                {
                    "role": "assistant",
                    "tool_calls": [_call("k1", "get_order_details", order_id="#W1")],
                },
                {"role": "tool", "tool_call_id": "k1", "content": '{"order_id": "#W1", "status": "delivered"}'},
                {
                    "role": "assistant",
                    "tool_calls": [_call("k2", "cancel_pending_order", order_id="#W1", reason="no longer needed")],
                },
            ],
        }
    )


def _call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": orjson.dumps(args).decode()}}


def test_stored_tool_definitions_are_exported_as_stored() -> None:
    from vigil.export.formats import to_inspect, to_verifiers

    conv = _stored_tools_conversation()
    findings = [
        {"rule_id": "no-cancel-delivered", "rule_type": "forbidden_tool", "severity": "high", "message": "m",
         "evidence": [{"message_index": 3}], "details": {"tool": "cancel_pending_order"}},
    ]  # fmt: skip
    task = build(Source(conv, "policy_violation", findings, [], []), {})
    assert task["tools_source"] == "conversation"
    assert task["tools"] == STORED_TOOLS  # descriptions and parameter schemas as the agent had them
    inspect_tools = {t["name"]: t for t in to_inspect(task)["metadata"]["tools"]}
    assert inspect_tools["cancel_pending_order"]["description"] == "Cancel an order that is still pending."
    assert set(inspect_tools) == {"get_order_details", "cancel_pending_order", "transfer_to_human_agents"}
    assert to_verifiers(task)["tools"] == STORED_TOOLS
    # definitions from traced spans (metadata.tools) are read the same way; calls are the last resort
    legacy = conv.model_copy(update={"tools": None, "metadata": {"tools": STORED_TOOLS[:1]}})
    assert build(Source(legacy, "x", findings, [], []), {})["tools"] == STORED_TOOLS[:1]
    bare = conv.model_copy(update={"tools": None})
    assert build(Source(bare, "x", findings, [], []), {})["tools_source"] == "calls_seen"


@pytest.mark.slow
def test_inspect_offers_the_stored_tools_and_a_forbidden_call_fails(tmp_path: Path) -> None:
    from inspect_ai.model import ModelOutput

    from vigil.export.formats import to_inspect

    findings = [
        {"rule_id": "no-cancel-delivered", "rule_type": "forbidden_tool", "severity": "high", "message": "m",
         "evidence": [{"message_index": 3}], "details": {"tool": "cancel_pending_order"}},
    ]  # fmt: skip
    sample = to_inspect(build(Source(_stored_tools_conversation(), "policy_violation", findings, [], []), {}))
    path = tmp_path / "stored.jsonl"
    path.write_bytes(orjson.dumps(sample) + b"\n")
    bad = ModelOutput.for_tool_call("mockllm/model", "cancel_pending_order", {"order_id": "#W1", "reason": "x"})
    judged = _inspect_eval(path, sample["id"], bad, tmp_path / "bad")
    [score] = judged.scores.values()
    assert score.value == "I" and score.metadata["broken"] == ["no-cancel-delivered"]
    [call] = [e for e in judged.events if e.event == "model"]
    offered = {t.name: t for t in call.tools}
    assert set(offered) == {"get_order_details", "cancel_pending_order", "transfer_to_human_agents"}
    assert offered["get_order_details"].description == "Look an order up by its id: status, items, payment."
    good = ModelOutput.for_tool_call("mockllm/model", "transfer_to_human_agents", {"summary": "delivered order"})
    judged = _inspect_eval(path, sample["id"], good, tmp_path / "good")
    [score] = judged.scores.values()
    assert score.value == "C", score.explanation
