"""Every setting and every CLI command is documented in the README."""

from __future__ import annotations

import re

from vigil.app.cli import app
from vigil.settings import PROJECT_ROOT, Settings

README = (PROJECT_ROOT / "README.md").read_text()


def test_every_setting_is_in_the_readme_table() -> None:
    table = README.split("<!-- settings-table:start -->")[1].split("<!-- settings-table:end -->")[0]
    documented = set(re.findall(r"`(VIGIL_[A-Z0-9_]+)`", table))
    expected = {f"VIGIL_{name.upper()}" for name in Settings.model_fields}
    assert not expected - documented, f"settings missing from README: {sorted(expected - documented)}"
    assert not documented - expected, f"README documents unknown settings: {sorted(documented - expected)}"


def test_every_setting_has_a_description() -> None:
    missing = [n for n, f in Settings.model_fields.items() if not f.description]
    assert not missing


def test_every_command_is_in_the_readme() -> None:
    import typer.main

    group = typer.main.get_command(app)
    names = set(group.commands)  # type: ignore[attr-defined]
    absent = [n for n in names if f"vigil {n}" not in README]
    assert not absent, f"commands missing from README: {absent}"


def test_quickstart_is_two_commands() -> None:
    quick = README.split("## Quickstart")[1].split("\n## ")[0]
    block = quick.split("```sh")[1].split("```")[0]
    commands = [ln for ln in block.strip().splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert [c.split("#")[0].strip() for c in commands] == ["make demo", "make test"]
