"""The command line's console, settings and error exit, shared by every stage's commands."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from vigil.errors import ConfigError
from vigil.settings import Settings
from vigil.tables import terminal_safe

console = Console(stderr=True)


def load_settings() -> Settings:
    """The settings from the environment; a bad value raises :class:`ConfigError` naming its variable."""
    from pydantic import ValidationError

    try:
        s = Settings()
    except ValidationError as exc:
        raise ConfigError(settings_problem(exc)) from None
    logging.basicConfig(level=s.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return s


def settings_problem(exc: Any) -> str:
    """A settings error as the operator set it: the ``VIGIL_*`` variable, the value given, what is wrong.

    pydantic names the field (``judge_mode``) and adds a link to its own docs; the operator set
    ``VIGIL_JUDGE_MODE``, and wants to know that and what it may be."""
    problems = []
    for err in exc.errors():
        name = "VIGIL_" + "_".join(str(part) for part in err["loc"]).upper() if err["loc"] else "settings"
        value = err.get("input")
        secret = any(word in name for word in ("KEY", "SECRET", "TOKEN", "PASSWORD", "URL"))  # never echoed
        given = f"={str(value)[:80]!r}" if err["loc"] and not secret and isinstance(value, str | int | float) else ""
        problems.append(f"{name}{given}: {err['msg']}")
    return "invalid setting: " + "; ".join(problems)


def checked_settings() -> Settings:
    """:func:`load_settings` for a command: a bad setting ends it with one line naming the variable."""
    try:
        return load_settings()
    except ConfigError as exc:
        fail(exc)


def fail(exc: Exception | str, code: int = 2) -> NoReturn:
    # soft_wrap: an error is one line however narrow the terminal (logs and tests read it whole);
    # escape: the message quotes input ("[/x]", a regex's "[a-z]"), which is text, not markup
    console.print(f"[red]error:[/red] {escape(terminal_safe(str(exc)))}", soft_wrap=True, highlight=False)
    raise typer.Exit(code)
