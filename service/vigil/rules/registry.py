"""The rule-type registry. A rule type is a pure function of a conversation view and its arguments.

Built-in types register here exactly as a user's plugin would::

    class MyArgs(RuleArgs):
        limit: int = 3

    @rule_type("my_rule", MyArgs)
    def my_rule(view: ConversationView, args: MyArgs) -> Iterator[Hit]:
        if len(view.tool_calls) > args.limit:
            yield Hit("too many tool calls", [Evidence(view.tool_calls[-1].message_index)])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from vigil.errors import VigilError
from vigil.rules.view import ConversationView


class RuleError(VigilError):
    """A rule type is unknown, registered twice, or failed on a conversation."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """Where a finding is visible: a message, and optionally a character span of its text."""

    message_index: int
    start: int | None = None
    end: int | None = None
    quote: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "message_index": self.message_index,
            "start": self.start,
            "end": self.end,
            "quote": self.quote,
        }


@dataclass(slots=True)
class Hit:
    """What a rule function yields: a message for humans, evidence, and optional machine details."""

    message: str
    evidence: list[Evidence] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


class RuleArgs(BaseModel):
    """Base of every rule type's argument model; unknown arguments are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


RuleFn = Callable[[ConversationView, Any], Iterable[Hit]]


@dataclass(frozen=True, slots=True)
class RuleType:
    name: str
    fn: RuleFn
    args_model: type[RuleArgs]
    doc: str


_REGISTRY: dict[str, RuleType] = {}


def rule_type(name: str, args_model: type[RuleArgs]) -> Callable[[RuleFn], RuleFn]:
    """Register ``fn`` as rule type ``name`` whose YAML ``args`` validate against ``args_model``."""

    def register(fn: RuleFn) -> RuleFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise RuleError(f"rule type {name!r} is already registered")
        _REGISTRY[name] = RuleType(name, fn, args_model, (fn.__doc__ or "").strip())
        return fn

    return register


def get_rule_type(name: str) -> RuleType:
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise RuleError(f"unknown rule type {name!r}; registered types: {known}") from None


def registered_rule_types() -> dict[str, RuleType]:
    return dict(_REGISTRY)


def load_plugins(names: str) -> None:
    """Import the modules ``VIGIL_RULE_PLUGINS`` names (comma-separated): each registers its rule types."""
    import importlib

    for name in (n.strip() for n in names.split(",")):
        if name:
            importlib.import_module(name)
