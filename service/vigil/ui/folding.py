"""Which messages of a long conversation a page renders, and the folded gaps between them.

A coding agent's transcript can run to tens of thousands of messages; rendering all of them made a
page of megabytes that took seconds to load. A page shows at most ``HEAD + TAIL`` messages by default
(the first and the last) and folds the middle into a row that links to a bounded window of it
(``?messages=100-399``); ``?around=N`` opens the window centred on message N, which is where a link to a
folded message goes. Everything is plain links, so the fold works without JavaScript.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HEAD = 100  # first messages shown by default
TAIL = 200  # last messages shown by default
WINDOW = 300  # most messages one window shows

_RANGE = re.compile(r"\s*(\d{1,9})\s*[-–]\s*(\d{1,9})\s*")
_NUMBER = re.compile(r"\s*(\d{1,9})\s*")


class BadWindow(ValueError):
    """A window parameter the page cannot use; the message says why (shown on a 400 page)."""


@dataclass(frozen=True)
class Gap:
    """Messages ``start``..``end`` (inclusive) folded; ``opens`` is the window its link shows."""

    start: int
    end: int
    opens: tuple[int, int]

    @property
    def count(self) -> int:
        return self.end - self.start + 1

    @property
    def query(self) -> str:
        return f"messages={self.opens[0]}-{self.opens[1]}"


@dataclass(frozen=True)
class Fold:
    """The shown ranges (half-open, in order) of a conversation of ``total`` messages."""

    total: int
    shown: tuple[tuple[int, int], ...]
    window: tuple[int, int] | None = None  # the asked-for window (inclusive), kept by the page's own links
    # the page's path, so its links lead to it also from a form post's answer (a refused label is shown at
    # .../label, where "?messages=..." asked for a conversation named "<id>/label")
    page: str = ""
    carry: str = ""  # a query every link to the page keeps (``from=``: its crumb back to a list)

    @property
    def folded(self) -> bool:
        return sum(b - a for a, b in self.shown) < self.total

    def visible(self, index: int) -> bool:
        return any(a <= index < b for a, b in self.shown)

    def link(self, query: str = "") -> str:
        """The page's address with ``query`` and what every link of it carries."""
        joined = "&".join(q for q in (query, self.carry) if q)
        return self.page + ("?" + joined if joined else "")

    def href(self, index: object) -> str:
        """Where a link to message ``index`` goes: its anchor here, or the window around it."""
        if not isinstance(index, int) or self.visible(index) or not 0 <= index < self.total:
            return f"#m{index}"  # shown here, or no message of this conversation: nothing to open
        return self.link(f"around={index}") + f"#m{index}"

    @property
    def keep(self) -> str:
        """The query that keeps this page's window (for links back to the same page), '' when none."""
        return f"messages={self.window[0]}-{self.window[1]}" if self.window else ""

    def here(self, query: str) -> str:
        """A link to this page as it is (its window kept) with ``query`` added."""
        return self.link("&".join(q for q in (self.keep, query) if q))

    def gaps(self) -> list[Gap]:
        """The folded runs, each opening the ``WINDOW`` messages next to what is shown before it (the
        start of the run), or for a run at the very start, the messages next to what follows it."""
        out = []
        at = 0
        for a, b in [*self.shown, (self.total, self.total)]:
            if a > at:
                end = a - 1
                opens = (at, min(end, at + WINDOW - 1)) if at > 0 else (max(at, end - WINDOW + 1), end)
                out.append(Gap(at, end, opens))
            at = b
        return out

    def rows(self) -> list[tuple[str, int | Gap]]:
        """The page's transcript in order: ("m", index) for a shown message, ("gap", Gap) for a fold."""
        gaps = {g.start: g for g in self.gaps()}
        out: list[tuple[str, int | Gap]] = []
        at = 0
        for a, b in [*self.shown, (self.total, self.total)]:
            if a > at:
                out.append(("gap", gaps[at]))
            out.extend(("m", i) for i in range(a, b))
            at = b
        return out


def default(total: int) -> Fold:
    """The first ``HEAD`` and last ``TAIL`` messages; all of them when that is every message."""
    if total <= HEAD + TAIL:
        return Fold(total, ((0, total),))
    return Fold(total, ((0, HEAD), (total - TAIL, total)))


def window(total: int, start: int, end: int) -> Fold:
    return Fold(total, ((start, end + 1),), (start, end))


def around(total: int, index: int) -> Fold:
    """The ``WINDOW`` messages centred on ``index`` (moved to fit inside the conversation)."""
    start = max(0, min(index - WINDOW // 2, total - WINDOW))
    return window(total, start, min(total - 1, start + WINDOW - 1))


def _in_range(total: int, index: int, what: str) -> None:
    if index >= total:
        last = f"0–{total - 1:,}" if total else "none"
        raise BadWindow(f"{what} is past the end: this conversation has {total:,} messages (numbered {last}).")


def pick(total: int, messages: str | None, near: str | None) -> Fold:
    """The fold the page's query asks for: ``messages=A-B`` (inclusive, at most ``WINDOW``), ``around=N``,
    or neither (the default; an empty parameter counts as absent). Raises :class:`BadWindow` with the reason
    for anything else."""
    messages, near = (v if v and v.strip() else None for v in (messages, near))
    if messages is not None and near is not None:
        raise BadWindow("Give messages=A-B or around=N, not both.")
    if near is not None:
        m = _NUMBER.fullmatch(near)
        if not m:
            raise BadWindow(f"around={near[:40]!r} is not a message number (a whole number from 0).")
        index = int(m.group(1))
        _in_range(total, index, f"Message {index:,}")
        return around(total, index)
    if messages is not None:
        m = _RANGE.fullmatch(messages)
        if not m:
            raise BadWindow(
                f"messages={messages[:40]!r} is not a range of message numbers: write first-last, like 100-399."
            )
        start, end = int(m.group(1)), int(m.group(2))
        if start > end:
            raise BadWindow(f"messages={start}-{end} is reversed: the first number must not exceed the last.")
        if end - start + 1 > WINDOW:
            asks = end - start + 1
            raise BadWindow(f"messages={start}-{end} asks for {asks:,} messages; a page shows {WINDOW} at most.")
        _in_range(total, end, f"Message {end:,}")
        return window(total, start, end)
    return default(total)
