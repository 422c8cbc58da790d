"""Built-in rule types about tool use: what was called, in which order, with whose consent."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pydantic import Field, model_validator

from .registry import Evidence, Hit, RuleArgs, rule_type
from .view import CallSite, ConversationView

_MISSING = object()


def field_value(obj: Any, path: str) -> Any:
    """Value at a dotted path of parsed JSON (``a.b.0.c``); a missing key gives ``_MISSING``."""
    for part in path.split("."):
        if isinstance(obj, dict):
            obj = obj.get(part, _MISSING)
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return _MISSING
        if obj is _MISSING:
            return obj
    return obj


class ResultCondition(RuleArgs):
    """An earlier tool result whose ``field`` has one of ``values``."""

    field: str
    values: list[Any] = Field(min_length=1)
    result_of: list[str] = Field(default_factory=list, description="Only results of these tools.")
    join_on: str | None = Field(
        default=None,
        description="Call argument that must equal the result's field of the same name (e.g. order_id).",
    )


class ForbiddenToolArgs(RuleArgs):
    tools: list[str] = Field(min_length=1)
    when: ResultCondition | None = None


def _condition_met(view: ConversationView, site: CallSite, cond: ResultCondition) -> Evidence | None:
    wanted = cond.values
    join_value = site.args.get(cond.join_on, _MISSING) if cond.join_on else _MISSING
    for earlier in view.tool_calls:
        if earlier.message_index >= site.message_index:
            break
        if cond.result_of and earlier.name not in cond.result_of:
            continue
        result = view.result_for(earlier)
        if result is None:
            continue
        data = result.parsed()
        if data is None:
            continue
        if cond.join_on and field_value(data, cond.join_on) != join_value:
            continue
        if field_value(data, cond.field) in wanted:
            return Evidence(result.message_index)
    return None


@rule_type("forbidden_tool", ForbiddenToolArgs)
def forbidden_tool(view: ConversationView, args: ForbiddenToolArgs) -> Iterator[Hit]:
    """The agent must never call these tools (optionally: when an earlier result shows a state)."""
    for site in view.tool_calls:
        if site.name not in args.tools:
            continue
        if args.when is None:
            yield Hit(f"called forbidden tool {site.name}", [Evidence(site.message_index)], {"tool": site.name})
            continue
        cause = _condition_met(view, site, args.when)
        if cause is not None:
            yield Hit(
                f"called {site.name} although {args.when.field} was one of {args.when.values}",
                [Evidence(site.message_index), cause],
                {"tool": site.name, "field": args.when.field},
            )


class ToolOrderArgs(RuleArgs):
    before: list[str] = Field(min_length=1, description="One of these must be called first...")
    after: list[str] = Field(min_length=1, description="...before any of these.")
    same_arg: str | None = Field(default=None, description="Match calls on this argument's value.")


@rule_type("tool_order", ToolOrderArgs)
def tool_order(view: ConversationView, args: ToolOrderArgs) -> Iterator[Hit]:
    """Tool X must happen before tool Y (optionally for the same argument value)."""
    seen_any = False
    seen_values: set[str] = set()
    for site in view.tool_calls:
        if site.name in args.before:
            seen_any = True
            if args.same_arg:
                seen_values.add(str(site.args.get(args.same_arg)))
        elif site.name in args.after:
            ok = str(site.args.get(args.same_arg)) in seen_values if args.same_arg else seen_any
            if not ok:
                yield Hit(
                    f"{site.name} called before any of {', '.join(args.before)}",
                    [Evidence(site.message_index)],
                    {"tool": site.name},
                )


DEFAULT_YES = (
    r"\b(yes|yeah|yep|yup|sure|confirm(ed)?|correct|go ahead|proceed|please do|do it|that'?s right|"
    r"ok(ay)?|absolutely|affirmative|sounds good|i agree|agreed)\b"
)
DEFAULT_NO = r"\b(no|nope|don'?t|do not|cancel that|stop|wait|hold on)\b"


class RequireConfirmationArgs(RuleArgs):
    tools: list[str] = Field(min_length=1, description="Consequential write tools.")
    yes_pattern: str = DEFAULT_YES
    no_pattern: str = DEFAULT_NO
    one_write_per_confirmation: bool = Field(
        default=False, description="Each confirmation authorises a single write call."
    )

    @model_validator(mode="after")
    def _compile(self) -> RequireConfirmationArgs:
        for p in (self.yes_pattern, self.no_pattern):
            re.compile(p)
        return self


_COMPILED: dict[str, re.Pattern[str]] = {}


def compiled(pattern: str, flags: int = re.IGNORECASE) -> re.Pattern[str]:
    key = f"{flags}:{pattern}"
    rx = _COMPILED.get(key)
    if rx is None:
        rx = _COMPILED[key] = re.compile(pattern, flags)
    return rx


@rule_type("require_confirmation", RequireConfirmationArgs)
def require_confirmation(view: ConversationView, args: RequireConfirmationArgs) -> Iterator[Hit]:
    """An explicit user "yes" must come between the agent's last question and a write tool call."""
    yes, no = compiled(args.yes_pattern), compiled(args.no_pattern)
    messages = view.messages
    used: set[int] = set()
    for site in view.tool_calls:
        if site.name not in args.tools:
            continue
        last_user = next((i for i in range(site.message_index - 1, -1, -1) if messages[i].role == "user"), None)
        text = messages[last_user].text if last_user is not None else ""
        affirmed = bool(yes.search(text)) and not (no.search(text) and not yes.match(text.strip()))
        if affirmed and args.one_write_per_confirmation and last_user in used:
            affirmed = False
        if affirmed and last_user is not None:
            used.add(last_user)
            continue
        evidence = [Evidence(site.message_index)]
        if last_user is not None:
            evidence.append(Evidence(last_user, 0, len(text), text[:200]))
        yield Hit(f"{site.name} called without an explicit user confirmation", evidence, {"tool": site.name})


class BudgetArgs(RuleArgs):
    max_turns: int | None = Field(default=None, ge=1, description="User + assistant messages.")
    max_tool_calls: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_cost_usd: float | None = Field(default=None, ge=0)
    max_latency_ms: float | None = Field(default=None, ge=0)


@rule_type("budget", BudgetArgs)
def budget(view: ConversationView, args: BudgetArgs) -> Iterator[Hit]:
    """Stay under budgets of turns, tool calls, tokens, cost and latency."""
    usage = view.conversation.usage
    measured: dict[str, float | None] = {
        "turns": sum(1 for m in view.messages if m.role in ("user", "assistant")),
        "tool_calls": len(view.tool_calls),
        "tokens": usage.tokens if usage else None,
        "cost_usd": usage.cost_usd if usage else None,
        "latency_ms": usage.latency_ms if usage else None,
    }
    last = len(view.messages) - 1
    for name, value in measured.items():
        limit = getattr(args, f"max_{name}")
        if limit is not None and value is not None and value > limit:
            yield Hit(f"{name} {value:g} over budget {limit:g}", [Evidence(last)], {"budget": name})


class ToolErrorRateArgs(RuleArgs):
    max_rate: float = Field(default=0.3, ge=0, le=1)
    min_calls: int = Field(default=3, ge=1)
    error_pattern: str | None = Field(
        default=r"^\s*(\"?error\b|Error:|Exception|Traceback)", description="Also counts results like this."
    )


@rule_type("tool_error_rate", ToolErrorRateArgs)
def tool_error_rate(view: ConversationView, args: ToolErrorRateArgs) -> Iterator[Hit]:
    """Too large a share of tool calls failed."""
    rx = compiled(args.error_pattern) if args.error_pattern else None
    errors = [
        r.message_index
        for r in view.results.values()
        if r.is_error or (rx is not None and rx.search(r.message.text[:200]))
    ]
    total = len(view.tool_calls)
    if total >= args.min_calls and len(errors) / total > args.max_rate:
        yield Hit(
            f"{len(errors)} of {total} tool calls failed",
            [Evidence(i) for i in errors[:10]],
            {"errors": len(errors), "calls": total},
        )


class EscalationArgs(RuleArgs):
    tools: list[str] = Field(default_factory=lambda: ["transfer_to_human_agents"])
    phrases: str = r"\b(transfer(ring)? you to a (human|live) agent|connect you with a (human|live) agent)\b"


@rule_type("escalation", EscalationArgs)
def escalation(view: ConversationView, args: EscalationArgs) -> Iterator[Hit]:
    """The conversation was handed off to a human."""
    for site in view.tool_calls:
        if site.name in args.tools:
            yield Hit(f"handed off to a human via {site.name}", [Evidence(site.message_index)], {"tool": site.name})
            return
    rx = compiled(args.phrases)
    for i, text in view.assistant_texts:
        m = rx.search(text)
        if m:
            yield Hit("handed off to a human", [Evidence(i, m.start(), m.end(), m.group(0))])
            return
