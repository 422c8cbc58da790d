"""What every importer shares: stable ids, the conversation envelope, and errors that name the item."""

from __future__ import annotations

import hashlib
import json
from collections import deque
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from vigil.errors import VigilError
from vigil.ingest.decode import describe_validation_error
from vigil.schema import INCOMING, Conversation, ToolDef

# Fields of Vigil's own schema an imported record may carry beside its format's fields
ENVELOPE = (
    "conversation_id",
    "revision",
    "updated_at",
    "started_at",
    "ended_at",
    "status",
    "agent_id",
    "agent_version",
    "task_id",
    "intent",
    "usage",
    "outcomes",
)


class ImportError_(VigilError):
    """A file that no importer understands, or an item inside it that is malformed."""


class ItemError(Exception):
    """Raised inside a converter; the caller adds the file and item."""


def dumps_any(value: Any, sort_keys: bool = False) -> bytes:
    """JSON of a parsed value, also when orjson cannot write it (an integer beyond 64 bits, a lone surrogate)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS if sort_keys else None, default=str)
    except TypeError:
        return json.dumps(value, sort_keys=sort_keys, default=str, ensure_ascii=False).encode("utf-8", "surrogatepass")


def digest(value: Any) -> str:
    return hashlib.sha256(dumps_any(value, sort_keys=True)).hexdigest()[:16]


def content_digest(messages: Any, agent_id: str | None, agent_version: str | None) -> str:
    """The digest a derived conversation id ends in: of the messages, and of the agent and version the caller
    named (the same transcript sent for two agents is two conversations, not one stored and one duplicate).
    Without either it is the messages' digest alone, so ids derived before stay the same."""
    if agent_id is None and agent_version is None:
        return digest(messages)
    return digest({"agent_id": agent_id, "agent_version": agent_version, "messages": messages})


def listed(value: Any, where: str, what: str = "items") -> list[Any]:
    """A list field: a list (absent is empty); anything else is refused, naming where."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ItemError(f"{where}: expected a list of {what}, not {type(value).__name__}")
    return value


def as_list(value: Any) -> list[Any]:
    """``value`` when it is a list, else an empty one (for detectors, which must never fail on any shape)."""
    return value if isinstance(value, list) else []


def reward(value: Any, where: str) -> float | None:
    """A recorded reward: a number, or a string holding one (absent is no reward); anything else is refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ItemError(f"{where}: expected a number, not {type(value).__name__}")
    try:
        out = float(value)
    except (ValueError, OverflowError):
        raise ItemError(f"{where}: expected a number, not {str(value)[:40]!r}") from None
    if out - out != 0:
        raise ItemError(f"{where}: expected a finite number, not {str(value)[:40]!r}")
    return out


def obj(x: Any) -> dict[str, Any]:
    """``x`` when it is an object, else an empty one (an optional part given as something else is absent)."""
    return x if isinstance(x, dict) else {}


def kind_of(x: Any, key: str = "type") -> str | None:
    """``x[key]`` when ``x`` is an object and that is a string (any other value never matches a known kind)."""
    if isinstance(x, dict):
        value = x.get(key)
        return value if isinstance(value, str) else None
    return None


def string(value: Any, where: str) -> str:
    """A text field: a string (absent is empty); anything else is refused."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ItemError(f"{where}: expected a string, not {type(value).__name__}")
    return value


def number(value: Any) -> int:
    """A token count: a number, else nothing counted."""
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and value == value else 0


def text_of(content: Any) -> str | None:
    """Text of a content given as a string or as a list of typed parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
        return "\n".join(parts)
    return dumps_any(content).decode("utf-8", "surrogatepass")


def mark_failed(history: list[dict[str, Any]], failed: list[str]) -> None:
    """Mark as errors the results of calls a trace records as failed (by tool name, in order): a failed call
    often reaches the model as an ordinary result text."""
    names = {
        c["id"]: kind_of(c.get("function"), "name")
        for m in history
        for c in as_list(m.get("tool_calls"))
        if isinstance(c, dict) and isinstance(c.get("id"), str)
    }
    pending = list(failed)
    for m in history:
        call_id = m.get("tool_call_id")
        name = names.get(call_id) if m["role"] == "tool" and isinstance(call_id, str) else None
        if name is not None and name in pending:
            pending.remove(name)
            m["is_error"] = True


def join_executions(
    history: list[dict[str, Any]], executions: list[tuple[dict[str, Any], dict[str, Any]]]
) -> list[dict[str, Any]]:
    """``history`` with the tool calls a trace records as executed (each a call and its result message, in
    the order they ran) joined to it: each answers the call in ``history`` with its call id, else the first
    call of its tool not yet answered by another; its result is added after that call when ``history`` has
    none (a run that stopped at the tool), and marks the result failed when it failed. A call ``history``
    never shows (made by a model whose spans carry no content) is added at the end with its result, never
    dropped."""
    slots = [
        (i, c) for i, m in enumerate(history) if m.get("role") == "assistant" for c in as_list(m.get("tool_calls"))
    ]
    answered: dict[str, dict[str, Any]] = {}
    for m in history:
        if m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str):
            answered.setdefault(m["tool_call_id"], m)
    by_id = {c["id"]: k for k, (_, c) in reversed(list(enumerate(slots))) if isinstance(kind_of(c, "id"), str)}
    shown = _shown_results(history)
    # a call id names its slot before any call is matched by tool name, so a name never takes another's slot;
    # an id names a call of the same tool (a run's own id may be another tool's call id by chance)
    chosen: list[int | None] = []
    used: set[int] = set()
    for call, _ in executions:
        slot = by_id.get(kind_of(call, "id") or "")
        if slot is not None and (slot in used or _other_tool(call, slots[slot][1])):
            slot = None
        chosen.append(slot)
        if slot is not None:
            used.add(slot)
    # each tool's slots in order, taken from the front: linear in the calls, however many share a name
    by_name: dict[str | None, deque[int]] = {}
    for k, (_, c) in enumerate(slots):
        by_name.setdefault(kind_of(c.get("function"), "name") if isinstance(c, dict) else None, deque()).append(k)
    results_after: dict[int, list[dict[str, Any]]] = {}
    unseen: list[dict[str, Any]] = []
    for (call, result), slot in zip(executions, chosen, strict=True):
        free = by_name.get(kind_of(call.get("function"), "name"), deque())
        while slot is None and free:
            k = free.popleft()
            slot = None if k in used else k
        if slot is None:
            unseen += [{"role": "assistant", "content": None, "tool_calls": [call]}, result]
            continue
        used.add(slot)
        at, seen = slots[slot]
        if not isinstance(seen, dict):
            unseen += [{"role": "assistant", "content": None, "tool_calls": [call]}, result]
            continue
        call_id = seen.get("id")
        if not isinstance(call_id, str):
            # a model whose calls carry no id (the trace's call ids are the tool runs' own): the call takes the
            # run's id so its result answers it, else the result would be lost; the result the model was shown
            # (under the run's id, or without one, after the call) is that result, not another to add
            call_id = kind_of(call, "id")
            if not isinstance(call_id, str) or call_id in by_id or (call_id in answered and id(seen) in shown):
                call_id = _unused(f"vigil-call-{slot}", by_id, answered)
            seen["id"] = call_id
            by_id[call_id] = slot
            if call_id not in answered and id(seen) in shown:
                answered[call_id] = shown[id(seen)]
                answered[call_id]["tool_call_id"] = call_id
        if call_id in answered:
            answered[call_id]["is_error"] = bool(answered[call_id].get("is_error")) or bool(result.get("is_error"))
        else:
            results_after.setdefault(at, []).append({**result, "tool_call_id": call_id})
    out: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    for i, m in enumerate(history):
        if pending and m.get("role") != "tool":
            out += pending
            pending = []
        out.append(m)
        pending += results_after.get(i, [])
    return out + pending + unseen


def _other_tool(call: dict[str, Any], seen: Any) -> bool:
    """Whether ``call`` (as run) and ``seen`` (as the model asked for it) name two different tools."""
    ran = kind_of(call.get("function"), "name")
    asked = kind_of(seen.get("function"), "name") if isinstance(seen, dict) else None
    return ran is not None and asked is not None and ran != asked


def _shown_results(history: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The result ``history`` shows for each tool call that carries no id (by ``id()`` of the call): the
    tool messages without a call id right after the call's message, in the order of its calls without one."""
    out: dict[int, dict[str, Any]] = {}
    for i, m in enumerate(history):
        if m.get("role") != "assistant":
            continue
        calls = [c for c in as_list(m.get("tool_calls")) if isinstance(c, dict) and not isinstance(c.get("id"), str)]
        results: list[dict[str, Any]] = []
        j = i + 1
        while calls and j < len(history) and history[j].get("role") == "tool":
            if not isinstance(history[j].get("tool_call_id"), str) or not history[j]["tool_call_id"]:
                results.append(history[j])
            j += 1
        out.update((id(c), r) for c, r in zip(calls, results, strict=False))
    return out


def _unused(call_id: str, *taken: dict[str, Any]) -> str:
    """``call_id``, or with a suffix when a call or result of the record goes by it already."""
    found, n = call_id, 1
    while any(found in t for t in taken):
        n += 1
        found = f"{call_id}-{n}"
    return found


def tool_defs(raw: Any, where: str) -> list[dict[str, Any]] | None:
    """Tool definitions in any of the APIs' shapes, checked; None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ItemError(f"{where}: expected a list of tool definitions")
    out = []
    for i, t in enumerate(raw):
        try:
            out.append(ToolDef.model_validate(t).model_dump(exclude_none=True))
        except ValidationError as exc:
            raise ItemError(f"{where}.{i}: {describe_validation_error(exc)}") from None
    return out


def envelope(
    record: dict[str, Any],
    path: Path,
    prefix: str,
    messages: list[dict[str, Any]],
    agent_id: str | None,
    agent_version: str | None,
    *,
    tools: list[dict[str, Any]] | None = None,
    metadata: dict[str, Any] | None = None,
    default_id: str | None = None,
    default_agent: str | None = None,
) -> dict[str, Any]:
    """A conversation document: Vigil's own fields kept where the record has them, a stable id otherwise
    (the same record always gets the same id, so importing a file twice changes nothing)."""
    out: dict[str, Any] = {k: record[k] for k in ENVELOPE if record.get(k) is not None}
    derived = f"{prefix}:{path.stem}:{content_digest(messages, agent_id, agent_version)}"
    out.setdefault("conversation_id", default_id or derived)
    out["agent_id"] = agent_id or out.get("agent_id") or default_agent or path.stem
    out["agent_version"] = agent_version or out.get("agent_version") or "unknown"
    out["messages"] = messages
    if tools is not None:
        out["tools"] = tools
    meta = dict(record.get("metadata") or {}) if isinstance(record.get("metadata"), dict) else {}
    meta.update({k: v for k, v in (metadata or {}).items() if v is not None})
    out["metadata"] = meta
    return out


def validated(doc: dict[str, Any], where: str) -> Conversation:
    try:
        return Conversation.model_validate(doc, context=INCOMING)
    except ValidationError as exc:
        raise ItemError(f"{where}: {describe_validation_error(exc)}") from None
