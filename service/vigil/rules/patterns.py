r"""Regular expressions for rules, compiled once and searched cheaply.

Rules run on every message of every conversation, and Python's regex engine spends 100 to 200
machine instructions per character on a pattern that does not open with a literal. Two shortcuts
keep that off the hot path without changing what matches:

* Needles: the literal strings one of which every match must contain are read from the parsed
  pattern (``transfer``/``connect`` for the hand-off phrases); when none occurs in the text (a
  C-speed substring test) the text cannot match and the engine is not run.
* Lowering: ``re.IGNORECASE`` makes the engine three to five times slower, so a case-insensitive
  pattern whose meaning does not depend on case (no ``\D``/``\S``/``\W``/``\B``, hex or octal
  escapes, inline flags) is lowercased once and run on the lowercased text. Spans stay valid because
  this path is only taken when lowercasing keeps the text's length; otherwise the ``IGNORECASE``
  pattern runs. Callers quote matches from the original text, never from the match object.

Every pattern runs on RE2 (``google-re2``), whose time is linear in the text whatever the pattern: a
hostile message cannot make a rule backtrack for hours. RE2 has no lookarounds or backreferences; a
pattern that uses them is refused when its pack loads (:func:`compile_linear`). Its ``\b``, ``\w`` and
``\d`` are ASCII-only.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import re2

_CASE_DEPENDENT = re.compile(r"\\[A-Zxu0-9]|\(\?[a-zA-Z-]|\(\?P")  # runs on pack patterns, not traffic


class UnsupportedPattern(ValueError):
    """A pattern the linear-time engine cannot run (a lookaround, a backreference) or not a pattern."""


def _options(ignore_case: bool) -> Any:
    options = re2.Options()
    options.case_sensitive = not ignore_case
    options.log_errors = False
    options.max_mem = 64 << 20  # room for the large alternations of operator packs
    return options


class LinearRegex:
    """An RE2 pattern with the ``re``-like interface of ``google-re2``, searched faster in ASCII text.

    ``google-re2``'s Python layer spends more per call than RE2 itself spends on a short text: for a
    ``str`` it encodes the text to UTF-8 and maps every match's byte offsets back to characters, in
    Python. In ASCII text (``str.isascii`` costs nothing) bytes and characters coincide, so the search
    runs on the text's bytes directly and hands back the same match objects with the same spans. Other
    text (a curly apostrophe or an em dash makes two thirds of real replies non-ASCII) is searched on its
    UTF-8 bytes with google-re2's own steps, each match's offsets counted back to characters more
    cheaply. Anything else (bytes, ``sub``, ``split``) goes to ``google-re2`` unchanged.
    """

    __slots__ = ("_rx", "_match")

    def __init__(self, rx: Any) -> None:
        self._rx = rx
        self._match = rx._regexp.Match

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rx, name)

    def _ascii(self, anchor: Any, text: str, pos: int | None, endpos: int | None) -> Iterator[Any]:
        n = len(text)
        pos = 0 if pos is None else max(0, min(pos, n))
        endpos = n if endpos is None else max(0, min(endpos, n))
        if pos > endpos:
            return
        data, start, rx, match = text.encode("ascii"), pos, self._rx, self._match
        while True:  # the same steps as google-re2's own loop over bytes
            spans = match(anchor, data, pos, endpos)
            if spans[0] == _NULL_SPAN:
                return
            yield _Match(rx, text, start, endpos, spans)
            if pos == endpos:
                return
            pos = pos + 1 if pos == spans[0][1] else spans[0][1]

    def _wide(self, anchor: Any, text: str, pos: int | None, endpos: int | None) -> Iterator[Any]:
        """google-re2's own steps over the text's UTF-8 bytes, each match's offsets counted back to
        characters from the match before it (google-re2 builds a sorted set and a dict per match)."""
        n = len(text)
        pos = 0 if pos is None else max(0, min(pos, n))
        endpos = n if endpos is None else max(0, min(endpos, n))
        if pos > endpos:
            return
        data, start, rx, match = text.encode(), pos, self._rx, self._match
        at = _chars_to_bytes(data, 0, pos)
        end = len(data) if endpos == n else at + _chars_to_bytes(data, at, endpos - pos)
        known_byte, known_char = at, pos  # a byte offset and its character offset, at or before any match
        while True:
            spans = match(anchor, data, at, end)
            first = spans[0]
            if first == _NULL_SPAN:
                return
            begin = first[0]
            known_char += _bytes_to_chars(data, known_byte, begin)
            known_byte = begin
            yield _Match(
                rx,
                text,
                start,
                endpos,
                [
                    _NULL_SPAN
                    if span == _NULL_SPAN
                    else (
                        known_char + _bytes_to_chars(data, begin, span[0]),
                        known_char + _bytes_to_chars(data, begin, span[1]),
                    )
                    for span in spans
                ],
            )
            if at == end:
                return
            at = at + _chars_to_bytes(data, at, 1) if at == first[1] else first[1]

    def _run(self, anchor: Any, text: Any, pos: int | None, endpos: int | None) -> Iterator[Any]:
        if type(text) is str:
            return self._ascii(anchor, text, pos, endpos) if text.isascii() else self._wide(anchor, text, pos, endpos)
        return self._rx._match(anchor, text, pos, endpos)  # type: ignore[no-any-return]

    def search(self, text: Any, pos: int | None = None, endpos: int | None = None) -> Any:
        return next(self._run(_UNANCHORED, text, pos, endpos), None)

    def match(self, text: Any, pos: int | None = None, endpos: int | None = None) -> Any:
        return next(self._run(_ANCHOR_START, text, pos, endpos), None)

    def fullmatch(self, text: Any, pos: int | None = None, endpos: int | None = None) -> Any:
        return next(self._run(_ANCHOR_BOTH, text, pos, endpos), None)

    def finditer(self, text: Any, pos: int | None = None, endpos: int | None = None) -> Iterator[Any]:
        return self._run(_UNANCHORED, text, pos, endpos)


def has_internals(module: Any) -> bool:
    """Whether ``module`` (google-re2) has the internals the fast paths above read; a release without them
    runs google-re2 as it is (:func:`compile_linear` hands out its own compiled objects)."""
    try:
        anchors = (module._Anchor.UNANCHORED, module._Anchor.ANCHOR_START, module._Anchor.ANCHOR_BOTH)
        steps = (module._Match, module._re2.CharLenToBytes, module._re2.BytesToCharLen)
        match = getattr(module.compile("a")._regexp, "Match", None)
        return module._NULL_SPAN is not None and None not in anchors and all(map(callable, (*steps, match)))
    except AttributeError:
        return False


FAST_PATHS = has_internals(re2)
if FAST_PATHS:
    _NULL_SPAN = re2._NULL_SPAN
    _chars_to_bytes = re2._re2.CharLenToBytes  # (data, byte offset, characters) -> their length in bytes
    _bytes_to_chars = re2._re2.BytesToCharLen  # (data, byte offset, byte end) -> characters between
    _Match = re2._Match
    _UNANCHORED, _ANCHOR_START, _ANCHOR_BOTH = re2._Anchor.UNANCHORED, re2._Anchor.ANCHOR_START, re2._Anchor.ANCHOR_BOTH


def compile_linear(pattern: str, ignore_case: bool = False) -> Any:
    """``pattern`` compiled for RE2; raises UnsupportedPattern with what RE2 objects to."""
    try:
        rx = re2.compile(pattern, _options(ignore_case))
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        raise UnsupportedPattern(
            f"not a pattern the linear-time engine (RE2) runs: {reason} "
            "(lookarounds and backreferences are not supported)"
        ) from None
    return LinearRegex(rx) if FAST_PATHS else rx


def needles(pattern: str) -> tuple[str, ...] | None:
    """Literal strings one of which every match of ``pattern`` contains, or None if none is known."""
    try:
        ops = importlib.import_module("re._constants")
        parser = importlib.import_module("re._parser")
    except ImportError:  # the parser is internal; without it patterns simply run unfiltered
        return None
    try:
        return _needles(parser.parse(pattern), ops)
    except Exception:
        return None


def _needles(items: Any, ops: Any) -> tuple[str, ...] | None:
    best: tuple[str, ...] | None = None

    def consider(found: tuple[str, ...] | None) -> None:
        nonlocal best
        if found and (best is None or min(map(len, found)) > min(map(len, best))):
            best = found

    run: list[str] = []
    for op, av in [*items, (None, None)]:
        if op == ops.LITERAL:
            run.append(chr(av))
            continue
        if run:
            consider(("".join(run),))
            run = []
        if op == ops.SUBPATTERN:
            consider(_needles(av[-1], ops))
        elif op == ops.BRANCH:
            alternatives = [_needles(alt, ops) for alt in av[1]]
            if all(alternatives):
                consider(tuple(sorted({n for alt in alternatives for n in alt})))  # type: ignore[union-attr]
    return best


_lowered_texts = lru_cache(maxsize=256)(str.lower)


def lowered(text: str) -> str:
    """``text.lower()``, computed once for the texts every pattern of every rule searches in turn."""
    return _lowered_texts(text) if len(text) <= 65536 else text.lower()


class Pattern:
    """A compiled search pattern; ``search``/``spans`` give character spans of the original text."""

    __slots__ = ("pattern", "ignore_case", "_rx", "_lowered", "_needles")

    def __init__(self, pattern: str, ignore_case: bool = True) -> None:
        self.pattern = pattern
        self.ignore_case = ignore_case
        self._rx = compile_linear(pattern, ignore_case)
        self._lowered: Any = None
        self._needles: tuple[str, ...] | None = None
        if pattern.startswith(("^", "\\A")):
            return  # anchored: the engine tries one position only, nothing to save
        if not ignore_case:
            self._needles = needles(pattern)
        elif not _CASE_DEPENDENT.search(pattern):
            try:
                self._lowered = compile_linear(pattern.lower())
            except UnsupportedPattern:
                self._lowered = None
            else:
                self._needles = needles(pattern.lower())

    def _prepared(self, text: str) -> tuple[Any, str] | None:
        """The pattern and subject to run, or None when the text cannot match."""
        rx, subject = self._rx, text
        if self._lowered is not None:
            low = lowered(text)
            if len(low) != len(text):
                return rx, text
            rx, subject = self._lowered, low
        elif self.ignore_case:
            return rx, text
        if self._needles is not None and not any(map(subject.__contains__, self._needles)):
            return None
        return rx, subject

    def search(self, text: str, pos: int = 0) -> tuple[int, int] | None:
        prepared = self._prepared(text)
        if prepared is None:
            return None
        m = prepared[0].search(prepared[1], pos)
        return m.span() if m else None

    def spans(self, text: str) -> Iterator[tuple[int, int]]:
        prepared = self._prepared(text)
        if prepared is not None:
            for m in prepared[0].finditer(prepared[1]):
                yield m.span()


_CACHE: dict[tuple[str, bool], Pattern] = {}


def pattern(text: str, ignore_case: bool = True) -> Pattern:
    """The shared compiled :class:`Pattern` for ``text`` (compiled on first use, then cached)."""
    key = (text, ignore_case)
    found = _CACHE.get(key)
    if found is None:
        found = _CACHE[key] = Pattern(text, ignore_case)
    return found
