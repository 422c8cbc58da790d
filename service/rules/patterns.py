"""Regular expressions for rules, compiled once and searched cheaply.

``re.IGNORECASE`` makes Python's regex engine three to five times slower on literal-heavy patterns,
and rules run on every message of every conversation. So a case-insensitive pattern whose meaning
does not depend on case (no ``\\D``/``\\S``/``\\W``/``\\B``, hex or octal escapes, inline flags) is
lowercased once and run case-sensitively on the lowercased text. Spans stay valid because the
fast path is only taken when lowercasing keeps the text's length; otherwise the ``IGNORECASE``
pattern runs. Callers quote matches from the original text, never from the match object.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_CASE_DEPENDENT = re.compile(r"\\[A-Zxu0-9]|\(\?[a-zA-Z-]|\(\?P")


class Pattern:
    """A compiled search pattern; ``search``/``spans`` give character spans of the original text."""

    __slots__ = ("pattern", "ignore_case", "_rx", "_lowered")

    def __init__(self, pattern: str, ignore_case: bool = True) -> None:
        self.pattern = pattern
        self.ignore_case = ignore_case
        self._rx = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
        self._lowered: re.Pattern[str] | None = None
        if ignore_case and not _CASE_DEPENDENT.search(pattern):
            try:
                self._lowered = re.compile(pattern.lower())
            except re.error:
                self._lowered = None

    def _prepared(self, text: str) -> tuple[re.Pattern[str], str]:
        if self._lowered is not None:
            low = text.lower()
            if len(low) == len(text):
                return self._lowered, low
        return self._rx, text

    def search(self, text: str, pos: int = 0) -> tuple[int, int] | None:
        rx, subject = self._prepared(text)
        m = rx.search(subject, pos)
        return m.span() if m else None

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        rx, subject = self._prepared(text)
        for m in rx.finditer(subject):
            yield m.span()


_CACHE: dict[tuple[str, bool], Pattern] = {}


def pattern(text: str, ignore_case: bool = True) -> Pattern:
    """The shared compiled :class:`Pattern` for ``text`` (compiled on first use, then cached)."""
    key = (text, ignore_case)
    found = _CACHE.get(key)
    if found is None:
        found = _CACHE[key] = Pattern(text, ignore_case)
    return found
