"""Unusual but valid records in each format, read as sent: nothing rounded, dropped or merged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vigil.ingest.importers import read_file

BIG = 2**70 + 1  # beyond 64 bits: orjson alone reads it as the nearest double


def _args(conversation: dict[str, Any]) -> list[Any]:
    return [c["function"]["arguments"] for m in conversation["messages"] for c in m.get("tool_calls") or []]


def test_formatted_bodies_and_files_keep_integers_exact_and_skip_a_byte_order_mark(
    sqlite_url: str, tmp_path: Path
) -> None:
    from tests.support.app import ADMIN, INGEST, make_client, make_settings
    from vigil.app.runtime import build_runtime

    body = b'{"messages": [{"role": "user", "content": "Refund my order."}, {"role": "assistant", "content": '
    body += b'[{"type": "tool_use", "id": "toolu_1", "name": "refund", "input": {"order": %d}}]}]}' % BIG
    rt = build_runtime(make_settings(sqlite_url))
    with make_client(rt) as client:
        r = client.post("/v1/conversations?format=anthropic", content=body, headers=INGEST)
        assert r.status_code == 202, r.text
        [cid] = r.json()["conversation_ids"]
        stored = client.get(f"/v1/conversations/{cid}", headers=ADMIN).json()["conversation"]
        assert _args(stored) == [{"order": BIG}]
        # a byte order mark is skipped, as Vigil's own schema skips it
        r = client.post("/v1/conversations?format=auto", content=b"\xef\xbb\xbf" + body, headers=INGEST)
        assert r.status_code == 202 and r.json()["format"] == "anthropic", r.text
    rt.close()
    path = tmp_path / "calls.json"
    path.write_bytes(body)
    [conv] = read_file(path).conversations
    assert [c.args for m in conv.messages for c in m.tool_calls or []] == [{"order": BIG}]
    lines = tmp_path / "calls.jsonl"
    lines.write_bytes(body + b"\n" + body.replace(b"toolu_1", b"toolu_2") + b"\n")
    convs = read_file(lines).conversations
    assert [c.args for conv in convs for m in conv.messages for c in m.tool_calls or []] == [{"order": BIG}] * 2


MCP_CALL = {
    "messages": [
        {"role": "user", "content": "Close ticket 7."},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Closing it."},
                {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "close_ticket", "server_name": "desk",
                 "input": {"ticket": 7}},
            ],
        },
    ]
}  # fmt: skip


def test_an_mcp_connector_call_is_read_as_a_tool_call_never_as_a_reply_without_text(sqlite_url: str) -> None:
    from tests.support.app import INGEST, make_client, make_settings
    from vigil.app.runtime import build_runtime
    from vigil.ingest.importers import convert_data
    from vigil.schema import Conversation

    imported = convert_data(MCP_CALL)
    assert imported.format == "anthropic"
    [conv] = imported.conversations
    assert [(c.name, c.args) for m in conv.messages for c in m.tool_calls or []] == [("close_ticket", {"ticket": 7})]
    rt = build_runtime(make_settings(sqlite_url))
    with make_client(rt) as client:
        native = {"conversation_id": "mcp-1", "agent_id": "desk", "agent_version": "1", **MCP_CALL}
        r = client.post("/v1/conversations", json=native, headers=INGEST)
        assert r.status_code == 422 and r.json()["stored"] == 0, r.text
        [error] = r.json()["errors"]
        assert "?format=anthropic" in error["hint"] and "mcp_tool_use" in str(error["errors"])
        result = {**native, "conversation_id": "mcp-2"}
        result["messages"] = [{"role": "user", "content": [{"type": "web_search_tool_result", "tool_use_id": "s"}]}]
        r = client.post("/v1/conversations", json=result, headers=INGEST)
        assert r.status_code == 422 and "web_search_tool_result" in str(r.json()["errors"]), r.text
    rt.close()
    # a document stored before these were refused still reads back as stored
    assert Conversation.model_validate(native).messages[1].content[1].type == "mcp_tool_use"  # type: ignore[index]


def _llm_run(run_id: str | None, question: str, answer: str, parent: str | None = None) -> dict[str, Any]:
    return {
        "id": run_id,
        "name": "ChatOpenAI",
        "run_type": "llm",
        "parent_run_id": parent,
        "inputs": {"messages": [{"type": "human", "content": question}]},
        "outputs": {"generations": [[{"text": answer}]]},
    }


def test_langsmith_runs_without_ids_or_sharing_one_are_never_merged() -> None:
    from vigil.ingest.importers import ImportError_, convert_data

    # two root runs without ids: two conversations (both were langsmith:None, the second stored as a duplicate)
    convs = convert_data([_llm_run(None, "alpha", "A"), _llm_run(None, "beta", "B")], "langsmith").conversations
    assert len({c.conversation_id for c in convs}) == 2
    assert [[m.text for m in c.messages] for c in convs] == [["alpha", "A"], ["beta", "B"]]
    # two different runs under one id: refused by name (the second replaced the first, its messages lost)
    root = {"id": "r1", "name": "agent", "run_type": "chain", "inputs": {}, "outputs": {}}
    tool = {"id": "c1", "name": "lookup", "run_type": "tool", "parent_run_id": "r1", "inputs": {}, "outputs": {}}
    try:
        convert_data([root, _llm_run("c1", "q", "a", "r1"), tool], "langsmith")
    except ImportError_ as exc:
        assert "run id 'c1'" in str(exc)
    else:
        raise AssertionError("two runs with one id were read")
    # the same run listed twice is read once
    [conv] = convert_data([root, _llm_run("c1", "q", "a", "r1"), _llm_run("c1", "q", "a", "r1")]).conversations
    assert [m.text for m in conv.messages] == ["q", "a"]


def _tool_run(run_id: str, parent: str, call_id: str | None, order: int, error: str | None = None) -> dict[str, Any]:
    return {"id": run_id, "name": "lookup", "run_type": "tool", "parent_run_id": parent, "dotted_order": f"r.{order}",
            "extra": {"tool_call_id": call_id}, "inputs": {"order": run_id}, "outputs": {"output": "found"},
            "error": error}  # fmt: skip


def test_langsmith_tool_runs_answer_their_own_call_id_and_nested_tools_stay_inside() -> None:
    """Parallel calls of one tool finish in any order: each tool run answers the call its ``tool_call_id``
    names (a failure marked the first result of the tool's name); tool runs inside a tool run are that
    tool's work, not calls of the agent."""
    from vigil.ingest.importers import convert_data

    root = {"id": "r", "name": "agent", "run_type": "chain", "inputs": {}, "outputs": {}}
    calls = [{"id": c, "name": "lookup", "args": {}} for c in ("c1", "c2")]
    ask = {"type": "human", "content": "find both"}
    reply = {"message": {"type": "ai", "content": "", "tool_calls": calls}}
    first = {"id": "m1", "run_type": "llm", "parent_run_id": "r", "dotted_order": "r.0",
             "inputs": {"messages": [ask]}, "outputs": {"generations": [[reply]]}}  # fmt: skip
    seen = [ask, {"type": "ai", "content": "", "tool_calls": calls}]
    seen += [{"type": "tool", "tool_call_id": c, "content": "found"} for c in ("c1", "c2")]
    second = {"id": "m2", "run_type": "llm", "parent_run_id": "r", "dotted_order": "r.3",
              "inputs": {"messages": seen}, "outputs": {"generations": [[{"text": "Found one."}]]}}  # fmt: skip
    runs = [root, first, _tool_run("t2", "r", "c2", 1, error="KeyError('c2')"), _tool_run("t1", "r", "c1", 2), second]
    [conv] = convert_data(runs, "langsmith").conversations
    assert [(m.tool_call_id, m.is_error) for m in conv.messages if m.role == "tool"] == [("c1", False), ("c2", True)]
    # a tool that runs another tool: one call of the agent, the inner run its own work
    outer = _tool_run("t3", "r", None, 4)
    runs = [root, outer, _tool_run("t4", "t3", None, 5)]
    [conv] = convert_data(runs, "langsmith").conversations
    assert [c.id for m in conv.messages for c in m.tool_calls or []] == ["t3"]
    [conv] = convert_data([{**outer, "parent_run_id": None}], "langsmith").conversations  # a tool run alone
    assert [(m.role, m.text) for m in conv.messages] == [("assistant", ""), ("tool", "found")]


def test_langsmith_tool_run_answers_a_model_call_that_carries_no_id() -> None:
    """A model whose tool calls carry no id (the trace's ids are the tool runs' own): the tool run's result
    answers the call, which takes the run's id; before, the result (a refund of 9999) was dropped."""
    from vigil.ingest.importers import convert_data

    root = {"id": "r", "name": "agent", "run_type": "chain", "inputs": {}, "outputs": {}}
    calls = [{"name": "issue_refund", "args": {"amount": 9999}}, {"name": "lookup", "args": {}}]
    ask = {"type": "human", "content": "refund"}
    out = {"generations": [[{"message": {"type": "ai", "content": "", "tool_calls": calls}}]]}
    first = {"id": "m1", "run_type": "llm", "parent_run_id": "r", "dotted_order": "r.0", "inputs": {"messages": [ask]},
             "outputs": out}  # fmt: skip
    refund = {"id": "t1", "name": "issue_refund", "run_type": "tool", "parent_run_id": "r", "dotted_order": "r.1",
              "inputs": {"amount": 9999}, "outputs": {"output": "refunded 9999"}}  # fmt: skip
    lookup = {**_tool_run("t2", "r", None, 2, error="KeyError('x')"), "extra": {}}
    [conv] = convert_data([root, first, refund, lookup], "langsmith").conversations
    assert [(m.role, m.text, m.tool_call_id, m.is_error) for m in conv.messages if m.role == "tool"] == [
        ("tool", "refunded 9999", "t1", False),
        ("tool", "KeyError('x')", "t2", True),
    ]
    [turn] = [m for m in conv.messages if m.tool_calls]
    assert [(c.id, c.name) for c in turn.tool_calls or []] == [("t1", "issue_refund"), ("t2", "lookup")]


def _span(span_id: str, data: dict[str, Any], second: int, error: Any = None) -> dict[str, Any]:
    at = f"2026-12-01T09:14:{second:02d}+00:00"
    return {"object": "trace.span", "id": span_id, "trace_id": "trace_1", "parent_id": None,
            "started_at": at, "ended_at": at, "span_data": data, "error": error}  # fmt: skip


def _call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def test_openai_agents_function_spans_are_never_dropped_beside_generations() -> None:
    from vigil.ingest.importers import convert_data

    generation = {
        "type": "generation",
        "input": [{"role": "user", "content": "Refund order 5."}],
        "output": [{"role": "assistant", "content": None, "tool_calls": [_call("call_1", "lookup")]}],
    }
    # a run that stops at its tool (tool_use_behavior="stop_on_first_tool"): no generation shows the result;
    # then a hand-off to an agent on the Responses model, whose response spans carry only their id
    spans = [
        _span("s1", generation, 1),
        _span("s2", {"type": "function", "name": "lookup", "input": "{}", "output": "delivered"}, 2),
        _span("s3", {"type": "response", "response_id": "resp_1"}, 3),
        _span("s4", {"type": "function", "name": "refund", "input": '{"amount": 9999}', "output": "done"}, 4),
        _span("s5", {"type": "function", "name": "notify", "input": "{}", "output": None}, 5, {"message": "down"}),
    ]
    [conv] = convert_data({"data": spans}, "openai-agents").conversations
    calls = [(c.id, c.name, c.args) for m in conv.messages for c in m.tool_calls or []]
    assert calls == [("call_1", "lookup", {}), ("s4", "refund", {"amount": 9999}), ("s5", "notify", {})]
    results = [(m.tool_call_id, m.text, m.is_error) for m in conv.messages if m.role == "tool"]
    assert results == [("call_1", "delivered", False), ("s4", "done", False), ("s5", "down", True)]
    # a call the next generation answers keeps that answer, marked failed when its span failed
    answered = {**generation, "input": [*generation["input"], *generation["output"]]}
    answered["input"].append({"role": "tool", "tool_call_id": "call_1", "content": "timeout"})
    answered["output"] = [{"role": "assistant", "content": "The lookup failed."}]
    spans = [
        _span("s1", generation, 1),
        _span("s2", {"type": "function", "name": "lookup", "input": "{}"}, 2, {"message": "timeout"}),
        _span("s3", answered, 3),
    ]
    [conv] = convert_data({"data": spans}, "openai-agents").conversations
    assert [(m.role, m.text, m.is_error) for m in conv.messages] == [
        ("user", "Refund order 5.", False),
        ("assistant", "", False),
        ("tool", "timeout", True),
        ("assistant", "The lookup failed.", False),
    ]


def _idless_langsmith(shown: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A LangSmith trace of a model whose tool call has no id; the next model run is shown ``shown`` as the
    tool's result (None: no next model run)."""
    root = {"id": "r", "name": "agent", "run_type": "chain", "inputs": {}, "outputs": {}}
    ask = {"type": "human", "content": "refund"}
    ai = {"type": "ai", "content": "", "tool_calls": [{"name": "issue_refund", "args": {"amount": 9999}}]}
    first = {"id": "m1", "run_type": "llm", "parent_run_id": "r", "dotted_order": "r.0", "inputs": {"messages": [ask]},
             "outputs": {"generations": [[{"message": ai}]]}}  # fmt: skip
    refund = {"id": "t1", "name": "issue_refund", "run_type": "tool", "parent_run_id": "r", "dotted_order": "r.1",
              "inputs": {"amount": 9999}, "outputs": {"output": "refunded 9999"}, "error": "PaymentError"}  # fmt: skip
    runs = [root, first, refund]
    if shown is not None:
        runs.append(
            {
                "id": "m2",
                "run_type": "llm",
                "parent_run_id": "r",
                "dotted_order": "r.2",
                "inputs": {"messages": [ask, ai, shown]},
                "outputs": {"generations": [[{"text": "Done."}]]},
            }  # fmt: skip
        )
    return runs


@pytest.mark.parametrize(
    "shown",
    [{"type": "tool", "content": "refunded 9999"}, {"type": "tool", "content": "refunded 9999", "tool_call_id": "t1"}],
    ids=["result-without-id", "result-with-the-run-id"],
)
def test_a_tool_result_the_model_was_shown_answers_its_id_less_call_once(shown: dict[str, Any]) -> None:
    """A model whose tool calls carry no id, its tool run, and the next model run shown the result (without
    an id, or with the run's): the run's result was added a second time after the call (the call taking the
    run's id, or ``vigil-call-0`` beside an answer to ``t1``), so every such result was stored twice. The
    result shown answers the call, which takes the run's id, and the run's failure marks it."""
    from vigil.ingest.importers import convert_data

    [conv] = convert_data(_idless_langsmith(shown), "langsmith").conversations
    assert [(m.role, m.text, m.tool_call_id, m.is_error) for m in conv.messages] == [
        ("user", "refund", None, False),
        ("assistant", "", None, False),
        ("tool", "refunded 9999", "t1", True),
        ("assistant", "Done.", None, False),
    ]
    [turn] = [m for m in conv.messages if m.tool_calls]
    assert [(c.id, c.name) for c in turn.tool_calls or []] == [("t1", "issue_refund")]


def test_openai_agents_a_result_shown_for_an_id_less_call_is_not_repeated() -> None:
    """The same through the OpenAI Agents importer: a generation whose tool call has no id, its function span,
    and the next generation shown the result without an id."""
    from vigil.ingest.importers import convert_data

    call = {"type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    asked = [{"role": "user", "content": "Where is order 5?"}]
    called = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    spans = [
        _span("s1", {"type": "generation", "input": asked, "output": called}, 1),
        _span("s2", {"type": "function", "name": "lookup", "input": "{}", "output": "delivered"}, 2),
        _span(
            "s3",
            {
                "type": "generation",
                "input": [*asked, *called, {"role": "tool", "content": "delivered"}],
                "output": [{"role": "assistant", "content": "It was delivered."}],
            },
            3,
        ),
    ]
    [conv] = convert_data({"data": spans}, "openai-agents").conversations
    assert [(m.role, m.text, m.tool_call_id) for m in conv.messages] == [
        ("user", "Where is order 5?", None),
        ("assistant", "", None),
        ("tool", "delivered", "s2"),
        ("assistant", "It was delivered.", None),
    ]
    assert [c.id for m in conv.messages for c in m.tool_calls or []] == ["s2"]


def test_a_tool_run_whose_id_is_another_tools_call_id_answers_its_own_tool() -> None:
    """A tool run whose own id happens to be the id of a call of another tool: it answered that call (a
    lookup's output recorded as the result of a refund that never ran) and left its own call unanswered. An
    id names a call of the same tool (or of an unnamed one); the run answers the call of its own tool."""
    from vigil.ingest.importers import convert_data

    root = {"id": "r", "name": "agent", "run_type": "chain", "inputs": {}, "outputs": {}}
    calls = [{"name": "lookup", "args": {}}, {"id": "t1", "name": "issue_refund", "args": {"amount": 9999}}]
    ask = {"type": "human", "content": "refund"}
    said = {"type": "ai", "content": "", "tool_calls": calls}
    first = {"id": "m1", "run_type": "llm", "parent_run_id": "r", "dotted_order": "r.0", "inputs": {"messages": [ask]},
             "outputs": {"generations": [[{"message": said}]]}}  # fmt: skip
    lookup = {"id": "t1", "name": "lookup", "run_type": "tool", "parent_run_id": "r", "dotted_order": "r.1",
              "inputs": {}, "outputs": {"output": "looked"}}  # fmt: skip
    [conv] = convert_data([root, first, lookup], "langsmith").conversations
    [turn] = [m for m in conv.messages if m.tool_calls]
    ids = {c.name: c.id for c in turn.tool_calls or []}
    assert ids["issue_refund"] == "t1" and ids["lookup"] not in (None, "t1"), ids
    assert [(m.text, m.tool_call_id) for m in conv.messages if m.role == "tool"] == [("looked", ids["lookup"])]


def test_the_id_given_to_a_call_without_one_is_no_other_calls_id() -> None:
    """A call without an id whose run's id is taken is named ``vigil-call-<n>``: a record whose own calls
    already used that name got two calls under one id, the lookup's result answering the refund again."""
    from vigil.ingest.importers import convert_data

    root = {"id": "r", "name": "agent", "run_type": "chain", "inputs": {}, "outputs": {}}
    calls = [{"name": "lookup", "args": {}}, {"id": "vigil-call-0", "name": "issue_refund", "args": {"amount": 9999}}]
    said = {"type": "ai", "content": "", "tool_calls": calls}
    first = {"id": "m1", "run_type": "llm", "parent_run_id": "r", "dotted_order": "r.0",
             "inputs": {"messages": [{"type": "human", "content": "refund"}]},
             "outputs": {"generations": [[{"message": said}]]}}  # fmt: skip
    lookup = {"id": "vigil-call-0", "name": "lookup", "run_type": "tool", "parent_run_id": "r", "dotted_order": "r.1",
              "inputs": {}, "outputs": {"output": "looked"}}  # fmt: skip
    [conv] = convert_data([root, first, lookup], "langsmith").conversations
    [turn] = [m for m in conv.messages if m.tool_calls]
    ids = [c.id for c in turn.tool_calls or []]
    assert len(set(ids)) == 2 and ids[1] == "vigil-call-0", ids
    assert [(m.text, m.tool_call_id) for m in conv.messages if m.role == "tool"] == [("looked", ids[0])]
