"""Messages as traces carry them (OpenTelemetry ``parts``, OpenAI's chat form) into Vigil (OpenAI) messages."""

from __future__ import annotations

import json
import math
import re
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


def json_value(value: Any) -> Any:
    """The JSON value a string holds, or the string itself when it holds none.

    JSON text that strict JSON (orjson) refuses but is JSON all the same is read by Python's parser instead
    (see :func:`_lenient`), so the messages it holds are not lost.
    """
    if isinstance(value, str | bytes):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return _lenient(value)
    return value


_SURROGATE = re.compile("[\ud800-\udfff]")
_U64 = 2**64


def _number(text: str) -> Any:
    """A number as orjson reads it (an integer beyond 64 bits becomes a double), or its text when no double
    holds it (``1e400``): stored documents are strict JSON, without infinities."""
    if "." not in text and "e" not in text and "E" not in text and len(text) <= 20:
        n = int(text)
        if -_U64 // 2 <= n < _U64:
            return n
    f = float(text)
    return f if math.isfinite(f) else text


def _repaired(value: Any) -> Any:
    """``value`` with every lone UTF-16 surrogate (a ``\\ud800`` escape without its pair) in its strings
    and keys replaced by U+FFFD: no strict JSON writer (orjson, Postgres) takes one. The native ingest
    refuses a document holding one (``invalid_unicode``); here it is one attribute of a span the exporter
    cannot correct, so it is repaired, as the native ingest repairs an escaped NUL."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_repaired(v) for v in value]
    if isinstance(value, dict):
        return {_repaired(k): _repaired(v) for k, v in value.items()}
    return value


def _lenient(value: str | bytes) -> Any:
    """What Python's JSON parser reads in ``value`` (a lone surrogate escape, a number beyond a double's
    range), made storable: numbers no double holds stay as their text (as do ``NaN`` and ``Infinity``),
    lone surrogates become U+FFFD. ``value`` itself when that parser refuses it too."""
    try:
        parsed = json.loads(value, parse_float=_number, parse_int=_number, parse_constant=str)
    except (ValueError, RecursionError):  # not JSON (JSONDecodeError, not UTF-8), or nested too deep
        return value
    try:
        return _repaired(parsed)
    except RecursionError:
        return value


def as_text(value: Any) -> str:
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


MAX_NAME = 256  # what the schema takes of a tool's name (a call's, a definition's)


def tool_name(value: Any) -> str:
    """A tool's name as the schema takes it: a span may name a tool with anything (a list, 300 characters),
    and one such name must not lose the conversation it belongs to: it is cut, not refused."""
    return str(value or "unknown_tool")[:MAX_NAME]


def call(cid: Any, name: Any, arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        args: Any = arguments
    else:
        args = str(arguments) if arguments not in (None, "") else "{}"
    return {
        "id": str(cid) if cid is not None else None,
        "type": "function",
        "function": {"name": tool_name(name), "arguments": args},
    }


def openai_calls(calls: Any) -> list[dict[str, Any]]:
    out = []
    for c in json_value(calls) or []:
        if isinstance(c, dict):
            function = c.get("function")
            fn = function if isinstance(function, dict) else c
            out.append(call(c.get("id"), fn.get("name"), fn.get("arguments")))
    return out


_SALVAGE = json.JSONDecoder(parse_float=_number, parse_int=_number, parse_constant=str)


def _salvaged(text: str) -> list[Any] | None:
    """The complete items of a JSON array cut short (an SDK's attribute length limit,
    ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``, cuts a long history mid-message): the messages before the cut
    are kept instead of the whole attribute being lost. None when not even one item is complete."""
    at = text.find("[") + 1
    items: list[Any] = []
    end = len(text)
    try:
        while True:
            while at < end and text[at] in " \t\r\n":
                at += 1
            item, at = _SALVAGE.raw_decode(text, at)
            items.append(item)
            while at < end and text[at] in " \t\r\n":
                at += 1
            if at >= end or text[at] != ",":
                break
            at += 1
    except (ValueError, RecursionError):
        pass
    try:
        return _repaired(items) if items else None
    except RecursionError:
        return None


def to_messages(items: Any, role: str | None = None) -> list[dict[str, Any]]:
    """Messages in the ``parts`` form or OpenAI's form into Vigil (OpenAI) messages.

    Text that is no JSON becomes one message of ``role`` (an instrumentation that records the prompt or the
    completion as plain text); a JSON array cut short keeps its complete items."""
    items = json_value(items)
    if isinstance(items, str) and items.strip():
        salvaged = _salvaged(items) if items.lstrip().startswith("[") else None
        if salvaged is not None:
            items = salvaged
        elif role is not None:
            items = [{"role": role, "content": items}]
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
        msg: dict[str, Any] = {"role": role, "content": as_text(item.get("content")) or None}
        calls = openai_calls(item.get("tool_calls")) if role == "assistant" else []
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
            calls.append(call(p.get("id"), p.get("name"), p.get("arguments")))
        elif kind == "tool_call_response":
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": str(p.get("id") or "") or None,
                    "content": as_text(p.get("response")),
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


def tool_definitions(value: Any) -> list[dict[str, Any]]:
    """Tool definitions in OpenAI's function form, from that form or the flat ``{name, parameters}`` one."""
    value = json_value(value)
    if isinstance(value, dict):
        value = [value]
    out: list[dict[str, Any]] = []
    for item in value if isinstance(value, list) else []:
        item = json_value(item)
        if not isinstance(item, dict):
            continue
        function = item.get("function")
        fn: dict[str, Any] = function if isinstance(function, dict) else item
        name = fn.get("name")
        if not name:
            continue
        definition: dict[str, Any] = {"name": tool_name(name)}
        if fn.get("description"):
            definition["description"] = str(fn["description"])
        params = json_value(fn.get("parameters", fn.get("input_schema")))
        if isinstance(params, dict):
            definition["parameters"] = params
        out.append({"type": "function", "function": definition})
    return out
