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

_SCORERS = {
    "ratio": fuzz.ratio,
    "token_sort_ratio": fuzz.token_sort_ratio,
    "token_set_ratio": fuzz.token_set_ratio,
}


class UserRepetitionArgs(RuleArgs):
    threshold: float = Field(
        default=88, ge=0, le=100, description="Similarity 0..100 that counts as a repeat."
    )
    min_chars: int = Field(default=20, ge=1, description="Shorter user turns ('yes', 'ok') are ignored.")
    window: int = Field(default=6, ge=1, description="Compare with this many earlier user turns.")
    scorer: Literal["ratio", "token_sort_ratio", "token_set_ratio"] = Field(
        default="token_sort_ratio",
        description="rapidfuzz scorer; token_set_ratio scores a turn containing an earlier one as 100.",
    )


@rule_type("user_repetition", UserRepetitionArgs)
def user_repetition(view: ConversationView, args: UserRepetitionArgs) -> Iterator[Hit]:
    """The user had to repeat themselves: a user turn nearly equal to an earlier one."""
    score_fn = _SCORERS[args.scorer]
    turns = [(i, t.lower(), len(t)) for i, t in view.user_turns if len(t) >= args.min_chars]
    for k in range(1, len(turns)):
        i, text, n = turns[k]
        for j, earlier, n_earlier in turns[max(0, k - args.window) : k]:
            score = score_fn(text, earlier, score_cutoff=args.threshold)
            if score:
                yield Hit(
                    f"user repeated message {j} (similarity {score:.0f})",
                    [Evidence(j, 0, n_earlier), Evidence(i, 0, n)],
                    {"similarity": round(score, 1)},
                )
                break


# A phone number needs a separator, parentheses or a leading "+": bare digit runs are order,
# item and tracking numbers far more often than phone numbers.
_PII_PATTERNS: dict[str, re.Pattern[str]] = {
    "email": re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b"),
    "phone": re.compile(
        r"(?<![\w+-])(?:\+\d{1,3}[ .-]?\d{3}[ .-]?\d{3}[ .-]?\d{4}"
        r"|(?:\+?\d{1,3}[ .-])?(?:\(\d{3}\)[ .-]?|\d{3}[ .-])\d{3}[ .-]\d{4})(?![\w-])"
    ),
    "card": re.compile(r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)"),
}
_NON_DIGIT = re.compile(r"\D")


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


def _normal(kind: str, value: str) -> str:
    return value.lower() if kind == "email" else _NON_DIGIT.sub("", value)


def find_pii(text: str, kinds: list[str]) -> Iterator[tuple[str, re.Match[str]]]:
    for kind in kinds:
        for m in _PII_PATTERNS[kind].finditer(text):
            if kind == "card":
                digits = _NON_DIGIT.sub("", m.group(0))
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
    user_values: set[str] | None = None
    for i, text in view.assistant_texts:
        if "@" not in text and not any(c.isdigit() for c in text):
            continue
        for kind, m in find_pii(text, list(args.kinds)):
            if args.except_user_provided:
                if user_values is None:
                    user_text = "\n".join(t for _, t in view.user_turns)
                    user_values = {_normal(k, u.group(0)) for k, u in find_pii(user_text, list(args.kinds))}
                if _normal(kind, m.group(0)) in user_values:
                    continue
            # The quote is left out so that findings do not copy the personal data they report.
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
            else:
                return
    if args.mode == "must_match" and not matched:
        yield Hit(
            f"no {'/'.join(args.roles)} message matched {args.pattern!r}", [Evidence(len(view.messages) - 1)]
        )


_AMOUNT = re.compile(r"\$\s?(\d{1,3}(?:,\d{3})+|\d+)(\.\d{1,2})?")
_DATE = re.compile(
    r"\b(\d{4}-\d{2}-\d{2}|(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? "
    r"\d{1,2}(?:st|nd|rd|th)?(?:, \d{4})?)\b"
)
_IDENTS = (
    re.compile(r"(?<![\w#])#?(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{6,}\b"),  # #W5565470, HAT030X
    re.compile(r"(?<![\w$.,-])\d{8,}\b(?![.,]\d)"),  # item, product and tracking numbers
    re.compile(r"\b[a-z]+(?:_[a-z]+)*_\d{2,}\b"),  # gift_card_1712795, sara_doe_496
)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_ORDINAL = re.compile(r"(?<=\d)(st|nd|rd|th)\b")
_MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_MONTHS = {m: i for i, m in enumerate(_MONTH_NAMES, 1)}


def _money(value: str) -> str:
    return f"{float(value.replace(',', '').replace('$', '').strip()):.2f}"


def _date_forms(text: str) -> set[str]:
    if text[:1].isdigit():
        return {text}
    parts = _ORDINAL.sub("", text.replace(",", "").replace(".", "")).split()
    month = _MONTHS.get(parts[0][:3].lower())
    day = int(parts[1])
    forms = {f"-{month:02d}-{day:02d}"}
    if len(parts) > 2:
        forms = {f"{parts[2]}-{month:02d}-{day:02d}"}
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
    source: str | None = None
    numbers: set[str] | None = None
    for i, text in view.assistant_texts:
        if source is None:
            source = "\n".join(m.text for m in view.messages if m.role in roles)
        if "amounts" in args.check and "$" in text:
            if numbers is None:
                numbers = {_money(n) for n in _NUMBER.findall(source.replace(",", ""))}
            for m in _AMOUNT.finditer(text):
                if _money(m.group(0)) not in numbers:
                    yield _ungrounded("amount", i, m)
        if "dates" in args.check:
            for m in _DATE.finditer(text):
                if m.group(0) not in source and not any(f in source for f in _date_forms(m.group(0))):
                    yield _ungrounded("date", i, m)
        if "identifiers" in args.check:
            for rx in _IDENTS:
                for m in rx.finditer(text):
                    if m.group(0).lstrip("#") not in source:
                        yield _ungrounded("identifier", i, m)


def _ungrounded(kind: str, i: int, m: re.Match[str]) -> Hit:
    return Hit(
        f"{kind} {m.group(0)} not found in any tool result or user turn",
        [Evidence(i, m.start(), m.end(), m.group(0))],
        {"kind": kind},
    )


class EmptyOrTruncatedArgs(RuleArgs):
    min_chars_for_truncation: int = Field(default=40, ge=1)
    terminal: str = Field(default=".!?)\"'`*:]}>", description="Characters a complete reply ends with.")


_MID_SENTENCE = ",;-–—(/&"


@rule_type("empty_or_truncated_response", EmptyOrTruncatedArgs)
def empty_or_truncated_response(view: ConversationView, args: EmptyOrTruncatedArgs) -> Iterator[Hit]:
    """An assistant reply that is empty, cut off by the token limit, or stops mid-sentence."""
    for i, m in enumerate(view.messages):
        if m.role != "assistant" or m.tool_calls:
            continue
        text = m.text.rstrip()
        if not text:
            yield Hit("empty assistant response", [Evidence(i)], {"kind": "empty"})
            continue
        last = text[-1]
        cut = (m.model_extra or {}).get("finish_reason") == "length" or (
            len(text) >= args.min_chars_for_truncation
            and last not in args.terminal
            and (last.isalpha() or last in _MID_SENTENCE)
        )
        if cut:
            start = max(0, len(text) - 20)
            yield Hit(
                "assistant response looks truncated",
                [Evidence(i, start, len(text), text[start:])],
                {"kind": "truncated"},
            )
