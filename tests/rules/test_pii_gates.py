"""The detector skips a search a text cannot satisfy (too few digits for a phone or a card number, no
bracketed "at" or spelled-out "dot" for an obfuscated address) and finds exactly what it found
searching everything."""

from __future__ import annotations

import pytest

from bench.pii_recall import load
from vigil.rules import pii

CORPUS = load()
TEXTS = [case["text"] for group in ("positives", "negatives") for case in CORPUS[group]] + [
    "call 555-0123",
    "call 555-012",
    "card 4111 1111 1111 1111 and 411111111111",
    "4242424242424",
    "jane [.] Dot at example.com",
    "jane dot doe AT example DOT com",
    "reach jane(at)example.com or bob [@] example.com",
    "meet at home.com (noon)",
    "İstanbul: jane DOT doe at example dot com, phone ５５５-０１２３",
    "İ jane dot doe at example dot com",
]


def _everything(kinds: tuple[pii.Kind, ...]) -> list[list[pii.Found]]:
    return [pii.detect(text, kinds) for text in TEXTS]


@pytest.mark.parametrize("kinds", [("email", "phone", "card"), pii.KINDS, ("phone",), ("card", "ssn"), ("email",)])
def test_skipped_searches_find_nothing_a_full_search_finds(
    kinds: tuple[pii.Kind, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    gated = _everything(kinds)
    monkeypatch.setattr(pii, "_LEAST_DIGITS", ())
    monkeypatch.setattr(pii, "_spelled", lambda text, low: True)
    assert gated == _everything(kinds)
    assert any(gated)


def test_a_text_with_too_few_digits_is_not_searched_for_phones_or_cards(monkeypatch: pytest.MonkeyPatch) -> None:
    searched: list[str] = []
    monkeypatch.setattr(pii, "_phones", lambda text, low: searched.append(text) or iter(()))
    pii.detect("Your order #W12345 ships on the 3rd.", ("email", "phone", "card"))
    assert searched == []
    pii.detect("Your order #W1234567 ships on the 3rd.", ("email", "phone", "card"))
    assert searched == ["Your order #W1234567 ships on the 3rd."]


@pytest.mark.parametrize("kinds", [("email", "phone", "card"), tuple(k for k in pii.KINDS if k != "secret")])
def test_boundaries_skipped_for_their_characters_hold_no_split_value(
    kinds: tuple[pii.Kind, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every text of the corpus cut in two at every place: what is found across the cut is the same whether
    or not the boundaries no value can cross (``?`` then ``T``) are skipped."""
    from vigil.rules import pii_split

    pairs = [(t[:cut], t[cut:]) for t in TEXTS if len(t) < 300 for cut in range(1, len(t))]
    inside = [(pii.detect(x, kinds), pii.detect(y, kinds)) for x, y in pairs]

    def found() -> list[list[pii_split.Split]]:
        return [pii_split.splits(pair, kinds, both) for pair, both in zip(pairs, inside, strict=True)]

    gated = found()
    monkeypatch.setattr(pii_split, "_could_hold", lambda ch: True)
    assert gated == found()
    assert sum(map(len, gated)) > 100
