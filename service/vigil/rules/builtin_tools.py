"""Built-in rule types about tool use: what was called, in which order, with whose consent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import Field, field_validator

from vigil.rules.conditions import (
    MISSING,
    ArgCondition,
    ResultCondition,
    arg_condition_met,
    field_value,
    result_condition_met,
)
from vigil.rules.patterns import Pattern, UnsupportedPattern, compile_linear, pattern
from vigil.rules.registry import Evidence, Hit, RuleArgs, rule_type
from vigil.rules.view import ConversationView

__all__ = ["ArgCondition", "ResultCondition", "field_value", "valid_pattern"]


def valid_pattern(v: str | None) -> str | None:
    """Field validator: a pattern the linear-time engine runs and that does not match every text, else a
    clear validation error."""
    if v is not None:
        try:
            rx = compile_linear(v)
        except UnsupportedPattern as exc:
            raise ValueError(str(exc)) from None
        # an empty match inside a text of one control character is an empty match anywhere: `yes|`,
        # `(refund)?`, `a*` or a bare `$` match every message (a must_not_match rule flags them all, an
        # error_pattern makes every tool result an error); `^\s*$` (a blank text) is not refused
        found = rx.search("\x01")
        if found is not None and found.start() == found.end():
            raise ValueError(
                "matches the empty string in any text, so it matches every message (an empty alternative "
                "such as a trailing or doubled '|', or a pattern whose every part is optional)"
            )
    return v


def _as_list(v: Any) -> Any:
    if v is None:
        return []
    return [v] if isinstance(v, dict) else v


class ForbiddenToolArgs(RuleArgs):
    tools: list[str] = Field(min_length=1)
    when: list[ResultCondition] = Field(
        default_factory=list, description="All must hold: states shown by earlier tool results."
    )
    when_args: list[ArgCondition] = Field(default_factory=list, description="All must hold: the call's own arguments.")

    _as_list_when = field_validator("when", "when_args", mode="before")(lambda cls, v: _as_list(v))


@rule_type("forbidden_tool", ForbiddenToolArgs)
def forbidden_tool(view: ConversationView, args: ForbiddenToolArgs) -> Iterator[Hit]:
    """The agent must never call these tools (optionally: only when earlier results or its args say so)."""
    for site in view.tool_calls:
        if site.name not in args.tools:
            continue
        if not all(arg_condition_met(site, c) for c in args.when_args):
            continue
        evidence = [Evidence(site.message_index)]
        for cond in args.when:
            cause = result_condition_met(view, site, cond)
            if cause is None:
                break
            if all(e.message_index != cause for e in evidence):
                evidence.append(Evidence(cause))
        else:
            reasons = [c.describe(c.field) for c in args.when] + [c.describe(c.arg) for c in args.when_args]
            yield Hit(
                f"called {site.name}" + (f" although {' and '.join(reasons)}" if reasons else ", a forbidden tool"),
                evidence,
                {"tool": site.name},
            )


class ToolOrderArgs(RuleArgs):
    before: list[str] = Field(min_length=1, description="One of these must be called first...")
    after: list[str] = Field(min_length=1, description="...before any of these.")
    same_arg: str | None = Field(default=None, description="Match calls on this argument's value.")
    before_must_succeed: bool = Field(
        default=True, description="A 'before' call whose result is an error does not count."
    )


@rule_type("tool_order", ToolOrderArgs)
def tool_order(view: ConversationView, args: ToolOrderArgs) -> Iterator[Hit]:
    """Tool X must happen before tool Y (optionally for the same argument value)."""
    seen_any = False
    seen_values: set[str] = set()
    for site in view.tool_calls:
        if site.name in args.after:
            value = site.args.get(args.same_arg, MISSING) if args.same_arg else MISSING
            ok = str(value) in seen_values if value is not MISSING else seen_any
            if not ok:
                what = f" for {args.same_arg}={value}" if value is not MISSING else ""
                yield Hit(
                    f"{site.name} called before any of {', '.join(args.before)}{what}",
                    [Evidence(site.message_index)],
                    {"tool": site.name},
                )
        if site.name in args.before:
            if args.before_must_succeed:
                result = view.result_for(site)
                if result is not None and result.is_error:
                    continue
            seen_any = True
            if args.same_arg and (v := site.args.get(args.same_arg, MISSING)) is not MISSING:
                seen_values.add(str(v))


DEFAULT_YES = (
    r"\b(yes|yeah|yep|yup|sure|confirm(ed)?|correct|go ahead|proceed|please do|do it|that['’]?s right|"
    r"ok(ay)?|absolutely|affirmative|sounds good|i agree|agreed)\b"
)
# "no longer", "no problem", ... are matched whole so that they can be told apart from a plain "no"
# (RE2 has no lookahead): a match that is one of these phrases is not a no (see ``_NOT_A_NO``).
DEFAULT_NO = (
    r"\b(no(?:[ -](?:longer|problem|worries|rush|need|other|more))?|nope|don['’]?t|do not|cancel that|"
    r"stop|wait|hold on)\b"
)
_NOT_A_NO = frozenset(
    f"no{sep}{w}" for sep in " -" for w in ("longer", "problem", "worries", "rush", "need", "other", "more")
)
# Words that take back a yes given earlier in the same turn. "no", "wait", "stop" and "hold on" count
# only at the start of a clause ("Yes. No, wait"), so "no insurance" or "I can't wait" stay details.
_LEAD = r"(?:^|[.!?;,:—–-]\s*|\b(?:but|actually|oh|um+|uh+|hmm+|sorry)\s*,?\s*)"
DEFAULT_RETRACT = (
    _LEAD + r"(?:no\s*(?:[,.!;:—–-]|$)|nope\b|wait\b|stop\b|hold on\b|hang on\b|not (?:yet|now|so fast)\b)"
    r"|\b(?:never ?mind|scratch that|on second thought|cancel that)\b"
    r"|\b(?:don['’]?t|do not) (?:do (?:it|that|anything)|go ahead|proceed|continue|cancel it)\b"
)
# A weak yes ("ok", "sure") that leads into a question acknowledges the agent; it does not confirm.
_WEAK_YES = frozenset(("ok", "okay", "sure"))
_NEGATED = compile_linear(r"(\bnot|n['’]t|\bno|\bnever)\s+(\w+\s+)?$", ignore_case=True)


class RequireConfirmationArgs(RuleArgs):
    tools: list[str] = Field(min_length=1, description="Consequential write tools.")
    yes_pattern: str = DEFAULT_YES
    no_pattern: str = DEFAULT_NO
    retract_pattern: str = Field(
        default=DEFAULT_RETRACT, description='After the yes, takes it back ("Yes. Actually no, wait").'
    )
    one_write_per_confirmation: bool = Field(
        default=False, description="Each confirmation authorises a single write call."
    )
    only_with_user: bool = Field(
        default=True, description="Skip conversations without any user turn (autonomous runs)."
    )

    _patterns = field_validator("yes_pattern", "no_pattern", "retract_pattern")(lambda cls, v: valid_pattern(v))


def affirmed(text: str, yes: Pattern, no: Pattern, retract: Pattern | None = None) -> bool:
    """A yes that is not negated ("not correct"), comes before any no ("wait", "don't"), is not a bare
    "ok"/"sure" leading into a question, and is not taken back after it ("Yes. Actually no, wait")."""
    first_no = next((span for span in no.spans(text) if text[span[0] : span[1]].lower() not in _NOT_A_NO), None)
    for start, end in yes.spans(text):
        if first_no is not None and first_no[0] < start:
            return False
        if _NEGATED.search(text[max(0, start - 16) : start]):
            continue
        if text[start:end].lower() in _WEAK_YES and "?" in text[end:]:
            continue
        return retract is None or retract.search(text, end) is None
    return False


@rule_type("require_confirmation", RequireConfirmationArgs)
def require_confirmation(view: ConversationView, args: RequireConfirmationArgs) -> Iterator[Hit]:
    """The last user turn before a write tool call must be an explicit "yes"."""
    if args.only_with_user and not view.user_turns:
        return
    yes, no, retract = pattern(args.yes_pattern), pattern(args.no_pattern), pattern(args.retract_pattern)
    messages = view.messages
    used: set[int] = set()
    for site in view.tool_calls:
        if site.name not in args.tools:
            continue
        last_user = next((i for i in range(site.message_index - 1, -1, -1) if messages[i].role == "user"), None)
        text = view.texts[last_user] if last_user is not None else ""
        ok = last_user is not None and affirmed(text, yes, no, retract)
        if ok and args.one_write_per_confirmation and last_user in used:
            ok = False
        if ok:
            used.add(last_user)  # type: ignore[arg-type]
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
    last = len(view.messages) - 1
    if args.max_turns is not None:
        turns = [i for i, m in enumerate(view.messages) if m.role in ("user", "assistant")]
        if len(turns) > args.max_turns:
            yield Hit(
                f"turns {len(turns)} over budget {args.max_turns}",
                [Evidence(turns[args.max_turns])],
                {"budget": "turns", "value": len(turns)},
            )
    if args.max_tool_calls is not None and len(view.tool_calls) > args.max_tool_calls:
        first_over = view.tool_calls[args.max_tool_calls].message_index
        yield Hit(
            f"tool_calls {len(view.tool_calls)} over budget {args.max_tool_calls}",
            [Evidence(first_over)],
            {"budget": "tool_calls", "value": len(view.tool_calls)},
        )
    if usage is None:
        return
    for name, value, limit in (
        ("tokens", usage.tokens, args.max_tokens),
        ("cost_usd", usage.cost_usd, args.max_cost_usd),
        ("latency_ms", usage.latency_ms, args.max_latency_ms),
    ):
        if limit is not None and value is not None and value > limit:
            yield Hit(f"{name} {value:g} over budget {limit:g}", [Evidence(last)], {"budget": name, "value": value})


class ToolErrorRateArgs(RuleArgs):
    max_rate: float = Field(default=0.3, ge=0, le=1)
    min_calls: int = Field(default=3, ge=1)
    error_pattern: str | None = Field(
        default=r"^\s*(\"?error\b|Error:|Exception|Traceback)", description="Also counts results like this."
    )

    _pattern = field_validator("error_pattern")(lambda cls, v: valid_pattern(v))


@rule_type("tool_error_rate", ToolErrorRateArgs)
def tool_error_rate(view: ConversationView, args: ToolErrorRateArgs) -> Iterator[Hit]:
    """Too large a share of the agent's tool calls failed."""
    total = len(view.tool_calls)
    if total < args.min_calls:
        return
    rx = pattern(args.error_pattern) if args.error_pattern else None
    errors = []
    for site in view.tool_calls:
        r = view.result_for(site)
        if r is not None and (r.is_error or (rx is not None and rx.search(r.message.text[:200]))):
            errors.append(r.message_index)
    if len(errors) / total > args.max_rate:
        yield Hit(
            f"{len(errors)} of {total} tool calls failed",
            [Evidence(i) for i in errors[:10]],
            {"errors": len(errors), "calls": total},
        )


class ToolCallsPerMessageArgs(RuleArgs):
    max_calls: int = Field(default=1, ge=1, description="Tool calls allowed in one assistant message.")
    allow_text: bool = Field(default=False, description="May a message with tool calls also talk to the user?")


@rule_type("tool_calls_per_message", ToolCallsPerMessageArgs)
def tool_calls_per_message(view: ConversationView, args: ToolCallsPerMessageArgs) -> Iterator[Hit]:
    """One action at a time: at most ``max_calls`` tool calls per assistant message, no text beside them."""
    for i, m in enumerate(view.messages):
        calls = m.tool_calls
        if m.role != "assistant" or not calls:
            continue
        if len(calls) > args.max_calls:
            yield Hit(
                f"{len(calls)} tool calls in one message (at most {args.max_calls})",
                [Evidence(i)],
                {"calls": len(calls)},
            )
        elif not args.allow_text and m.text.strip():
            yield Hit(
                "replied to the user and called a tool in the same message",
                [Evidence(i)],
                {"calls": len(calls)},
            )


class EscalationArgs(RuleArgs):
    tools: list[str] = Field(default_factory=lambda: ["transfer_to_human_agents"])
    phrases: str = (
        r"\b(transferr?(ed|ing)? you to (a|an|our) (human|live|real)( support)? "
        r"(agent|representative|person)|"
        r"connect(ing)? you (with|to) (a|an) (human|live|real) (agent|representative|person)|"
        r"you are being transferred to a human agent)\b"
    )

    _pattern = field_validator("phrases")(lambda cls, v: valid_pattern(v))


@rule_type("escalation", EscalationArgs)
def escalation(view: ConversationView, args: EscalationArgs) -> Iterator[Hit]:
    """The conversation was handed off to a human (a hand-off tool call, or the agent saying so)."""
    for site in view.tool_calls:
        if site.name in args.tools:
            yield Hit(f"handed off to a human via {site.name}", [Evidence(site.message_index)], {"tool": site.name})
            return
    rx = pattern(args.phrases)
    for i, text in view.assistant_texts:
        span = rx.search(text)
        if span:
            start, end = span
            yield Hit("handed off to a human", [Evidence(i, start, end, text[start:end])], {"phrase": True})
            return


class UnofferedToolArgs(RuleArgs):
    allow: list[str] = Field(
        default_factory=list, description="Tools the agent may call without their being offered (e.g. hosted ones)."
    )


@rule_type("unoffered_tool", UnofferedToolArgs)
def unoffered_tool(view: ConversationView, args: UnofferedToolArgs) -> Iterator[Hit]:
    """The agent called a tool it was not offered (needs the conversation's tool definitions; without
    them nothing is known and nothing fires)."""
    offered = view.conversation.offered_tools
    if offered is None:
        return
    names = {t.name for t in offered} | set(args.allow)
    for site in view.tool_calls:
        if site.name not in names:
            yield Hit(
                f"called {site.name}, a tool it was not offered",
                [Evidence(site.message_index)],
                {"tool": site.name, "offered": sorted(t.name for t in offered)},
            )
