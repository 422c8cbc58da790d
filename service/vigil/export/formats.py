"""The native task in the dataset shapes offline harnesses load.

- ``inspect``: Inspect AI's JSON-lines dataset fields ``id``, ``input`` (a list of chat messages in
  Inspect's own shape: tool calls with parsed ``arguments``, tool results with ``function`` and ``error``),
  ``target`` (the reviewer's expected behaviour, else the grading criteria as sentences) and ``metadata``
  (the native task's failure, grading and source), loadable with ``inspect_ai.dataset.json_dataset``.
- ``verifiers``: the verifiers / prime-rl dataset row: ``prompt`` (OpenAI chat messages), ``answer``,
  ``info`` (a JSON string, which verifiers parses into a dict) and ``task``.
"""

from __future__ import annotations

from typing import Any

import orjson

from vigil.export.grading import describe

FORMATS = ("native", "inspect", "verifiers")


def target_text(task: dict[str, Any]) -> str:
    expected = task["review"]["expected_behavior"]
    if expected:
        return str(expected)
    return " ".join(describe(c) for c in task["grading"]) or f"Avoid the failure: {task['failure']['category']}."


def info(task: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": task["schema"],
        "schema_version": task["schema_version"],
        "task_id": task["task_id"],
        "source": task["source"],
        "goal": task["goal"],
        "failure": task["failure"],
        "reviewer_notes": task["review"]["notes"],
        "expected_behavior": task["review"]["expected_behavior"],
        "grading": task["grading"],
        "duplicates": task["duplicates"],
    }


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text") or "" for p in content if isinstance(p, dict))


def _args(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = orjson.loads(raw or "{}")
    except orjson.JSONDecodeError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_value": value}


def inspect_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for m in messages:
        role, text = m["role"], _text(m.get("content"))
        if role == "assistant":
            calls = []
            for c in m.get("tool_calls") or []:
                fn = c["function"]
                if c.get("id"):
                    names[c["id"]] = fn["name"]
                calls.append(
                    {
                        "id": c.get("id") or "",
                        "function": fn["name"],
                        "arguments": _args(fn.get("arguments")),
                        "type": "function",
                    }
                )
            out.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
        elif role == "tool":
            msg: dict[str, Any] = {
                "role": "tool",
                "content": text,
                "tool_call_id": m.get("tool_call_id"),
                "function": m.get("name") or names.get(m.get("tool_call_id") or ""),
            }
            if m.get("is_error"):
                msg["error"] = {"type": "unknown", "message": text[:2000]}
            out.append(msg)
        else:
            out.append({"role": role, "content": text})
    return out


def to_inspect(task: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": task["task_id"],
        "input": inspect_messages(task["messages"]),
        "target": target_text(task),
        "metadata": info(task),
    }


def openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        msg: dict[str, Any] = {"role": m["role"], "content": _text(m.get("content"))}
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {
                    "id": c.get("id") or "",
                    "type": "function",
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": c["function"]["arguments"]
                        if isinstance(c["function"].get("arguments"), str)
                        else orjson.dumps(c["function"].get("arguments") or {}).decode(),
                    },
                }
                for c in m["tool_calls"]
            ]
        if m["role"] == "tool" and m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def to_verifiers(task: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt": openai_messages(task["messages"]),
        "answer": target_text(task),
        # a JSON string: rows differ in shape (grading), which a columnar dataset cannot hold as dicts
        "info": orjson.dumps(info(task)).decode(),
        "task": "vigil-regression",
    }


def render(task: dict[str, Any], fmt: str) -> dict[str, Any]:
    if fmt == "inspect":
        return to_inspect(task)
    if fmt == "verifiers":
        return to_verifiers(task)
    return task
