"""Every message format Vigil reads, detected or refused by name, never misread.

Payloads are the formats' own: built and checked with the providers' SDK types (``openai``, ``anthropic``),
or recorded from the libraries themselves (the OpenAI Agents SDK's trace processor, LangChain's LangSmith
tracer) running a tool-calling agent against a scripted model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import TypeAdapter

from vigil.ingest.importers import FORMATS, ImportError_, convert_data, matches, read_file
from vigil.rules import ConversationView, registered_rule_types
from vigil.schema import Conversation


def _write(tmp_path: Path, name: str, data: Any, jsonl: bool = False) -> Path:
    path = tmp_path / name
    if jsonl:
        path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in data))
    else:
        path.write_bytes(orjson.dumps(data))
    return path


def _refused(data: Any, fmt: str = "auto") -> str:
    with pytest.raises(ImportError_) as err:
        convert_data(data, fmt)
    return str(err.value)


def _flags(conv: Conversation, rule: str, **args: Any) -> bool:
    rtype = registered_rule_types()[rule]
    return bool(list(rtype.fn(ConversationView(conv), rtype.args_model.model_validate(args))))


def _calls(conv: Conversation) -> list[tuple[str | None, str, dict[str, Any]]]:
    return [(c.id, c.name, c.args) for m in conv.messages for c in m.tool_calls or []]


def _results(conv: Conversation) -> list[tuple[str | None, str, bool]]:
    return [(m.tool_call_id, m.text, m.is_error) for m in conv.messages if m.role == "tool"]


# --- OpenAI chat ------------------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}


def openai_chat_record() -> dict[str, Any]:
    """A logged Chat Completions call: the request (with tools) and its ChatCompletion response."""
    from openai.types.chat import ChatCompletion, ChatCompletionFunctionToolParam, ChatCompletionMessageParam

    messages = [
        {"role": "developer", "content": "You answer weather questions with the tool."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_w1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_w1", "content": '{"temp": 18, "sky": "clear"}'},
    ]
    TypeAdapter(list[ChatCompletionMessageParam]).validate_python(messages)
    TypeAdapter(ChatCompletionFunctionToolParam).validate_python(WEATHER_TOOL)
    response = ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1764579600,
            "model": "gpt-4.1-2025-04-14",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "It is 18 °C and clear in Paris."},
                }
            ],
            "usage": {"prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132},
        }
    ).model_dump(mode="json", exclude_none=True)
    return {
        "model": "gpt-4.1",
        "messages": messages,
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
        "temperature": 0.2,
        "response": response,
    }


def test_openai_chat_with_tools_is_read_with_its_tools(tmp_path: Path) -> None:
    path = _write(tmp_path, "chat.jsonl", [openai_chat_record()], jsonl=True)
    imported = read_file(path)
    assert imported.format == "openai"
    [conv] = imported.conversations
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert _calls(conv) == [("call_w1", "get_weather", {"city": "Paris", "unit": "c"})]
    assert conv.messages[-1].text == "It is 18 °C and clear in Paris."
    [tool] = conv.tools or []
    assert (tool.name, tool.description) == ("get_weather", "Current weather in a city.")
    assert tool.parameters is not None and tool.parameters["required"] == ["city"]
    assert conv.metadata["request"] == {"model": "gpt-4.1", "temperature": 0.2, "tool_choice": "auto"}
    assert conv.usage is not None and conv.usage.tokens == 132
    assert not _flags(conv, "unoffered_tool")


def test_openai_fine_tuning_record_with_tools_and_parallel_calls() -> None:
    """OpenAI's fine-tuning chat format: messages, tools and parallel_tool_calls on one line."""
    record = {
        "messages": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},  # noqa: E501
                    {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": '{"city":"Rome"}'}},
                ],
            },
        ],
        "parallel_tool_calls": True,
        "tools": [WEATHER_TOOL],
    }  # fmt: skip
    imported = convert_data(record)
    assert imported.format == "openai"
    [conv] = imported.conversations
    assert [c[1] for c in _calls(conv)] == ["get_weather", "get_time"]
    assert conv.metadata["request"] == {"parallel_tool_calls": True}
    assert _flags(conv, "unoffered_tool")  # get_time was not offered


def test_native_conversation_with_tools_is_accepted_over_http(sqlite_url: str) -> None:
    from tests.support.app import ADMIN, INGEST, make_client, make_settings
    from vigil.app.runtime import build_runtime

    rt = build_runtime(make_settings(sqlite_url))
    body = {
        "conversation_id": "native-tools",
        "agent_id": "weather",
        "agent_version": "v1",
        "messages": openai_chat_record()["messages"][1:],
        "tools": [WEATHER_TOOL],
    }
    with make_client(rt) as client:
        r = client.post("/v1/conversations", json=body, headers=INGEST)
        assert r.status_code == 202, r.text
        page = client.get("/v1/conversations/native-tools", headers=ADMIN)
    rt.close()
    assert page.status_code == 200, page.text
    assert page.json()["conversation"]["tools"] == [WEATHER_TOOL]  # the document is kept as sent
    [tool] = Conversation.model_validate(page.json()["conversation"]).tools or []
    assert (tool.name, tool.description) == ("get_weather", "Current weather in a city.")


# --- OpenAI Responses -------------------------------------------------------------------------------

LOOKUP_TOOL = {
    "type": "function",
    "name": "lookup_order",
    "description": "Find an order by id.",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    "strict": True,
}


def responses_input() -> list[dict[str, Any]]:
    from openai.types.responses import ResponseInputParam

    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Where is order A17?"}]},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Look the order up first."}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_a17",
            "name": "lookup_order",
            "arguments": '{"order_id": "A17"}',
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_a17", "output": '{"status": "shipped"}'},
    ]
    TypeAdapter(ResponseInputParam).validate_python(items)
    return items


def responses_response(status: str = "completed") -> dict[str, Any]:
    from openai.types.responses import Response

    return Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 1764579600,
            "model": "gpt-5",
            "status": status,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": "You are the order desk.",
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Order A17 has shipped.", "annotations": []}],
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [LOOKUP_TOOL],
            "usage": {
                "input_tokens": 80,
                "output_tokens": 9,
                "total_tokens": 89,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
    ).model_dump(mode="json")


def test_openai_responses_request_with_response(tmp_path: Path) -> None:
    record = {"model": "gpt-5", "input": responses_input(), "tools": [LOOKUP_TOOL], "response": responses_response()}
    imported = read_file(_write(tmp_path, "responses.json", record))
    assert imported.format == "openai-responses"
    [conv] = imported.conversations
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert conv.messages[0].text == "You are the order desk."
    call_turn = conv.messages[2]
    assert _calls(conv) == [("call_a17", "lookup_order", {"order_id": "A17"})]
    assert call_turn.model_extra == {"reasoning": "Look the order up first."}  # reasoning is not said to the user
    assert _results(conv) == [("call_a17", '{"status": "shipped"}', False)]
    assert conv.messages[-1].text == "Order A17 has shipped."
    assert [t.name for t in conv.tools or []] == ["lookup_order"]
    assert conv.usage is not None and conv.usage.tokens == 89
    assert conv.metadata["response_id"] == "resp_1"


def test_openai_responses_object_alone_and_bare_items() -> None:
    [conv] = convert_data(responses_response("incomplete")).conversations
    assert [m.role for m in conv.messages] == ["system", "assistant"]
    assert conv.messages[-1].model_extra == {"finish_reason": "length"}  # cut at the token limit: a rule sees it
    assert _flags(conv, "empty_or_truncated_response")
    imported = convert_data([*responses_input(), {"role": "assistant", "content": "Shipped."}])
    assert imported.format == "openai-responses"
    assert [m.role for m in imported.conversations[0].messages] == ["user", "assistant", "tool", "assistant"]


def test_openai_responses_unknown_items_are_refused_by_name() -> None:
    items = [*responses_input(), {"type": "item_reference", "id": "msg_9"}]
    assert "item_reference (msg_9) points to content that is not in the file" in _refused(items)
    record = {"input": [*responses_input()[:1], {"type": "hologram_call", "id": "h1"}]}
    assert "item 0.input.1: an item of type 'hologram_call' is not one Vigil reads" in _refused(record)
    part = {"type": "message", "role": "user", "content": [{"type": "input_smell", "smell": "coffee"}]}
    assert "a content part of type 'input_smell'" in _refused({"input": [part]})


# --- Anthropic Messages -----------------------------------------------------------------------------

ANTHROPIC_TOOLS = [
    {
        "name": "get_order",
        "description": "Look an order up by id.",
        "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    },
    {
        "name": "refund_order",
        "description": "Refund a delivered order.",
        "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    },
]


def anthropic_record(system: Any = None, stop_reason: str = "end_turn") -> dict[str, Any]:
    """A logged Messages call: tool_use in an assistant turn, its tool_result in the next user turn."""
    from anthropic.types import Message, MessageParam, ToolParam

    messages = [
        {"role": "user", "content": "Refund order 881, it arrived broken."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Check the order first.", "signature": "sig"},
                {"type": "text", "text": "Let me look that up."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_order", "input": {"order_id": "881"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "content": [{"type": "text", "text": '{"status": "delivered"}'}],
                },
                {"type": "text", "text": "Please hurry."},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_02", "name": "refund_order", "input": {"order_id": "881"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_02", "content": "payment service down", "is_error": True}
            ],
        },
    ]
    TypeAdapter(list[MessageParam]).validate_python(messages)
    TypeAdapter(list[ToolParam]).validate_python(ANTHROPIC_TOOLS)
    response = Message.model_validate(
        {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [{"type": "text", "text": "The refund failed; I have escalated it to billing."}],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": 410, "output_tokens": 25},
        }
    ).model_dump(mode="json", exclude_none=True)
    record: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 1024, "tools": ANTHROPIC_TOOLS}
    if system is not None:
        record["system"] = system
    return {**record, "messages": messages, "response": response}


@pytest.mark.parametrize(
    "system",
    [None, "You are the refunds agent.", [{"type": "text", "text": "You are the refunds agent."}]],
    ids=["no-system", "system-string", "system-blocks"],
)
def test_anthropic_messages_tool_use_becomes_tool_calls(system: Any) -> None:
    imported = convert_data(anthropic_record(system))
    assert imported.format == "anthropic"
    [conv] = imported.conversations
    roles = ["user", "assistant", "tool", "user", "assistant", "tool", "assistant"]
    assert [m.role for m in conv.messages] == (roles if system is None else ["system", *roles])
    if system is not None:
        assert conv.messages[0].text == "You are the refunds agent."
    assert _calls(conv) == [
        ("toolu_01", "get_order", {"order_id": "881"}),
        ("toolu_02", "refund_order", {"order_id": "881"}),
    ]
    assert _results(conv) == [
        ("toolu_01", '{"status": "delivered"}', False),
        ("toolu_02", "payment service down", True),
    ]
    first_reply = next(m for m in conv.messages if m.role == "assistant")
    assert first_reply.text == "Let me look that up." and first_reply.model_extra == {
        "reasoning": "Check the order first."
    }
    assert [t.name for t in conv.tools or []] == ["get_order", "refund_order"]
    assert conv.usage is not None and (conv.usage.prompt_tokens, conv.usage.completion_tokens) == (410, 25)
    # read as tool calls, not as empty replies: the empty-or-truncated rule stays quiet
    assert not _flags(conv, "empty_or_truncated_response")
    assert not _flags(conv, "unoffered_tool")


def test_anthropic_response_cut_at_max_tokens_is_seen() -> None:
    [conv] = convert_data(anthropic_record(stop_reason="max_tokens")).conversations
    assert conv.messages[-1].model_extra == {"finish_reason": "length"}
    assert _flags(conv, "empty_or_truncated_response")


def test_anthropic_unknown_blocks_and_roles_are_refused() -> None:
    record = anthropic_record()
    record["messages"][1]["content"].append({"type": "hologram", "data": "x"})
    assert "item 0.messages.1.content.3: an assistant block of type 'hologram' is not one Vigil reads" in _refused(
        record
    )
    record = anthropic_record("sys")
    record["messages"].append({"role": "tool", "content": "x"})
    msg = _refused(record, "anthropic")
    assert "Anthropic Messages have user and assistant turns only, not 'tool'" in msg


# --- ambiguity and unknown shapes --------------------------------------------------------------------


def test_mixed_openai_and_anthropic_markers_are_ambiguous() -> None:
    record = anthropic_record("sys")
    record["messages"].append({"role": "tool", "tool_call_id": "toolu_02", "content": "x"})
    msg = _refused(record)
    assert "ambiguous shape" in msg and "anthropic (" in msg and "openai (a tool message)" in msg
    assert "tried " + ", ".join(FORMATS) in msg


@pytest.mark.parametrize(
    "data",
    [{"prompt": "hi", "completion": "hello"}, [{"role": "user", "content": "hi"}], 42, []],
    ids=["completion-pair", "bare-message-list", "number", "empty"],
)
def test_unknown_shapes_are_refused_naming_every_format_tried(data: Any) -> None:
    msg = _refused(data)
    assert "unknown shape" in msg and "tried " + ", ".join(FORMATS) in msg


def test_plain_turns_read_the_same_in_every_format() -> None:
    found = matches({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
    assert list(found) == ["openai"] and "read the same" in found["openai"]


# --- OpenAI Agents SDK ------------------------------------------------------------------------------


def agents_sdk_trace() -> dict[str, Any]:
    """What the OpenAI Agents SDK's exporter sends for a tool-calling agent run: ``{"data": [trace, spans...]}``,
    recorded with a trace processor while the SDK runs against a scripted chat-completions server."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_trace_processors, trace
    from agents.tracing import TracingProcessor
    from openai import AsyncOpenAI

    from tests.support.fake_openai import Script, fake_openai

    class Keep(TracingProcessor):
        def __init__(self) -> None:
            self.items: list[dict[str, Any]] = []

        def on_trace_start(self, t: Any) -> None:
            pass

        def on_trace_end(self, t: Any) -> None:
            self.items.append(t.export())

        def on_span_start(self, s: Any) -> None:
            pass

        def on_span_end(self, s: Any) -> None:
            self.items.append(s.export())

        def shutdown(self) -> None:
            pass

        def force_flush(self) -> None:
            pass

    @function_tool
    def get_order_details(order_id: str) -> str:
        """Look an order up by its id."""
        return json.dumps({"order_id": order_id, "status": "delivered"})

    @function_tool
    def cancel_pending_order(order_id: str, reason: str) -> str:
        """Cancel a pending order."""
        raise ValueError("order is not pending")

    keep = Keep()
    set_trace_processors([keep])
    try:
        with fake_openai(Script()) as (url, _):
            model = OpenAIChatCompletionsModel(model="gpt-4.1", openai_client=AsyncOpenAI(base_url=url, api_key="x"))
            tools = [get_order_details, cancel_pending_order]
            agent = Agent(name="Shop agent", instructions="You are a shop agent.", tools=tools, model=model)
            with trace("Shop workflow", group_id="session-42"):
                Runner.run_sync(agent, "Cancel order #W1")
    finally:
        set_trace_processors([])
    return orjson.loads(orjson.dumps({"data": keep.items}, default=str))


def test_openai_agents_sdk_trace_becomes_one_conversation(tmp_path: Path) -> None:
    payload = agents_sdk_trace()
    for path in (_write(tmp_path, "agents.json", payload), _write(tmp_path, "agents.jsonl", payload["data"], True)):
        imported = read_file(path)
        assert imported.format == "openai-agents"
        [conv] = imported.conversations
        assert conv.conversation_id.startswith("openai-agents:trace_") and conv.agent_id == "Shop agent"
        assert [m.role for m in conv.messages] == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
        ]
        assert [c[1:] for c in _calls(conv)] == [
            ("get_order_details", {"order_id": "#W1"}),
            ("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"}),
        ]
        assert [r[2] for r in _results(conv)] == [False, True]  # the function span's error marks its result
        assert conv.messages[-1].text == "Order #W1 is cancelled."
        assert {t.name for t in conv.tools or []} == {"get_order_details", "cancel_pending_order"}
        assert conv.metadata["session_id"] == "session-42" and conv.metadata["workflow_name"] == "Shop workflow"
        assert conv.status == "finished" and conv.usage is not None and conv.usage.tokens
        assert not _flags(conv, "unoffered_tool")


def agents_responses_model_trace() -> dict[str, Any]:
    """An Agents SDK trace of the default Responses model, in the shapes of the SDK's span data exports."""
    trace = {"object": "trace", "id": "trace_1", "workflow_name": "Agent workflow", "group_id": None, "metadata": None}

    def span(sid: str, data: dict[str, Any], error: Any = None) -> dict[str, Any]:
        return {"object": "trace.span", "id": sid, "trace_id": "trace_1", "parent_id": "span_a",
                "started_at": f"2026-12-01T09:00:0{sid[-1]}+00:00", "ended_at": f"2026-12-01T09:00:0{sid[-1]}+00:00",
                "span_data": data, "error": error}  # fmt: skip

    spans = [
        span("span_1", {"type": "agent", "name": "Triage", "handoffs": ["Refund agent"], "tools": ["lookup"]}),
        span("span_2", {"type": "response", "response_id": "resp_1", "usage": None}),
        span("span_3", {"type": "function", "name": "lookup", "input": '{"id": 4}', "output": "found"}),
        span("span_4", {"type": "handoff", "from_agent": "Triage", "to_agent": "Refund agent"}),
        span("span_5", {"type": "function", "name": "refund", "input": "{}", "output": None, "mcp_data": None},
             {"message": "Error running tool", "data": {"error": "denied"}}),
    ]  # fmt: skip
    return {"data": [trace, *spans]}


def test_openai_agents_responses_model_trace_keeps_its_tool_calls() -> None:
    """With the default Responses model, response spans export only their id: the function spans remain."""
    trace, *spans = agents_responses_model_trace()["data"]
    [conv] = convert_data({"data": [trace, *spans]}).conversations
    assert [c[1:] for c in _calls(conv)] == [("lookup", {"id": 4}), ("refund", {})]
    assert _results(conv) == [("span_3", "found", False), ("span_5", "Error running tool", True)]
    assert conv.metadata["content"] == "tool calls only"
    assert conv.metadata["handoffs"] == [{"from": "Triage", "to": "Refund agent"}]
    assert {t.name for t in conv.tools or []} == {"lookup", "transfer_to_refund_agent"}
    assert _flags(conv, "unoffered_tool")  # refund was not among the agent's tools
    only_responses = {"data": [trace, spans[1]]}
    assert "holds no conversation" in _refused(only_responses)
    odd = {"data": [trace, {**spans[0], "id": "span_6", "span_data": {"type": "teleport"}}]}
    assert "a span of type 'teleport' is not one Vigil reads" in _refused(odd)


# --- LangChain / LangSmith --------------------------------------------------------------------------


def langsmith_run_tree() -> dict[str, Any]:
    """A run tree as LangSmith stores it: LangChain's LangSmith tracer recording a tool-calling agent loop
    (a chat model with tools bound, tools, a failing tool), kept instead of posted."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool

    @tool
    def get_order_details(order_id: str) -> str:
        """Look an order up."""
        return json.dumps({"order_id": order_id, "status": "delivered"})

    @tool
    def cancel_pending_order(order_id: str, reason: str) -> str:
        """Cancel a pending order."""
        raise ValueError("order is not pending")

    replies = iter(
        [
            AIMessage(content="", tool_calls=[{"name": "get_order_details", "args": {"order_id": "#W1"}, "id": "c1"}]),
            AIMessage(
                content="",
                tool_calls=[{"name": "cancel_pending_order", "args": {"order_id": "#W1", "reason": "x"}, "id": "c2"}],
            ),
            AIMessage(content="Sorry, it could not be cancelled."),
        ]
    )
    tools = {t.name: t for t in (get_order_details, cancel_pending_order)}
    model = GenericFakeChatModel(messages=replies).bind(tools=[convert_to_openai_tool(t) for t in tools.values()])

    def agent(inp: dict[str, Any]) -> dict[str, Any]:
        msgs: list[Any] = [SystemMessage("You are a shop agent."), HumanMessage(inp["question"])]
        while True:
            ai = model.invoke(msgs)
            msgs.append(ai)
            if not ai.tool_calls:
                return {"messages": msgs}
            for c in ai.tool_calls:
                try:
                    msgs.append(ToolMessage(tools[c["name"]].invoke(c["args"]), tool_call_id=c["id"]))
                except ValueError as exc:
                    msgs.append(ToolMessage(str(exc), tool_call_id=c["id"], status="error"))

    return _recorded(agent, {"question": "Cancel #W1"}, "shop_agent")


def _recorded(fn: Any, inputs: dict[str, Any], name: str) -> dict[str, Any]:
    """The run tree of ``fn`` run as ``name`` under LangChain's LangSmith tracer, kept instead of posted."""
    from langchain_core.runnables import RunnableLambda
    from langchain_core.tracers.langchain import LangChainTracer
    from langsmith import Client

    class Keep(LangChainTracer):
        roots: list[Any] = []

        def _persist_run_single(self, run: Any) -> None:
            pass

        def _update_run_single(self, run: Any) -> None:  # type: ignore[override]
            pass

        def _persist_run(self, run: Any) -> None:
            self.roots.append(run)

    tracer = Keep(client=Client(api_key="unused", api_url="http://127.0.0.1:9", info={}))
    RunnableLambda(fn).with_config(run_name=name).invoke(inputs, {"callbacks": [tracer]})
    [root] = tracer.roots

    def tree(run: Any) -> dict[str, Any]:
        d = run.model_dump(mode="json", exclude={"child_runs", "parent_run", "client", "ls_client"})
        d["child_runs"] = [tree(c) for c in run.child_runs]
        return d

    return tree(root)


def _flatten(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The same runs as ``list_runs`` gives them: flat, linked by ``parent_run_id``."""
    children = run.pop("child_runs", [])
    return [run, *(r for c in children for r in _flatten(c))]


def test_langsmith_run_tree_and_flat_runs_read_the_same(tmp_path: Path) -> None:
    tree = langsmith_run_tree()
    assert [c["run_type"] for c in tree["child_runs"]] == ["llm", "tool", "llm", "tool", "llm"]
    nested = read_file(_write(tmp_path, "run.json", tree))
    flat = read_file(_write(tmp_path, "runs.jsonl", _flatten(json.loads(json.dumps(tree))), jsonl=True))
    assert nested.format == flat.format == "langsmith"
    [conv] = nested.conversations
    assert flat.conversations[0].messages == conv.messages
    assert conv.conversation_id == f"langsmith:{tree['id']}" and conv.agent_id == "shop_agent"
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert [c[1:] for c in _calls(conv)] == [
        ("get_order_details", {"order_id": "#W1"}),
        ("cancel_pending_order", {"order_id": "#W1", "reason": "x"}),
    ]
    assert [(r[0], r[2]) for r in _results(conv)] == [("c1", False), ("c2", True)]
    assert [t.name for t in conv.tools or []] == ["get_order_details", "cancel_pending_order"]
    assert conv.tools and conv.tools[0].description == "Look an order up."
    assert not _flags(conv, "unoffered_tool")


def _tool_loop(replies: list[Any], tools: list[Any], steps: int = 9) -> Any:
    """A tool-calling agent loop as LangGraph's ``ToolNode`` runs it: each tool given the model's tool call
    (so its run records the call id and returns a ``ToolMessage``); after ``steps`` model calls it stops
    where it is, as an agent at its step limit does, its last tool's result shown to no model."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.utils.function_calling import convert_to_openai_tool

    by_name = {t.name: t for t in tools}
    model = GenericFakeChatModel(messages=iter(replies)).bind(tools=[convert_to_openai_tool(t) for t in tools])

    def agent(inp: dict[str, Any]) -> dict[str, Any]:
        msgs: list[Any] = [HumanMessage(inp["question"])]
        for _ in range(steps):
            ai = model.invoke(msgs)
            msgs.append(ai)
            if not ai.tool_calls:
                return {"output": ai.content}
            for c in ai.tool_calls:
                try:
                    msgs.append(by_name[c["name"]].invoke({**c, "type": "tool_call"}))
                except ValueError as exc:  # the model is told as plain text, as a handler that catches it does
                    msgs.append(ToolMessage(str(exc), tool_call_id=c["id"]))
        return {"output": "Agent stopped due to max iterations."}

    return agent


def _ai_calls(*calls: tuple[str, str, dict[str, Any]]) -> Any:
    from langchain_core.messages import AIMessage

    return AIMessage(content="", tool_calls=[{"id": i, "name": n, "args": a} for i, n, a in calls])


def test_langsmith_tool_run_no_model_shows_is_kept_with_its_result() -> None:
    """An agent that stopped at its tool: the call and its result reached no later model call, and once any
    llm run carried messages a tool run only marked failures, so the cancellation vanished from the rules."""
    from langchain_core.tools import tool

    @tool
    def cancel_pending_order(order_id: str) -> str:
        """Cancel a pending order."""
        return f"cancelled {order_id}"

    call = ("c1", "cancel_pending_order", {"order_id": "#W1"})
    tree = _recorded(_tool_loop([_ai_calls(call)], [cancel_pending_order], steps=1), {"question": "Cancel #W1"}, "a")
    assert [r["run_type"] for r in tree["child_runs"]] == ["llm", "tool"]
    [conv] = convert_data(tree, "langsmith").conversations
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool"]
    assert _calls(conv) == [call] and _results(conv) == [("c1", "cancelled #W1", False)]
    assert _flags(conv, "forbidden_tool", tools=["cancel_pending_order"])
    # the model's output not recorded (a stream cut off): the tool run alone gives the call, under its call id
    tree["child_runs"][0]["outputs"] = None
    [conv] = convert_data(_flatten(tree), "langsmith").conversations
    assert [m.role for m in conv.messages] == ["user", "assistant", "tool"]
    assert _calls(conv) == [call] and _results(conv) == [("c1", "cancelled #W1", False)]


def test_langsmith_agent_used_as_a_tool_is_its_own_conversation() -> None:
    """An agent called as a tool runs its own model and tools inside the tool run: those calls are the inner
    agent's, read as a conversation of its own (named by the tool, linked to the call), never as the outer
    agent's calls; the outer agent's call of it keeps its result."""
    from langchain_core.messages import AIMessage
    from langchain_core.runnables import RunnableLambda
    from langchain_core.tools import tool

    @tool
    def close_account(account: str) -> str:
        """Close an account."""
        return f"closed {account}"

    inner = _tool_loop(
        [_ai_calls(("i1", "close_account", {"account": "A7"})), AIMessage("Closed A7.")], [close_account]
    )

    @tool
    def account_agent(task: str) -> str:
        """Hand a task to the account agent."""
        return str(RunnableLambda(inner).invoke({"question": task})["output"])

    outer = _tool_loop([_ai_calls(("o1", "account_agent", {"task": "close A7"}))], [account_agent], steps=1)
    tree = _recorded(outer, {"question": "Please close my account A7"}, "front_desk")
    for shape in (tree, _flatten(json.loads(json.dumps(tree)))):
        first, second = convert_data(shape, "langsmith").conversations
        assert first.conversation_id == f"langsmith:{tree['id']}" and first.agent_id == "front_desk"
        assert _calls(first) == [("o1", "account_agent", {"task": "close A7"})]
        assert _results(first) == [("o1", "Closed A7.", False)]
        assert [t.name for t in first.tools or []] == ["account_agent"]
        assert not _flags(first, "forbidden_tool", tools=["close_account"])
        tool_run = tree["child_runs"][1]
        assert second.conversation_id == f"langsmith:{tool_run['id']}" and second.agent_id == "account_agent"
        assert second.metadata["caller_run_id"] == tree["id"] and second.metadata["tool_call_id"] == "o1"
        assert _calls(second) == [("i1", "close_account", {"account": "A7"})]
        assert _results(second) == [("i1", "closed A7", False)]
        assert _flags(second, "forbidden_tool", tools=["close_account"])


def test_langsmith_failed_tool_run_marks_its_own_result() -> None:
    """Two calls of one tool, the second failing, its error reaching the model as plain text: the failed run
    marked the first result of that tool's name, the call that succeeded."""
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    @tool
    def cancel_pending_order(order_id: str) -> str:
        """Cancel a pending order."""
        if order_id == "#W2":
            raise ValueError("order is not pending")
        return f"cancelled {order_id}"

    calls = [("c1", "cancel_pending_order", {"order_id": "#W1"}), ("c2", "cancel_pending_order", {"order_id": "#W2"})]
    loop = _tool_loop([_ai_calls(*calls), AIMessage("One was cancelled.")], [cancel_pending_order])
    tree = _recorded(loop, {"question": "Cancel #W1 and #W2"}, "shop_agent")
    assert [bool(r["error"]) for r in tree["child_runs"] if r["run_type"] == "tool"] == [False, True]
    [conv] = convert_data(tree, "langsmith").conversations
    assert _calls(conv) == calls
    assert _results(conv) == [("c1", "cancelled #W1", False), ("c2", "order is not pending", True)]
    # the last step failing, no model shown it: its result is kept, failed, with the run's error text
    [conv] = convert_data({**tree, "child_runs": tree["child_runs"][:3]}, "langsmith").conversations
    assert [(r[0], r[2]) for r in _results(conv)] == [("c1", False), ("c2", True)]
    assert "order is not pending" in _results(conv)[1][1]


def test_langsmith_llm_runs_alone_and_unknown_messages() -> None:
    tree = langsmith_run_tree()
    llm_only = [r for r in _flatten(tree) if r["run_type"] == "llm"]
    for r in llm_only:
        r["parent_run_id"] = None
    # three llm runs without their parent: three conversations, each the history its call saw
    convs = convert_data(llm_only, "langsmith").conversations
    assert [len(c.messages) for c in convs] == [3, 5, 7]
    odd = langsmith_run_tree()
    odd["child_runs"][0]["inputs"]["messages"][0][0]["id"][-1] = "HologramMessage"
    assert "a message of class 'HologramMessage' is not one Vigil reads" in _refused(odd)


def test_langsmith_runs_in_a_parent_cycle_beside_a_real_root_are_refused_by_name() -> None:
    """Two runs naming each other as parent, beside a real run tree, were dropped without a word."""
    runs = _flatten(langsmith_run_tree())
    runs += [
        {"id": "A", "run_type": "chain", "parent_run_id": "B", "name": "a"},
        {"id": "B", "run_type": "chain", "parent_run_id": "A", "name": "b"},
    ]
    why = _refused(runs, "langsmith")
    assert "2 run(s) reach no root run" in why and "'A', 'B'" in why
    assert len(convert_data(_flatten(langsmith_run_tree()), "langsmith").conversations) == 1  # without them


# --- the command line and the HTTP API say which format they read -----------------------------------


def test_vigil_import_says_the_format_it_chose(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from vigil.app.cli import app

    chat = _write(tmp_path, "chat.jsonl", [openai_chat_record()], jsonl=True)
    claude = _write(tmp_path, "claude.json", anthropic_record("sys"))
    result = CliRunner().invoke(app, ["import", "--dry-run", str(chat), str(claude)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"{chat}: openai (detected" in result.output and f"{claude}: anthropic (detected" in result.output
    odd = _write(tmp_path, "odd.json", {"prompt": "hi"})
    result = CliRunner().invoke(app, ["import", "--dry-run", str(odd)], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "unknown shape" in result.output and "langsmith" in result.output


def test_http_ingest_reads_a_format_and_says_which(sqlite_url: str) -> None:
    from tests.support.app import ADMIN, INGEST, make_client, make_settings
    from vigil.app.runtime import build_runtime

    rt = build_runtime(make_settings(sqlite_url))
    with make_client(rt) as client:
        r = client.post("/v1/conversations?format=auto&agent_id=refunds", json=anthropic_record("sys"), headers=INGEST)
        assert r.status_code == 202, r.text
        assert r.json()["format"] == "anthropic" and r.json()["stored"] == 1
        [cid] = r.json()["conversation_ids"]
        page = client.get(f"/v1/conversations/{cid}", headers=ADMIN).json()
        assert page["agent_id"] == "refunds" if "agent_id" in page else page["conversation"]["agent_id"] == "refunds"
        assert [c["function"]["name"] for m in page["conversation"]["messages"] for c in m.get("tool_calls") or []] == [
            "get_order",
            "refund_order",
        ]
        # the same transcript for another agent is its own conversation (it was a duplicate of the first, and
        # the second agent's conversation was never stored); the same agent again is a duplicate
        for agent, stored in (("billing", 1), ("refunds", 0)):
            url = f"/v1/conversations?format=auto&agent_id={agent}"
            again = client.post(url, json=anthropic_record("sys"), headers=INGEST).json()
            assert (again["stored"], again["duplicates"]) == (stored, 1 - stored), again
        chat = {"messages": [{"role": "user", "content": "same words"}, {"role": "assistant", "content": "ok"}]}
        ids = set()
        for version in ("v1", "v2"):
            r = client.post(
                f"/v1/conversations?format=openai&agent_id=a&agent_version={version}", json=chat, headers=INGEST
            )
            assert r.json()["stored"] == 1, r.text
            ids.update(r.json()["conversation_ids"])
        assert len(ids) == 2
        r = client.post("/v1/conversations?format=auto", json={"prompt": "hi"}, headers=INGEST)
        assert r.status_code == 422 and "unknown shape" in r.json()["detail"] and "langsmith" in r.json()["detail"]
        r = client.post("/v1/conversations?format=yaml", json={"prompt": "hi"}, headers=INGEST)
        assert r.status_code == 400 and "format must be auto" in r.json()["detail"]
        letters = client.get("/v1/dead-letters", headers=ADMIN).json()
        assert any("unknown shape" in d.get("detail", "") for d in letters)  # refused, and kept
    rt.close()


def test_anthropic_messages_sent_as_vigils_schema_are_refused_with_a_hint(sqlite_url: str) -> None:
    """Not accepted with tool_use blocks read as empty replies: refused, naming the format to send it in."""
    from tests.support.app import INGEST, make_client, make_settings
    from vigil.app.runtime import build_runtime

    record = anthropic_record()
    del record["response"], record["model"], record["max_tokens"], record["tools"]
    body = {"conversation_id": "claude-1", "agent_id": "refunds", "agent_version": "v1", **record}
    rt = build_runtime(make_settings(sqlite_url))
    with make_client(rt) as client:
        r = client.post("/v1/conversations", json=body, headers=INGEST)
        assert r.status_code == 422, r.text
        [error] = r.json()["errors"]
        assert "a thinking block is Anthropic Messages" in str(error["errors"])
        assert error["hint"].startswith("this looks like anthropic (") and "?format=anthropic" in error["hint"]
        r = client.post("/v1/conversations?format=auto", json=body, headers=INGEST)
        assert r.status_code == 202 and r.json()["format"] == "anthropic", r.text
        assert r.json()["conversation_ids"] == ["claude-1"]  # its own id and agent are kept
    rt.close()


# --- any JSON at all: conversations or a clear refusal, never a crash --------------------------------

KEYS = [
    "messages", "role", "content", "type", "text", "tool_calls", "tool_call_id", "function", "name", "arguments",
    "id", "call_id", "input", "output", "response", "choices", "message", "system", "tools", "input_schema",
    "tool_use_id", "is_error", "summary", "object", "trace_id", "span_data", "data", "error", "run_type",
    "inputs", "outputs", "child_runs", "parent_run_id", "generations", "lc", "kwargs", "simulations", "traj",
]  # fmt: skip
VALUES = ["user", "assistant", "tool", "system", "developer", "text", "tool_use", "tool_result", "message",
          "function_call", "function_call_output", "reasoning", "trace", "trace.span", "generation", "function",
          "agent", "llm", "chain", "response", "constructor", "AIMessage", "ai", "human"]  # fmt: skip


def _json() -> Any:
    from hypothesis import strategies as st

    leaves = st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(VALUES) | st.text(max_size=5)
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=5),
        max_leaves=30,
    )


def _read_or_refused(data: Any, fmt: str) -> None:
    """Valid conversations, or a refusal by ``ImportError_`` that names where in the body; nothing else."""
    try:
        imported = convert_data(data, fmt)
    except ImportError_ as exc:
        assert str(exc).startswith("body: ")
        return
    assert imported.conversations and all(isinstance(c, Conversation) for c in imported.conversations)


def test_any_json_gives_conversations_or_a_named_refusal() -> None:
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=_json(), fmt=st_formats())
    def check(data: Any, fmt: str) -> None:
        _read_or_refused(data, fmt)

    check()


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _mutated(sample: Any, path: tuple[Any, ...], new: Any, delete: bool) -> Any:
    if not path:
        return new
    head, *rest = path
    copy = dict(sample) if isinstance(sample, dict) else list(sample)
    if not rest and delete:
        del copy[head]
    else:
        copy[head] = _mutated(copy[head], tuple(rest), new, delete)
    return copy


def test_realistic_payloads_with_any_part_broken_give_conversations_or_a_named_refusal() -> None:
    """Every sample above with one or two of its parts replaced by any JSON (or removed): read, or refused by
    ``ImportError_`` naming where; never a crash, never an invalid conversation."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    samples = [
        openai_chat_record(),
        {"model": "gpt-5", "input": responses_input(), "tools": [LOOKUP_TOOL], "response": responses_response()},
        anthropic_record("sys"),
        agents_responses_model_trace(),
        agents_sdk_trace(),
        langsmith_run_tree(),
    ]
    paths = [_paths(x) for x in samples]

    @settings(max_examples=800, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data(), fmt=st_formats())
    def check(data: Any, fmt: str) -> None:
        k = data.draw(st.integers(0, len(samples) - 1))
        value = samples[k]
        for _ in range(data.draw(st.integers(1, 2))):
            path = data.draw(st.sampled_from(_paths(value) if value is not samples[k] else paths[k]))
            value = _mutated(value, path, data.draw(_json()), bool(path) and data.draw(st.booleans()))
        _read_or_refused(value, fmt)

    check()


def st_formats() -> Any:
    from hypothesis import strategies as st

    return st.sampled_from(["auto", *FORMATS])


def test_langsmith_run_of_a_wrapped_openai_client() -> None:
    """A run LangSmith's ``wrap_openai`` records: the Chat Completions request as inputs, the response as outputs."""
    run = {
        "id": "0b5d-run",
        "name": "ChatOpenAI",
        "run_type": "llm",
        "start_time": "2026-12-01T09:00:00.000000",
        "end_time": "2026-12-01T09:00:01.200000",
        "extra": {"metadata": {"thread_id": "thread-7", "ls_provider": "openai", "ls_model_name": "gpt-4o-mini"}},
        "inputs": {
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "system", "content": "You answer weather questions."},
                {"role": "user", "content": "Weather in Paris?"},
            ],
            "tools": [WEATHER_TOOL],
        },
        "outputs": {
            "id": "chatcmpl-9",
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "call_p", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
                        ],
                    },
                }
            ],
        },
        "prompt_tokens": 52,
        "completion_tokens": 14,
        "total_tokens": 66,
        "trace_id": "0b5d-run",
        "dotted_order": "20261201T090000000000Z0b5d-run",
    }  # fmt: skip
    imported = convert_data([run])
    assert imported.format == "langsmith"
    [conv] = imported.conversations
    assert [m.role for m in conv.messages] == ["system", "user", "assistant"]
    assert _calls(conv) == [("call_p", "get_weather", {"city": "Paris"})]
    assert [t.name for t in conv.tools or []] == ["get_weather"]
    assert conv.metadata["session_id"] == "thread-7" and conv.usage is not None and conv.usage.tokens == 66
