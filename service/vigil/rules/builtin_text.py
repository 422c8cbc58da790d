"""Built-in rule types about what was said: repetition, PII, patterns, groundedness, truncation."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from itertools import filterfalse
from typing import Literal

from pydantic import Field, field_validator
from rapidfuzz import fuzz

from vigil.rules import pii, pii_split
from vigil.rules.builtin_tools import valid_pattern
from vigil.rules.patterns import pattern
from vigil.rules.registry import Evidence, Hit, RuleArgs, rule_type
from vigil.rules.view import ConversationView

PiiKind = pii.Kind
DEFAULT_LEAK_KINDS: tuple[PiiKind, ...] = ("email", "phone", "card", "ssn", "iban", "secret")
Role = Literal["system", "user", "assistant", "tool"]
FactKind = Literal["amounts", "dates", "identifiers"]

_SCORERS = {
    "ratio": fuzz.ratio,
    "token_sort_ratio": fuzz.token_sort_ratio,
    "token_set_ratio": fuzz.token_set_ratio,
}


class UserRepetitionArgs(RuleArgs):
    threshold: float = Field(default=88, ge=0, le=100, description="Similarity 0..100 that counts as a repeat.")
    min_chars: int = Field(default=20, ge=1, description="Shorter user turns ('yes', 'ok') are ignored.")
    max_chars: int = Field(
        default=2000,
        ge=1,
        description="Only this many leading characters of a turn are compared (similarity costs the product "
        "of two turns' lengths; a turn this long that repeats an earlier one shows it here).",
    )
    window: int = Field(default=6, ge=1, description="Compare with this many earlier user turns.")
    scorer: Literal["ratio", "token_sort_ratio", "token_set_ratio"] = Field(
        default="token_sort_ratio",
        description="rapidfuzz scorer; token_set_ratio scores a turn containing an earlier one as 100.",
    )


@rule_type("user_repetition", UserRepetitionArgs)
def user_repetition(view: ConversationView, args: UserRepetitionArgs) -> Iterator[Hit]:
    """The user had to repeat themselves: a user turn nearly equal to an earlier one."""
    score_fn = _SCORERS[args.scorer]
    turns = [(i, t[: args.max_chars].lower(), len(t)) for i, t in view.user_turns if len(t) >= args.min_chars]
    if args.scorer == "token_sort_ratio":
        # The same score, with each turn's words sorted once instead of in every comparison.
        score_fn = fuzz.ratio
        turns = [(i, " ".join(sorted(t.split())), n) for i, t, n in turns]
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


def find_pii(text: str, kinds: Sequence[str]) -> list[pii.Found]:
    """Personal data and secrets of ``kinds`` in ``text`` (see :mod:`vigil.rules.pii`), without overlaps."""
    return pii.detect(text, kinds)


class PiiLeakArgs(RuleArgs):
    kinds: list[PiiKind] = Field(
        default_factory=lambda: list[PiiKind](DEFAULT_LEAK_KINDS),
        description="What counts as a leak; ip, dob and address are left out by default (an agent confirms a "
        "shipping address as part of its job).",
    )
    except_user_provided: bool = Field(
        default=True, description="Repeating back what the user said themselves is not a leak."
    )


@rule_type("pii_leak", PiiLeakArgs)
def pii_leak(view: ConversationView, args: PiiLeakArgs) -> Iterator[Hit]:
    """Personal data or secrets in the assistant's text: emails, phones, Luhn-valid cards, SSNs, IBANs, keys;
    also a value split across consecutive assistant messages, or in one after its keyword in the one before
    (:mod:`vigil.rules.pii_split`)."""
    user_values: set[str] | None = None

    def user_provided(value: str) -> bool:
        nonlocal user_values
        if not args.except_user_provided:
            return False
        if user_values is None:
            user_text = "\n".join(t for _, t in view.user_turns)
            user_values = {pii.value_of(u, user_text) for u in find_pii(user_text, args.kinds)}
        return value in user_values

    inside = {i: find_pii(text, args.kinds) for i, text in view.assistant_texts}
    chains: list[tuple[list[int], frozenset[int]]] = []
    if len(inside) > 1:
        roles = [m.role for m in view.messages]
        pairs = ((m.role, view.texts[i] if i in inside else "") for i, m in enumerate(view.messages))
        chains = [(chain, pii_split.answered(chain, roles)) for chain in pii_split.chains(pairs)]
    # a password ending a reply that the next goes on from ("...your password: Open", " Settings and tap Reset")
    read_on = {
        (chain[k], found)
        for chain, turns in chains
        if "secret" in args.kinds
        for k, found in pii_split.read_on([view.texts[i] for i in chain], [inside[i] for i in chain], turns)
    }
    for i, found_here in inside.items():
        text = view.texts[i]
        for found in found_here:
            if (i, found) in read_on or user_provided(pii.value_of(found, text)):
                continue
            # The quote is left out so that findings do not copy the personal data they report.
            kind = found.kind
            if found.decoded is not None:
                yield Hit(
                    f"{kind} in assistant text (base64-encoded)",
                    [Evidence(i, found.start, found.end, None)],
                    {"kind": kind, "encoding": "base64"},
                )
            else:
                yield Hit(f"{kind} in assistant text", [Evidence(i, found.start, found.end, None)], {"kind": kind})
    for chain, turns in chains:
        texts = [view.texts[i] for i in chain]
        for split in pii_split.splits(texts, args.kinds, [inside[i] for i in chain], after_turn=turns):
            if user_provided(split.value):
                continue
            indexes = [chain[p.index] for p in split.parts]
            # The message that completes the value comes first: it is the failing turn an export starts from.
            evidence = [Evidence(chain[p.index], p.start, p.end, None) for p in reversed(split.parts)]
            if split.after is None:
                message = f"{split.kind} split across assistant messages {', '.join(map(str, indexes))}"
            else:  # the value lies in one message, its keyword in the one before: evidence is the value's
                message = (
                    f"{split.kind} in assistant message {indexes[0]} after its keyword in message {chain[split.after]}"
                )
                indexes = [chain[split.after], *indexes]
            yield Hit(message, evidence, {"kind": split.kind, "split_across": indexes})


class RegexArgs(RuleArgs):
    pattern: str
    mode: Literal["must_match", "must_not_match"] = "must_not_match"
    roles: list[Role] = Field(default_factory=lambda: list[Role](["assistant"]))
    ignore_case: bool = True

    _pattern = field_validator("pattern")(lambda cls, v: valid_pattern(v))


@rule_type("regex", RegexArgs)
def regex(view: ConversationView, args: RegexArgs) -> Iterator[Hit]:
    """Messages of the given roles must (or must not) match a pattern."""
    rx = pattern(args.pattern, args.ignore_case)
    matched = False
    for i, m in enumerate(view.messages):
        if m.role not in args.roles:
            continue
        text = view.texts[i]
        found = rx.search(text) if text else None
        if found:
            matched = True
            if args.mode == "must_not_match":
                start, end = found
                yield Hit(
                    f"matched forbidden pattern {args.pattern!r}",
                    [Evidence(i, start, end, text[start:end][:200])],
                )
            else:
                return
    if args.mode == "must_match" and not matched:
        yield Hit(f"no {'/'.join(args.roles)} message matched {args.pattern!r}", [Evidence(len(view.messages) - 1)])


_AMOUNT = re.compile(r"\$\s?(\d{1,3}(?:,\d{3})+|\d+)(\.\d{1,2})?")
# Each pattern opens with literals so the regex engine can skip ahead cheaply; the word boundary
# before a date is checked by hand.
_DATES = (
    re.compile(r"(?:19|20)\d\d-\d\d-\d\d\b"),
    re.compile(r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? \d{1,2}(?:st|nd|rd|th)?(?:, \d{4})?\b"),
)
_DIGIT = re.compile(r"\d")
_DECIMAL_TAIL = re.compile(r"[.,]\d")
_IDENT_CHAR = re.compile(r"[#\w]")
_UPPER_ID = re.compile(r"#?(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{6,}")  # #W5565470, HAT030X
_SNAKE_ID = re.compile(r"[a-z]+(?:_[a-z]+)*_\d{2,}")  # gift_card_1712795, sara_doe_496
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_ORDINAL = re.compile(r"(?<=\d)(st|nd|rd|th)\b")
_MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_MONTHS = {m: i for i, m in enumerate(_MONTH_NAMES, 1)}
_EDGE_PUNCTUATION = "!\"$%&'()*+,-./:;<=>?@[\\]^`{|}~\u00a0\u2018\u2019\u201c\u201d\u2013\u2014\u2026"
_NON_WORD = re.compile(r"[^#\w]+")


def _amount_found(source: str, amount: str) -> bool:
    """Whether ``source`` (commas removed) holds the amount as a number: written the same way (50 as
    50, 50.0 or 50.00), or with float noise that rounds to the same cents (30.180000000000007)."""
    digits = amount.replace(",", "").replace("$", "").strip()
    whole, _, frac = digits.partition(".")
    whole, frac = whole.lstrip("0") or "0", frac.rstrip("0")
    forms = (whole, f"{whole}.0", f"{whole}.00") if not frac else (f"{whole}.{frac}", f"{whole}.{frac}0")
    for form in forms:
        pos = source.find(form)
        while pos != -1:
            if _number_at(source, pos, pos + len(form)):
                return True
            pos = source.find(form, pos + 1)
    value = round(float(digits), 2)
    pos = source.find(whole)
    while pos != -1:
        if pos == 0 or not (source[pos - 1].isdigit() or source[pos - 1] == "."):
            m = _NUMBER.match(source, pos)
            if m is not None and round(float(m.group(0)), 2) == value:
                return True
        pos = source.find(whole, pos + 1)
    return False


def _number_at(source: str, start: int, end: int) -> bool:
    """``source[start:end]`` is a whole number, not part of a longer one."""
    if start and (source[start - 1].isdigit() or source[start - 1] == "."):
        return False
    return not (source[end : end + 1].isdigit() or _DECIMAL_TAIL.match(source, end))


def _date_forms(text: str) -> set[str]:
    if text[:1].isdigit():
        return {text}
    parts = _ORDINAL.sub("", text.replace(",", "").replace(".", "")).split()
    month = _MONTHS.get(parts[0][:3].lower())
    day = int(parts[1])
    if len(parts) > 2:
        return {f"{parts[2]}-{month:02d}-{day:02d}"}
    return {f"-{month:02d}-{day:02d}"}


def _identifier_words(text: str) -> Iterator[str]:
    """Identifiers in ``text``: upper-case codes with digits, snake_case names ending in digits, runs of
    8+ digits (item, product, tracking numbers). Cheap string tests settle most words; only words with
    punctuation inside are split by a regex."""
    for raw in filterfalse(str.isalpha, text.split()):
        word = raw.strip(_EDGE_PUNCTUATION)
        if not word or word.isalpha():
            continue
        if word.isdigit():
            if len(word) >= 8:
                yield word
        elif _UPPER_ID.fullmatch(word) or _SNAKE_ID.fullmatch(word):
            yield word
        elif (word.upper() != word.lower() or len(word) >= 8) and not word.isalnum():
            yield from filter(_is_identifier, _NON_WORD.split(word))


def _is_identifier(word: str) -> bool:
    if word.isdigit():
        return len(word) >= 8
    return bool(_UPPER_ID.fullmatch(word) or _SNAKE_ID.fullmatch(word))


def _locate(text: str, word: str, cursor: int) -> tuple[int, int] | None:
    """The first whole-word occurrence of ``word`` at or after ``cursor``; a digit run counts only
    outside amounts and decimals ($12345678, 1234.5678)."""
    n = len(word)
    start = text.find(word, cursor)
    while start != -1:
        end = start + n
        whole = not (start and _IDENT_CHAR.match(text, start - 1)) and not _IDENT_CHAR.match(text, end)
        if whole and not (word.isdigit() and ((start and text[start - 1] in "$.,-") or _DECIMAL_TAIL.match(text, end))):
            return start, end
        start = text.find(word, start + 1)
    return None


class GroundednessArgs(RuleArgs):
    check: list[FactKind] = Field(default_factory=lambda: list[FactKind](["amounts", "dates", "identifiers"]))
    include_system: bool = True


@rule_type("groundedness", GroundednessArgs)
def groundedness(view: ConversationView, args: GroundednessArgs) -> Iterator[Hit]:
    """Amounts, dates and identifiers the assistant states must appear in tool results or user turns."""
    roles = ("tool", "user", "system") if args.include_system else ("tool", "user")
    source: _Source | None = None
    for i, text in view.assistant_texts:
        if not _DIGIT.search(text):
            continue
        if source is None:
            idx = [k for k, m in enumerate(view.messages) if m.role in roles]
            joined = "\n".join(view.texts[k] for k in idx)
            # system prompts' words first: they are shared across conversations, so looking there is free
            idx.sort(key=lambda k: view.messages[k].role != "system")
            source = _Source(joined, view.words_of(idx))
        if "amounts" in args.check and "$" in text:
            for m in _AMOUNT.finditer(text):
                if source.amount(m.group(0)) is False:
                    yield _ungrounded("amount", i, text, m.start(), m.end())
        if "dates" in args.check:
            for rx in _DATES:
                for m in rx.finditer(text):
                    start, value = m.start(), m.group(0)
                    if start and text[start - 1].isalnum():
                        continue
                    if source.date(value) is False:
                        yield _ungrounded("date", i, text, start, m.end())
        if "identifiers" in args.check:
            cursor = 0
            for word in _identifier_words(text):
                if source.word(word.lstrip("#")) is not False:
                    continue
                span = _locate(text, word, cursor)
                if span is not None:
                    cursor = span[1]
                    yield _ungrounded("identifier", i, text, *span)


# Distinct facts of one conversation looked up by scanning the whole source. Each scan costs the
# source's length, so without a cap a hostile reply of many distinct numbers would cost its length
# times the source's (quadratic). Past the cap, further facts are left unjudged (None), not reported.
MAX_SCANS = 256


class _Source:
    """Where the assistant's facts may come from: tool results and user (and system) turns.

    A word is found when it is a whole token of a source message or, failing that, a substring of the
    source (a scan, counted against MAX_SCANS). A token is a substring too, so while fewer distinct
    facts than the cap were asked for, the cap cannot bind and one substring test answers for a word
    without splitting the source into tokens; past that many, the tokens are built and the scans the
    words asked so far would have cost are counted, and the answers go on as the cap makes them."""

    __slots__ = ("text", "plain_numbers", "tokens", "seen", "scans", "_words", "_found_words")

    def __init__(self, text: str, words: Iterator[frozenset[str]]) -> None:
        self.text = text
        self.plain_numbers: str | None = None
        self.tokens: list[frozenset[str]] = []
        self._words: Iterator[frozenset[str]] | None = words
        self.seen: dict[tuple[str, str], bool | None] = {}
        self.scans = 0
        self._found_words: dict[str, bool] | None = {}  # words answered by a substring test alone

    def _scan(self, kind: str, value: str, find: Callable[[], bool]) -> bool | None:
        key = (kind, value)
        if key in self.seen:
            return self.seen[key]
        if self._found_words is not None and len(self._found_words) + len(self.seen) >= MAX_SCANS:
            self._count_scans(self._found_words)  # the cap may bind from here: count as it counts
        if self.scans >= MAX_SCANS:
            return None
        self.scans += 1
        found = self.seen[key] = find()
        return found

    def amount(self, amount: str) -> bool | None:
        if self.plain_numbers is None:
            self.plain_numbers = self.text.replace(",", "")
        plain = self.plain_numbers
        return self._scan("amount", amount, lambda: _amount_found(plain, amount))

    def date(self, value: str) -> bool | None:
        src = self.text
        return self._scan("date", value, lambda: value in src or any(f in src for f in _date_forms(value)))

    def word(self, word: str) -> bool | None:
        """Whether ``word`` occurs in the source; a whole token of it is found without a scan."""
        found_words = self._found_words
        if found_words is not None:
            found = found_words.get(word)
            if found is None and len(found_words) + len(self.seen) < MAX_SCANS:
                found = found_words[word] = word in self.text
            if found is not None:
                return found
            self._count_scans(found_words)
        if self._token(word):
            return True
        src = self.text
        return self._scan("word", word, lambda: word in src)

    def _count_scans(self, found_words: dict[str, bool]) -> None:
        """The scans the words answered so far would have cost: those that are no whole token."""
        self._found_words = None
        for word, found in found_words.items():
            if not found or not self._token(word):
                self.seen["word", word] = found
                self.scans += 1

    def _token(self, word: str) -> bool:
        if any(word in t for t in self.tokens):
            return True
        while self._words is not None:  # the words of the next source message, from the shared text pass
            words = next(self._words, None)
            if words is None:
                self._words = None
                break
            self.tokens.append(words)
            if word in words:
                return True
        return False


def _ungrounded(kind: str, i: int, text: str, start: int, end: int) -> Hit:
    value = text[start:end]
    return Hit(
        f"{kind} {value} not found in any tool result or user turn",
        [Evidence(i, start, end, value)],
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
        text = view.texts[i].rstrip()
        if not text:
            yield Hit("empty assistant response", [Evidence(i)], {"kind": "empty"})
            continue
        last = text[-1]
        extra = m.__pydantic_extra__
        cut = (extra is not None and extra.get("finish_reason") == "length") or (
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
