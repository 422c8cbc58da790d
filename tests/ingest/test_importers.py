"""Importers on the real τ² results files, a τ-bench file in its published shape, and native JSONL."""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.services import shared_data
from vigil.ingest.importers import ImportError_, convert_data, load_file
from vigil.schema import Conversation

TAU2 = {
    "airline": ("sierra_gpt-4.1_airline_default_gpt-4.1_1trials.json", 20),
    "retail": ("sierra_gpt-4.1_retail_defautl_gpt-4.1_1trials.json", 40),
    "telecom": ("sierra_gpt-4.1_telecom_default_gpt-4.1_1trials.json", 40),
    "telecom-no-user": (
        "sierra_testrun1_gpt-4.1-2025-04-14_telecom_no-user_gpt-4.1-2025-04-14_4trials_5tasks.json",
        20,
    ),
}


def tau2_file(key: str) -> Path:
    return shared_data("tau2", "trajectories", TAU2[key][0])


@pytest.mark.parametrize("key", sorted(TAU2))
def test_tau2_counts_ids_and_outcomes(key: str) -> None:
    path = tau2_file(key)
    raw = json.loads(path.read_text())
    convs = list(load_file(path))
    assert len(convs) == TAU2[key][1] == len(raw["simulations"])
    assert len({c.conversation_id for c in convs}) == len(convs)
    domain = raw["info"]["environment_info"]["domain_name"]
    for conv, sim in zip(convs, raw["simulations"], strict=True):
        assert conv.agent_id == f"tau2-{domain}"
        assert conv.agent_version == raw["info"]["agent_info"]["llm"]
        assert conv.conversation_id == f"tau2:{domain}:{sim['id']}"
        assert conv.task_id == f"{domain}:{sim['task_id']}"
        [outcome] = conv.outcomes
        assert outcome.type == "task_success" and outcome.value == sim["reward_info"]["reward"]
        # The policy becomes the system message; every recorded message follows in order.
        assert conv.messages[0].role == "system"
        assert conv.messages[0].text == raw["info"]["environment_info"]["policy"]
        assert [m.role for m in conv.messages[1:]] == [m["role"] for m in sim["messages"]]
        assert conv.usage is not None and conv.usage.cost_usd == sim["agent_cost"]
    rewards = Counter(c.outcomes[0].value for c in convs)
    assert set(rewards) <= {0.0, 1.0} and rewards[0.0] and rewards[1.0]


def test_tau2_tool_calls_and_results() -> None:
    path = tau2_file("retail")
    raw = json.loads(path.read_text())
    convs = list(load_file(path, "tau2"))
    calls = results = errors = 0
    for conv, sim in zip(convs, raw["simulations"], strict=True):
        for m, src in zip(conv.messages[1:], sim["messages"], strict=True):
            if src.get("tool_calls"):
                assert m.role == "assistant"
                for tc, src_tc in zip(m.tool_calls or [], src["tool_calls"], strict=True):
                    assert tc.id == src_tc["id"] and tc.function.name == src_tc["name"]
                    assert tc.args == src_tc["arguments"]
                    calls += 1
            if src["role"] == "tool":
                assert m.tool_call_id == src["id"] and m.is_error == bool(src["error"])
                assert m.text == src["content"]
                results += 1
                errors += m.is_error
    assert (calls, results) == (299, 299)
    assert errors == 12
    first = next(c for c in convs for m in c.messages if m.tool_calls)
    call = next(tc for m in first.messages for tc in m.tool_calls or [])
    answer = next(m for m in first.messages if m.role == "tool" and m.tool_call_id == call.id)
    assert answer.text


def test_tau2_user_side_device_tool_calls_in_telecom() -> None:
    convs = list(load_file(tau2_file("telecom")))
    user_calls = [tc for c in convs for m in c.messages if m.role == "user" for tc in m.tool_calls or []]
    assert len(user_calls) > 100
    names = {tc.function.name for tc in user_calls}
    assert {"check_status_bar", "toggle_airplane_mode", "reboot_device"} <= names
    assert all(tc.model_extra and tc.model_extra.get("requestor") == "user" for tc in user_calls)
    # The device's answers are tool messages tied to the user's call ids.
    ids = {tc.id for tc in user_calls}
    answered = {m.tool_call_id for c in convs for m in c.messages if m.role == "tool" and m.tool_call_id in ids}
    assert answered == ids
    agent_calls = [tc for c in convs for m in c.messages if m.role == "assistant" for tc in m.tool_calls or []]
    assert not names & {tc.function.name for tc in agent_calls} - {"transfer_to_human_agents"}


def test_tau2_no_user_run_has_no_user_turns() -> None:
    convs = list(load_file(tau2_file("telecom-no-user")))
    assert all(m.role != "user" for c in convs for m in c.messages)
    assert {c.metadata["trial"] for c in convs} == {0, 1, 2, 3}


def test_tau2_overrides_agent_and_version() -> None:
    [conv, *_] = load_file(tau2_file("airline"), "tau2", agent_id="my-agent", agent_version="v7")
    assert (conv.agent_id, conv.agent_version) == ("my-agent", "v7")


def tau_bench_runs() -> list[dict[str, Any]]:
    """Two runs in τ-bench's published ``[{task_id, reward, info, traj, trial}]`` shape."""
    traj = [
        {"role": "system", "content": "You are a retail agent. Follow the policy."},
        {"role": "user", "content": "Cancel order #W2378156, I no longer need it."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_order_details", "arguments": '{"order_id": "#W2378156"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "name": "get_order_details",
            "content": '{"order_id": "#W2378156", "status": "pending"}',
        },
        {"role": "assistant", "content": "Order #W2378156 is pending. Cancel it for 'no longer needed'?"},
        {"role": "user", "content": "Yes."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {
                        "name": "cancel_pending_order",
                        "arguments": '{"order_id": "#W2378156", "reason": "no longer needed"}',
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_2",
            "name": "cancel_pending_order",
            "content": "Error: order not found",
        },
        {"role": "assistant", "content": "Sorry, something went wrong."},
    ]
    info = {"task": {"user_id": "yusuf_rossi_9620", "actions": []}, "source": "user"}
    return [
        {"task_id": 3, "reward": 1.0, "info": info, "traj": traj, "trial": 0},
        {"task_id": 3, "reward": 0.0, "info": info, "traj": traj[:6], "trial": 1},
    ]


def test_tau_bench_file(tmp_path: Path) -> None:
    path = tmp_path / "gpt-4o-retail-tool-calling.json"
    path.write_bytes(orjson.dumps(tau_bench_runs()))
    convs = list(load_file(path))
    assert [c.conversation_id for c in convs] == [
        "tau-bench:gpt-4o-retail-tool-calling:3:0",
        "tau-bench:gpt-4o-retail-tool-calling:3:1",
    ]
    first, second = convs
    assert first.agent_id == "tau-bench-retail" and first.task_id == "retail:3"
    assert [m.role for m in first.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    call = first.messages[6].tool_calls[0]  # type: ignore[index]
    assert (call.id, call.function.name) == ("call_2", "cancel_pending_order")
    assert call.args == {"order_id": "#W2378156", "reason": "no longer needed"}
    assert first.messages[7].tool_call_id == "call_2" and "not found" in first.messages[7].text
    assert [o.value for c in convs for o in c.outcomes if o.type == "task_success"] == [1.0, 0.0]
    assert len(second.messages) == 6


def test_tau_bench_runs_as_json_lines_read_the_same_with_one_line_or_several(tmp_path: Path) -> None:
    """A file of one run per line is read whatever its length: one line is one JSON object, not a list."""
    runs = tau_bench_runs()
    for count in (2, 1):
        path = tmp_path / f"gpt-4o-retail-{count}.jsonl"
        path.write_bytes(b"\n".join(orjson.dumps(r) for r in runs[:count]) + b"\n")
        for fmt in ("auto", "tau-bench"):
            convs = list(load_file(path, fmt))
            assert [c.task_id for c in convs] == ["retail:3"] * count
            assert convs[0].outcomes[0].type == "task_success"


def test_openai_native_jsonl(tmp_path: Path) -> None:
    full = {
        "conversation_id": "c-1",
        "revision": 2,
        "agent_id": "support",
        "agent_version": "2024-06",
        "messages": [
            {"role": "user", "content": "Where is my order?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "t1",
                        "type": "function",
                        "function": {"name": "track", "arguments": '{"id": "A1"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "timeout", "is_error": True},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "It ships "}, {"type": "text", "text": "today."}],
            },
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "cost_usd": 0.001},
        "metadata": {"tenant": "acme"},
    }
    bare = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}]}
    path = tmp_path / "prod-export.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in (full, bare)) + "\n\n")
    c1, c2 = load_file(path)
    assert (c1.conversation_id, c1.revision, c1.agent_id, c1.metadata) == (
        "c-1",
        2,
        "support",
        {"tenant": "acme"},
    )
    assert c1.messages[1].tool_calls[0].args == {"id": "A1"}  # type: ignore[index]
    assert c1.messages[2].is_error and c1.messages[3].text == "It ships \ntoday."
    assert c1.usage is not None and c1.usage.tokens == 120
    assert c2.agent_id == "prod-export" and c2.agent_version == "unknown"
    assert c2.conversation_id.startswith("prod-export:")
    # The same record always gets the same id, so replaying a file twice changes nothing.
    assert [c.conversation_id for c in load_file(path)][1] == c2.conversation_id
    single = tmp_path / "one.json"
    single.write_text(json.dumps(full))
    assert [c.conversation_id for c in load_file(single, "openai")] == ["c-1"]


def expect_error(path: Path, fmt: Any = "auto") -> str:
    with pytest.raises(ImportError_) as err:
        list(load_file(path, fmt))
    msg = str(err.value)
    assert msg.startswith(str(path)), msg
    return msg


def test_malformed_jsonl_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "a"}]}\n{"messages": [\n')
    assert expect_error(path).startswith(f"{path}:2: not JSON")


def test_invalid_openai_items_name_item_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = {"messages": [{"role": "user", "content": "hi"}]}
    path.write_text(json.dumps(good) + "\n" + json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n")
    msg = expect_error(path)
    assert msg.startswith(f"{path}: item 1: messages.0.role")
    path.write_text(json.dumps(good) + "\n[1, 2]\n")
    assert f"{path}: item 1: expected an object" in expect_error(path)
    path.write_text(json.dumps({"messages": []}) + "\n")
    assert "item 0: messages: List should have at least 1 item" in expect_error(path)


def test_malformed_tau2_names_simulation(tmp_path: Path) -> None:
    raw = json.loads(tau2_file("airline").read_text())
    raw["simulations"] = raw["simulations"][:3]
    del raw["simulations"][1]["messages"]
    path = tmp_path / "broken_tau2.json"
    path.write_text(json.dumps(raw))
    assert expect_error(path) == f"{path}: simulation 1: missing or malformed field 'messages'"
    raw["simulations"][1]["messages"] = [{"role": "wizard", "content": "hi"}]
    path.write_text(json.dumps(raw))
    assert expect_error(path).startswith(f"{path}: simulation 1: messages.1.role")


def test_malformed_tau_bench_names_item(tmp_path: Path) -> None:
    runs = tau_bench_runs()
    del runs[1]["traj"]
    path = tmp_path / "retail-runs.json"
    path.write_text(json.dumps(runs))
    assert expect_error(path, "tau-bench") == f"{path}: item 1: missing or malformed field 'traj'"


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.json"
    assert "No such file" in expect_error(path)


def test_imported_conversations_survive_a_json_round_trip() -> None:
    [conv, *_] = load_file(tau2_file("telecom"))
    again = Conversation.model_validate_json(conv.model_dump_json())
    assert again == conv


def test_tau2_tool_definitions_become_the_conversations_tools(tmp_path: Path) -> None:
    raw = json.loads(tau2_file("airline").read_text())
    raw["simulations"] = raw["simulations"][:2]
    schema = {"type": "object", "properties": {"user_id": {"type": "string"}}, "required": ["user_id"]}
    fn = {"name": "get_user_details", "description": "Get the details of a user.", "parameters": schema}
    raw["info"]["environment_info"]["tool_defs"] = {
        "get_user_details": {"openai_schema": {"type": "function", "function": fn}}
    }
    path = tmp_path / "with_tools.json"
    path.write_text(json.dumps(raw))
    convs = list(load_file(path))
    assert all([t.name for t in c.tools or []] == ["get_user_details"] for c in convs)
    assert convs[0].tools and convs[0].tools[0].parameters == schema
    # the published files carry none: then the conversation says nothing about its tools
    assert all(c.tools is None for c in load_file(tau2_file("airline")))


def test_tau2_simulations_sharing_an_id_are_refused_by_name(tmp_path: Path) -> None:
    """Two runs under one simulation id became one conversation ('1 stored, 1 already stored')."""
    raw = json.loads(tau2_file("airline").read_text())
    raw["simulations"] = raw["simulations"][:3]
    raw["simulations"][2] = {**raw["simulations"][2], "id": raw["simulations"][0]["id"]}
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ImportError_, match=r"simulation 2: id '.*' is simulation 0's too"):
        list(load_file(path))


def test_a_tau2_run_without_an_end_is_never_dated_ahead_on_a_host_east_of_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The τ² importer dated a rewarded run that records no end at the host's local wall time, without an
    offset: read as UTC, nine hours ahead in Tokyo."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        data = {
            "info": {"environment_info": {"domain_name": "retail"}, "agent_info": {"llm": "m"}},
            "tasks": [],
            "simulations": [
                {
                    "id": "s1",
                    "task_id": "t1",
                    "messages": [{"role": "user", "content": "hi"}],
                    "reward_info": {"reward": 1.0},
                }
            ],
        }
        [conv] = convert_data(data, "tau2", Path("run.json"), None, None).conversations
    finally:
        monkeypatch.undo()  # the zone as it was, then read again
        time.tzset()
    [outcome] = conv.outcomes
    assert outcome.occurred_at is not None and outcome.occurred_at.tzinfo is not None
    assert outcome.occurred_at <= datetime.now(UTC)
