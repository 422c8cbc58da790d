"""OpenAI Agents SDK traces: the trace and span objects its exporters send (``{"data": [...]}``, as the
SDK's backend exporter posts them, a list of them, or JSON lines), one conversation per trace.

``generation`` spans (models called through Chat Completions) carry the messages: each one's input
continues the previous one's, so the conversation is the longest run of them plus the last output.
``function`` spans are the tool calls with their input and output (an ``error`` marks the result failed);
one no generation shows is added with its result; without generation content (the Responses model's
``response`` spans export only their id) the conversation is the tool calls alone, unless the span also
carries its ``input`` and ``response``, as processors that keep them write. ``agent`` spans give the
agent's name and the tools it was offered (names), ``handoff`` spans the hand-offs; the trace's
``group_id`` is its session.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vigil.ingest.importers.common import (
    ItemError,
    dumps_any,
    envelope,
    join_executions,
    listed,
    number,
    obj,
    text_of,
    validated,
)
from vigil.schema import Conversation

NAME = "openai-agents"
TITLE = "OpenAI Agents SDK traces (trace and trace.span objects)"

OBJECTS = ("trace", "trace.span")


def _items(data: Any) -> list[Any] | None:
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        return list(data["data"])
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        return [data]
    return None


def sniff(data: Any) -> bool:
    items = _items(data)
    return bool(items) and all(isinstance(x, dict) and x.get("object") in OBJECTS for x in items or [])


def handoff_tool(agent: str) -> str:
    """The tool name the SDK gives a hand-off to ``agent`` (``transfer_to_`` and the name in snake case)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", f"transfer_to_{agent}".replace(" ", "_")).lower()


def _chat_message(m: Any, where: str) -> dict[str, Any]:
    if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
        raise ItemError(f"{where}: expected a chat message (role system, user, assistant or tool)")
    out = {k: v for k, v in m.items() if k in ("role", "content", "tool_calls", "tool_call_id", "name", "refusal")}
    if out["role"] == "developer":
        out["role"] = "system"
    return out


def _key(m: dict[str, Any]) -> bytes:
    calls = m.get("tool_calls") if isinstance(m.get("tool_calls"), list) else []
    ids = [[c.get("id"), c.get("function")] if isinstance(c, dict) else c for c in calls or []]
    content = m.get("content")
    text = text_of(content) if isinstance(content, str | list) or content is None else content
    return dumps_any([m["role"], text or "", ids, m.get("tool_call_id")], sort_keys=True)


def _merge(history: list[dict[str, Any]], turn: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``history`` continued by a generation's input (which repeats the history it saw) and output."""
    keys = [_key(m) for m in history]
    if [_key(m) for m in turn[: len(history)]] == keys:
        return history + turn[len(history) :]
    # another agent (after a hand-off) sees its own prompt: keep ours, add what is new since the last reply
    last_reply = max((i for i, m in enumerate(turn) if m["role"] == "assistant"), default=-1)
    seen = set(keys)
    new = [m for m in turn[last_reply + 1 :] if m["role"] != "system" and _key(m) not in seen]
    return history + new


def _trace(trace_id: str, trace: dict[str, Any], spans: list[dict[str, Any]], where: str) -> dict[str, Any]:
    spans = sorted(spans, key=lambda s: (str(s.get("started_at") or ""), str(s.get("id") or "")))
    history: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    tools: dict[str, dict[str, Any]] = {}
    agents: list[str] = []
    handoffs: list[dict[str, Any]] = []
    usage = {"prompt_tokens": 0, "completion_tokens": 0}
    models: set[str] = set()
    saw_usage = False
    for s in spans:
        data = s.get("span_data")
        at = f"{where} span {s.get('id')}"
        if not isinstance(data, dict):
            raise ItemError(f"{at}: span_data: expected an object")
        kind = data.get("type")
        if kind == "generation":
            inp, out = data.get("input") or [], data.get("output") or []
            if not isinstance(inp, list) or not isinstance(out, list):
                raise ItemError(f"{at}: generation input and output: expected lists of messages")
            turn = [_chat_message(m, f"{at}.input.{i}") for i, m in enumerate(inp)]
            turn += [_chat_message(m, f"{at}.output.{i}") for i, m in enumerate(out)]
            history = _merge(history, turn) if turn else history
            if data.get("model"):
                models.add(str(data["model"]))
            u = obj(data.get("usage"))
            if isinstance(u, dict) and u:
                saw_usage = True
                usage["prompt_tokens"] += number(u.get("input_tokens") or u.get("prompt_tokens"))
                usage["completion_tokens"] += number(u.get("output_tokens") or u.get("completion_tokens"))
        elif kind == "response":
            if data.get("input") is not None or isinstance(data.get("response"), dict):
                from vigil.ingest.importers.responses import _Builder, items_to_messages

                b = _Builder()
                if data.get("input") is not None:
                    items_to_messages(data["input"], f"{at}.input", b)
                output = obj(data.get("response")).get("output")
                if output is not None:
                    items_to_messages(output, f"{at}.response.output", b)
                history = _merge(history, b.messages)
            u = obj(data.get("usage"))
            if isinstance(u, dict) and u:
                saw_usage = True
                usage["prompt_tokens"] += number(u.get("input_tokens"))
                usage["completion_tokens"] += number(u.get("output_tokens"))
        elif kind == "function":
            calls.append({"span": s, "data": data})
        elif kind == "agent":
            name = data.get("name")
            if name and name not in agents:
                agents.append(str(name))
            for t in listed(data.get("tools"), f"{at}.span_data.tools", "tool names"):
                tools.setdefault(str(t), {"name": str(t)})
            # a hand-off is offered to the model as a transfer_to_ tool
            for h in listed(data.get("handoffs"), f"{at}.span_data.handoffs", "agent names"):
                name = handoff_tool(str(h))
                tools.setdefault(name, {"name": name, "description": f"Hand off to {h}."})
        elif kind == "handoff":
            handoffs.append({"from": data.get("from_agent"), "to": data.get("to_agent")})
        elif kind in ("guardrail", "custom", "mcp_tools", "transcription", "speech", "speech_group", "task", "turn"):
            continue
        else:
            raise ItemError(f"{at}: a span of type {kind!r} is not one Vigil reads")
    executions = []
    for c in calls:
        s, data = c["span"], c["data"]
        call = {
            "id": s.get("id"),
            "type": "function",
            "function": {"name": data.get("name"), "arguments": data.get("input") or "{}"},
        }
        error = s.get("error")
        output = data.get("output") if not error else (error.get("message") if isinstance(error, dict) else str(error))
        executions.append(
            (call, {"role": "tool", "tool_call_id": s.get("id"), "content": output, "is_error": bool(error)})
        )
    # a function span is a call that ran: one the generations show is joined to it (a failed call reaches the
    # next generation as an ordinary result text), one they do not (a Responses model's, whose spans carry
    # only their id, or the last call of a run that stopped at it) is added
    history = join_executions(history, executions)
    if not history:
        raise ItemError(
            f"{where}: no generation or function spans with content: the trace holds no conversation "
            "(its response spans carry only their id)"
        )
    starts = [s["started_at"] for s in spans if isinstance(s.get("started_at"), str) and s["started_at"]]
    ends = [s["ended_at"] for s in spans if isinstance(s.get("ended_at"), str) and s["ended_at"]]
    return {
        "messages": history,
        "tools": list(tools.values()) if tools else None,
        "agent": agents[0] if agents else trace.get("workflow_name"),
        "usage": usage if saw_usage else None,
        "started_at": min(starts) if starts else None,
        "ended_at": max(ends) if ends else None,
        "metadata": {
            "source": "openai-agents",
            "trace_id": trace_id,
            "workflow_name": trace.get("workflow_name"),
            "session_id": trace.get("group_id"),
            "agents": agents or None,
            "handoffs": handoffs or None,
            "models": sorted(models) or None,
            "trace_metadata": trace.get("metadata") or None,
            "content": None if any(m["role"] != "tool" and m.get("content") for m in history) else "tool calls only",
        },
    }


def convert(data: Any, path: Path, agent_id: str | None, agent_version: str | None) -> Iterator[Conversation]:
    items = _items(data) or []
    traces: dict[str, dict[str, Any]] = {}
    spans: dict[str, list[dict[str, Any]]] = {}
    for n, x in enumerate(items):
        if not isinstance(x, dict) or x.get("object") not in OBJECTS:
            raise ItemError(f"item {n}: expected a trace or trace.span object")
        if x["object"] == "trace":
            if not x.get("id"):
                raise ItemError(f"item {n}: a trace without an id")
            traces[str(x["id"])] = x
        else:
            if not x.get("trace_id"):
                raise ItemError(f"item {n}: a span without a trace_id")
            spans.setdefault(str(x["trace_id"]), []).append(x)
    for trace_id in [*traces, *(t for t in spans if t not in traces)]:
        if trace_id not in spans:
            continue  # a trace object whose spans were not exported (yet): nothing to read
        t = _trace(trace_id, traces.get(trace_id, {}), spans[trace_id], f"trace {trace_id}")
        record = {k: t[k] for k in ("usage", "started_at", "ended_at") if t[k] is not None}
        record["status"] = "finished"
        doc = envelope(
            record,
            path,
            "openai-agents",
            t["messages"],
            agent_id,
            agent_version,
            tools=t["tools"],
            metadata=t["metadata"],
            default_id=f"openai-agents:{trace_id}",
            default_agent=t["agent"],
        )
        yield validated(doc, f"trace {trace_id}")
