"""Built-in rule types for written business policies: limits per entity, one customer per conversation,
arguments that must come from what a lookup showed, an issue still unresolved when the talk ended, and a
request the user made that no action carried out.

Markers are literal substrings; the one pattern-based check (a user's request) runs on RE2, linear in the text.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import defaultdict
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from pydantic import Field, field_validator

from vigil.rules.builtin_tools import valid_pattern
from vigil.rules.patterns import pattern
from vigil.rules.registry import Evidence, Hit, RuleArgs, rule_type
from vigil.rules.view import CallSite, ConversationView, ToolResult


def _succeeded(view: ConversationView, site: CallSite) -> bool:
    result = view.result_for(site)
    return result is None or not result.is_error


def _key(site: CallSite, arg: str) -> str | None:
    value = site.args.get(arg)
    return None if value is None or isinstance(value, dict | list) else str(value)


class PerEntityLimitArgs(RuleArgs):
    tools: list[str] = Field(min_length=1, description="Calls counted together (e.g. modify items, exchange).")
    key: str = Field(description="The argument naming the entity (e.g. order_id).")
    max_calls: int = Field(default=1, ge=1, description="Successful calls allowed per entity.")
    then_forbidden: list[str] = Field(
        default_factory=list, description="Tools not allowed on the entity once the limit is reached."
    )


@rule_type("per_entity_limit", PerEntityLimitArgs)
def per_entity_limit(view: ConversationView, args: PerEntityLimitArgs) -> Iterator[Hit]:
    """At most ``max_calls`` successful calls of ``tools`` per entity; after that, no ``then_forbidden`` call."""
    counted: dict[str, int] = defaultdict(int)
    for site in view.tool_calls:
        key = _key(site, args.key)
        if key is None:
            continue
        if counted[key] >= args.max_calls and (site.name in args.tools or site.name in args.then_forbidden):
            yield Hit(
                f"{site.name} on {args.key}={key} after {counted[key]} successful "
                f"{'/'.join(args.tools)} call(s) (limit {args.max_calls})",
                [Evidence(site.message_index)],
                {"tool": site.name, args.key: key},
            )
        if site.name in args.tools and _succeeded(view, site):
            counted[key] += 1


class SingleEntityArgs(RuleArgs):
    key: str = Field(description="The argument naming the customer (e.g. user_id).")
    tools: list[str] = Field(default_factory=list, description="Only these tools' calls; empty: every call.")


@rule_type("single_entity", SingleEntityArgs)
def single_entity(view: ConversationView, args: SingleEntityArgs) -> Iterator[Hit]:
    """Every successful call naming ``key`` names the same value ("one user per conversation")."""
    first: str | None = None
    for site in view.tool_calls:
        if args.tools and site.name not in args.tools:
            continue
        key = _key(site, args.key)
        if key is None or not _succeeded(view, site):
            continue
        if first is None:
            first = key
        elif key != first:
            yield Hit(
                f"{site.name} for {args.key}={key} in a conversation about {args.key}={first}",
                [Evidence(site.message_index)],
                {"first": first, "other": key},
            )
            return


def _values_of(obj: Any, name: str) -> list[str]:
    """Every scalar held under the key ``name`` at any depth of a parsed tool result.

    A walk with its own stack that visits containers only: a lookup result is mostly scalars, and a
    generator call per scalar was most of this rule's time (and a deep result must not reach the
    interpreter's recursion limit).
    """
    found: list[str] = []
    stack = [obj]
    containers = (dict, list)
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            for k, v in o.items():
                if isinstance(v, containers):
                    stack.append(v)
                elif k == name:
                    found.append(str(v))
        elif isinstance(o, list):
            stack.extend(v for v in o if isinstance(v, containers))
    return found


class ArgFromLookupArgs(RuleArgs):
    tools: list[str] = Field(min_length=1, description="The calls whose argument is checked.")
    arg: str = Field(description="The argument that must be one the lookup showed (each element of a list).")
    lookup: list[str] = Field(min_length=1, description="Tools whose results list the allowed values.")
    join_on: str | None = Field(
        default=None,
        description="The argument both the call and the lookup name (e.g. order_id); none: every lookup of the "
        "conversation counts (one customer per conversation).",
    )
    field: str | None = Field(default=None, description="The result field holding allowed values; default: `arg`.")
    also_allowed_prefixes: list[str] = Field(
        default_factory=list, description="Values starting with one of these are allowed too (e.g. gift_card_)."
    )


def _arg_values(site: CallSite, arg: str) -> list[str]:
    value = site.args.get(arg)
    if isinstance(value, list):
        return [str(v) for v in value if v is not None and not isinstance(v, dict | list)]
    return [] if value is None or isinstance(value, dict) else [str(value)]


@rule_type("arg_from_lookup", ArgFromLookupArgs)
def arg_from_lookup(view: ConversationView, args: ArgFromLookupArgs) -> Iterator[Hit]:
    """The call's ``arg`` is a value the lookup of the same entity showed ("refund to the original payment"); a
    list argument (item ids) must hold only such values."""
    field = args.field or args.arg
    shown: dict[str, set[str]] = defaultdict(set)
    prefixes = tuple(args.also_allowed_prefixes)
    for site in view.tool_calls:
        key = _key(site, args.join_on) if args.join_on else ""
        if site.name in args.lookup and key is not None:
            result = view.result_for(site)
            if result is not None and not result.is_error:
                shown[key].update(_values_of(result.parsed(), field))
            continue
        if site.name not in args.tools or key is None or key not in shown:
            continue  # nothing was looked up: other rules say the lookup is missing
        bad = [v for v in _arg_values(site, args.arg) if v not in shown[key] and not v.startswith(prefixes)]
        if not bad:
            continue
        where = f" for {args.join_on}={key}" if args.join_on else ""
        yield Hit(
            f"{site.name} with {args.arg}={', '.join(bad)}, not among {sorted(shown[key])[:20]} shown{where}",
            [Evidence(site.message_index)],
            {args.arg: bad if isinstance(site.args.get(args.arg), list) else bad[0]}
            | ({args.join_on: key} if args.join_on else {}),
        )


class UnresolvedAtEndArgs(RuleArgs):
    tools: list[str] = Field(min_length=1, description="Checks that verify the issue (a speed test, a send test).")
    unresolved: list[str] = Field(
        min_length=1, description="Markers (case-insensitive substrings) of a result that says the issue remains."
    )


@rule_type("unresolved_at_end", UnresolvedAtEndArgs)
def unresolved_at_end(view: ConversationView, args: UnresolvedAtEndArgs) -> Iterator[Hit]:
    """The last verification the conversation ran (by agent or user) still shows the issue."""
    names: dict[str, str] = {}
    last: tuple[int, str] | None = None
    markers = [m.lower() for m in args.unresolved]
    for i, m in enumerate(view.messages):
        for call in m.tool_calls or ():
            if call.id:
                names[call.id] = call.function.name
        if m.role == "tool" and m.tool_call_id and names.get(m.tool_call_id) in args.tools:
            last = (i, view.texts[i])
    if last is None:
        return
    text = last[1].lower()
    found = next((mk for mk in markers if mk in text), None)
    if found is not None:
        yield Hit(
            f"the last check still shows the issue ({found!r})",
            [Evidence(last[0], quote=last[1][:200])],
            {"marker": found},
        )


class SayBeforeArgs(RuleArgs):
    tools: list[str] = Field(min_length=1, description="Calls the policy wants announced a certain way.")
    phrases: list[str] = Field(
        min_length=1, description="Case-insensitive substrings, one of which an assistant message must contain."
    )
    what: str = Field(default="the required reminder", description="What the phrases say, for the message.")


@rule_type("say_before", SayBeforeArgs)
def say_before(view: ConversationView, args: SayBeforeArgs) -> Iterator[Hit]:
    """Before each call of ``tools``, an assistant message since the previous such call says one of ``phrases``."""
    phrases = [p.lower() for p in args.phrases]
    said = False
    calls = {s.message_index: s for s in view.tool_calls if s.name in args.tools}
    for i, m in enumerate(view.messages):
        if m.role == "assistant" and any(p in view.lower(i) for p in phrases):
            said = True
        site = calls.get(i)
        if site is not None:
            if not said:
                yield Hit(f"{site.name} without {args.what} first", [Evidence(i)], {"tool": site.name})
            said = False


class WriteRefusedArgs(RuleArgs):
    tools: list[str] = Field(min_length=1, description="Consequential (write) tools.")
    error_prefixes: list[str] = Field(
        default_factory=lambda: ["error", '"error', '{"error'],
        description="A result starting with one of these (case-insensitive) is a refusal too.",
    )


@rule_type("write_refused", WriteRefusedArgs)
def write_refused(view: ConversationView, args: WriteRefusedArgs) -> Iterator[Hit]:
    """A write call the tools refused: its arguments broke what the tool accepts."""
    prefixes = tuple(p.lower() for p in args.error_prefixes)
    for site in view.tool_calls:
        if site.name not in args.tools:
            continue
        result = view.result_for(site)
        if result is None:
            continue
        head = result.message.text[:200].lstrip().lower()
        if result.is_error or head.startswith(prefixes):
            yield Hit(
                f"{site.name} refused: {result.message.text[:120]}",
                [Evidence(site.message_index), Evidence(result.message_index)],
                {"tool": site.name},
            )


class RequestKind(RuleArgs):
    name: str = Field(min_length=1, description="What the user asks for, for the message (e.g. 'cancel an order').")
    pattern: str = Field(description="RE2 pattern (case-insensitive) of a user sentence asking for it.")
    tools: list[str] = Field(min_length=1, description="A successful call of one of these carries the request out.")

    _linear = field_validator("pattern")(lambda cls, v: valid_pattern(v))


_WITHDRAW = (
    r"\b(?:changed? my mind|never ?mind|forget (?:it|about it|that)|no longer want"
    r"|(?:don['’]?t|do not) want to \w+ (?:anything|it|that) (?:anymore|after all|right now))\b"
)


class RequestLeftUndoneArgs(RuleArgs):
    requests: list[RequestKind] = Field(
        min_length=1,
        description="Kinds of request, most specific first: a user sentence asks for the first kind whose "
        "pattern has a match ending in it.",
    )
    withdraw_pattern: str | None = Field(
        default=_WITHDRAW, description="A user turn matching this withdraws every request still open; null: never."
    )
    closed_by: list[str] = Field(
        default_factory=list,
        description="A successful call of one of these closes every open request (a hand-off to a human).",
    )
    sentence_ends: str = Field(default=".?!\n", min_length=1, description="Characters that end a sentence.")
    error_prefixes: list[str] = Field(
        default_factory=lambda: ["error", '"error', '{"error'],
        description="A result starting with one of these (case-insensitive) did not go through.",
    )

    _linear = field_validator("withdraw_pattern")(lambda cls, v: valid_pattern(v))


@lru_cache(maxsize=16)
def _sentence_end(chars: str) -> re.Pattern[str]:
    return re.compile(f"[{re.escape(chars)}]+")  # one character class: linear, no backtracking


def _asked(text: str, kinds: list[RequestKind], sentence_ends: str) -> dict[str, tuple[int, int]]:
    """Each kind asked for in ``text``: the span of its first match; a sentence asks for one kind at most."""
    ends: list[int] | None = None
    taken: set[int] = set()
    asked: dict[str, tuple[int, int]] = {}
    for kind in kinds:  # most specific first: a sentence already taken is not asked again
        for start, end in pattern(kind.pattern).spans(text):
            if ends is None:  # only texts with a request pay for finding their sentences
                ends = [m.end() for m in _sentence_end(sentence_ends).finditer(text)]
            sentence = bisect_right(ends, max(start, end - 1))
            if sentence in taken:
                continue
            taken.add(sentence)
            asked.setdefault(kind.name, (start, end))
    return asked


@rule_type("request_left_undone", RequestLeftUndoneArgs)
def request_left_undone(view: ConversationView, args: RequestLeftUndoneArgs) -> Iterator[Hit]:
    """The user asked for an action (a user sentence matching a request's pattern) and no successful call of
    its tools followed before the end, unless the user withdrew it or a ``closed_by`` call handed it off."""
    kinds = {k.name: k for k in args.requests}
    open_: dict[str, tuple[int, int, int]] = {}  # kind -> (message index, start, end)
    prefixes = tuple(p.lower() for p in args.error_prefixes)
    done_at: dict[int, list[str]] = defaultdict(list)  # message index -> tools whose call went through there
    for site in view.tool_calls:
        result = view.result_for(site)
        if result is None:
            done_at[site.message_index].append(site.name)  # no result recorded: taken as done
        elif not result.is_error and not result.message.text[:200].lstrip().lower().startswith(prefixes):
            done_at[result.message_index].append(site.name)
    withdraw = pattern(args.withdraw_pattern) if args.withdraw_pattern else None
    for i, m in enumerate(view.messages):
        if m.role == "user":
            text = view.texts[i]
            if withdraw is not None and withdraw.search(text) is not None:
                open_.clear()
            for name, (start, end) in _asked(text, args.requests, args.sentence_ends).items():
                open_.setdefault(name, (i, start, end))
        for tool in done_at.get(i, ()):
            if tool in args.closed_by:
                open_.clear()
            for name in [k for k in open_ if tool in kinds[k].tools]:
                del open_[name]
    for name, (i, start, end) in open_.items():
        text = view.texts[i]
        yield Hit(
            f"the user asked to {name} ({text[start:end][-80:]!r}) and no {'/'.join(kinds[name].tools)} "
            "call went through afterwards",
            [Evidence(i, start, end, text[start:end][:200])],
            {"request": name, "tools": kinds[name].tools},
        )


class AllowanceChargeArgs(RuleArgs):
    tools: list[str] = Field(min_length=1, description="Calls that say how many units there are and how many are paid.")
    total_arg: str = Field(description="The call's argument with the number of units (e.g. total_baggages).")
    charged_arg: str = Field(description="The call's argument with the number of paid units (e.g. nonfree_baggages).")
    allowance: dict[str, dict[str, int]] = Field(
        min_length=1, description="Free units per person: tier -> category -> count (e.g. gold -> economy -> 3)."
    )
    tier_field: str = Field(description="Result field with the customer's tier (e.g. membership).")
    tier_from: list[str] = Field(default_factory=list, description="Only these tools' results show the tier; [] any.")
    category: str = Field(description="The call's argument, else the joined entity's result field (e.g. cabin).")
    people: str = Field(description="The call's list argument, else the joined entity's list field (passengers).")
    join_on: str = Field(description="The argument naming the entity whose latest result is read (reservation_id).")


@rule_type("allowance_charge", AllowanceChargeArgs)
def allowance_charge(view: ConversationView, args: AllowanceChargeArgs) -> Iterator[Hit]:
    """The paid units of a call differ from the total less the free allowance the tier and category give each
    person ("gold member: 3 free checked bags for each economy passenger"): a charge for free units, or free
    units given away. Nothing is flagged unless the tier, the category and the people were all seen."""
    if not any(site.name in args.tools for site in view.tool_calls):
        return
    # (message index, 0 result / 1 call, call, its result): one pass in order
    events: list[tuple[int, int, CallSite, ToolResult | None]] = []
    for site in view.tool_calls:
        if site.name in args.tools:
            events.append((site.message_index, 1, site, None))
        result = view.result_for(site)
        if result is not None and not result.is_error:
            events.append((result.message_index, 0, site, result))
    events.sort(key=lambda e: (e[0], e[1]))
    tier: str | None = None
    state: dict[str, dict[str, Any]] = defaultdict(dict)  # entity -> latest category and people seen
    for *_, site, result in events:
        if result is not None:
            data = result.parsed()
            if not isinstance(data, dict):
                continue
            if (not args.tier_from or site.name in args.tier_from) and isinstance(data.get(args.tier_field), str):
                tier = data[args.tier_field]
            if data.get(args.join_on) is not None:
                entity = state[str(data[args.join_on])]
                entity.update({f: data[f] for f in (args.category, args.people) if f in data})
            continue
        key = _key(site, args.join_on)
        seen = state.get(key, {}) if key is not None else {}
        category = site.args.get(args.category, seen.get(args.category))
        people = site.args.get(args.people, seen.get(args.people))
        total, charged = _count(site.args.get(args.total_arg)), _count(site.args.get(args.charged_arg))
        free = args.allowance.get(str(tier), {}).get(str(category))
        if free is None or not isinstance(people, list) or total is None or charged is None:
            continue
        due = max(0, total - free * len(people))
        if charged != due:
            what = "charged for free units" if charged > due else "units given free that are due"
            yield Hit(
                f"{site.name}: {args.charged_arg}={charged} of {args.total_arg}={total}, but a {tier} customer "
                f"gets {free} free per person in {category} ({len(people)} people): {due} due ({what})",
                [Evidence(site.message_index)],
                {"charged": charged, "due": due, "tier": tier, "category": category},
            )


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None
