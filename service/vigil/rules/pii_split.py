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

A keyword ending one text and its value opening the next (``"Your temporary password is:"`` then
``"hunter2!x"``, ``"You can reach her at"`` then ``"4155550123"``) is a value in one message that the
detector, reading it alone, does not find: a password, a bare phone number, a date of birth or an SSN is
one only after its keyword (:data:`pii.KEYWORDS`). It counts when the clause runs on across the boundary:
no sentence ends (``.``, ``!``, ``?``) at the end of the first text or between the boundary and the value,
and a password after a keyword written out (``the new token``) is not a bare word (``Please``), which
opens a sentence. Streamed, a phone number, date or SSN is found after its keyword as it is (their
patterns allow words between them); a password needs white space or ``:``/``=`` after its keyword, so
where a password's keyword ends a text within ``_KEYWORD_REACH`` characters and no white space separates
it from the next, the window is also read with a space there (``password is`` then ``hunter2!x``: the
password is ``hunter2!x``, not ``ishunter2!x``, and of the two readings this one is kept).
"""

from __future__ import annotations

import re
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
    reported there, and is only of use to redaction; ``after``: the value lies in one message and is one by
    the keyword that ends the text of this index (``Your temporary password is:`` then ``hunter2!x``)."""

    kind: pii.Kind
    parts: tuple[Part, ...]
    value: str
    extends: bool = False
    after: int | None = None


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


def answered(chain: Sequence[int], roles: Sequence[str]) -> frozenset[int]:
    """The positions in ``chain`` (indexes of ``roles``' messages) of the texts a user turn comes before,
    after the chain's text before them: what a keyword before that turn said does not reach into them."""
    return frozenset(
        k for k in range(1, len(chain)) if any(roles[j] == "user" for j in range(chain[k - 1] + 1, chain[k]))
    )


def splits(
    texts: Sequence[str],
    kinds: Sequence[str],
    inside: Sequence[Sequence[pii.Found]],
    extending: bool = False,
    after_turn: frozenset[int] = frozenset(),
) -> list[Split]:
    """Values of ``kinds`` crossing a boundary of the chain ``texts``, or made values by a keyword before the
    boundary (:data:`pii.KEYWORDS`), none overlapping ``inside`` (what the detector found in each text alone)
    unless ``extending``, in text order without overlaps. Part indexes are positions in ``texts``.
    ``after_turn``: the positions of texts a user turn comes before (:func:`answered`); a keyword's value is
    not read across one (the reply answers the user), a value split across one is."""
    chain = _Chain(texts)
    joints = _joints(chain, kinds)
    if not joints:
        return []
    # A password's keyword needs white space before its value ("password is hunter2"): a phone number, a date
    # of birth or an SSN is found after its keyword streamed ("reach her at4155550123"), but for the keyword
    # itself glued to the digits ("DOB" then "03/14/1985": no word ends at "DOB0"). No space elsewhere: inside
    # a word it would cut the words that say a number is not a phone ("o" then "rder 5550123456").
    needles = pii.KEYWORDS["secret"] if "secret" in kinds else ()
    digit_words = tuple(w for k in ("phone", "dob", "ssn") if k in kinds for w in pii.KEYWORDS[k])
    taken = sorted((chain.offsets[k] + f.start, chain.offsets[k] + f.end) for k, fs in enumerate(inside) for f in fs)
    taken_starts = [t for t, _ in taken]
    found: list[_Candidate] = []
    spelled: set[int] = set()  # joints a password's keyword ends, where a value was read with a space
    for a, b in _regions(joints, chain.length):
        inner = joints[bisect_right(joints, a) : bisect_left(joints, b)]
        keyworded = {p for p in inner if needles and chain.keyword_before(p, needles)}
        spaced = [
            p
            for p in inner
            if p in keyworded or chain.digits_meet(p) or (digit_words and chain.keyword_ends(p, digit_words))
        ]
        for inserted in ([], spaced) if spaced else ([],):
            for start, end, kind, value, extends, one in _read(
                chain, a, b, inserted, kinds, joints, taken, taken_starts
            ):
                first = bool(inserted) and start in keyworded
                if first and kind == "secret" and one and not extends:  # a value by the keyword alone
                    spelled.add(start)
                if one:
                    after = None if extends else chain.keyword_made(kind, value, start, a, after_turn)
                    if after is not None:
                        found.append(_Candidate(start, end, kind, value, False, after, first))
                elif (extending or not extends) and not (
                    kind == "secret" and chain.joiner_glued(start, end, keyworded)
                ):
                    found.append(_Candidate(start, end, kind, value, extends, None, False))
    kept = _without_overlaps(found, sorted(spelled))
    return [Split(c.kind, chain.parts(c.start, c.end), c.value, c.extends, c.after) for c in kept]


# Of the text after a password that ends one, this many characters are read with it: the word that follows
# (``pii._opens_sentence`` reads 16 characters after a value) and the white space before it.
_READ_ON = 32


def read_on(
    texts: Sequence[str], inside: Sequence[Sequence[pii.Found]], after_turn: frozenset[int] = frozenset()
) -> Iterator[tuple[int, pii.Found]]:
    """The secrets found inside a text of the chain ``texts`` (``inside``, as :func:`splits` takes them) that are
    none once the next text is read on from them: a reply cut right after the word a keyword labels
    (``...change your password: Open``, then `` Settings and tap Reset``) reads alone as a password, but the
    two are one instruction. Each as ``(position in texts, found)``. Only a secret that is a word and ends its
    text (but for white space) is read again, with ``REACH`` characters before it and ``_READ_ON`` of the
    next text, never across a user turn (``after_turn``, as :func:`splits` takes it: the next reply answers
    the user): a few hundred characters, and only where a reply ends with a word a keyword labels."""
    for k in range(len(texts) - 1):
        if k + 1 in after_turn:
            continue
        text = texts[k]
        end = len(text.rstrip())
        for found in inside[k]:
            if found.kind != "secret" or found.end != end or not text[found.start : found.end].isalpha():
                continue  # only a word can be the first of a sentence; a token cut in two is read by splits()
            lo = max(0, found.start - REACH)
            alone = text[lo:end]
            if not _secret_at(alone, found.start - lo, found.end - lo):
                continue  # its keyword lies beyond the window: the detector's own reading stands
            if not _secret_at(text[lo:] + texts[k + 1][:_READ_ON], found.start - lo, found.end - lo):
                yield k, found


def _secret_at(window: str, start: int, end: int) -> bool:
    return any(f.start < end and start < f.end for f in pii.detect(window, ["secret"]))


def _joints(chain: _Chain, kinds: Sequence[str]) -> list[int]:
    """The boundaries worth reading: an empty text's are its neighbour's, or the chain's own ends (each once,
    none at an end); without ``secret``, not one where a character no value holds is on a side, unless a
    keyword ends the text before it ("phones" then '": [4155550123') and no sentence."""
    joints = sorted({p for p in chain.offsets[1:-1] if 0 < p < chain.length})
    if "secret" in kinds:
        return joints
    words = tuple(w for kind in kinds if kind in pii.KEYWORDS for w in pii.KEYWORDS[kind])
    return [
        p
        for p in joints
        if (_could_hold(chain.char(p - 1)) and _could_hold(chain.char(p)))
        or (words and chain.char(p - 1) not in _ENDS and any(w in chain.tail(p) for w in words))
    ]


def _read(
    chain: _Chain,
    a: int,
    b: int,
    inserted: list[int],
    kinds: Sequence[str],
    joints: list[int],
    taken: list[tuple[int, int]],
    taken_starts: list[int],
) -> Iterator[tuple[int, int, pii.Kind, str, bool, bool]]:
    """What the detector finds in the chain from ``a`` to ``b`` with a space at each of ``inserted``: each
    value's span in the chain, kind, value, whether it overlaps one of ``taken`` (found inside a message,
    sorted, and their starts), and whether it lies in one message."""
    window = chain.window(a, b, inserted)
    spaces = [p - a + k for k, p in enumerate(inserted)]  # where each inserted space is in the window
    for f in pii.detect(window, kinds):
        if (f.start == 0 and chain.ragged(a)) or (f.end == len(window) and chain.ragged(b)):
            continue  # the value may go on past the window: the detector saw part of it
        start = a + f.start - bisect_left(spaces, f.start)
        end = a + f.end - bisect_left(spaces, f.end)
        j = bisect_left(taken_starts, end) - 1
        k = bisect_right(joints, start)
        yield (
            start,
            end,
            f.kind,
            pii.value_of(f, window),
            j >= 0 and taken[j][1] > start,
            k == len(joints) or joints[k] >= end,
        )


@dataclass(frozen=True, slots=True)
class _Candidate:
    start: int
    end: int
    kind: pii.Kind
    value: str
    extends: bool
    after: int | None
    first: bool  # it starts at a boundary its keyword ends, read with a space there


def _without_overlaps(found: list[_Candidate], spelled: list[int]) -> list[_Candidate]:
    """The first of overlapping values, and of two starting together the longer; before all others, a value
    read with a space at the boundary its keyword ends (``password is`` then ``hunter2!x``: the password is
    ``hunter2!x``, not ``ishunter2!x`` as the two read streamed). A password read streamed across a boundary
    where one was read with a space is dropped even when that one was not kept (``the password is`` then
    ``Please log in``: not the password ``isPlease``)."""
    first = _greedy(c for c in found if c.first)
    first_starts = [c.start for c in first]
    rest = []
    for c in found:
        if c.first or (c.kind == "secret" and bisect_left(spelled, c.end) > bisect_right(spelled, c.start)):
            continue
        i = bisect_left(first_starts, c.end) - 1  # kept apart and in order: the last to start is the last to end
        if i < 0 or first[i].end <= c.start:
            rest.append(c)
    return sorted([*first, *_greedy(rest)], key=lambda c: c.start)


def _greedy(found: Iterable[_Candidate]) -> list[_Candidate]:
    kept: list[_Candidate] = []
    reach = 0
    for c in sorted(found, key=lambda c: (c.start, c.start - c.end)):
        if c.start >= reach:
            kept.append(c)
            reach = c.end
    return kept


_GROUP = 3  # digits of a group written whole at the end of one reply and the start of the next

# Besides letters, digits, white space and non-ASCII characters (folded, or part of an IDN address), the
# characters a value of a kind other than ``secret`` can hold (base64 runs included). A boundary where either
# side's character is none of these ("Could you confirm?" then "Thanks") has no such value across it. A
# password after its keyword may hold any character but white space, so with ``secret`` every boundary is read.
_IN_VALUES = frozenset("._%+-'@()[]{}<>,/:#=_")


# A keyword's value across a boundary: the keyword within this many characters of the text's end (past
# "the password for your account is set to"), and the clause it opens not ended before the value.
_KEYWORD_REACH = 64
_ENDS = frozenset(".!?")
_JOINERS = frozenset(("is", "was", "be", "to"))  # the last word of "password is", "will be", "set to"
_SENTENCE_END = re.compile(r"[.!?]\s")  # on at most 2 x REACH characters


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

    def keyword_before(self, p: int, needles: tuple[str, ...]) -> bool:
        """Whether the text before joint ``p`` ends with one of ``needles`` near its end, in a clause that goes
        on into the next text with no white space between them (``password is`` then ``hunter2``): the two
        read streamed glue the keyword's last word to the value."""
        before, here = self.char(p - 1), self.char(p)
        if before.isspace() or here.isspace() or before in _ENDS:
            return False
        tail = self.tail(p)
        return any(w in tail for w in needles)

    def keyword_ends(self, p: int, words: tuple[str, ...]) -> bool:
        """Whether the text before joint ``p`` ends with one of ``words``, a letter, and the next opens with a
        digit (``Patient DOB`` then ``03/14/1985``)."""
        return self.char(p - 1).isalpha() and self.char(p).isdigit() and self.tail(p).endswith(words)

    def joiner_glued(self, start: int, end: int, keyworded: set[int]) -> bool:
        """Whether a password read streamed from ``start`` to ``end`` opens with the word that joins a keyword
        to its value, glued to the next text at a boundary a keyword ends (``password is`` then ``[...]``:
        not the password ``is:[``)."""
        k = bisect_right(self.offsets, start)
        if k >= len(self.offsets) or self.offsets[k] not in keyworded or self.offsets[k] >= end:
            return False
        return self._slice(start, self.offsets[k]).rstrip(":=").lower() in _JOINERS

    def tail(self, p: int) -> str:
        """The last ``_KEYWORD_REACH`` characters of the text that ends at joint ``p``, lower case."""
        k = bisect_right(self.offsets, p - 1) - 1
        at = p - self.offsets[k]
        return self.texts[k][max(0, at - _KEYWORD_REACH) : at].lower()

    def keyword_made(self, kind: str, value: str, start: int, a: int, after_turn: frozenset[int]) -> int | None:
        """For a value found at ``start`` in a window from ``a`` and lying in one text, which the detector
        did not find reading that text alone: the index of the text before whose keyword made it a value, if
        one clause runs from that text to the value (no sentence ends between them, no user turn comes
        between them: the positions ``after_turn``); else None. A word opening the next message after a
        keyword written out (``the new token`` then ``Please log in``) is the start of a sentence, not a
        password, nor one with the mark that ends its sentence (``Thanks!``, ``Here:``)."""
        if kind not in pii.KEYWORDS:
            return None
        holder = bisect_right(self.offsets, start) - 1
        q = self.offsets[holder]  # where the text holding the value starts
        lead = self._slice(q, start)
        if q <= a or _SENTENCE_END.search(lead):
            return None
        p = q - 1
        while p > max(a, q - _KEYWORD_REACH) and self.char(p).isspace():
            p -= 1
        last = self.char(p)
        # a word, with the mark that ends its sentence or opens what follows ("Thanks!", "Here:"), after a
        # keyword written out opens a sentence of its own; not after the label that ends a keyword cut in two
        # ("Your pass" then "word: Sunshine and ...")
        labelled = lead.rstrip().endswith((":", "="))
        if last in _ENDS or (kind == "secret" and value.rstrip(".!?:").isalpha() and last.isalpha() and not labelled):
            return None
        keyword = bisect_right(self.offsets, p) - 1
        if after_turn and any(k in after_turn for k in range(keyword + 1, holder + 1)):
            return None
        return keyword

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
