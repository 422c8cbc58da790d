"""Groundedness answers a word with one substring test while the cap on scans cannot bind, without
splitting the source into tokens, and past the cap answers as splitting and counting would."""

from __future__ import annotations

from typing import Any

import pytest

from tests.rules.test_rules_builtin import a, convo, run, u
from vigil.rules import builtin_text
from vigil.rules.builtin_text import MAX_SCANS
from vigil.rules.view import ConversationView
from vigil.schema import Conversation


def _conv(n: int) -> Conversation:
    """``n`` identifiers stated, a third whole tokens of the source, a third only inside longer source
    words, a third nowhere (interleaved, so the cap falls among all three), then amounts."""
    tokens = " ".join(f"W{k:07d}" for k in range(0, n, 3))
    inside = " ".join(f"xW{k:07d}x" for k in range(1, n, 3))
    amounts = " ".join(f"${k}.50" for k in range(0, n, 2))
    source = f"Orders {tokens}. Refs {inside}. Paid {amounts}."
    ids = " ".join(f"W{k:07d}" for k in range(n))
    paid = " ".join(f"${k}.50" for k in range(n))
    return convo({"role": "system", "content": "policy"}, u(source), a(f"Orders: {ids}."), a(f"Paid {paid}"))


def _slow_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every word looked up among the source's tokens first, as before the substring test."""
    init = builtin_text._Source.__init__

    def tokens_first(self: Any, *args: Any) -> None:
        init(self, *args)
        self._found_words = None

    monkeypatch.setattr(builtin_text._Source, "__init__", tokens_first)


@pytest.mark.parametrize("n", [10, MAX_SCANS // 2 - 3, MAX_SCANS // 2 + 3, MAX_SCANS + 40, 3 * MAX_SCANS])
def test_the_same_findings_as_looking_among_tokens_first(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    conv = _conv(n)
    fast = [(h.message, h.evidence) for h in run("groundedness", conv)]
    _slow_path(monkeypatch)
    assert fast == [(h.message, h.evidence) for h in run("groundedness", conv)]
    assert any("identifier" in m for m, _ in fast)


def test_the_source_is_not_split_into_tokens_below_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    split: list[int] = []
    words = ConversationView.words
    monkeypatch.setattr(ConversationView, "words", lambda self, i: split.append(i) or words(self, i))
    assert [h.details["kind"] for h in run("groundedness", _conv(30))] == ["identifier"] * 10 + ["amount"] * 15
    assert split == []
