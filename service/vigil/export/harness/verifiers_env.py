"""Vigil's ``verifiers`` export as a verifiers (v1) taskset: each line a task whose prompt is the conversation up
to the failure point; the agent's tools are served to the model under test (an MCP toolset built from the
export's tool definitions); the reward is 1 when the model's next turn breaks none of the task's checkable
criteria (:mod:`vigil.export.checks`), 0 when it does (a call to a forbidden tool, an unconfirmed write).

    vf-eval vigil.export.harness.verifiers_env --env.taskset.path failures.verifiers.jsonl \\
        --env.agent.harness.id null --model gpt-4o-mini --client.base-url ...

The tool calls are graded, not executed: each tool answers that it was not run.
"""

from __future__ import annotations

import inspect
import json
import keyword
from pathlib import Path
from typing import Any

import verifiers.v1 as vf

from vigil.export.checks import Turn, grade

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}


class VigilData(vf.TaskData):
    """One exported task: verifiers' fields (``id``, ``name``, ``prompt``, ``system_prompt``) and Vigil's."""

    tools: list[dict[str, Any]] = []
    criteria: list[dict[str, Any]] = []
    answer: str | None = None
    info: dict[str, Any] = {}


class VigilToolsetConfig(vf.ToolsetConfig):
    path: str = ""
    """The export file: its tool definitions are the tools served."""


def _offered(name: str, params: dict[str, Any]) -> Any:
    """A function MCP can describe (its signature follows the tool's JSON Schema parameters)."""
    # the stored schema is the agent's, as sent: read it defensively (no parameters when it is not an object)
    params = params if isinstance(params, dict) else {}
    found = params.get("properties")
    props: dict[Any, Any] = found if isinstance(found, dict) else {}
    listed = params.get("required")
    listed = [listed] if isinstance(listed, str) else listed if isinstance(listed, list) else []
    required = {r for r in listed if isinstance(r, str)}

    def tool(**kwargs: Any) -> str:
        return json.dumps({"not_executed": name, "arguments": kwargs})

    parameters = [
        inspect.Parameter(
            key,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=_JSON_TYPES.get(str(spec.get("type")), Any) if isinstance(spec, dict) else Any,
            **({} if key in required else {"default": None}),
        )
        for key, spec in props.items()
        # a Python signature takes neither non-identifiers nor keywords (``from``, ``class``): such a
        # parameter is left out of the signature, and the tool (and every tool after it) still registers
        if isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key)
    ]
    tool.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    tool.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": str}
    tool.__name__ = name
    return tool


class VigilToolset(vf.Toolset[VigilToolsetConfig]):
    TOOL_PREFIX = None  # the agent's own tool names

    def register(self, mcp: Any) -> None:
        seen: dict[str, dict[str, Any]] = {}
        for line in _lines(self.config.path):
            if line.strip():
                for t in json.loads(line).get("tools") or []:
                    seen.setdefault(t["function"]["name"], t["function"])
        for name, fn in seen.items():
            mcp.add_tool(
                _offered(name, fn.get("parameters") or {}), name=name, description=fn.get("description") or name
            )


class VigilTaskConfig(vf.TaskConfig):
    tools: VigilToolsetConfig = VigilToolsetConfig()


class VigilTask(vf.Task[VigilData, vf.State, VigilTaskConfig]):
    @classmethod
    def toolsets(cls, config: VigilTaskConfig) -> list[vf.Toolset]:
        return [VigilToolset(config.tools)] if config.tools.path else []

    @vf.reward(weight=1.0)
    async def criteria_met(self, trace: vf.Trace) -> float:
        """1 when no turn the model took after the prompt breaks one of the task's checkable criteria."""
        prompt = self.data.prompt if isinstance(self.data.prompt, list) else []
        replayed = len(prompt) + (1 if self.data.system_prompt else 0)
        history = [m.model_dump() for m in prompt]
        results = []
        for m in trace.messages[replayed:]:
            if m.role == "assistant":
                calls = [(c.name, _args(c.arguments)) for c in m.tool_calls or []]
                results.append(grade(self.data.criteria, Turn(m.content or "", calls), history))
            history.append(m.model_dump())
        if not results:
            return 0.0  # the model never answered
        broken = sorted({b for r in results for b in r["broken"]})
        trace.info["vigil"] = {"passed": not broken, "broken": broken, "turns": len(results)}
        return 0.0 if broken else 1.0


def _lines(path: str) -> list[bytes]:
    """The file's JSON lines, split at newlines only (``str.splitlines`` also splits at U+2028, U+0085 and
    others, which a JSON string may hold raw)."""
    return Path(path).read_bytes().split(b"\n")


def _args(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class VigilConfig(vf.TasksetConfig):
    path: str = ""
    """The ``vigil export --format verifiers`` file (JSON lines)."""
    task: VigilTaskConfig = VigilTaskConfig()


class VigilTaskset(vf.Taskset[VigilTask, VigilConfig]):
    def load(self) -> list[VigilTask]:
        if not self.config.path:
            raise ValueError("set --env.taskset.path to a `vigil export --format verifiers` file")
        task_config = self.config.task
        if not task_config.tools.path:
            task_config = task_config.model_copy(update={"tools": VigilToolsetConfig(path=self.config.path)})
        rows = [json.loads(line) for line in _lines(self.config.path) if line.strip()]
        return [VigilTask(VigilData.model_validate(row), task_config) for row in rows]


__all__ = ["VigilTaskset"]


if __name__ == "__main__":  # verifiers starts the toolset's MCP server as `python -m` this module
    VigilToolset.run()
