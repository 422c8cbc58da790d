"""The command line under test: output as a wide terminal would print it, never wrapped mid-message.

Rich and Typer wrap at the terminal width (``COLUMNS``, else 80 when there is no terminal), so an error
message or a table cell could be split over lines depending on where the suite runs. Every CLI test
uses :func:`cli_runner`, whose width is fixed and wide; tests of machine-readable output use ``--json``.
"""

from __future__ import annotations

from typing import Any

from typer.testing import CliRunner

WIDTH = "500"


def cli_runner(**kwargs: Any) -> CliRunner:
    env = {"COLUMNS": WIDTH, "TERMINAL_WIDTH": WIDTH, **kwargs.pop("env", {})}
    return CliRunner(env=env, **kwargs)
