"""Built-in rule types about what was said: repetition, PII, patterns, groundedness, truncation."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Literal

from pydantic import Field, field_validator
from rapidfuzz import fuzz

from .builtin_tools import compiled
from .registry import Evidence, Hit, RuleArgs, rule_type
from .view import ConversationView


class UserRepetitionArgs(RuleArgs):
    threshold: float = Field(default=88, ge=0, le=100, description="rapidfuzz token_set_ratio, 0..100.")
    min_chars: int = Field(default=20, ge=1, description="Shorter user turns ('yes', 'ok') are ignored.")
    window: int = Field(default=6, ge=1, description="Compare with this many earlier user turns.")


@rule_type("user_repetition", UserRepetitionArgs)
def user_repetition(view: ConversationView, args: UserRepetitionArgs) -> Iterator[Hit]:
    """The user had to repeat themselves: a user turn nearly equal to an earlier one."""
    turns = [(i, t.lower()) for i, t in view.user_turns if len(t) >= args.min_chars]
    for k in range(1, len(turns)):
        i, text = turns[k]
        for j, earlier in turns[max(0, k - args.window) : k]:
            score = fuzz.token_set_ratio(text, earlier, score_cutoff=args.threshold)
            if score:
                yield Hit(
                    f"user repeated message {j} (similarity {score:.0f})",
                    [Evidence(j, 0, len(earlier)), Evidence(i, 0, len(text))],
                    {"similarity": round(score, 1)},
                )
                break


_PII_PATTERNS: dict[str, re.Pattern[str]] = {
    "email": re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b"),
    "phone": re.compile(r"(?<![\w-])(?:\+?\d{1,3}[ .-]?)?(?:\(\d{3}\)|\d{3})[ .-]?\d{3}[ .-]?\d{4}(?![\w-])"),
    "card": re.compile(r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)"),
}


def luhn_ok(digits: str) -> bool:
    total, parity = 0, len(digits) % 2
    for pos, ch in enumerate(digits):
        d = ord(ch) - 48
        if pos % 2 == parity:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def find_pii(text: str, kinds: list[str]) -> Iterator[tuple[str, re.Match[str]]]:
    for kind in kinds:
        for m in _PII_PATTERNS[kind].finditer(text):
            if kind == "card":
                digits = re.sub(r"\D", "", m.group(0))
                if not (13 <= len(digits) <= 19 and luhn_ok(digits)):
                    continue
            yield kind, m


class PiiLeakArgs(RuleArgs):
    kinds: list[Literal["email", "phone", "card"]] = Field(default_factory=lambda: ["email", "phone", "card"])
    except_user_provided: bool = Field(
        default=True, description="Repeating back what the user said themselves is not a leak."
    )


@rule_type("pii_leak", PiiLeakArgs)
def pii_leak(view: ConversationView, args: PiiLeakArgs) -> Iterator[Hit]:
    """Emails, phone numbers or card numbers (Luhn-checked) in the assistant's text."""
    user_text = " ".join(t for _, t in view.user_turns) if args.except_user_provided else ""
    for i, text in view.assistant_texts:
        if "@" not in text and not any(c.isdigit() for c in text):
            continue
        for kind, m in find_pii(text, list(args.kinds)):
            value = m.group(0)
            if user_text and value in user_text:
                continue
            yield Hit(f"{kind} in assistant text", [Evidence(i, m.start(), m.end(), None)], {"kind": kind})


class RegexArgs(RuleArgs):
    pattern: str
    mode: Literal["must_match", "must_not_match"] = "must_not_match"
    roles: list[Literal["system", "user", "assistant", "tool"]] = Field(default_factory=lambda: ["assistant"])
    ignore_case: bool = True

    @field_validator("pattern")
    @classmethod
    def _valid(cls, v: str) -> str:
        re.compile(v)
        return v


@rule_type("regex", RegexArgs)
def regex(view: ConversationView, args: RegexArgs) -> Iterator[Hit]:
    """Messages of the given roles must (or must not) match a pattern."""
    rx = compiled(args.pattern, re.IGNORECASE if args.ignore_case else 0)
    matched = False
    for i, m in enumerate(view.messages):
        if m.role not in args.roles:
            continue
        text = m.text
        found = rx.search(text) if text else None
        if found:
            matched = True
            if args.mode == "must_not_match":
                yield Hit(
                    f"matched forbidden pattern {args.pattern!r}",
                    [Evidence(i, found.start(), found.end(), found.group(0)[:200])],
                )
    if args.mode == "must_match" and not matched:
        yield Hit(f"no {'/'.join(args.roles)} message matched {args.pattern!r}", [Evidence(len(view.messages) - 1)])


_AMOUNT = re.compile(r"\$\s?(\d{1,3}(?:,\d{3})+|\d+)(\.\d{1,2})?")
_DATE = re.compile(
    r"\b(\d{4}-\d{2}-\d{2}|(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? \d{1,2}(?:, \d{4})?)\b"
)
_IDENT = re.compile(r"(?<![\w#])#?(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{6,}\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), 1)}


def _money(value: str) -> str:
    return f"{float(value.replace(',', '').replace('$', '').strip()):.2f}"


def _date_forms(text: str) -> set[str]:
    if text[:1].isdigit():
        return {text}
    parts = text.replace(",", "").replace(".", "").split()
    month = _MONTHS.get(parts[0][:3].lower())
    day = int(parts[1])
    forms = {f"-{month:02d}-{day:02d}"}
    if len(parts) > 2:
        forms.add(f"{parts[2]}-{month:02d}-{day:02d}")
    return forms


class GroundednessArgs(RuleArgs):
    check: list[Literal["amounts", "dates", "identifiers"]] = Field(
        default_factory=lambda: ["amounts", "dates", "identifiers"]
    )
    include_system: bool = True


@rule_type("groundedness", GroundednessArgs)
def groundedness(view: ConversationView, args: GroundednessArgs) -> Iterator[Hit]:
    """Amounts, dates and identifiers the assistant states must appear in tool results or user turns."""
    roles = ("tool", "user", "system") if args.include_system else ("tool", "user")
    source = "\n".join(m.text for m in view.messages if m.role in roles)
    numbers: set[str] | None = None
    for i, text in view.assistant_texts:
        if "amounts" in args.check and "$" in text:
            if numbers is None:
                numbers = {_money(n) for n in _NUMBER.findall(source.replace(",", ""))}
            for m in _AMOUNT.finditer(text):
                if _money(m.group(0)) not in numbers:
                    yield Hit(f"amount {m.group(0)} not found in any tool result or user turn",
                              [Evidence(i, m.start(), m.end(), m.group(0))], {"kind": "amount"})
        if "dates" in args.check:
            for m in _DATE.finditer(text):
                if not any(f in source for f in _date_forms(m.group(0))) and m.group(0) not in source:
                    yield Hit(f"date {m.group(0)} not found in any tool result or user turn",
                              [Evidence(i, m.start(), m.end(), m.group(0))], {"kind": "date"})
        if "identifiers" in args.check:
            for m in _IDENT.finditer(text):
                if m.group(0).lstrip("#") not in source:
                    yield Hit(f"identifier {m.group(0)} not found in any tool result or user turn",
                              [Evidence(i, m.start(), m.end(), m.group(0))], {"kind": "identifier"})


class EmptyOrTruncatedArgs(RuleArgs):
    min_chars_for_truncation: int = Field(default=40, ge=1)
    terminal: str = Field(default=".!?)\"'`*:]}>", description="Characters a complete reply ends with.")


@rule_type("empty_or_truncated_response", EmptyOrTruncatedArgs)
def empty_or_truncated_response(view: ConversationView, args: EmptyOrTruncatedArgs) -> Iterator[Hit]:
    """An assistant reply that is empty, or stops mid-sentence."""
    for i, m in enumerate(view.messages):
        if m.role != "assistant" or m.tool_calls:
            continue
        text = m.text.rstrip()
        if not text:
            yield Hit("empty assistant response", [Evidence(i)], {"kind": "empty"})
        elif len(text) >= args.min_chars_for_truncation and text[-1] not in args.terminal and not text[-1].isdigit():
            yield Hit("assistant response looks truncated", [Evidence(i, len(text) - 20, len(text))], {"kind": "truncated"})
