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
from vigil.schema import dumps_exact, loads_exact

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


_JSON_TYPES = frozenset({"string", "integer", "number", "boolean", "array", "object", "null"})
_MAX_SCHEMA_DEPTH = 32  # deeper nesting becomes an untyped value: no model needs it to call the tool


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _schema(value: Any, depth: int = 0) -> dict[str, Any]:
    """A parameter's JSON Schema as Inspect's ``JSONSchema`` accepts it: each field it knows kept only when
    of the type it requires (an unknown ``type`` is dropped, leaving the value untyped; ``required`` keeps
    only names of known properties); fields it does not know are kept, Inspect ignores them."""
    if not isinstance(value, dict) or depth > _MAX_SCHEMA_DEPTH:
        return {}
    out = {k: v for k, v in value.items() if isinstance(k, str)}
    kind = out.pop("type", None)
    if isinstance(kind, str) and kind in _JSON_TYPES:
        out["type"] = kind
    elif isinstance(kind, list) and (kinds := [t for t in kind if isinstance(t, str) and t in _JSON_TYPES]):
        out["type"] = list(dict.fromkeys(kinds))
    for key in ("format", "description", "pattern"):
        if key in out and not isinstance(out[key], str):
            del out[key]
    for key in ("enum", "examples"):
        if key in out and not isinstance(out[key], list):
            del out[key]
    for key in ("minLength", "maxLength"):
        if key in out and not (isinstance(out[key], int) and not isinstance(out[key], bool)):
            del out[key]
    for key in ("minimum", "maximum"):
        if key in out and not _number(out[key]):
            del out[key]
    if "items" in out:
        if isinstance(out["items"], dict):
            out["items"] = _schema(out["items"], depth + 1)
        else:
            del out["items"]
    if "properties" in out:
        if isinstance(out["properties"], dict):
            out["properties"] = {k: _schema(v, depth + 1) for k, v in out["properties"].items() if isinstance(k, str)}
        else:
            del out["properties"]
    if "anyOf" in out:
        anyof = out["anyOf"]
        out["anyOf"] = [_schema(v, depth + 1) for v in anyof if isinstance(v, dict)] if isinstance(anyof, list) else []
        if not out["anyOf"]:
            del out["anyOf"]
    if "additionalProperties" in out:
        extra = out["additionalProperties"]
        if isinstance(extra, dict):
            out["additionalProperties"] = _schema(extra, depth + 1)
        elif not isinstance(extra, bool):
            del out["additionalProperties"]
    if "required" in out:
        required = _required(out["required"], out.get("properties") or {})
        if required:
            out["required"] = required
        else:
            del out["required"]
    return out


def _required(value: Any, properties: dict[str, Any]) -> list[str]:
    """``required`` as a list of known property names (a single name given as a string counts as one)."""
    names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return list(dict.fromkeys(n for n in names if isinstance(n, str) and n in properties))


def inspect_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI function definitions as Inspect's tool definitions (``ToolInfo``: name, description, parameters).

    The stored schemas are the agent's, as sent: parameters are made what Inspect's ``ToolParams`` accepts
    (see :func:`_schema`), so the sample loads and the solver can offer them. A tool whose ``properties`` is
    not an object (a list, a string) keeps its name and description with no parameters rather than being
    dropped: the task stays usable, since a criterion about calling that tool (``must_not_call``) still
    needs the tool offered to the model under test.
    """
    out = []
    for t in tools:
        fn = t["function"]
        raw = fn.get("parameters")
        raw = raw if isinstance(raw, dict) else {}
        props = raw.get("properties") if isinstance(raw.get("properties"), dict) else {}
        params = _schema({**raw, "properties": props})
        params["type"] = "object"  # ToolParams accepts nothing else
        # Inspect requires a description of every parameter; tools seen only in calls have none
        params["properties"] = {
            k: {**v, "description": v.get("description") or k} for k, v in params["properties"].items()
        }
        params["required"] = _required(raw.get("required"), params["properties"])
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
        value = loads_exact(raw or "{}")
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
    for i, m in enumerate(messages):
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
                        else dumps_exact(c["function"].get("arguments") or {}),
                    },
                }
                for c in m["tool_calls"]
            ]
        if m["role"] == "tool":
            # a tool result must name its call: one that does not (the agent's log lost it) gets an id of
            # its own, as verifiers refuses the whole file over one tool message without it
            msg["tool_call_id"] = m.get("tool_call_id") or f"vigil-unnamed-call-{i}"
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
