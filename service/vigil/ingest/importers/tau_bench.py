"""τ-bench trajectory files: a list of ``{task_id, reward, info, traj, trial}`` with OpenAI messages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from vigil.ingest.decode import describe_validation_error
from vigil.schema import INCOMING, Conversation


def _message(m: dict[str, Any]) -> dict[str, Any]:
    out = {k: m[k] for k in ("role", "content", "tool_calls", "tool_call_id", "name") if m.get(k) is not None}
    if out.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c.get("id"), "type": "function", "function": c.get("function") or {"name": c.get("name")}}
            for c in out["tool_calls"]
        ]
    return out


def convert(data: list[Any], path: Path, agent_id: str | None, agent_version: str | None) -> Iterator[Conversation]:
    from vigil.ingest.importers.common import ImportError_, ItemError, reward

    stem = path.stem
    env = next((e for e in ("airline", "retail") if e in stem), "unknown")
    for n, run in enumerate(data):
        try:
            trial = run.get("trial", 0)
            task = run["task_id"]
            messages = [_message(m) for m in run["traj"]]
            raw_reward = reward(run.get("reward"), "reward")
            yield Conversation.model_validate(
                {
                    "conversation_id": f"tau-bench:{stem}:{task}:{trial}",
                    "revision": 1,
                    "status": "finished",
                    "agent_id": agent_id or f"tau-bench-{env}",
                    "agent_version": agent_version or stem,
                    "task_id": f"{env}:{task}",
                    "messages": messages,
                    "metadata": {"source": "tau-bench", "trial": trial, "domain": env},
                    "outcomes": []
                    if raw_reward is None
                    else [
                        {
                            "type": "task_success",
                            "value": raw_reward,
                            "idempotency_key": f"tau-bench:{stem}:{task}:{trial}:task_success",
                        }
                    ],
                },
                context=INCOMING,
            )
        except ItemError as exc:
            raise ImportError_(f"{path}: item {n}: {exc}") from None
        except ValidationError as exc:
            raise ImportError_(f"{path}: item {n}: {describe_validation_error(exc)}") from None
        except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:  # ValidationError is above
            raise ImportError_(f"{path}: item {n}: missing or malformed field {exc}") from None
