"""LangChain / LangSmith run trees: a root run with its ``child_runs`` (as ``read_run(...,
load_child_runs=True)`` and ``RunTree`` give them), or runs listed flat with ``parent_run_id`` (as
``list_runs`` exports them), one conversation per root run.

Messages come from the ``llm`` runs: their ``inputs.messages`` (LangChain's serialized messages, the
``{"type": "human", ...}`` dicts, or OpenAI chat messages from wrapped clients) and their output
(``generations``, ``choices`` or ``messages``); each call's input continues the previous one's. A root
chain whose ``outputs.messages`` hold more (a LangGraph agent's final state) gives the whole history.
Tool calls are the AI messages' ``tool_calls``; every ``tool`` run of the agent is a call that ran,
joined to the call it answers (by ``extra.tool_call_id``, else by tool name) or added with its result when
no model's messages show it, and marks its result failed when it failed. The agent's tool runs are those
no other tool run contains: an agent used as a tool (a tool run whose work calls a model) is a
conversation of its own. The tools bound to the model (``extra.invocation_params.tools``) are the tools
offered. A message type Vigil does not know is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vigil.ingest.importers.common import (
    ItemError,
    envelope,
    join_executions,
    listed,
    number,
    obj,
    text_of,
    tool_defs,
    validated,
)
from vigil.ingest.importers.openai_agents import _merge
from vigil.schema import Conversation

NAME = "langsmith"
TITLE = "LangChain/LangSmith run trees (runs with child_runs or parent_run_id, inputs/outputs messages)"

ROLES = {
    "human": "user",
    "user": "user",
    "ai": "assistant",
    "assistant": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}
CLASSES = {
    "HumanMessage": "human",
    "HumanMessageChunk": "human",
    "AIMessage": "ai",
    "AIMessageChunk": "ai",
    "SystemMessage": "system",
    "SystemMessageChunk": "system",
    "ToolMessage": "tool",
    "ToolMessageChunk": "tool",
    "FunctionMessage": "function",
    "ChatMessage": "chat",
}


def _runs(data: Any) -> list[Any] | None:
    if isinstance(data, dict) and isinstance(data.get("runs"), list):
        return list(data["runs"])
    return data if isinstance(data, list) else [data]


def sniff(data: Any) -> bool:
    runs = _runs(data)
    return bool(runs) and all(
        isinstance(r, dict) and isinstance(r.get("run_type"), str) and ("inputs" in r or "outputs" in r)
        for r in runs or []
    )


def message(raw: Any, where: str) -> dict[str, Any]:
    """One LangChain message (serialized, dumped or OpenAI-shaped) in Vigil's shape."""
    if not isinstance(raw, dict):
        if isinstance(raw, list) and len(raw) == 2 and isinstance(raw[0], str):  # ("human", "text") tuples
            raw = {"type": raw[0], "content": raw[1]}
        elif isinstance(raw, str):
            raw = {"type": "human", "content": raw}
        else:
            raise ItemError(f"{where}: expected a message")
    kind: Any
    if raw.get("lc") == 1 and raw.get("type") == "constructor":
        ids = raw.get("id")
        cls = ids[-1] if isinstance(ids, list) and ids and isinstance(ids[-1], str) else repr(ids)
        kind, fields = CLASSES.get(cls), raw.get("kwargs") or {}
        if kind is None:
            raise ItemError(f"{where}: a message of class {cls!r} is not one Vigil reads")
    elif "role" in raw and "type" not in raw:
        kind, fields = raw["role"], raw
    elif isinstance(raw.get("data"), dict) and "type" in raw:  # messages_to_dict
        kind, fields = raw["type"], raw["data"]
    else:
        kind, fields = raw.get("type"), raw
    if not isinstance(fields, dict):
        raise ItemError(f"{where}: expected a message object")
    if kind == "chat":
        kind = fields.get("role")
    role = ROLES.get(kind) if isinstance(kind, str) else None
    if role is None:
        raise ItemError(f"{where}: a message of type {kind!r} is not one Vigil reads")
    content = fields.get("content")
    calls = listed(fields.get("tool_calls") or None, f"{where}.tool_calls", "tool calls")
    out: dict[str, Any] = {"role": role}
    if isinstance(content, list):  # content blocks; tool_use blocks repeat tool_calls
        texts = [b for b in content if isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text")]
        out["content"] = text_of(texts) if texts else None
    else:
        out["content"] = content if isinstance(content, str) or content is None else text_of(content)
    if role == "assistant":
        if not calls:
            calls = listed(
                obj(fields.get("additional_kwargs")).get("tool_calls") or None,
                f"{where}.additional_kwargs.tool_calls",
                "tool calls",
            )
        if calls:
            out["tool_calls"] = [_call(c, f"{where}.tool_calls.{i}") for i, c in enumerate(calls)]
        finish = obj(fields.get("response_metadata")).get("finish_reason") or (
            obj(fields.get("response_metadata")).get("stop_reason")
        )
        if finish in ("length", "max_tokens"):
            out["finish_reason"] = "length"
    if role == "tool":
        out["tool_call_id"] = fields.get("tool_call_id")
        out["is_error"] = fields.get("status") == "error"
        if fields.get("name"):
            out["name"] = fields["name"]
    return out


def _call(c: Any, where: str) -> dict[str, Any]:
    if not isinstance(c, dict):
        raise ItemError(f"{where}: expected a tool call")
    if isinstance(c.get("function"), dict):  # OpenAI-shaped
        return {"id": c.get("id"), "type": "function", "function": c["function"]}
    return {
        "id": c.get("id"),
        "type": "function",
        "function": {"name": c.get("name"), "arguments": c.get("args") or {}},
    }


def _llm_turn(run: dict[str, Any], where: str) -> list[dict[str, Any]]:
    inputs, outputs = obj(run.get("inputs")), obj(run.get("outputs"))
    raw = inputs.get("messages")
    if raw and isinstance(raw, list) and isinstance(raw[0], list):  # chat models log a batch: one list per prompt
        if len(raw) > 1:
            raise ItemError(f"{where}: a batch of {len(raw)} prompts; Vigil reads one conversation per call")
        raw = raw[0]
    turn: list[dict[str, Any]] = []
    if isinstance(raw, list):
        turn = [message(m, f"{where}.inputs.messages.{i}") for i, m in enumerate(raw)]
    elif isinstance(inputs.get("prompts"), list) and inputs["prompts"]:
        turn = [{"role": "user", "content": str(inputs["prompts"][0])}]
    gens = outputs.get("generations")
    if isinstance(gens, list) and gens:
        first = gens[0][0] if isinstance(gens[0], list) and gens[0] else gens[0]
        if isinstance(first, dict):
            if first.get("message") is not None:
                turn.append(message(first["message"], f"{where}.outputs.generations.0"))
            elif first.get("text") is not None:
                turn.append({"role": "assistant", "content": first["text"]})
    elif isinstance(outputs.get("choices"), list) and outputs["choices"]:
        turn.append(message(outputs["choices"][0].get("message"), f"{where}.outputs.choices.0.message"))
    elif isinstance(outputs.get("messages"), list):
        turn += [message(m, f"{where}.outputs.messages.{i}") for i, m in enumerate(outputs["messages"])]
    elif outputs.get("output") is not None and isinstance(outputs["output"], dict):
        turn.append(message(outputs["output"], f"{where}.outputs.output"))
    return turn


def _walk(run: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``run`` and the runs of its agent below it, in the order they ran: a ``tool`` run below it is one of
    the agent's calls, and what runs inside that tool (an agent used as a tool, its model and its tools) is
    the tool's own work, not the agent's."""
    yield run
    where = f"run {run.get('id')}.child_runs"
    children = [c for c in listed(run.get("child_runs"), where, "runs") if isinstance(c, dict)]
    for child in sorted(children, key=lambda c: str(c.get("dotted_order") or c.get("start_time") or "")):
        if child.get("run_type") == "tool":
            yield child
        else:
            yield from _walk(child)


def _is_model(run: dict[str, Any]) -> bool:
    return run.get("run_type") in ("llm", "chat_model")


def agents(root: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
    """``root``, then every ``tool`` run below it whose own work calls a model (an agent used as a tool),
    each with the agent whose call it is: each is one conversation, its tool runs the calls of that agent
    alone."""
    yield root, None
    yield from _nested(root, root)


def _nested(run: dict[str, Any], caller: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None]]:
    for inner in _walk(run):
        if inner is not run and inner.get("run_type") == "tool":
            if any(_is_model(r) for r in _walk(inner)):
                yield inner, caller
                yield from _nested(inner, inner)
            else:
                yield from _nested(inner, caller)


def _execution(run: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The call a ``tool`` run made and its result: the call id is the model's (``extra.tool_call_id``, set
    when the tool was given the model's tool call) or else the run's own id."""
    tool_call_id = obj(run.get("extra")).get("tool_call_id")
    call_id = tool_call_id if isinstance(tool_call_id, str) else str(run.get("id"))
    inputs = obj(run.get("inputs"))
    args = inputs["input"] if list(inputs) == ["input"] else inputs  # a one-string tool logs {"input": ...}
    fn = {"name": run.get("name"), "arguments": args if isinstance(args, dict | str) else str(args)}
    outputs = obj(run.get("outputs"))
    out = outputs.get("output", outputs or None)
    error = run.get("error")
    failed = bool(error)
    if error:
        content: Any = error if isinstance(error, str) else text_of(error)
    elif _is_tool_message(out):
        result = message(out, f"{where}.outputs.output")
        content, failed = result.get("content"), bool(result.get("is_error"))
    else:
        content = text_of(out)
    call = {"id": call_id, "type": "function", "function": fn}
    return call, {"role": "tool", "tool_call_id": call_id, "content": content, "is_error": failed}


def _is_tool_message(out: Any) -> bool:
    """A tool's output that is a ``ToolMessage`` (a tool given the model's tool call returns one)."""
    if not isinstance(out, dict):
        return False
    ids = out.get("id")
    if out.get("lc") == 1 and isinstance(ids, list) and ids:
        return ids[-1] in ("ToolMessage", "ToolMessageChunk")
    return out.get("type") == "tool" and "tool_call_id" in out


def _tree(root: dict[str, Any], where: str) -> dict[str, Any]:
    history: list[dict[str, Any]] = []
    tools: dict[str, dict[str, Any]] = {}
    tool_runs: list[dict[str, Any]] = []
    prompt = completion = 0
    saw_usage = False
    runs = list(_walk(root))
    for run in runs:
        at = f"{where} run {run.get('id')}"
        if _is_model(run):
            turn = _llm_turn(run, at)
            if turn:
                history = _merge(history, turn)
            params = obj(obj(run.get("extra")).get("invocation_params"))
            bound = params.get("tools") or params.get("functions") or obj(run.get("inputs")).get("tools")
            for t in tool_defs(bound, f"{at}.tools") or []:
                tools.setdefault(t["name"], t)
            if run.get("prompt_tokens") is not None or run.get("completion_tokens") is not None:
                saw_usage = True
                prompt += number(run.get("prompt_tokens"))
                completion += number(run.get("completion_tokens"))
        elif run.get("run_type") == "tool" and run is not root:
            tool_runs.append(run)
    if root.get("run_type") == "tool" and not any(_is_model(r) for r in runs):
        tool_runs = [root]  # a tool run alone is one call; the tool runs inside it are its own work
    outputs = obj(root.get("outputs"))
    if root.get("run_type") == "chain" and isinstance(outputs.get("messages"), list):
        final = [message(m, f"{where}.outputs.messages.{i}") for i, m in enumerate(outputs["messages"])]
        if len(final) >= len(history):
            history = _merge(history, final) if history else final
    # every tool run is a call that ran: one the model's messages show is joined to it (a failure often
    # reaches the model as an ordinary result text), one they do not (the last step of a run that stopped
    # at its tool, or a model whose output was not recorded) is added with its result
    executions = [_execution(run, f"{where} run {run.get('id')}") for run in tool_runs]
    history = join_executions(history, executions)
    if not history:
        raise ItemError(f"{where}: no llm run with messages and no tool run: the run tree holds no conversation")
    extra = obj(root.get("extra"))
    meta = obj(extra.get("metadata"))
    if root.get("total_tokens") is not None and not saw_usage:
        saw_usage, prompt, completion = (
            True,
            number(root.get("prompt_tokens")),
            number(root.get("completion_tokens")),
        )
    return {
        "messages": history,
        "tools": list(tools.values()) if tools else None,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion} if saw_usage else None,
        "metadata": {
            "source": "langsmith",
            "run_id": root.get("id"),
            "trace_id": root.get("trace_id") or root.get("id"),
            "run_name": root.get("name"),
            "session_id": meta.get("thread_id") or meta.get("session_id") or meta.get("conversation_id"),
            "tags": root.get("tags") or None,
            "error": root.get("error"),
        },
    }


def _roots(runs: list[Any]) -> list[dict[str, Any]]:
    """Root runs with their children attached (flat lists are linked by ``parent_run_id``)."""
    by_id: dict[str, dict[str, Any]] = {}
    for n, r in enumerate(runs):
        if not isinstance(r, dict) or not isinstance(r.get("run_type"), str):
            raise ItemError(f"item {n}: expected a run (with run_type)")
        key = str(r.get("id") or f"#{n}")
        if key in by_id and by_id[key] != r:  # the same run listed twice is read once; two runs are not one
            raise ItemError(f"item {n}: run id {key!r} is also the id of another run; each run needs its own id")
        by_id[key] = dict(r)
    roots = []
    children: dict[str, list[dict[str, Any]]] = {}
    for r in by_id.values():
        parent = r.get("parent_run_id")
        if parent is not None and str(parent) in by_id:
            children.setdefault(str(parent), []).append(r)
        else:
            roots.append(r)
    # attached once per parent: appending one child at a time copied the list each time, quadratic in a
    # parent's children (a root with 200,000 tool runs, 13.7 MB, took 128 s of CPU)
    for parent, kids in children.items():
        p = by_id[parent]
        p["child_runs"] = [*listed(p.get("child_runs"), f"run {parent}.child_runs", "runs"), *kids]
    # runs whose parent_run_id links go round in a circle reach no root: say so instead of dropping them
    reached: set[int] = set()
    stack = list(roots)
    while stack:
        run = stack.pop()
        if id(run) in reached:
            continue
        reached.add(id(run))
        kids = children.get(str(run["id"]), []) if run.get("id") else []  # a run without an id is no parent
        stack.extend(c for c in kids if id(c) not in reached)
    lost = [k for k, r in by_id.items() if id(r) not in reached]
    if lost:
        raise ItemError(
            f"{len(lost)} run(s) reach no root run, their parent_run_id links forming a cycle: "
            + ", ".join(repr(k) for k in lost[:5])
            + (" ..." if len(lost) > 5 else "")
        )
    return roots


def convert(data: Any, path: Path, agent_id: str | None, agent_version: str | None) -> Iterator[Conversation]:
    for tree in _roots(_runs(data) or []):
        for root, caller in agents(tree):
            rid = str(root.get("id")) if root.get("id") else None
            t = _tree(root, f"run {rid}" if rid else "a run without an id")
            if caller is not None:  # an agent used as a tool: the call it answers, in its caller's conversation
                t["metadata"]["caller_run_id"] = caller.get("id")
                t["metadata"]["tool_call_id"] = _execution(root, f"run {rid}")[0]["id"]
            record: dict[str, Any] = {"usage": t["usage"], "status": "finished"}
            if root.get("start_time"):
                record["started_at"] = root["start_time"]
            if root.get("end_time"):
                record["ended_at"] = root["end_time"]
            else:
                record["status"] = "in_progress"
            doc = envelope(
                {k: v for k, v in record.items() if v is not None},
                path,
                "langsmith",
                t["messages"],
                agent_id,
                agent_version,
                tools=t["tools"],
                metadata=t["metadata"],
                default_id=f"langsmith:{rid}" if rid else None,  # without an id: one derived from its messages
                default_agent=str(root.get("name") or path.stem),
            )
            yield validated(doc, f"run {rid}" if rid else "a run without an id")
