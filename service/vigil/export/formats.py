"""The native task in the dataset shapes offline harnesses load.

- ``inspect``: Inspect AI's JSON-lines dataset fields ``id``, ``input`` (a list of chat messages in
  Inspect's own shape: tool calls with parsed ``arguments``, tool results with ``function`` and ``error``),
  ``target`` (the reviewer's expected behaviour, else the grading criteria as sentences) and ``metadata``
  (the native task's failure, grading, source and ``tools`` as Inspect tool definitions: name,
  description, JSON Schema parameters), loadable with ``inspect_ai.dataset.json_dataset`` and run by the
  task in :mod:`vigil.export.harness.inspect_task`, which offers the tools to the model under test.
- ``verifiers``: one task per line in the fields of the verifiers (v1) ``TaskData`` the taskset in
  :mod:`vigil.export.harness.verifiers_env` loads: ``id``, ``name``, ``prompt`` (verifiers messages:
  tool calls flat, ``{id, type, name, arguments}``), ``system_prompt``, plus ``tools`` (OpenAI function
  definitions), ``criteria`` (the grading), ``answer`` (the expected behaviour) and ``info``.
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
        "tools": inspect_tools(task["tools"]),
        "tools_source": task["tools_source"],
        "duplicates": task["duplicates"],
    }


def inspect_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI function definitions as Inspect's tool definitions (``ToolInfo``: name, description, parameters)."""
    out = []
    for t in tools:
        fn = t["function"]
        params = dict(fn.get("parameters") or {"type": "object", "properties": {}})
        # Inspect requires a description of every parameter; tools seen only in calls have none
        params["properties"] = {
            k: {**v, "description": v.get("description") or k}
            for k, v in (params.get("properties") or {}).items()
            if isinstance(v, dict)
        }
        out.append({"name": fn["name"], "description": fn.get("description") or fn["name"], "parameters": params})
    return out


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


def verifiers_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages in verifiers' own shape (tool calls flat: id, type, name, arguments as a string)."""
    out = []
    for m in openai_messages(messages):
        if m.get("tool_calls"):
            m = {
                **m,
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "name": c["function"]["name"],
                        "arguments": c["function"]["arguments"],
                    }
                    for c in m["tool_calls"]
                ],
            }
        out.append(m)
    return out


def to_verifiers(task: dict[str, Any]) -> dict[str, Any]:
    messages = verifiers_messages(task["messages"])
    system = [m["content"] for m in messages if m["role"] == "system" and m["content"]]
    return {
        "id": task["task_id"],
        "name": f"{task['failure']['category']}: {task['source']['conversation_id']}"[:200],
        "prompt": [m for m in messages if m["role"] != "system"],
        "system_prompt": "\n\n".join(system) or None,
        "tools": task["tools"],
        "criteria": task["grading"],
        "answer": target_text(task),
        "info": info(task),
    }


def render(task: dict[str, Any], fmt: str) -> dict[str, Any]:
    if fmt == "inspect":
        return to_inspect(task)
    if fmt == "verifiers":
        return to_verifiers(task)
    return task
