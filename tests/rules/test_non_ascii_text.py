"""Non-ASCII text (two thirds of real replies have a curly apostrophe or an em dash) read cheaply with the
same answers: rule patterns searched on its bytes give google-re2's own matches, spans and groups, and
a text nothing in it folds is its own folded form."""

from __future__ import annotations

import random
from typing import Any

import pytest
import re2

from vigil.rules import pii
from vigil.rules.fold import Folded
from vigil.rules.patterns import compile_linear

PATTERNS = [
    r"\w+",
    r"(a)|(b)",
    r"x*",  # empty matches: each step moves on by one character, not one byte
    r"(?:’|')s\b",
    r"([\p{L}\p{N}]+)@([\p{L}\p{N}]+)\.(\p{L}{2,})",
    r"\d{3}[ \-–]\d{4}",
    r"(?i)straße|ÉTÉ",
    r"$",
]
TEXTS = [
    "It’s the customer’s “order” — #W123 at 555–0123",
    "jöse@exämple.de and 🎉 a@b.cc ✈️ bb",
    "STRASSE straße été ÉTÉ ǅ x",
    "𝟘𝟙𝟚 ４２ \u200b\u00a0 end",
    "",
]


def _spans(m: Any) -> list[tuple[int, int]]:
    return [m.span(g) for g in range(m.re.groups + 1)]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_non_ascii_text_matches_as_google_re2_matches_it(pattern: str) -> None:
    rx = compile_linear(pattern)
    rng = random.Random(7)
    alphabet = "ab x’—–“é🎉ß\u200b0123@.-"
    texts = TEXTS + ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40))) for _ in range(200)]
    for text in texts:
        n = len(text)
        for pos, endpos in [(None, None), (1, None), (2, n - 1), (n, None), (3, 2)]:
            ours = [(_spans(m), m.pos, m.endpos, m.group(0)) for m in rx.finditer(text, pos, endpos)]
            theirs = [(_spans(m), m.pos, m.endpos, m.group(0)) for m in rx._rx.finditer(text, pos, endpos)]
            assert ours == theirs, (pattern, text, pos, endpos)
            for name in ("search", "match", "fullmatch"):
                a, b = getattr(rx, name)(text, pos, endpos), getattr(rx._rx, name)(text, pos, endpos)
                assert (a and _spans(a)) == (b and _spans(b)), (name, pattern, text, pos, endpos)


def test_non_ascii_text_is_not_searched_by_google_re2s_python_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    rx = compile_linear(r"[\p{L}.]+@[\p{L}.]+")

    def refused(*args: Any) -> Any:
        raise AssertionError("google-re2's per-match offset mapping ran")

    monkeypatch.setattr(re2._Regexp, "_match", refused)
    text = "She’s at jöse@exämple.de — “call me”"
    assert rx.search(text).span() == (9, 24) and text[9:24] == "jöse@exämple.de"
    found = pii.detect("Reach me at jane@example.com — it’s fine", ["email"])
    assert [(f.kind, f.start, f.end) for f in found] == [("email", 12, 28)]


def _reference_fold(text: str) -> tuple[str, list[int]]:
    """The folded text and, for each folded character, where it came from: character by character."""
    from vigil.rules.fold import _between_digits, fold_char

    out, origin = [], []
    for i, ch in enumerate(text):
        folded = ch if ch.isascii() else fold_char(ch)
        if folded == "-" and ch != "-" and not _between_digits(text, i):
            folded = ch
        out.append(folded)
        origin.extend([i] * len(folded))
    return "".join(out), origin


@pytest.mark.parametrize(
    "text",
    [
        "It’s the “order” — it’s fine – really",
        "Call 555—0123 or ５５５‐０１２３ — it’s “urgent”",
        "jane@exam\u200bple.com’s ＠ ｆｕｌｌ ①",
        "a\u00ad’b—c 1–2 x–y ’" * 3,
        "ǅ " + "é" * 20 + " 4111\u00a01111\u00a01111\u00a01111",
    ],
)
def test_folding_maps_back_as_character_by_character_folding_does(text: str) -> None:
    folded = Folded(text)
    expected, origin = _reference_fold(text)
    assert folded.text == expected
    assert folded.changed == (expected != text)
    for p in range(len(expected)):
        assert folded.start(p) == origin[p] and folded.end(p + 1) == origin[p] + 1, p


def test_a_text_nothing_in_it_folds_is_kept_as_it_is() -> None:
    text = "It’s your “order” — the one you placed – thanks"
    folded = Folded(text)
    assert not folded.changed and folded.text is text
    assert Folded("555—0123").changed and Folded("555—0123").text == "555-0123"


def test_a_google_re2_without_the_internals_the_fast_paths_read_runs_the_rules_on_google_re2_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast paths read google-re2's internals; a release without them (checked at import) is found out, and
    patterns then compile to google-re2's own objects and rules find the same spans."""
    import types

    from vigil.rules import patterns

    assert patterns.has_internals(re2) and patterns.FAST_PATHS  # the pinned release has them
    public = types.ModuleType("re2")  # google-re2's public names only
    for name in ("compile", "Options", "error", "escape"):
        setattr(public, name, getattr(re2, name))
    assert not patterns.has_internals(public)
    fast = [m.span() for m in compile_linear(r"\w+’s").finditer(TEXTS[0])]
    monkeypatch.setattr(patterns, "FAST_PATHS", False)
    rx = compile_linear(r"\w+’s")
    assert type(rx) is not patterns.LinearRegex
    assert [m.span() for m in rx.finditer(TEXTS[0])] == fast == [(0, 4), (9, 19)]
    assert patterns.Pattern("customer’s").search(TEXTS[0]) == (9, 19)
