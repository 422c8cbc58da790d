"""The command line's console, settings and error exit, shared by every stage's commands."""

from __future__ import annotations

import logging
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from vigil.settings import Settings
from vigil.tables import terminal_safe

console = Console(stderr=True)


def load_settings() -> Settings:
    s = Settings()
    logging.basicConfig(level=s.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return s


def fail(exc: Exception | str, code: int = 2) -> NoReturn:
    # soft_wrap: an error is one line however narrow the terminal (logs and tests read it whole);
    # escape: the message quotes input ("[/x]", a regex's "[a-z]"), which is text, not markup
    console.print(f"[red]error:[/red] {escape(terminal_safe(str(exc)))}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)
