"""Builds a Vigil conversation from the spans (and joined log events) of one conversation.

Each span is read in its own convention (:mod:`vigil.ingest.otlp.conventions`); inference spans give
messages, tool spans give a call and its result, other spans (the root HTTP or application span, agent
and chain spans) are the container. Spans are taken in start-time order. Each inference span usually
resends the whole history; its input is overlapped with what is already assembled so nothing is
repeated. A tool span without a call id answers the latest unanswered call of the same tool.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from vigil.ingest.otlp.conventions import (
    InputCache,
    SpanView,
    ToolRun,
    is_relevant,
    session_and_user,
    tool_call_message,
    view,
)
from vigil.ingest.otlp.messages import as_text, json_value, to_messages
from vigil.schema import MAX_INT

__all__ = ["assemble", "conversation_id_of", "is_relevant", "merge", "to_messages"]

MAX_TREE_SPANS = 200


MAX_ID = 256  # what the conversation id columns hold
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ID_HEAD = 222  # an id longer than MAX_ID: this much of it, "~" and a hash of it all (32 hex digits)


def conversation_key(value: Any) -> str | None:
    """The conversation id (and key) of a ``gen_ai.conversation.id`` value, or None when empty: at most
    ``MAX_ID`` characters, the value itself when it fits. A longer one keeps its start and appends a hash
    of the whole value, so two ids sharing their first ``MAX_ID`` characters stay two conversations."""
    if value in (None, ""):
        return None
    # what a conversation id may not hold (see schema.addressable_id): control characters are written as
    # escapes, and a blank id names no conversation (the trace's own key is used)
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
    if not text.strip():
        return None
    if len(text) <= MAX_ID:
        return text
    digest = hashlib.blake2b(text.encode(errors="surrogatepass"), digest_size=16).hexdigest()
    return f"{text[:_ID_HEAD]}~{digest}"


def _label(value: Any, default: str, size: int) -> str:
    """An agent id or version as the schema takes it (see schema.addressable_id): control characters written
    as escapes, ``default`` for none or a blank one, at most ``size`` characters."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value)) if value not in (None, "") else ""
    return text[:size] if text.strip() else default


def conversation_id_of(span: dict[str, Any]) -> str | None:
    """The conversation a span names (see :func:`conversation_key`), or None."""
    return conversation_key(span["attributes"].get("gen_ai.conversation.id"))


def _key(m: dict[str, Any]) -> tuple[Any, ...]:
    if m["role"] == "tool":
        return ("tool", m.get("tool_call_id"))
    calls = tuple(c.get("id") or c["function"]["name"] for c in m.get("tool_calls") or [])
    return (m["role"], (m.get("content") or "").strip(), calls)


def merge(
    acc: list[dict[str, Any]],
    inputs: list[dict[str, Any]],
    keys_acc: list[tuple[Any, ...]] | None = None,
    keys_in: list[tuple[Any, ...]] | None = None,
) -> None:
    """Append ``inputs`` to ``acc`` without repeating the history they share (largest overlap wins).

    ``keys_acc`` (kept in step with ``acc``) and ``keys_in`` spare recomputing the keys of a long
    history on every span.
    """
    if not inputs:
        return
    if keys_acc is None:
        keys_acc = [_key(m) for m in acc]
    if keys_in is None:
        keys_in = [_key(m) for m in inputs]
    n = len(acc)
    for k in range(min(n, len(inputs)), 0, -1):
        if keys_acc[n - k :] == keys_in[:k]:
            for i in range(k):
                mine, theirs = acc[n - k + i], inputs[i]
                if mine is theirs:
                    continue
                is_error = bool(mine.get("is_error") or theirs.get("is_error"))
                fill = mine["role"] == "tool" and not theirs.get("content") and mine.get("content")
                if is_error != bool(theirs.get("is_error")) or fill:
                    theirs = dict(theirs)
                    if is_error:
                        theirs["is_error"] = True
                    if fill:
                        theirs["content"] = mine["content"]
                acc[n - k + i] = theirs
            acc.extend(inputs[k:])
            keys_acc.extend(keys_in[k:])
            return
    acc.extend(inputs)
    keys_acc.extend(keys_in)


def _pending_call(acc: list[dict[str, Any]], name: str) -> str | None:
    """The id of the latest call of tool ``name`` that no tool message answers yet."""
    answered = {m.get("tool_call_id") for m in acc if m["role"] == "tool"}
    for m in reversed(acc):
        for c in reversed(m.get("tool_calls") or []):
            if c["function"]["name"] == name and c.get("id") and c["id"] not in answered:
                return str(c["id"])
    return None


def _tool_span(acc: list[dict[str, Any]], run: ToolRun, span_id: str) -> None:
    call_id = run.call_id or _pending_call(acc, run.name) or f"call_{span_id}"
    result = json_value(run.result) if isinstance(run.result, str | bytes) else run.result
    content = as_text(result) if run.result is not None else run.error
    for i, m in enumerate(acc):
        if m["role"] == "tool" and m.get("tool_call_id") == call_id:
            m = acc[i] = dict(m)  # a copy: the message may be shared with an input cache
            if run.failed:
                m["is_error"] = True
            if not m.get("content"):
                m["content"] = content
            return
    called = any(c.get("id") == call_id for m in acc for c in m.get("tool_calls") or [])
    if not called:
        acc.append(tool_call_message(run, call_id))
    tool_msg: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": content, "name": run.name}
    if run.failed:
        tool_msg["is_error"] = True
    acc.append(tool_msg)


def _iso(ns: int) -> str | None:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat() if ns > 0 else None


def _first(spans: Iterable[dict[str, Any]], *keys: str) -> Any:
    for s in spans:
        for k in keys:
            v = s["attributes"].get(k) if not k.startswith("resource:") else s["resource"].get(k[9:])
            if v not in (None, "") and not (k == "resource:service.name" and str(v).startswith("unknown_service")):
                return v
    return None


def with_events(spans: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spans with the log events joined to them (by span id); events of a span not received stand as one."""
    if not events:
        return spans
    by_span: dict[str, list[dict[str, Any]]] = {}
    for ev in events:
        by_span.setdefault(ev.get("span_id") or "", []).append(ev)
    out = []
    for s in spans:
        joined = by_span.pop(s["span_id"], None)
        out.append({**s, "events": s["events"] + [_as_event(e) for e in joined]} if joined else s)
    for span_id, evs in by_span.items():
        if not span_id:
            continue
        t = min(e["time_ns"] for e in evs)
        out.append(
            {
                "trace_id": evs[0]["trace_id"],
                "span_id": span_id,
                "parent_span_id": "?",  # a span not (yet) received: never taken for a root
                "name": evs[0]["name"],
                "kind": 0,
                "start_ns": t,
                "end_ns": max(e["time_ns"] for e in evs),
                "attributes": {},
                "events": [_as_event(e) for e in evs],
                "status": {"code": 0, "message": ""},
                "resource": evs[0].get("resource") or {},
                "from_logs": True,
            }
        )
    return out


def _as_event(e: dict[str, Any]) -> dict[str, Any]:
    """A log record as a span event: its body's fields (older GenAI events put content there) under its attributes."""
    body = e.get("body")
    attrs = {**body, **e["attributes"]} if isinstance(body, dict) else dict(e["attributes"])
    if body is not None and not isinstance(body, dict):
        attrs.setdefault("content", body)
    return {"name": e["name"], "time_ns": e["time_ns"], "attributes": attrs}


def _tree(spans: list[dict[str, Any]], views: list[SpanView], start: int) -> list[dict[str, Any]]:
    out = []
    for s, v in zip(spans[:MAX_TREE_SPANS], views, strict=False):
        if s.get("from_logs"):
            continue
        failed = s["status"]["code"] == 2 or (v.tool is not None and v.tool.failed)
        out.append(
            {
                "span_id": s["span_id"],
                "parent_span_id": s.get("parent_span_id"),
                "name": s["name"][:200],
                "kind": v.role,
                "start_ms": round(max(0, s["start_ns"] - start) / 1e6, 3),
                "duration_ms": round(max(0, s["end_ns"] - s["start_ns"]) / 1e6, 3),
                "error": (s["status"]["message"] or (v.tool.error if v.tool else "") or "error")[:300]
                if failed
                else None,
            }
        )
    return out


def assemble(
    key: str,
    spans: list[dict[str, Any]],
    default_version: str,
    *,
    events: list[dict[str, Any]] | None = None,
    idle_finished: bool = False,
) -> dict[str, Any] | None:
    """A conversation document (schema v1) from the spans of one conversation, or None without messages.

    ``revision`` counts the distinct spans and log events (plus one once the idle timeout finished it),
    so it grows as they arrive and a resent one changes nothing. ``status`` is ``finished`` once every
    trace's root span has arrived, or when the idle timeout finished the conversation.
    """
    received = len(spans) + len(events or [])
    spans = sorted(with_events(spans, events or []), key=lambda s: (s["start_ns"], s["end_ns"]))
    acc: list[dict[str, Any]] = []
    system: list[str] = []
    tools: dict[str, dict[str, Any]] = {}
    prompt_tokens = completion_tokens = 0
    models: list[str] = []
    cache = InputCache()
    views: list[SpanView] = []
    keys: list[tuple[Any, ...]] = []
    for s in spans:
        v = view(s, cache)  # in order: the cache holds the previous span's input messages
        views.append(v)
        if v.tool is not None:
            _tool_span(acc, v.tool, s["span_id"])
            keys = [_key(m) for m in acc]
            continue
        if v.role != "inference":
            continue
        for text in v.system + [m["content"] or "" for m in v.inputs if m["role"] == "system"]:
            if text and text not in system:
                system.append(text)
        inputs, in_keys = cache.keyed(v.inputs, _key)
        merge(acc, inputs, keys, in_keys)
        merge(acc, v.outputs, keys)
        for t in v.tools:
            tools.setdefault(t["function"]["name"], t)
        prompt_tokens = min(MAX_INT, prompt_tokens + v.prompt_tokens)  # what the schema (a BIGINT) holds
        completion_tokens = min(MAX_INT, completion_tokens + v.completion_tokens)
        if v.model and v.model not in models:
            models.append(v.model)
    messages = [{"role": "system", "content": t} for t in system] + acc
    if not messages:
        return None
    real = [s for s in spans if not s.get("from_logs")] or spans
    traces = sorted({s["trace_id"] for s in spans})
    rooted = {s["trace_id"] for s in real if not s.get("parent_span_id")}
    start = min(s["start_ns"] for s in spans)
    end = max(s["end_ns"] for s in spans)
    conversation_id = next((cid for s in spans if (cid := conversation_id_of(s))), None) or key
    usage: dict[str, Any] = {"latency_ms": round(max(0, end - start) / 1e6, 3)}
    if prompt_tokens or completion_tokens:
        usage.update(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=min(MAX_INT, prompt_tokens + completion_tokens),
        )
    agent = _first(spans, "gen_ai.agent.name", "gen_ai.agent.id", "agent.name", "resource:service.name")
    if agent is None:
        agent = next((s["name"] for s in spans if s["attributes"].get("langfuse.observation.type") == "agent"), None)
    metadata: dict[str, Any] = {
        "source": "otlp",
        "trace_ids": traces[:20],
        "span_count": len(real),
        "models": models[:10],
        "provider": _first(spans, "gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system"),
        "conventions": sorted({v.convention for v in views if v.role in ("inference", "tool")}),
        "trace": {"spans": _tree(spans, views, start), "span_total": len(real)},
    }
    session, user = session_and_user(spans)
    if session:
        metadata["session_id"] = session
    if user:
        metadata["user_id"] = user
    if tools:
        metadata["tools"] = list(tools.values())
    return {
        "conversation_id": conversation_id[:MAX_ID],
        "revision": received + (1 if idle_finished else 0),
        "status": "finished" if idle_finished or rooted >= set(traces) else "in_progress",
        "agent_id": _label(agent, "unknown-agent", 256),
        "agent_version": _label(
            _first(spans, "gen_ai.agent.version", "resource:service.version", "langfuse.version", "langfuse.release"),
            default_version,
            128,
        ),
        "started_at": _iso(start),
        "ended_at": _iso(end),
        "messages": messages,
        "usage": usage,
        "metadata": metadata,
    }


def ordered_tree(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stored span list in tree order (each span after its parent, children by start) with its ``depth``;
    a span whose parent was not kept hangs under the root. Spans whose parents form a cycle (A's parent B,
    B's parent A: no exporter means it, any may send it) reach no root: each such group is shown from its
    earliest span, at the top, and every span once."""
    ids = {s["span_id"] for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for s in spans:
        parent = s.get("parent_span_id")
        children.setdefault(parent if parent in ids else None, []).append(s)
    out: list[dict[str, Any]] = []
    shown: set[int] = set()
    tops = sorted(children.get(None, []), key=lambda s: s["start_ms"])
    for top in [*tops, *sorted(spans, key=lambda s: s["start_ms"])]:
        stack = [(top, 0)]
        while stack:
            s, depth = stack.pop()
            if id(s) in shown:
                continue
            shown.add(id(s))
            out.append({**s, "depth": depth})
            kids = sorted(children.get(s["span_id"], []), key=lambda c: -c["start_ms"])
            stack.extend((c, depth + 1) for c in kids if id(c) not in shown)
        if len(shown) == len(spans):
            break
    return out
