"""Values split across consecutive assistant messages: ``"Your card is 4111 1111"`` then ``"1111 1111"``,
``"jane.doe"`` then ``"@example.com"``, a reply streamed as several message chunks.

The detector (:mod:`vigil.rules.pii`) reads each message on its own; here it reads the text around each
boundary between two consecutive assistant texts (a *chain*: assistant texts with nothing but user turns
between them; a tool result or any other message ends the chain). Around every boundary, ``REACH``
characters either side are read, the chain's texts joined as they were streamed (nothing between them);
where a group of digits ends one text and another opens the next (``"4111 1111"``, ``"1111 1111"``),
the same windows are read again with a space between the two, as two replies of one number read. Windows that
touch are read as one, so a chain of tiny chunks is read once, whole, and a chain of long messages only
``2 × REACH`` characters a boundary: the extra work is bounded by the smaller of the chain's length and
``2 × REACH`` a boundary, and linear in the chain whatever it holds.

A value counts when it crosses a boundary and overlaps nothing the detector found inside one message
(that one is reported there already). Everything else is the detector's: its digit gates, the Luhn,
mod-97 and SSN checks, the folding of hidden characters.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from vigil.rules import pii

# The longest value worth finding split: an e-mail address (at most 254 characters), a password after its
# keyword (the keyword recognizer reads 200), a grouped card or IBAN (under 50). A longer token split
# unevenly is found by the detector in the message holding its longer part.
REACH = 256


@dataclass(frozen=True, slots=True)
class Part:
    """Where one message holds part of a split value: its index in the caller's sequence and the span."""

    index: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Split:
    """A value split across messages: its kind, its parts in message order, and its :func:`pii.normal` form;
    ``extends``: it overlaps a value found inside one message (``jane@example.co`` then ``m``), which is
    reported there, and is only of use to redaction."""

    kind: pii.Kind
    parts: tuple[Part, ...]
    value: str
    extends: bool = False


def chains(messages: Iterable[tuple[str, str]]) -> Iterator[list[int]]:
    """Indexes of consecutive assistant texts (two or more) in ``(role, text)`` pairs: an assistant message
    with no text and user turns leave a chain open, any other message ends it."""
    chain: list[int] = []
    for i, (role, text) in enumerate(messages):
        if role == "assistant":
            if text:
                chain.append(i)
        elif role != "user":
            if len(chain) > 1:
                yield chain
            chain = []
    if len(chain) > 1:
        yield chain


def splits(
    texts: Sequence[str], kinds: Sequence[str], inside: Sequence[Sequence[pii.Found]], extending: bool = False
) -> list[Split]:
    """Values of ``kinds`` crossing a boundary of the chain ``texts``, none overlapping ``inside`` (what the
    detector found in each text alone) unless ``extending``, in text order without overlaps. Part indexes
    are positions in ``texts``."""
    chain = _Chain(texts)
    # an empty text's boundaries are its neighbour's, or the chain's own ends: each once, none at an end
    joints = sorted({p for p in chain.offsets[1:-1] if 0 < p < chain.length})
    if "secret" not in kinds:
        joints = [p for p in joints if _could_hold(chain.char(p - 1)) and _could_hold(chain.char(p))]
    if not joints:
        return []
    taken = sorted((chain.offsets[k] + f.start, chain.offsets[k] + f.end) for k, fs in enumerate(inside) for f in fs)
    taken_starts = [a for a, _ in taken]
    found: list[tuple[int, int, pii.Kind, str, bool]] = []
    for a, b in _regions(joints, chain.length):
        spaced = [p for p in joints[bisect_right(joints, a) : bisect_left(joints, b)] if chain.digits_meet(p)]
        for inserted in ([], spaced) if spaced else ([],):
            window = chain.window(a, b, inserted)
            spaces = [p - a + k for k, p in enumerate(inserted)]  # where each inserted space is in the window
            for f in pii.detect(window, kinds):
                if (f.start == 0 and chain.ragged(a)) or (f.end == len(window) and chain.ragged(b)):
                    continue  # the value may go on past the window: the detector saw part of it
                start = a + f.start - bisect_left(spaces, f.start)
                end = a + f.end - bisect_left(spaces, f.end)
                k = bisect_right(joints, start)
                if k == len(joints) or joints[k] >= end:
                    continue  # inside one message
                j = bisect_left(taken_starts, end) - 1
                extends = j >= 0 and taken[j][1] > start
                if extends and not extending:
                    continue  # overlaps a value found inside one message: reported there
                found.append((start, end, f.kind, pii.value_of(f, window), extends))
    kept: list[Split] = []
    reach = 0
    for start, end, kind, value, extends in sorted(found, key=lambda s: (s[0], s[0] - s[1])):
        if start >= reach:
            kept.append(Split(kind, chain.parts(start, end), value, extends))
            reach = end
    return kept


_GROUP = 3  # digits of a group written whole at the end of one reply and the start of the next

# Besides letters, digits, white space and non-ASCII characters (folded, or part of an IDN address), the
# characters a value of a kind other than ``secret`` can hold (base64 runs included). A boundary where either
# side's character is none of these ("Could you confirm?" then "Thanks") has no such value across it. A
# password after its keyword may hold any character but white space, so with ``secret`` every boundary is read.
_IN_VALUES = frozenset("._%+-'@()[]{}<>,/:#=_")


def _could_hold(ch: str) -> bool:
    return ch.isalnum() or ch.isspace() or ch in _IN_VALUES or not ch.isascii()


def _regions(joints: list[int], total: int) -> Iterator[tuple[int, int]]:
    """``REACH`` characters either side of each joint, windows that touch merged."""
    a, b = max(0, joints[0] - REACH), min(total, joints[0] + REACH)
    for p in joints[1:]:
        if p - REACH <= b:
            b = min(total, p + REACH)
        else:
            yield a, b
            a, b = p - REACH, min(total, p + REACH)
    yield a, b


class _Chain:
    """The texts of a chain as one text, without joining them: positions count across the texts."""

    __slots__ = ("texts", "offsets", "length")

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = texts
        self.offsets = [0]
        for t in texts:
            self.offsets.append(self.offsets[-1] + len(t))
        self.length = self.offsets[-1]

    def char(self, p: int) -> str:
        k = bisect_right(self.offsets, p) - 1
        return self.texts[k][p - self.offsets[k]]

    def digits_meet(self, p: int) -> bool:
        """Whether a group of digits ends the text before joint ``p`` and another opens the one after it:
        three digits or more each side (``4111 1111`` then ``1111 1111``; ``+1`` then ``0 000 000`` is a
        signed amount cut in two, not a phone number ``+1 0 000 000``)."""
        if p < _GROUP or p + _GROUP > self.length:
            return False
        return all(self.char(q).isdigit() for q in range(p - _GROUP, p + _GROUP))

    def ragged(self, p: int) -> bool:
        """Whether a window edge at ``p`` cuts between two characters of one word (not at the chain's ends)."""
        return 0 < p < self.length and not self.char(p - 1).isspace() and not self.char(p).isspace()

    def window(self, a: int, b: int, inserted: list[int]) -> str:
        """The chain's characters from ``a`` to ``b``, a space at each joint of ``inserted``."""
        pieces, cuts = [], [a, *inserted, b]
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            pieces.append(self._slice(lo, hi))
        return " ".join(pieces)

    def _slice(self, a: int, b: int) -> str:
        offsets, out = self.offsets, []
        k = bisect_right(offsets, a) - 1
        while k < len(self.texts) and offsets[k] < b:
            out.append(self.texts[k][max(0, a - offsets[k]) : b - offsets[k]])
            k += 1
        return "".join(out)

    def parts(self, start: int, end: int) -> tuple[Part, ...]:
        offsets, parts = self.offsets, []
        for k in range(bisect_right(offsets, start) - 1, len(self.texts)):
            if offsets[k] >= end:
                break
            lo, hi = max(start, offsets[k]), min(end, offsets[k + 1])
            if hi > lo:
                parts.append(Part(k, lo - offsets[k], hi - offsets[k]))
        return tuple(parts)
