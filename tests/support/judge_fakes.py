"""The judge tests' only fake: a scripted model at the litellm boundary, plus a judge folder builder."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from vigil.judge.client import LiteLLMClient, Reply, _litellm

PASS = '{"verdict": "pass", "score": 0.9, "categories": [], "rationale": "resolved"}'
FAIL = '{"verdict": "fail", "score": 0.2, "categories": ["wrong_action"], "rationale": "cancelled it"}'

Item = str | float | BaseException | Callable[[list[dict[str, str]]], Any]


class Scripted:
    """Answers from ``script`` in order, then ``default``.

    An item is a reply text, an exception to raise, a function of the messages, or a float: hang that
    many seconds (to hit the judge's timeout). With ``via_litellm`` every item goes through
    ``litellm.acompletion(mock_response=...)``, so errors are litellm's own exception types and costs
    come from litellm's price list.
    """

    def __init__(
        self,
        script: list[Item] | None = None,
        default: Item = PASS,
        delay: float = 0.0,
        via_litellm: bool = False,
        cost: float | None = 0.001,
    ) -> None:
        self.script = list(script or [])
        self.default = default
        self.delay = delay
        self.via_litellm = via_litellm
        self.cost = cost
        self.calls: list[tuple[float, str, list[dict[str, str]], dict[str, Any]]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.litellm = LiteLLMClient() if via_litellm else None

    async def complete(self, model: str, messages: list[dict[str, str]], **params: Any) -> Reply:
        self.calls.append((time.monotonic(), model, messages, params))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            item = self.script.pop(0) if self.script else self.default
            if isinstance(item, float):
                await asyncio.sleep(item)
                item = self.default
            if callable(item) and not isinstance(item, BaseException):
                item = item(messages)
            if self.litellm is not None:
                return await self.litellm.complete(model, messages, mock_response=item, **params)
            if isinstance(item, BaseException):
                raise item
            return Reply(item, 120, 30, self.cost)
        finally:
            self.in_flight -= 1


def litellm_error(name: str, status: int | None = None) -> BaseException:
    """One of litellm's exception classes, as a provider would raise it."""
    lm = _litellm()
    cls = getattr(lm, name)
    kwargs: dict[str, Any] = {"message": f"scripted {name}", "llm_provider": "openai", "model": "gpt-4o-mini"}
    if "response" in inspect.signature(cls.__init__).parameters:
        request = httpx.Request("POST", "https://provider.invalid/v1/chat/completions")
        kwargs["response"] = httpx.Response(status or 403, request=request)
    return cls(**kwargs)


JUDGE_YAML: dict[str, Any] = {
    "version": "3",
    "description": "test judge",
    "model": "openai/gpt-4o-mini",
    "temperature": 0,
    "max_tokens": 200,
    "timeout_seconds": 5,
    "categories": ["wrong_action", "policy_violation", "unconfirmed_write", "hallucination", "other"],
    "sampling": {"rate": 0.02, "salt": "t-v1", "always_judge_severity": "high"},
    "limits": {"rpm": 100_000, "concurrency": 64, "daily_budget_usd": 100.0},
    "offline": {"category_map": {"forbidden_tool": "wrong_action", "require_confirmation": "unconfirmed_write"}},
}
PROMPT = "# Rubric\nGrade the agent.\n\n{{transcript}}\n"


def judge_dir(root: Path, name: str = "tj", prompt: str = PROMPT, **overrides: Any) -> Path:
    """Write ``root/<name>/judge.yaml`` (JUDGE_YAML, ``overrides`` merged one level deep) and prompt.md."""
    spec = orjson.loads(orjson.dumps(JUDGE_YAML))
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(spec.get(k), dict):
            spec[k].update(v)
        else:
            spec[k] = v
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "judge.yaml").write_text(yaml.safe_dump(spec))
    (folder / "prompt.md").write_text(prompt)
    return root
