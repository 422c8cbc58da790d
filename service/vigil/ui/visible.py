"""Characters a reviewer cannot see, shown as marks on the conversation page.

A conversation is text from users, models and tools. Some of its characters draw nothing or change how
the text around them is drawn: bidirectional overrides and isolates (``U+202E`` turns "refund $05" into
what reads "50$ dnufer", the "Trojan Source" trick), the direction marks, and control characters (an
``ESC`` of a terminal colour code, a ``NUL``). A reviewer confirms or rejects a failure on what the page
shows, so each such character is shown as a small mark naming it (``U+202E``), with its name as the
mark's title; the text around it is drawn as stored. Joiners and zero-width spaces are left alone: emoji
sequences and several scripts need them.
"""

from __future__ import annotations

import re

from markupsafe import Markup, escape

NAMES = {
    "\u061c": "ARABIC LETTER MARK",
    "\u200e": "LEFT-TO-RIGHT MARK",
    "\u200f": "RIGHT-TO-LEFT MARK",
    "\u202a": "LEFT-TO-RIGHT EMBEDDING",
    "\u202b": "RIGHT-TO-LEFT EMBEDDING",
    "\u202c": "POP DIRECTIONAL FORMATTING",
    "\u202d": "LEFT-TO-RIGHT OVERRIDE",
    "\u202e": "RIGHT-TO-LEFT OVERRIDE",
    "\u2066": "LEFT-TO-RIGHT ISOLATE",
    "\u2067": "RIGHT-TO-LEFT ISOLATE",
    "\u2068": "FIRST STRONG ISOLATE",
    "\u2069": "POP DIRECTIONAL ISOLATE",
    "\x00": "NULL",
    "\x1b": "ESCAPE",
    "\x7f": "DELETE",
}
# C0 controls but tab, line feed and carriage return; DEL and the C1 controls; the direction characters
HIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _mark(m: re.Match[str]) -> str:
    ch = m.group()
    code = f"U+{ord(ch):04X}"
    name = NAMES.get(ch, "control character")
    return f'<span class="ctl" title="{code} {name}">{code}</span>'


def visible(value: object) -> Markup:
    """``value`` escaped for HTML, each character of :data:`HIDDEN` shown as a mark (see the module)."""
    text = "" if value is None else str(value)
    escaped = escape(text)
    if not HIDDEN.search(text):
        return escaped
    # escaping leaves these characters as they are, and a mark holds none of the text: safe to substitute
    return Markup(HIDDEN.sub(_mark, str(escaped)))


def hidden_count(*texts: object) -> int:
    """How many characters of :data:`HIDDEN` the texts hold."""
    return sum(len(HIDDEN.findall(t)) for t in texts if isinstance(t, str))
