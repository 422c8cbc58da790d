"""Text as the personal-data detectors read it, and the way back to the text as written.

A reader sees ``jane@example.com`` in ``jane@exam\\u200bple.com`` and ``4111 1111 1111 1111`` in
``4111\\u00a01111\\u00a01111\\u00a01111``, and so must the detectors: an agent talked into hiding a value
(a zero-width space inside an address, full-width digits) still discloses it. The folded copy drops
invisible format characters (zero-width spaces and joiners, soft hyphens, direction marks) and writes
compatibility forms (full-width digits and ``＠``, no-break and thin spaces), other scripts' decimal digits
and dashes between digits as ASCII. Every span found in the folded copy maps back to the characters it
came from. ASCII text is its own folded form and costs one ``isascii`` check.
"""

from __future__ import annotations

import re
import unicodedata
from bisect import bisect_right
from functools import cache, lru_cache

_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


@cache
def fold_char(ch: str) -> str:
    category = unicodedata.category(ch)
    if category == "Cf":
        return ""
    if category == "Pd" or ch == "\u2212":  # en dash, non-breaking hyphen, minus sign: what a "-" separates
        return "-"
    digit = unicodedata.decimal(ch, None)
    return str(digit) if digit is not None else unicodedata.normalize("NFKC", ch)


def _fold_chars(run: str) -> tuple[str, ...] | None:
    """Each character of a run of non-ASCII characters folded, or None when none changes."""
    outs = tuple(fold_char(ch) for ch in run)
    return None if "".join(outs) == run else outs


# Short runs (a curly apostrophe, an em dash, an accented letter) recur in nearly every text: their
# folding is kept, for a bounded number of them.
_KEPT_RUN = 8
_fold_run = lru_cache(maxsize=4096)(_fold_chars)


def _between_digits(text: str, i: int) -> bool:
    return 0 < i < len(text) - 1 and fold_char(text[i - 1]).isdigit() and fold_char(text[i + 1]).isdigit()


class Folded:
    """``text`` as the detectors read it, and the way back: each folded character's position in ``text``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts: list[int] = [0]  # folded position where each piece starts
        self.origins: list[tuple[int, bool]] = [(0, True)]  # its position in text; True: copied as is
        if text.isascii():
            return
        parts: list[str] = []
        pos = folded = 0
        for m in _NON_ASCII.finditer(text):
            run = m.group(0)
            outs = _fold_run(run) if len(run) <= _KEPT_RUN else _fold_chars(run)
            if outs is None:
                continue  # letters that stay as they are: copied with the text around them
            i = m.start()
            kept = [
                run[k] if out == "-" and not _between_digits(text, i + k) else out  # a dash as punctuation
                for k, out in enumerate(outs)  # ("I gave you—555-0123—"), not a separator
            ]
            if "".join(kept) == run:
                continue  # only dashes between words: copied as well
            if i > pos:
                parts.append(text[pos:i])
                self.starts.append(folded)
                self.origins.append((pos, True))
                folded += i - pos
            for k, out in enumerate(kept):
                parts.append(out)
                self.starts.append(folded)
                self.origins.append((i + k, out == run[k]))
                folded += len(out)
            pos = m.end()
        if not parts:
            return  # nothing folds (curly quotes, accented letters): the text is its own folded form
        parts.append(text[pos:])
        self.starts.append(folded)
        self.origins.append((pos, True))
        self.text = "".join(parts)

    @property
    def changed(self) -> bool:
        return len(self.starts) > 1

    def start(self, p: int) -> int:
        """The position in the original text of folded position ``p``."""
        k = bisect_right(self.starts, p) - 1
        origin, copied = self.origins[k]
        return origin + (p - self.starts[k]) if copied else origin

    def end(self, p: int) -> int:
        """The end in the original text of a span ending (exclusively) at folded position ``p``."""
        return self.start(p - 1) + 1 if p > 0 else 0


def fold(text: str) -> str:
    """``text`` as the detectors read it."""
    return Folded(text).text
