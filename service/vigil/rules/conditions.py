"""Conditions rule arguments can put on a value: a tool result's field or a tool call's argument.

A condition holds when every test it gives passes: ``values`` (one of), ``not_values`` (none of),
``less_than`` / ``greater_than`` (numbers, or strings such as ISO dates, which compare in order).
A value that is absent never satisfies a condition: Vigil flags what it saw, not what it guessed.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from pydantic import Field, field_validator, model_validator

from vigil.rules.registry import RuleArgs
from vigil.rules.view import CallSite, ConversationView

MISSING: Any = object()


def field_value(obj: Any, path: str) -> Any:
    """Value at a dotted path of parsed JSON (``a.b.0.c``); a missing key gives ``MISSING``."""
    for part in path.split("."):
        if isinstance(obj, dict):
            obj = obj.get(part, MISSING)
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return MISSING
        if obj is MISSING:
            return obj
    return obj


def _bound(v: Any) -> Any:
    # YAML reads unquoted 2024-05-14 as a date; tool results carry ISO strings.
    if isinstance(v, date):
        return v.isoformat()
    if v is None or isinstance(v, int | float | str) and not isinstance(v, bool):
        return v
    raise ValueError("must be a number or a string")


def _ordered(value: Any, bound: Any) -> tuple[Any, Any] | None:
    """The pair made comparable (numeric strings become numbers next to a number), or None."""
    if isinstance(bound, int | float):
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                return None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value, bound
        return None
    return (value, bound) if isinstance(value, str) else None


class ValueTest(RuleArgs):
    values: list[Any] | None = Field(default=None, description="The value is one of these.")
    not_values: list[Any] | None = Field(default=None, description="The value is none of these.")
    less_than: Any = Field(default=None, description="The value is below this number or string.")
    greater_than: Any = Field(default=None, description="The value is above this number or string.")

    @field_validator("less_than", "greater_than", mode="before")
    @classmethod
    def _comparable(cls, v: Any) -> Any:
        return _bound(v)

    @model_validator(mode="after")
    def _some_test(self) -> ValueTest:
        if self.values is None and self.not_values is None and self.less_than is None and self.greater_than is None:
            raise ValueError("give at least one of values, not_values, less_than, greater_than")
        if self.values is not None and not self.values:
            raise ValueError("values must not be empty")
        return self

    def test(self, value: Any) -> bool:
        if value is MISSING:
            return False
        if self.values is not None and value not in self.values:
            return False
        if self.not_values is not None and value in self.not_values:
            return False
        for bound, below in ((self.less_than, True), (self.greater_than, False)):
            if bound is None:
                continue
            pair = _ordered(value, bound)
            if pair is None or not (pair[0] < pair[1] if below else pair[0] > pair[1]):
                return False
        return True

    def describe(self, name: str) -> str:
        parts = []
        if self.values is not None:
            parts.append(f"{name} in {self.values}")
        if self.not_values is not None:
            parts.append(f"{name} not in {self.not_values}")
        if self.less_than is not None:
            parts.append(f"{name} < {self.less_than}")
        if self.greater_than is not None:
            parts.append(f"{name} > {self.greater_than}")
        return " and ".join(parts)


class ResultCondition(ValueTest):
    """An earlier tool result whose ``field`` passes the tests (by default the latest such result)."""

    field: str
    result_of: list[str] = Field(default_factory=list, description="Only results of these tools.")
    join_on: str | None = Field(
        default=None,
        description="Call argument that must equal the result's field of the same name (e.g. order_id).",
    )
    latest: bool = Field(
        default=True,
        description="Test only the most recent result showing the field (the state as last seen); "
        "false: any earlier result.",
    )


class ArgCondition(ValueTest):
    """An argument of the call itself (dotted path) that passes the tests."""

    arg: str


def result_condition_met(view: ConversationView, site: CallSite, cond: ResultCondition) -> int | None:
    """Message index of the tool result that makes ``cond`` hold before ``site``, or None."""
    join_value: Any = MISSING
    if cond.join_on:
        join_value = site.args.get(cond.join_on, MISSING)
        if join_value is MISSING:
            return None
        join_value = str(join_value)
    last: tuple[Any, int] | None = None
    for earlier in view.tool_calls:
        if earlier.message_index >= site.message_index:
            break
        if cond.result_of and earlier.name not in cond.result_of:
            continue
        result = view.result_for(earlier)
        if result is None or result.message_index >= site.message_index or result.is_error:
            continue
        data = result.parsed()
        if data is None:
            continue
        if cond.join_on and str(field_value(data, cond.join_on)) != join_value:
            continue
        value = field_value(data, cond.field)
        if value is MISSING:
            continue
        if cond.latest:
            last = (value, result.message_index)
        elif cond.test(value):
            return result.message_index
    if last is not None and cond.test(last[0]):
        return last[1]
    return None


def arg_condition_met(site: CallSite, cond: ArgCondition) -> bool:
    return cond.test(field_value(site.args, cond.arg))
