"""How listing commands print: a table on a terminal; plain tab-separated lines with full values when piped
(nothing cut at 80 columns); JSON with ``--json``."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

import orjson

# control characters but tab and line feed, DEL, the C1 controls, and the direction characters
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """``text`` with each character that a terminal would act on or draw the text around it differently
    written out as an escape (``\\x1b``, ``\\u202e``). Conversations are written by an agent's users: a
    first message holding ``ESC ] 0 ; ... BEL`` retitled the on-call engineer's terminal and ``ESC [ 2 J``
    cleared it when ``vigil review near-duplicates`` printed it (rich passes ESC through)."""
    return _UNSAFE.sub(_escaped, text) if _UNSAFE.search(text) else text


def print_json(data: Any) -> None:
    """``--json`` as the API writes it: UTC times end in ``Z`` (pydantic's form, which the API answers in)."""
    options = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z
    sys.stdout.write(orjson.dumps(data, option=options).decode() + "\n")


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    if not sys.stdout.isatty():
        lines = [
            "\t".join(columns),
            *("\t".join(terminal_safe(str(v)).replace("\t", " ").replace("\n", " ") for v in r) for r in rows),
        ]
        sys.stdout.write("\n".join(lines) + "\n")
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(*columns)
    for r in rows:
        table.add_row(*(escape(terminal_safe(str(v))) for v in r))  # ids and names are data, not markup
    Console().print(table)
