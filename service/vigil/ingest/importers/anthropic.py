"""Anthropic Messages: a logged request (``system``, ``messages``, ``tools``) with its ``response``.

``system`` (a string or text blocks) becomes the system message. In assistant turns, ``text`` blocks are
the reply, ``tool_use`` (and ``server_tool_use``) blocks its tool calls, ``thinking`` blocks its
``reasoning``; a server tool's result block (``web_search_tool_result``...) becomes a tool message. In user
turns, ``tool_result`` blocks become tool messages (``is_error`` kept) before the user's own text. A
``response`` (a Message object) is the last assistant turn; ``stop_reason: max_tokens`` marks it cut at the
token limit. A block type Vigil does not know is refused by name, never skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vigil.ingest.importers.common import (
    ENVELOPE,
    ItemError,
    as_list,
    envelope,
    kind_of,
    number,
    obj,
    string,
    text_of,
    tool_defs,
    validated,
)
from vigil.schema import Conversation

NAME = "anthropic"
TITLE = "Anthropic Messages (system, messages with content blocks, tool_use/tool_result, a response)"

REQUEST_KEYS = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop_sequences",
        "tool_choice",
        "thinking",
        "stream",
        "service_tier",
        "container",
        "mcp_servers",
        "context_management",
        "output_config",
        "betas",
    }
)
OWN = frozenset({*ENVELOPE, "messages", "system", "tools", "metadata", "response"})
MEDIA = frozenset({"image", "document", "search_result", "container_upload"})
ONLY_ANTHROPIC = frozenset(
    {"tool_use", "tool_result", "thinking", "redacted_thinking", "server_tool_use", "mcp_tool_use"}
)


def markers(records: list[dict[str, Any]]) -> list[str]:
    """What only Anthropic Messages has."""
    found: set[str] = set()
    for r in records:
        if "system" in r:
            found.add("a top-level system")
        if any(isinstance(t, dict) and "input_schema" in t for t in as_list(r.get("tools"))):
            found.add("tools with input_schema")
        if isinstance(r.get("response"), dict) and r["response"].get("type") == "message":
            found.add("a Message response")
        for m in as_list(r.get("messages")):
            content = m.get("content") if isinstance(m, dict) else None
            for block in content if isinstance(content, list) else []:
                kind = kind_of(block)
                if kind in ONLY_ANTHROPIC or (isinstance(kind, str) and kind.endswith("_tool_result")):
                    found.add(f"{kind} blocks")
                elif kind in MEDIA and isinstance(block.get("source"), dict):
                    found.add(f"{kind} blocks with a source")
    return sorted(found)


def _result_text(content: Any) -> str | None:
    if isinstance(content, list):
        return text_of([b for b in content if isinstance(b, dict) and b.get("type") == "text"])
    return text_of(content)


def _assistant(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """One assistant turn as messages: its text and calls, split where a server tool's result comes in."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []

    def flush() -> None:
        if texts or calls or reasoning:
            m: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
            if calls:
                m["tool_calls"] = list(calls)
            if reasoning:
                m["reasoning"] = "\n".join(reasoning)
            out.append(m)
        texts.clear()
        calls.clear()
        reasoning.clear()

    for i, block in enumerate(blocks):
        kind = kind_of(block)
        if kind == "text":
            texts.append(string(block.get("text"), f"{where}.content.{i}.text"))
        elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
            fn = {"name": block.get("name"), "arguments": block.get("input") or {}}
            call = {"id": block.get("id"), "type": "function", "function": fn}
            if kind != "tool_use":
                call["executed_by"] = "server"
            calls.append(call)
        elif kind == "thinking":
            reasoning.append(string(block.get("thinking"), f"{where}.content.{i}.thinking"))
        elif kind == "redacted_thinking":
            reasoning.append("[redacted thinking]")
        elif isinstance(kind, str) and kind.endswith("_tool_result"):
            flush()
            is_error = bool(block.get("is_error")) or (
                isinstance(block.get("content"), dict) and str(block["content"].get("type", "")).endswith("_error")
            )
            content = block.get("content")
            text = _result_text(content) if not isinstance(content, dict) else text_of([content])
            out.append(
                {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text, "is_error": is_error}
            )
        else:
            raise ItemError(f"{where}.content.{i}: an assistant block of type {kind!r} is not one Vigil reads")
    flush()
    return out


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise ItemError(f"{where}.content: expected a string or a list of content blocks")
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(content):
        kind = kind_of(block)
        if kind == "tool_result":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id"),
                    "content": _result_text(block.get("content")),
                    "is_error": bool(block.get("is_error")),
                }
            )
        elif kind == "text":
            parts.append({"type": "text", "text": string(block.get("text"), f"{where}.content.{i}.text")})
        elif kind in MEDIA:
            parts.append({"type": kind, **{k: v for k, v in block.items() if k != "type"}})
        else:
            raise ItemError(f"{where}.content.{i}: a user block of type {kind!r} is not one Vigil reads")
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def messages_of(raw: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise ItemError(f"{where}: expected a list of messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(raw):
        at = f"{where}.{i}"
        if not isinstance(m, dict):
            raise ItemError(f"{at}: expected a message object")
        role, content = m.get("role"), m.get("content")
        if role == "user":
            out.extend(_user(content, at))
        elif role == "assistant":
            if isinstance(content, str):
                content = [{"type": "text", "text": content}]
            if not isinstance(content, list):
                raise ItemError(f"{at}.content: expected a string or a list of content blocks")
            out.extend(_assistant(content, at))
        else:
            raise ItemError(f"{at}.role: Anthropic Messages have user and assistant turns only, not {role!r}")
    return out


def _system(raw: Any, where: str) -> str | None:
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in raw):
        return "\n".join(string(b.get("text"), f"{where}.system.{i}.text") for i, b in enumerate(raw))
    raise ItemError(f"{where}.system: expected a string or a list of text blocks")


def convert(data: Any, path: Path, agent_id: str | None, agent_version: str | None) -> Iterator[Conversation]:
    items = data if isinstance(data, list) else [data]
    for n, item in enumerate(items):
        where = f"item {n}"
        if not isinstance(item, dict):
            raise ItemError(f"{where}: expected an object")
        unknown = sorted(set(item) - OWN - REQUEST_KEYS)
        if unknown:
            raise ItemError(f"{where}: {', '.join(unknown)}: not a field of Vigil's schema nor a Messages parameter")
        messages = messages_of(item.get("messages"), f"{where}.messages")
        system = _system(item.get("system"), where)
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        response = item.get("response")
        usage = None
        if response is not None:
            if not isinstance(response, dict) or response.get("role") != "assistant":
                raise ItemError(f"{where}.response: expected a Message object (role assistant)")
            content = response.get("content")
            if content is not None and not isinstance(content, list):
                raise ItemError(f"{where}.response.content: expected a list of content blocks")
            reply = _assistant(content or [], f"{where}.response")
            if response.get("stop_reason") == "max_tokens" and reply:
                reply[-1]["finish_reason"] = "length"
            messages.extend(reply)
            u = obj(response.get("usage"))
            if isinstance(u, dict) and ("input_tokens" in u or "output_tokens" in u):
                usage = {
                    "prompt_tokens": number(u.get("input_tokens")),
                    "completion_tokens": number(u.get("output_tokens")),
                }
        request = {k: item[k] for k in sorted(REQUEST_KEYS) if k in item}
        record = {**item, "usage": item.get("usage") or usage}
        meta: dict[str, Any] = {"source": "anthropic-messages", "request": request or None}
        if isinstance(response, dict):
            meta["response_id"] = response.get("id")
            meta["stop_reason"] = response.get("stop_reason")
        doc = envelope(
            record,
            path,
            "anthropic",
            messages,
            agent_id,
            agent_version,
            tools=tool_defs(item.get("tools"), f"{where}.tools"),
            metadata=meta,
        )
        yield validated(doc, where)
