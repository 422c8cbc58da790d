"""Hostile span attributes: names and values an exporter may send that must not abort assembling a conversation.

Whatever one span carries, ``assemble`` gives a document (or None) that serializes and validates; an
exception there fails every conversation of the batch (or the idle finisher, again and again).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from vigil.ingest.otlp.assemble import MAX_ID, assemble, conversation_id_of, conversation_key
from vigil.ingest.otlp.conventions import SystemTexts, view
from vigil.ingest.otlp.messages import json_value, tool_definitions
from vigil.schema import INCOMING, MAX_INT, Conversation

HUGE = "9" * 5000  # beyond the 4300 digits Python's int() takes


def span(attrs: dict[str, Any], start: int = 1, trace: str = "a" * 32) -> dict[str, Any]:
    return {
        "trace_id": trace,
        "span_id": f"{start:016x}",
        "parent_span_id": "p",
        "name": "chat",
        "kind": 1,
        "start_ns": start,
        "end_ns": start + 10,
        "attributes": attrs,
        "events": [],
        "status": {"code": 0, "message": ""},
        "resource": {"service.name": "svc"},
    }


def stored(spans: list[dict[str, Any]], key: str = "k") -> dict[str, Any]:
    """The document as the ingest stores it: assembled, written as JSON, validated."""
    doc = assemble(key, spans, "unknown")
    assert doc is not None
    orjson.dumps(doc)
    Conversation.model_validate(doc, context=INCOMING)
    return doc


def contents(doc: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(m["role"], m.get("content")) for m in doc["messages"]]


# --- indices in attribute names ---------------------------------------------------------------------


def test_flattened_tool_call_index_that_is_not_a_number_is_ignored() -> None:
    """``gen_ai.prompt.0.tool_calls.x.name`` is skipped; the message it belongs to is kept."""
    doc = stored(
        [
            span(
                {
                    "gen_ai.prompt.0.role": "user",
                    "gen_ai.prompt.0.content": "hi",
                    "gen_ai.prompt.0.tool_calls.x.name": "lookup",
                    "gen_ai.completion.0.role": "assistant",
                    "gen_ai.completion.0.content": "hello",
                }
            )
        ]
    )
    assert contents(doc) == [("user", "hi"), ("assistant", "hello")]


def test_flattened_message_index_of_thousands_of_digits_is_ignored() -> None:
    """``gen_ai.prompt.<5000 digits>.role`` is not a message index: ignored, the other messages kept."""
    doc = stored(
        [
            span(
                {
                    f"gen_ai.prompt.{HUGE}.role": "user",
                    f"gen_ai.prompt.{HUGE}.content": "never read",
                    "gen_ai.prompt.0.role": "user",
                    "gen_ai.prompt.0.content": "hi",
                    f"gen_ai.completion.0.tool_calls.{HUGE}.name": "lookup",
                    "gen_ai.completion.0.content": "hello",
                }
            )
        ]
    )
    assert contents(doc) == [("user", "hi"), ("assistant", "hello")]


def test_openinference_indices_of_thousands_of_digits_or_not_numbers_are_ignored() -> None:
    """Message, tool call, content and tool schema indices of OpenInference attributes: only plain decimals count."""
    attrs = {
        "openinference.span.kind": "LLM",
        f"llm.input_messages.{HUGE}.message.role": "user",
        f"llm.input_messages.{HUGE}.message.content": "never read",
        "llm.input_messages.-1.message.content": "negative",
        "llm.input_messages.0.message.role": "user",
        "llm.input_messages.0.message.contents.x.message_content.text": "not a content index",
        "llm.input_messages.0.message.contents.0.message_content.text": "hi",
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.tool_calls.0.tool_call.id": "c1",
        "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "lookup",
        "llm.output_messages.0.message.tool_calls.x.tool_call.function.name": "not a call index",
        f"llm.output_messages.0.message.tool_calls.{HUGE}.tool_call.function.name": "nor this",
        f"llm.tools.{HUGE}.tool.json_schema": '{"name": "never_read"}',
        "llm.tools.0.tool.json_schema": '{"name": "lookup"}',
    }
    v = view(span(attrs))
    assert [(m["role"], m["content"]) for m in v.inputs] == [("user", "hi")]
    assert [c["function"]["name"] for c in v.outputs[0]["tool_calls"]] == ["lookup"]
    assert [t["function"]["name"] for t in v.tools] == ["lookup"]
    stored([span(attrs)])


def test_message_indices_are_ordered_as_given_and_past_six_digits_ignored() -> None:
    """Sparse indices keep their order (no list as long as the largest index is built); an index of more
    than six digits (999999999) is not read."""
    doc = stored(
        [
            span(
                {
                    "gen_ai.prompt.999999999.role": "user",
                    "gen_ai.prompt.999999999.content": "too far",
                    "gen_ai.prompt.999999.role": "user",
                    "gen_ai.prompt.999999.content": "last",
                    "gen_ai.prompt.7.role": "assistant",
                    "gen_ai.prompt.7.content": "middle",
                    "gen_ai.prompt.0.role": "user",
                    "gen_ai.prompt.0.content": "first",
                }
            )
        ]
    )
    assert contents(doc) == [("user", "first"), ("assistant", "middle"), ("user", "last")]


def test_one_poisoned_span_leaves_the_rest_of_its_conversation() -> None:
    """The idle finisher's case: a span whose flattened names cannot be read among ordinary chat spans."""
    ok = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "q"}]}]),
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "a"}]}]),
    }
    poison = {
        "gen_ai.prompt.0.role": "user",
        "gen_ai.prompt.0.content": "q",
        "gen_ai.prompt.0.tool_calls.x.name": "lookup",
        f"gen_ai.prompt.{HUGE}.role": "user",
    }
    doc = stored([span(ok, 1), span(poison, 2)])
    assert ("assistant", "a") in contents(doc)


def test_token_counts_no_integer_holds_count_as_nothing_and_sums_stay_in_range() -> None:
    """An infinite double, a 5000-digit string or a negative token count does not raise; the sums stay
    within what the schema (a BIGINT) holds, so the document can be written."""
    base = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps([{"role": "user", "content": "q"}]),
    }
    odd = stored(
        [
            span({**base, "gen_ai.usage.input_tokens": float("inf"), "gen_ai.usage.output_tokens": HUGE}, 1),
            span({**base, "gen_ai.usage.input_tokens": -5, "gen_ai.usage.output_tokens": float("nan")}, 2),
        ]
    )
    assert "prompt_tokens" not in odd["usage"]
    big = stored(
        [span({**base, "gen_ai.usage.input_tokens": 2**70, "gen_ai.usage.output_tokens": 2**63}, i) for i in range(4)]
    )
    assert big["usage"]["prompt_tokens"] == big["usage"]["total_tokens"] == MAX_INT


# --- JSON strict JSON refuses -----------------------------------------------------------------------


def test_input_messages_with_a_number_beyond_a_double_keep_their_messages() -> None:
    """``1e400`` in ``gen_ai.input.messages`` (valid JSON, refused by orjson): the messages are read, the number
    kept as its text, not as an infinity."""
    raw = '[{"role":"user","parts":[{"type":"text","content":"big float"}],"x":1e400,"y":-1e999,"z":1.5}]'
    doc = stored(
        [
            span(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.input.messages": raw,
                    "gen_ai.output.messages": '[{"role":"assistant","content":"fine","n":1e400}]',
                }
            )
        ]
    )
    assert contents(doc) == [("user", "big float"), ("assistant", "fine")]
    assert json_value(raw)[0]["x"] == "1e400" and json_value(raw)[0]["y"] == "-1e999" and json_value(raw)[0]["z"] == 1.5


def test_lone_surrogate_escape_in_messages_is_replaced_not_lost() -> None:
    """``"\\ud800"`` (valid JSON text, no character) in input messages, system instructions and tool definitions:
    read with U+FFFD in its place, and the document can be written."""
    doc = stored(
        [
            span(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.system_instructions": '[{"type":"text","content":"be \\udfff kind"}]',
                    "gen_ai.input.messages": '[{"role":"user","parts":[{"type":"text","content":"lone \\ud800"}]}]',
                    "gen_ai.output.messages": '[{"role":"assistant","content":"ok \\ud83d\\ude00"}]',
                    "gen_ai.tool.definitions": '[{"name":"f\\ud800","parameters":{"type":"object","\\udc00":1e400}}]',
                }
            )
        ]
    )
    assert contents(doc) == [("system", "be \ufffd kind"), ("user", "lone \ufffd"), ("assistant", "ok \U0001f600")]
    assert doc["metadata"]["tools"] == [
        {"type": "function", "function": {"name": "f\ufffd", "parameters": {"type": "object", "\ufffd": "1e400"}}}
    ]


def test_json_value_fast_path_and_non_json_are_unchanged() -> None:
    """What orjson reads is orjson's value (an integer beyond 64 bits a double); what no parser reads stays a string."""
    assert json_value('[1, 2.5, {"a": "b"}, 18446744073709551615]') == [1, 2.5, {"a": "b"}, 18446744073709551615]
    assert json_value(str(2**70)) == float(2**70)
    for text in ("hello there", "NaN", '{"a": 1', "[" * 5000):
        assert json_value(text) == text
    assert json_value("[NaN, Infinity, " + HUGE + "]") == ["NaN", "Infinity", HUGE]
    orjson.dumps(json_value('[1e400, "\\ud800", ' + "9" * 30 + "]"))
    assert tool_definitions('{"name": "t", "parameters": {"max": 1e400}}')[0]["function"]["parameters"] == {
        "max": "1e400"
    }


# --- conversation ids ---------------------------------------------------------------------------------


def test_long_conversation_ids_sharing_their_start_stay_distinct() -> None:
    """Two ``gen_ai.conversation.id`` values with the same first 256 characters are two conversations; each
    key fits the column and is the same every time; short ids are kept as they are."""
    p = "c" * 256
    alice, bob = conversation_key(p + "-alice"), conversation_key(p + "-bob")
    assert alice and bob and alice != bob
    assert len(alice) <= MAX_ID and len(bob) <= MAX_ID
    assert alice == conversation_key(p + "-alice") and alice.startswith("c" * 200)
    assert conversation_key(p) == p and conversation_key("conv-1") == "conv-1" and conversation_key(7) == "7"
    assert conversation_key("") is None and conversation_key(None) is None
    assert conversation_key("x" * 300 + "\ud800") != conversation_key("x" * 300 + "\ufffd")


def test_document_id_is_the_key_its_spans_name() -> None:
    """The stored conversation id of a long id is the key the ingest groups its spans by."""
    chat = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps([{"role": "user", "content": "q"}]),
    }
    docs = []
    for who in ("alice", "bob"):
        s = span({**chat, "gen_ai.conversation.id": "c" * 256 + who})
        key = conversation_id_of(s)
        assert key is not None
        doc = stored([s], key)
        assert doc["conversation_id"] == key
        docs.append(doc)
    assert docs[0]["conversation_id"] != docs[1]["conversation_id"]


def test_agent_names_and_versions_with_control_characters_are_escaped_not_refused() -> None:
    """A span's agent name or version with a newline (or a blank one) still makes a conversation: control
    characters written as escapes, a blank value read as none."""
    chat = {"gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps([{"role": "user", "content": "q"}])}
    doc = stored([span({**chat, "gen_ai.agent.name": "support\nbot", "gen_ai.agent.version": "v2\x00"})])
    assert doc["agent_id"] == "support\\x0abot" and doc["agent_version"] == "v2\\x00"
    doc = stored([span({**chat, "gen_ai.agent.name": "  ", "gen_ai.agent.version": "\t"})])
    assert doc["agent_id"] == "unknown-agent" and doc["agent_version"] == "\\x09"


def _instructions(text: str) -> str:
    return orjson.dumps([{"type": "text", "content": text}]).decode()


def test_system_instructions_shared_across_conversations_are_read_right_even_when_their_ends_match() -> None:
    # two policies of one length, the same first and last 64 characters, another middle: the memo keyed
    # by length and ends must still compare them whole
    head, tail = "P" * 80, "Q" * 80
    first, second = _instructions(head + "refunds allowed" + tail), _instructions(head + "refunds refused" + tail)
    assert len(first) == len(second) and first != second
    texts = SystemTexts()
    assert texts.texts(first) == [head + "refunds allowed" + tail]
    assert texts.texts(second) == [head + "refunds refused" + tail]
    assert texts.texts(first) == [head + "refunds allowed" + tail]
    # a copy of the string (another object, as each trace decodes its own) is found, and read the same
    assert texts.texts("".join(list(first))) is texts.texts(first)
    # not JSON, or no string at all: read as the conventions read them, not kept
    assert texts.texts("plain words") == ["plain words"]
    assert texts.texts([{"type": "text", "content": "a list"}]) == ["a list"]


def test_system_instructions_memo_stays_bounded() -> None:
    texts = SystemTexts()
    for i in range(SystemTexts.MAX_VALUES * 3):
        assert texts.texts(_instructions(f"policy {i} " + "x" * 1000)) == [f"policy {i} " + "x" * 1000]
    assert len(texts._texts) <= SystemTexts.MAX_VALUES
    big = "y" * (SystemTexts.MAX_CHARS // 8)
    for i in range(12):
        assert texts.texts(_instructions(f"{i}{big}")) == [f"{i}{big}"]
    assert texts._chars <= SystemTexts.MAX_CHARS
    assert texts._chars == sum(len(raw) for raw, _ in texts._texts.values())


def test_two_agents_with_different_instructions_each_keep_their_own_system_message() -> None:
    for n, policy in enumerate(("Policy of agent A: never refund." * 20, "Policy of agent B: always refund." * 20)):
        attrs = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system_instructions": _instructions(policy),
            "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]),
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "yo"}]}]),
        }
        assert contents(stored([span(attrs, trace=f"{n + 1:032x}")]))[0] == ("system", policy)


def test_an_operation_name_that_is_a_list_or_a_map_is_no_operation_and_loses_nothing() -> None:
    """OTLP allows any value for any attribute. ``gen_ai.operation.name`` sent as an array or a key-value
    list raised TypeError (unhashable) when assembled, and the whole conversation was lost behind a 200."""
    for odd in (["chat"], {"name": "chat"}):
        doc = stored(
            [
                span({"gen_ai.input.messages": json.dumps([{"role": "user", "content": "hi"}])}, 1),
                span(
                    {"gen_ai.operation.name": odd, "gen_ai.output.messages": '[{"role":"assistant","content":"x"}]'}, 2
                ),
                span({"gen_ai.operation.name": odd, "gen_ai.tool.name": "lookup"}, 3),
            ]
        )
        assert ("user", "hi") in contents(doc) and ("assistant", "x") in contents(doc), odd


def test_tool_names_longer_than_the_schema_takes_are_cut_not_the_conversation_lost() -> None:
    """A 300-character tool name (on a tool span, a flattened call, or a definition) failed validation of
    the assembled document: every message of the conversation was lost. The name is cut to 256."""
    long = "t" * 300
    doc = stored(
        [
            span(
                {
                    "gen_ai.prompt.0.role": "user",
                    "gen_ai.prompt.0.content": "hi",
                    "gen_ai.completion.0.role": "assistant",
                    "gen_ai.completion.0.tool_calls.0.id": "c1",
                    "gen_ai.completion.0.tool_calls.0.name": long,
                    "gen_ai.completion.0.tool_calls.0.arguments": "{}",
                    "gen_ai.tool.definitions": json.dumps([{"name": long, "parameters": {"type": "object"}}]),
                },
                1,
            ),
            span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": long, "gen_ai.tool.call.id": "c1"}, 2),
            span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "u" * 300}, 3),
        ]
    )
    names = [c["function"]["name"] for m in doc["messages"] for c in m.get("tool_calls") or []]
    assert names and all(len(n) == 256 for n in names), names
    assert names[0] == long[:256]
    tool_messages = [m for m in doc["messages"] if m["role"] == "tool"]
    assert len(tool_messages) == 2 and tool_messages[0]["tool_call_id"] == "c1"  # still answers its call
    assert [t["function"]["name"] for t in doc["metadata"]["tools"]] == [long[:256]]
