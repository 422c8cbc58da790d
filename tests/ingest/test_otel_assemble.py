"""Assembling conversations from GenAI spans in the forms agents emit them."""

from __future__ import annotations

from typing import Any

import orjson

from vigil.ingest.otlp.assemble import assemble, merge, to_messages
from vigil.schema import Conversation


def span(
    start: int,
    attrs: dict[str, Any],
    events: list[dict[str, Any]] | None = None,
    parent: str | None = "p",
    trace: str = "a" * 32,
    status: int = 0,
) -> dict[str, Any]:
    return {
        "trace_id": trace,
        "span_id": f"{start:016x}",
        "parent_span_id": parent,
        "name": "s",
        "kind": 1,
        "start_ns": start,
        "end_ns": start + 10,
        "attributes": attrs,
        "events": events or [],
        "status": {"code": status, "message": "boom" if status == 2 else ""},
        "resource": {"service.name": "svc"},
    }


def test_flattened_prompt_and_completion_attributes() -> None:
    s = span(
        1,
        {
            "gen_ai.system": "openai",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": "Refund #1?",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.tool_calls.0.id": "c9",
            "gen_ai.completion.0.tool_calls.0.name": "refund",
            "gen_ai.completion.0.tool_calls.0.arguments": '{"order": "#1"}',
            "gen_ai.completion.1.content": "second choice is ignored",
        },
    )
    doc = assemble("k", [s], "unknown")
    assert doc is not None
    conv = Conversation.model_validate(doc)
    assert [m.role for m in conv.messages] == ["user", "assistant"]
    assert conv.messages[1].tool_calls[0].args == {"order": "#1"}
    assert conv.agent_id == "svc" and conv.agent_version == "unknown" and conv.status == "in_progress"


def test_tool_results_sent_as_user_parts_and_openai_content_lists() -> None:
    msgs = to_messages(
        [
            {
                "role": "user",
                "parts": [
                    {"type": "tool_call_response", "id": "t1", "response": "42"},
                    {"type": "tool_call_response", "id": "t2", "response": {"ok": True}},
                ],
            },
            {"role": "developer", "content": [{"type": "text", "text": "Be kind."}]},
            {"role": "narrator", "content": "dropped"},
        ]
    )
    assert msgs == [
        {"role": "tool", "tool_call_id": "t1", "content": "42"},
        {"role": "tool", "tool_call_id": "t2", "content": '{"ok":true}'},
        {"role": "system", "content": "Be kind."},
    ]


def test_merge_overlaps_history_and_appends_only_new_turns() -> None:
    acc = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    merge(
        acc,
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "bye"},
        ],
    )
    assert [m["content"] for m in acc] == ["hi", "hello", "bye"]
    merge(acc, [{"role": "user", "content": "new only"}])
    assert [m["content"] for m in acc] == ["hi", "hello", "bye", "new only"]


def test_tool_span_without_chat_content_still_gives_a_call_and_error() -> None:
    tool = span(
        5,
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "lookup",
            "gen_ai.tool.call.id": "x1",
            "gen_ai.tool.call.arguments": '{"q": 1}',
        },
        status=2,
    )
    root = span(
        0,
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "bot", "gen_ai.agent.version": "3"},
        parent=None,
    )
    doc = assemble("k", [tool, root], "unknown")
    assert doc is not None
    conv = Conversation.model_validate(doc)
    assert conv.messages[0].tool_calls[0].name == "lookup"
    assert conv.messages[1].is_error and conv.messages[1].content == "boom"
    assert (conv.agent_id, conv.agent_version, conv.status, conv.revision) == ("bot", "3", "finished", 2)


def test_spans_without_any_content_give_no_conversation() -> None:
    assert assemble("k", [span(1, {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"})], "u") is None


def test_input_messages_on_an_event() -> None:
    ev = {
        "name": "gen_ai.client.inference.operation.details",
        "time_ns": 2,
        "attributes": {
            "gen_ai.input.messages": orjson.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": "q"}]}]
            ).decode(),
            "gen_ai.output.messages": orjson.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": "a"}]}]
            ).decode(),
        },
    }
    doc = assemble("k", [span(1, {"gen_ai.operation.name": "chat"}, [ev])], "u")
    assert doc is not None and [m["content"] for m in doc["messages"]] == ["q", "a"]


def test_compacted_spans_expand_to_what_was_received() -> None:
    from vigil.ingest.otlp.compact import compact, expand

    history = [{"role": "user", "parts": [{"type": "text", "content": "x" * 300}]}]
    spans = []
    for i in range(1, 5):
        history.append({"role": "assistant", "parts": [{"type": "text", "content": f"turn {i} " * 40}]})
        spans.append(span(i * 100, {"gen_ai.input.messages": orjson.dumps(history).decode(), "same": "y" * 300}))
    first, last = compact(spans[:2])
    assert isinstance(first[1]["attributes"]["gen_ai.input.messages"], dict)  # an extension of span 1's
    assert first[1]["attributes"]["same"] == {"$same": spans[0]["span_id"], "t": ""}  # "": its own trace
    later, _ = compact(spans[2:], last)  # a later request refers to spans stored before
    stored = first + later
    assert sum(len(orjson.dumps(s)) for s in stored) < sum(len(orjson.dumps(s)) for s in spans) / 2
    assert expand(list(reversed(stored))) == spans
    # a span that starts before the stored one it would extend is kept whole (bases come first)
    early = span(50, {"gen_ai.input.messages": spans[3]["attributes"]["gen_ai.input.messages"] + " "})
    assert compact([early], last)[0][0] == early
    # a base gone (purged, or beyond the span limit) drops the value, not the span
    assert "gen_ai.input.messages" not in expand(later)[0]["attributes"]


def test_input_cache_reuses_outputs_and_shared_strings_without_changing_messages() -> None:
    from vigil.ingest.otlp.compact import compact
    from vigil.ingest.otlp.conventions import InputCache

    def msg(role: str, text: str) -> dict[str, Any]:
        return {"role": role, "parts": [{"type": "text", "content": text}]}

    history = [msg("user", "hi"), msg("assistant", "hello"), msg("user", "book it"), msg("assistant", "done")]
    out_of = {1: [history[1]], 3: [history[3]]}
    cache = InputCache()
    for n in (1, 3):
        raw_in, raw_out = orjson.dumps(history[:n]).decode(), orjson.dumps(out_of[n]).decode()
        assert cache.messages_of(raw_in) == to_messages(raw_in)
        assert cache.outputs_of(raw_out) == to_messages(raw_out)
    # an input that resends the previous output and adds nothing, or something else after a same-looking prefix
    same = orjson.dumps(history[:4]).decode()
    assert cache.messages_of(same) == to_messages(same)
    other = orjson.dumps([*history[:3], msg("assistant", "done, and more")]).decode()
    assert InputCache().messages_of(other) == cache.messages_of(other) == to_messages(other)

    # compaction hands an equal long value on as the earlier span's string, unchanged in content
    long = orjson.dumps([msg("system", "x" * 400)]).decode()
    spans = [
        {"span_id": f"{i}", "start_ns": i, "end_ns": i, "attributes": {"gen_ai.system_instructions": long[:]}}
        for i in range(2)
    ]
    spans[1]["attributes"]["gen_ai.system_instructions"] = "".join(long)  # an equal string, another object
    stored, _ = compact(spans)
    assert stored[1]["attributes"]["gen_ai.system_instructions"] == {"$same": "0", "t": ""}
    assert spans[1]["attributes"]["gen_ai.system_instructions"] is spans[0]["attributes"]["gen_ai.system_instructions"]


def test_messages_cut_short_or_sent_as_plain_text_are_kept() -> None:
    """An SDK's attribute length limit cuts a long history mid-message, and some instrumentations record a
    prompt as plain text: the whole conversation was lost (no messages, no conversation, and the exporter
    told nothing). The complete messages before the cut are kept; plain text is a message of its side."""
    history = [
        {"role": "user", "parts": [{"type": "text", "content": "Cancel order #7"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "cancel_order", "arguments": {}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "cancelled " * 40}]},
    ]
    full = orjson.dumps(history).decode()
    cut = full[: len(full) - 200]  # the third message cut mid-string
    first = span(1, {"gen_ai.operation.name": "chat", "gen_ai.input.messages": cut})
    doc = assemble("k", [first], "v")
    assert doc is not None
    conv = Conversation.model_validate(doc)
    assert [m.role for m in conv.messages] == ["user", "assistant"]
    assert conv.messages[1].tool_calls[0].name == "cancel_order"

    plain = span(
        2,
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.input.messages": "Where is my refund?",
            "gen_ai.output.messages": "It was sent on Monday.",
        },
    )
    conv = Conversation.model_validate(assemble("k2", [plain], "v"))
    assert [(m.role, m.text) for m in conv.messages] == [
        ("user", "Where is my refund?"),
        ("assistant", "It was sent on Monday."),
    ]
    for hostile in ("[" * 100_000, "[" + '{"a": ' * 50_000, "[1, 2, {", "not json at all ["):
        assemble("k3", [span(3, {"gen_ai.operation.name": "chat", "gen_ai.input.messages": hostile})], "v")
