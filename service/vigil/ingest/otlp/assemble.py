"""Builds a Vigil conversation from the GenAI spans of one conversation (OpenTelemetry GenAI conventions).

Messages come, per inference span and in start-time order, from the first of these that is present:

- ``gen_ai.input.messages`` / ``gen_ai.output.messages`` / ``gen_ai.system_instructions``
  (span attributes, or attributes of a span event), in the ``parts`` form or OpenAI's message form;
- the older events ``gen_ai.content.prompt`` / ``gen_ai.content.completion`` carrying
  ``gen_ai.prompt`` / ``gen_ai.completion`` (JSON message lists);
- the per-message events ``gen_ai.system.message``, ``gen_ai.user.message``,
  ``gen_ai.assistant.message``, ``gen_ai.tool.message`` and ``gen_ai.choice``;
- flattened ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*`` attributes.

Each inference span usually resends the whole history; its input is overlapped with what is already
assembled so nothing is repeated. Tool execution spans (``gen_ai.operation.name=execute_tool``) add
the call and its result (``gen_ai.tool.call.id``, ``gen_ai.tool.name``, ``gen_ai.tool.call.arguments``,
``gen_ai.tool.call.result``) and mark the result an error when the span's status is ERROR.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import orjson

ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "model": "assistant",
    "ai": "assistant",
    "tool": "tool",
    "function": "tool",
    "ipython": "tool",
}
INFERENCE_OPS = {"chat", "text_completion", "generate_content"}
MESSAGE_EVENTS = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}
_FLAT = re.compile(r"^gen_ai\.(prompt|completion)\.(\d+)\.(.+)$")
STATUS_ERROR = 2


def is_genai(span: dict[str, Any]) -> bool:
    """Whether a span says anything in GenAI terms (so it is kept)."""
    return any(k.startswith("gen_ai.") for k in span["attributes"]) or any(
        e["name"].startswith("gen_ai.") or any(k.startswith("gen_ai.") for k in e["attributes"]) for e in span["events"]
    )


def conversation_id_of(span: dict[str, Any]) -> str | None:
    value = span["attributes"].get("gen_ai.conversation.id")
    return str(value)[:256] if value not in (None, "") else None


def _json(value: Any) -> Any:
    if isinstance(value, str | bytes):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = [p.get("text") or p.get("content") for p in value if isinstance(p, dict)]
        strings = [t for t in texts if isinstance(t, str)]
        if texts and len(strings) == len(texts):
            return "\n".join(strings)
    return orjson.dumps(value).decode()


def _call(cid: Any, name: Any, arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        args: Any = arguments
    else:
        args = str(arguments) if arguments not in (None, "") else "{}"
    return {
        "id": str(cid) if cid is not None else None,
        "type": "function",
        "function": {"name": str(name or "unknown_tool"), "arguments": args},
    }


def _openai_calls(calls: Any) -> list[dict[str, Any]]:
    out = []
    for c in _json(calls) or []:
        if isinstance(c, dict):
            function = c.get("function")
            fn = function if isinstance(function, dict) else c
            out.append(_call(c.get("id"), fn.get("name"), fn.get("arguments")))
    return out


def to_messages(items: Any) -> list[dict[str, Any]]:
    """Messages in the ``parts`` form or OpenAI's form into Vigil (OpenAI) messages."""
    items = _json(items)
    if isinstance(items, dict):
        items = [items]
    out: list[dict[str, Any]] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if isinstance(item.get("message"), dict):  # a choice
            item = {"role": "assistant", **item["message"]}
        role = ROLES.get(str(item.get("role", "assistant")).lower())
        if role is None:
            continue
        if isinstance(item.get("parts"), list):
            out.extend(_from_parts(role, item["parts"]))
            continue
        msg: dict[str, Any] = {"role": role, "content": _text(item.get("content")) or None}
        calls = _openai_calls(item.get("tool_calls")) if role == "assistant" else []
        if calls:
            msg["tool_calls"] = calls
        if role == "tool":
            msg["tool_call_id"] = str(item.get("tool_call_id") or item.get("id") or "") or None
            msg["content"] = msg["content"] or ""
        if msg["content"] is None and not calls:
            continue
        out.append(msg)
    return out


def _from_parts(role: str, parts: list[Any]) -> list[dict[str, Any]]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for p in parts:
        if not isinstance(p, dict):
            continue
        kind = p.get("type")
        if kind == "text" and p.get("content") is not None:
            texts.append(str(p["content"]))
        elif kind == "tool_call":
            calls.append(_call(p.get("id"), p.get("name"), p.get("arguments")))
        elif kind == "tool_call_response":
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": str(p.get("id") or "") or None,
                    "content": _text(p.get("response")),
                }
            )
    out: list[dict[str, Any]] = []
    if texts or calls:
        msg: dict[str, Any] = {
            "role": role if role != "tool" else "assistant",
            "content": "\n".join(texts) or None,
        }
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out + results


def _attr(span: dict[str, Any], key: str) -> Any:
    if key in span["attributes"]:
        return span["attributes"][key]
    for ev in span["events"]:
        if key in ev["attributes"]:
            return ev["attributes"][key]
    return None


def _event_messages(span: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    inputs: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    for ev in span["events"]:
        a = ev["attributes"]
        if ev["name"] in MESSAGE_EVENTS:
            item = {
                "role": a.get("role") or MESSAGE_EVENTS[ev["name"]],
                "content": _json(a.get("content")),
                "tool_calls": a.get("tool_calls"),
                "tool_call_id": a.get("id") or a.get("tool_call_id"),
            }
            inputs.extend(to_messages([item]))
        elif ev["name"] == "gen_ai.choice" and int(a.get("index", 0) or 0) == 0:
            message = _json(a.get("message"))
            item = (
                message
                if isinstance(message, dict)
                else {"content": a.get("content"), "tool_calls": a.get("tool_calls")}
            )
            outputs.extend(to_messages([{"role": "assistant", **item}]))
    return inputs, outputs


def _flat_messages(span: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    by_index: dict[int, dict[str, Any]] = {}
    for key, value in span["attributes"].items():
        m = _FLAT.match(key)
        if not m or m.group(1) != kind:
            continue
        entry = by_index.setdefault(int(m.group(2)), {})
        path = m.group(3).split(".")
        if path[0] == "tool_calls" and len(path) == 3:
            entry.setdefault("_calls", {}).setdefault(int(path[1]), {})[path[2]] = value
        else:
            entry[path[0]] = value
    items = []
    for i in sorted(by_index):
        if kind == "completion" and i > 0:
            break
        e = by_index[i]
        calls = [
            {"id": c.get("id"), "function": {"name": c.get("name"), "arguments": c.get("arguments")}}
            for _, c in sorted(e.pop("_calls", {}).items())
        ]
        items.append({**e, "tool_calls": calls or None})
    return to_messages(items)


def span_messages(span: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(input messages, output messages, system instructions) of one inference span."""
    system = _attr(span, "gen_ai.system_instructions")
    system_texts = [_text(_json(system))] if system not in (None, "", "[]") else []
    raw_in, raw_out = _attr(span, "gen_ai.input.messages"), _attr(span, "gen_ai.output.messages")
    if raw_in is None and raw_out is None:
        raw_in, raw_out = _attr(span, "gen_ai.prompt"), _attr(span, "gen_ai.completion")
    inputs, outputs = to_messages(raw_in), to_messages(raw_out)
    if not inputs and not outputs:
        inputs, outputs = _event_messages(span)
    if not inputs and not outputs:
        inputs, outputs = _flat_messages(span, "prompt"), _flat_messages(span, "completion")
    return inputs, outputs, system_texts


def _key(m: dict[str, Any]) -> tuple[Any, ...]:
    if m["role"] == "tool":
        return ("tool", m.get("tool_call_id"))
    calls = tuple(c.get("id") or c["function"]["name"] for c in m.get("tool_calls") or [])
    return (m["role"], (m.get("content") or "").strip(), calls)


def merge(acc: list[dict[str, Any]], inputs: list[dict[str, Any]]) -> None:
    """Append ``inputs`` to ``acc`` without repeating the history they share (largest overlap wins)."""
    if not inputs:
        return
    keys_acc = [_key(m) for m in acc]
    keys_in = [_key(m) for m in inputs]
    for k in range(min(len(acc), len(inputs)), 0, -1):
        if keys_acc[len(acc) - k :] == keys_in[:k]:
            for i in range(k):
                mine = acc[len(acc) - k + i]
                theirs = dict(inputs[i])
                theirs["is_error"] = bool(mine.get("is_error") or theirs.get("is_error"))
                if not theirs["is_error"]:
                    theirs.pop("is_error")
                if mine["role"] == "tool" and not theirs.get("content"):
                    theirs["content"] = mine.get("content", "")
                acc[len(acc) - k + i] = theirs
            acc.extend(inputs[k:])
            return
    acc.extend(inputs)


def _tool_span(acc: list[dict[str, Any]], span: dict[str, Any]) -> None:
    a = span["attributes"]
    call_id = a.get("gen_ai.tool.call.id")
    call_id = str(call_id) if call_id not in (None, "") else f"call_{span['span_id']}"
    failed = span["status"]["code"] == STATUS_ERROR or bool(a.get("error.type"))
    result = a.get("gen_ai.tool.call.result")
    content = _text(_json(result)) if result is not None else (span["status"]["message"] if failed else "")
    for m in acc:
        if m["role"] == "tool" and m.get("tool_call_id") == call_id:
            if failed:
                m["is_error"] = True
            if not m.get("content"):
                m["content"] = content
            return
    called = any(c.get("id") == call_id for m in acc for c in m.get("tool_calls") or [])
    if not called:
        call = _call(call_id, a.get("gen_ai.tool.name"), a.get("gen_ai.tool.call.arguments"))
        acc.append({"role": "assistant", "content": None, "tool_calls": [call]})
    tool_msg: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": content}
    if a.get("gen_ai.tool.name"):
        tool_msg["name"] = str(a["gen_ai.tool.name"])
    if failed:
        tool_msg["is_error"] = True
    acc.append(tool_msg)


def _iso(ns: int) -> str | None:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat() if ns > 0 else None


def _first(spans: Iterable[dict[str, Any]], *keys: str) -> Any:
    for s in spans:
        for k in keys:
            v = s["attributes"].get(k) if not k.startswith("resource:") else s["resource"].get(k[9:])
            if v not in (None, ""):
                return v
    return None


def assemble(key: str, spans: list[dict[str, Any]], default_version: str) -> dict[str, Any] | None:
    """A conversation document (schema v1) from the spans of one conversation, or None without messages.

    ``revision`` is the number of distinct spans, so it grows as spans arrive and a resent span
    changes nothing. ``status`` is ``finished`` once every trace's root span has arrived.
    """
    spans = sorted(spans, key=lambda s: (s["start_ns"], s["end_ns"]))
    acc: list[dict[str, Any]] = []
    system: list[str] = []
    prompt_tokens = completion_tokens = 0
    models: list[str] = []
    for s in spans:
        op = s["attributes"].get("gen_ai.operation.name")
        if op == "execute_tool":
            _tool_span(acc, s)
            continue
        inputs, outputs, sys_texts = span_messages(s)
        for text in sys_texts + [m["content"] or "" for m in inputs if m["role"] == "system"]:
            if text and text not in system:
                system.append(text)
        merge(acc, [m for m in inputs if m["role"] != "system"])
        merge(acc, outputs)
        if op in INFERENCE_OPS or inputs or outputs:
            a = s["attributes"]
            prompt_tokens += int(a.get("gen_ai.usage.input_tokens") or a.get("gen_ai.usage.prompt_tokens") or 0)
            completion_tokens += int(
                a.get("gen_ai.usage.output_tokens") or a.get("gen_ai.usage.completion_tokens") or 0
            )
            model = a.get("gen_ai.response.model") or a.get("gen_ai.request.model")
            if model and str(model) not in models:
                models.append(str(model))
    messages = [{"role": "system", "content": t} for t in system] + acc
    if not messages:
        return None
    traces = sorted({s["trace_id"] for s in spans})
    rooted = {s["trace_id"] for s in spans if not s.get("parent_span_id")}
    start = min(s["start_ns"] for s in spans)
    end = max(s["end_ns"] for s in spans)
    conversation_id = _first(spans, "gen_ai.conversation.id") or key
    usage: dict[str, Any] = {"latency_ms": round(max(0, end - start) / 1e6, 3)}
    if prompt_tokens or completion_tokens:
        usage.update(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )
    return {
        "conversation_id": str(conversation_id)[:256],
        "revision": len(spans),
        "status": "finished" if rooted >= set(traces) else "in_progress",
        "agent_id": str(
            _first(spans, "gen_ai.agent.name", "gen_ai.agent.id", "resource:service.name") or "unknown-agent"
        )[:256],
        "agent_version": str(_first(spans, "gen_ai.agent.version", "resource:service.version") or default_version)[
            :128
        ],
        "started_at": _iso(start),
        "ended_at": _iso(end),
        "messages": messages,
        "usage": usage,
        "metadata": {
            "source": "otlp",
            "trace_ids": traces[:20],
            "span_count": len(spans),
            "models": models[:10],
            "provider": _first(spans, "gen_ai.provider.name", "gen_ai.system"),
        },
    }
