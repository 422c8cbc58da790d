"""τ²-bench results files: ``{info, tasks, simulations[]}``; the reward becomes ``task_success``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from vigil.ingest.decode import describe_validation_error
from vigil.ingest.importers.common import ImportError_, ItemError, listed, obj, reward
from vigil.schema import INCOMING, Conversation, ToolDef


def _domain(info: dict[str, Any]) -> str:
    return str(obj(info.get("environment_info")).get("domain_name") or "unknown")


def _message(m: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content")}
    if m.get("timestamp"):
        out["timestamp"] = m["timestamp"]
    if m["role"] == "tool":
        out["tool_call_id"] = m.get("id")
        out["is_error"] = bool(m.get("error"))
        if m.get("requestor"):
            out["requestor"] = m["requestor"]
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {"name": c["name"], "arguments": c.get("arguments") or {}},
                "requestor": c.get("requestor", "assistant"),
            }
            for c in m["tool_calls"]
        ]
    return out


def _tools(info: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The domain's tool definitions when the results file carries them (``environment_info.tool_defs``,
    by name; each an OpenAI function schema, or a tool with one under ``openai_schema``); None otherwise, or
    when one cannot be read (then no tools rather than some)."""
    raw = obj(info.get("environment_info")).get("tool_defs")
    values = list(raw.values()) if isinstance(raw, dict) else raw if isinstance(raw, list) else None
    if not values:
        return None
    out = []
    for v in values:
        spec = v.get("openai_schema", v) if isinstance(v, dict) else v
        try:
            out.append(ToolDef.model_validate(spec).model_dump(exclude_none=True))
        except ValidationError:
            return None
    return out


def _goal(task: dict[str, Any] | None) -> str | None:
    if not task:
        return None
    scenario = obj(task.get("user_scenario"))
    instr = scenario.get("instructions") if isinstance(scenario, dict) else None
    if isinstance(instr, dict):
        parts = [instr.get("reason_for_call"), instr.get("task_instructions")]
        return "\n".join(str(p) for p in parts if p) or None
    return str(instr) if instr else None


def convert(
    data: dict[str, Any],
    path: Path,
    agent_id: str | None,
    agent_version: str | None,
    include_policy: bool = True,
) -> Iterator[Conversation]:
    info = obj(data.get("info"))
    domain = _domain(info)
    model = obj(info.get("agent_info")).get("llm") or "unknown"
    policy = obj(info.get("environment_info")).get("policy")
    tasks = {str(t.get("id")): t for t in listed(data.get("tasks"), "tasks", "task objects") if isinstance(t, dict)}
    tools = _tools(info)
    seen: dict[str, int] = {}
    for n, sim in enumerate(data.get("simulations") or []):
        try:
            sid = str(sim["id"])
            if sid in seen:  # two runs under one id would be one conversation: the second "already stored"
                raise ItemError(f"id {sid!r} is simulation {seen[sid]}'s too; each run needs an id of its own")
            seen[sid] = n
            messages = [_message(m) for m in sim["messages"]]
            if include_policy and policy:
                messages.insert(0, {"role": "system", "content": policy})
            raw_reward = reward(obj(sim.get("reward_info")).get("reward"), "reward_info.reward")
            end = sim.get("end_time")
            cost = sim.get("agent_cost")
            duration = sim.get("duration")
            conv = Conversation.model_validate(
                {
                    "conversation_id": f"tau2:{domain}:{sim['id']}",
                    "revision": 1,
                    "status": "finished",
                    "agent_id": agent_id or f"tau2-{domain}",
                    "agent_version": agent_version or str(model),
                    "task_id": f"{domain}:{sim['task_id']}",
                    "started_at": sim.get("start_time"),
                    "ended_at": end,
                    "messages": messages,
                    "tools": tools,
                    "usage": {
                        "cost_usd": cost if isinstance(cost, int | float) else None,
                        "latency_ms": duration * 1000 if isinstance(duration, int | float) else None,
                    },
                    "metadata": {
                        "source": "tau2-bench",
                        "domain": domain,
                        "trial": sim.get("trial"),
                        "termination_reason": sim.get("termination_reason"),
                        "goal": _goal(tasks.get(str(sim["task_id"]))),
                    },
                    # no reward recorded means unknown, not failed: then there is no outcome at all
                    "outcomes": []
                    if raw_reward is None
                    else [
                        {
                            "type": "task_success",
                            "value": raw_reward,
                            "occurred_at": end or datetime.now(UTC).isoformat(),
                            "idempotency_key": f"tau2:{domain}:{sim['id']}:task_success",
                        }
                    ],
                },
                context=INCOMING,
            )
        except ItemError as exc:
            raise ImportError_(f"{path}: simulation {n}: {exc}") from None
        except ValidationError as exc:
            raise ImportError_(f"{path}: simulation {n}: {describe_validation_error(exc)}") from None
        except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:  # ValidationError is above
            raise ImportError_(f"{path}: simulation {n}: missing or malformed field {exc}") from None
        yield conv
