"""OpenAI chat records: Vigil's native format, bare ``{"messages": [...]}`` records (OpenAI's fine-tuning and
eval files), and logged Chat Completions requests with their response.

A record may carry the request's parameters (``model``, ``tools``, ``tool_choice``, ``temperature``...):
``tools`` (and the legacy ``functions``) become the conversation's tool definitions, the others are kept
in ``metadata.request``. A ``response`` (a ChatCompletion) or its ``choices`` add the model's reply as the
last assistant message. The ``developer`` role is read as ``system``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vigil.ingest.importers.common import (
    ENVELOPE,
    ItemError,
    as_list,
    content_digest,
    envelope,
    tool_defs,
    validated,
)
from vigil.schema import Conversation

NAME = "openai"
TITLE = "OpenAI chat (Vigil's native format, {messages} records, Chat Completions requests with tools)"

# Chat Completions request parameters: kept in metadata.request, never refused
REQUEST_KEYS = frozenset(
    {
        "model",
        "tool_choice",
        "parallel_tool_calls",
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "response_format",
        "seed",
        "stop",
        "n",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "store",
        "reasoning_effort",
        "service_tier",
        "stream",
        "stream_options",
        "modalities",
        "prediction",
        "audio",
        "verbosity",
        "prompt_cache_key",
        "safety_identifier",
        "web_search_options",
        "function_call",
    }
)
OWN = frozenset({*ENVELOPE, "schema_version", "messages", "tools", "functions", "metadata", "response", "choices"})


def sniff(records: list[Any]) -> bool:
    """Records with a list of messages (an item that is no object at all is left to the converter to name)."""
    objects = [r for r in records if isinstance(r, dict)]
    return bool(objects) and all(isinstance(r.get("messages"), list) for r in objects)


def markers(records: list[dict[str, Any]]) -> list[str]:
    """What only OpenAI chat has."""
    found: set[str] = set()
    for r in records:
        for m in as_list(r.get("messages")):
            if not isinstance(m, dict):
                continue
            if m.get("role") in ("system", "tool", "developer", "function"):
                found.add(f"a {m['role']} message")
            if m.get("tool_calls"):
                found.add("tool_calls")
        if any(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in as_list(r.get("tools"))):
            found.add('tools as {"type": "function", "function": ...}')
        if "choices" in r or (isinstance(r.get("response"), dict) and "choices" in r["response"]):
            found.add("a ChatCompletion response")
    return sorted(found)


def _message(m: Any, where: str) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise ItemError(f"{where}: expected a message object")
    out = dict(m)
    if out.get("role") == "developer":
        out["role"] = "system"
    elif out.get("role") == "function":  # the legacy function result
        out["role"] = "tool"
    if isinstance(out.get("function_call"), dict) and not out.get("tool_calls"):  # the legacy single call
        out["tool_calls"] = [{"type": "function", "function": out.pop("function_call")}]
    return out


def _reply(record: dict[str, Any], where: str) -> dict[str, Any] | None:
    response = record.get("response")
    choices = response.get("choices") if isinstance(response, dict) else record.get("choices")
    if choices is None:
        return None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ItemError(f"{where}.choices: expected a list of choices")
    if len(choices) > 1:
        raise ItemError(f"{where}.choices: {len(choices)} choices; Vigil reads one reply per conversation")
    choice = choices[0]
    reply = _message(choice.get("message"), f"{where}.choices.0.message")
    if choice.get("finish_reason"):
        reply["finish_reason"] = choice["finish_reason"]
    return reply


def convert(data: Any, path: Path, agent_id: str | None, agent_version: str | None) -> Iterator[Conversation]:
    items = data if isinstance(data, list) else [data]
    for n, item in enumerate(items):
        where = f"item {n}"
        if not isinstance(item, dict):
            raise ItemError(f"{where}: expected an object")
        unknown = sorted(set(item) - OWN - REQUEST_KEYS)
        if unknown:
            raise ItemError(
                f"{where}: {', '.join(unknown)}: not a field of Vigil's schema nor a Chat Completions parameter"
            )
        raw_messages = item.get("messages")
        if not isinstance(raw_messages, list):
            raise ItemError(f"{where}: messages: expected a list of messages")
        messages = [_message(m, f"{where}.messages.{i}") for i, m in enumerate(raw_messages)]
        reply = _reply(item, where)
        if reply is not None:
            messages.append(reply)
        request = {k: item[k] for k in sorted(REQUEST_KEYS) if k in item}
        tools = tool_defs(item.get("tools") or item.get("functions"), f"{where}.tools")
        meta: dict[str, Any] = {"request": request} if request else {}
        response = item.get("response")
        if isinstance(response, dict) and response.get("usage") and "usage" not in item:
            item = {**item, "usage": response["usage"]}
        doc = envelope(
            item,
            path,
            path.stem,
            messages,
            agent_id,
            agent_version,
            tools=tools,
            metadata=meta,
            default_id=f"{path.stem}:{content_digest(item.get('messages'), agent_id, agent_version)}",
        )
        yield validated(doc, where)
