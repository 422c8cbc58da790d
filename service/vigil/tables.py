"""How listing commands print: a table on a terminal; plain tab-separated lines with full values when piped
(nothing cut at 80 columns); JSON with ``--json``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import orjson


def print_json(data: Any) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n")


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    if not sys.stdout.isatty():
        lines = [
            "\t".join(columns),
            *("\t".join(str(v).replace("\t", " ").replace("\n", " ") for v in r) for r in rows),
        ]
        sys.stdout.write("\n".join(lines) + "\n")
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(*columns)
    for r in rows:
        table.add_row(*(escape(str(v)) for v in r))  # ids and names are data, not markup
    Console().print(table)
