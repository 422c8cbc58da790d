"""OpenAI Responses API items: a logged request (``instructions``, ``input``, ``tools``) with its ``output``
(or its ``response``), a Response object, or a bare list of items (a conversation's items).

``message`` items are turns (``developer`` read as ``system``; ``input_text``/``output_text`` parts their
text, a ``refusal`` part kept as ``refusal``); ``function_call`` and ``custom_tool_call`` items are the
assistant's tool calls (consecutive ones, and the text just before them, form one assistant message);
``function_call_output`` items are tool results; ``reasoning`` items become the next assistant message's
``reasoning`` (its summary text); ``mcp_call`` is a call with its result; hosted tools' items
(``web_search_call``...) are calls run by the server. An item type Vigil does not know, or an
``item_reference`` (whose content is not in the file), is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vigil.ingest.importers.common import ENVELOPE, ItemError, envelope, text_of, tool_defs, validated
from vigil.schema import Conversation

NAME = "openai-responses"
TITLE = "OpenAI Responses items (message, function_call, function_call_output, reasoning)"

HOSTED = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "computer_call",
        "code_interpreter_call",
        "image_generation_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
    }
)
HOSTED_OUTPUTS = frozenset({"computer_call_output", "local_shell_call_output", "shell_call_output"})
KNOWN = frozenset(
    {
        "message",
        "function_call",
        "function_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "reasoning",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "item_reference",
        *HOSTED,
        *HOSTED_OUTPUTS,
    }
)
REQUEST_KEYS = frozenset(
    {
        "model",
        "tool_choice",
        "parallel_tool_calls",
        "temperature",
        "top_p",
        "max_output_tokens",
        "max_tool_calls",
        "previous_response_id",
        "conversation",
        "reasoning",
        "text",
        "truncation",
        "store",
        "stream",
        "service_tier",
        "include",
        "background",
        "prompt",
        "prompt_cache_key",
        "safety_identifier",
        "user",
        "top_logprobs",
    }
)
OWN = frozenset({*ENVELOPE, "instructions", "input", "output", "tools", "metadata", "response"})


def is_item(x: Any) -> bool:
    if not isinstance(x, dict):
        return False
    if x.get("type") in KNOWN:
        return True
    return "type" not in x and x.get("role") in ("user", "assistant", "system", "developer") and "messages" not in x


def sniff_items(data: Any) -> bool:
    """A bare list of items: each an item, at least one typed (a list of bare role messages is not enough)."""
    return (
        isinstance(data, list)
        and bool(data)
        and all(is_item(x) for x in data)
        and any(isinstance(x, dict) and x.get("type") in KNOWN for x in data)
    )


def sniff_records(records: list[Any]) -> bool:
    return bool(records) and all(
        isinstance(r, dict)
        and "messages" not in r
        and (isinstance(r.get("input"), str | list) or (r.get("object") == "response" and "output" in r))
        for r in records
    )


class _Builder:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.reasoning: list[str] = []

    def _assistant(self) -> dict[str, Any]:
        """The assistant message a call joins: the last message when it is the assistant's, else a new one."""
        last = self.messages[-1] if self.messages else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant", "content": None}
            self.messages.append(last)
        self._reason(last)
        return last

    def _reason(self, m: dict[str, Any]) -> None:
        if self.reasoning:
            m["reasoning"] = "\n".join([*([m["reasoning"]] if m.get("reasoning") else []), *self.reasoning])
            self.reasoning.clear()

    def call(self, call_id: Any, name: Any, arguments: Any, **extra: Any) -> None:
        m = self._assistant()
        fn = {"name": name, "arguments": arguments if arguments is not None else "{}"}
        m.setdefault("tool_calls", []).append({"id": call_id, "type": "function", "function": fn, **extra})

    def result(self, call_id: Any, output: Any, is_error: bool = False) -> None:
        text = output if isinstance(output, str) or output is None else text_of(output)
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text, "is_error": is_error})

    def message(self, item: dict[str, Any], where: str) -> None:
        role = item.get("role")
        if role == "developer":
            role = "system"
        if role not in ("user", "assistant", "system"):
            raise ItemError(f"{where}.role: {role!r} is not a Responses message role")
        content = item.get("content")
        out: dict[str, Any] = {"role": role}
        if isinstance(content, list):
            texts, parts, refusals = [], [], []
            for i, p in enumerate(content):
                kind = p.get("type") if isinstance(p, dict) else None
                if kind in ("input_text", "output_text", "text"):
                    texts.append(p.get("text") or "")
                elif kind == "refusal":
                    refusals.append(p.get("refusal") or "")
                elif kind in ("input_image", "input_file", "input_audio"):
                    parts.append(p)
                else:
                    raise ItemError(f"{where}.content.{i}: a content part of type {kind!r} is not one Vigil reads")
            if parts:
                out["content"] = [*([{"type": "text", "text": "".join(texts)}] if texts else []), *parts]
            else:
                out["content"] = "".join(texts) if texts or not refusals else None
            if refusals:
                out["refusal"] = "\n".join(refusals)
        elif isinstance(content, str):
            out["content"] = content
        else:
            raise ItemError(f"{where}.content: expected a string or a list of content parts")
        if role == "assistant":
            self._reason(out)
        self.messages.append(out)

    def add(self, item: Any, where: str) -> None:
        if not is_item(item):
            kind = item.get("type") if isinstance(item, dict) else type(item).__name__
            raise ItemError(f"{where}: an item of type {kind!r} is not one Vigil reads")
        kind = item.get("type", "message")
        if kind == "message":
            self.message(item, where)
        elif kind == "function_call":
            self.call(item.get("call_id"), item.get("name"), item.get("arguments"))
        elif kind == "custom_tool_call":
            self.call(item.get("call_id"), item.get("name"), {"input": item.get("input")})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self.result(item.get("call_id"), item.get("output"))
        elif kind == "reasoning":
            summary = text_of(item.get("summary") or []) or text_of(item.get("content") or []) or ""
            self.reasoning.append(summary or "[encrypted reasoning]")
        elif kind == "mcp_call":
            call_id = item.get("id")
            self.call(call_id, item.get("name"), item.get("arguments"), executed_by="server")
            error = item.get("error")
            self.result(call_id, error if error else item.get("output"), is_error=bool(error))
        elif kind in HOSTED:
            args = {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status", "results")}
            name = kind.removesuffix("_call")
            self.call(item.get("call_id") or item.get("id"), name, args, executed_by="server")
            if item.get("results") is not None:
                self.result(item.get("call_id") or item.get("id"), item["results"], item.get("status") == "failed")
        elif kind in HOSTED_OUTPUTS:
            self.result(item.get("call_id"), item.get("output"))
        elif kind == "item_reference":
            raise ItemError(f"{where}: an item_reference ({item.get('id')}) points to content that is not in the file")
        # mcp_list_tools and approvals carry no turn of the conversation

    def finish(self) -> None:
        if self.reasoning and self.messages:  # reasoning with no reply after it joins the last assistant turn
            for m in reversed(self.messages):
                if m["role"] == "assistant":
                    self._reason(m)
                    break


def items_to_messages(items: Any, where: str, builder: _Builder | None = None) -> list[dict[str, Any]]:
    b = builder or _Builder()
    if isinstance(items, str):
        b.messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for i, item in enumerate(items):
            b.add(item, f"{where}.{i}")
    else:
        raise ItemError(f"{where}: expected a string or a list of items")
    b.finish()
    return b.messages


def _usage(u: Any) -> dict[str, Any] | None:
    if not isinstance(u, dict):
        return None
    return {
        "prompt_tokens": u.get("input_tokens"),
        "completion_tokens": u.get("output_tokens"),
        "total_tokens": u.get("total_tokens"),
    }


def _record(item: dict[str, Any], where: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    response = item.get("response")
    if item.get("object") == "response":
        response, item = item, {k: v for k, v in item.items() if k in ("instructions", "tools", "model", "metadata")}
    elif response is not None and not isinstance(response, dict):
        raise ItemError(f"{where}.response: expected a Response object")
    b = _Builder()
    instructions = item.get("instructions")
    if instructions is None and response is not None:
        instructions = response.get("instructions")
    if isinstance(instructions, str):
        b.messages.append({"role": "system", "content": instructions})
    elif instructions is not None:
        items_to_messages(instructions, f"{where}.instructions", b)
    if "input" in item:
        items_to_messages(item["input"], f"{where}.input", b)
    output = item.get("output") if "output" in item else (response or {}).get("output")
    if output is not None:
        items_to_messages(output, f"{where}.output" if "output" in item else f"{where}.response.output", b)
    meta: dict[str, Any] = {"source": "openai-responses"}
    if response is not None:
        meta["response_id"] = response.get("id")
        meta["response_status"] = response.get("status")
        details = response.get("incomplete_details") or {}
        if details.get("reason") == "max_output_tokens" and b.messages and b.messages[-1]["role"] == "assistant":
            b.messages[-1]["finish_reason"] = "length"
    extra = {
        "tools": item.get("tools") if item.get("tools") is not None else (response or {}).get("tools"),
        "usage": _usage((response or {}).get("usage")),
        "model": item.get("model") or (response or {}).get("model"),
    }
    return b.messages, {"meta": meta, **extra}


def convert(data: Any, path: Path, agent_id: str | None, agent_version: str | None) -> Iterator[Conversation]:
    if sniff_items(data):
        messages = items_to_messages(data, "items")
        doc = envelope({}, path, "openai-responses", messages, agent_id, agent_version,
                       metadata={"source": "openai-responses"})  # fmt: skip
        yield validated(doc, "items")
        return
    items = data if isinstance(data, list) else [data]
    for n, item in enumerate(items):
        where = f"item {n}"
        if not isinstance(item, dict):
            raise ItemError(f"{where}: expected an object")
        # a Response object is the API's own output: its other fields (settings, moderation) are no turns
        unknown = [] if item.get("object") == "response" else sorted(set(item) - OWN - REQUEST_KEYS)
        if unknown:
            raise ItemError(f"{where}: {', '.join(unknown)}: not a field of Vigil's schema nor a Responses parameter")
        messages, extra = _record(item, where)
        request = {k: item[k] for k in sorted(REQUEST_KEYS) if k in item and k not in ("model",)}
        meta = {**extra["meta"], "model": extra["model"], "request": request or None}
        if item.get("object") == "response":  # the API's output: none of its fields are Vigil's own
            record = {"usage": extra["usage"], "metadata": item.get("metadata")}
        else:
            record = {**item, "usage": item.get("usage") or extra["usage"]}
        doc = envelope(
            record,
            path,
            "openai-responses",
            messages,
            agent_id,
            agent_version,
            tools=tool_defs(extra["tools"], f"{where}.tools"),
            metadata=meta,
        )
        yield validated(doc, where)
