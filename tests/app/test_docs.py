"""Every setting and every CLI command is documented, the README's quickstart stays two commands, and the
docs site builds."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.cli import cli_runner
from tests.support.services import missing
from vigil.app.cli import app
from vigil.settings import PROJECT_ROOT, Settings

DOCS = PROJECT_ROOT / "docs"
README = (PROJECT_ROOT / "README.md").read_text()
CONFIGURATION = (DOCS / "configuration.md").read_text()
CLI = (DOCS / "cli.md").read_text()


def test_every_setting_is_in_the_settings_table() -> None:
    table = CONFIGURATION.split("<!-- settings-table:start -->")[1].split("<!-- settings-table:end -->")[0]
    documented = set(re.findall(r"`(VIGIL_[A-Z0-9_]+)`", table))
    expected = {f"VIGIL_{name.upper()}" for name in Settings.model_fields}
    assert not expected - documented, f"settings missing from docs/configuration.md: {sorted(expected - documented)}"
    assert not documented - expected, (
        f"docs/configuration.md documents unknown settings: {sorted(documented - expected)}"
    )


def test_every_setting_has_a_description() -> None:
    missing_descriptions = [n for n, f in Settings.model_fields.items() if not f.description]
    assert not missing_descriptions


def test_settings_table_is_what_vigil_settings_markdown_prints() -> None:
    """The table is regenerated with ``vigil settings --markdown``: a hand edit would be lost the next time."""
    table = CONFIGURATION.split("<!-- settings-table:start -->\n")[1].split("<!-- settings-table:end -->")[0]
    out = cli_runner().invoke(app, ["settings", "--markdown"])
    assert out.exit_code == 0, out.output
    assert table == out.stdout


def test_every_command_is_in_the_cli_page() -> None:
    import typer.main

    group = typer.main.get_command(app)
    names = set(group.commands)  # type: ignore[attr-defined]
    absent = [n for n in names if f"vigil {n}" not in CLI]
    assert not absent, f"commands missing from docs/cli.md: {absent}"


def test_quickstart_is_two_commands() -> None:
    quick = README.split("## Quickstart")[1].split("\n## ")[0]
    block = quick.split("```sh")[1].split("```")[0]
    commands = [ln for ln in block.strip().splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert [c.split("#")[0].strip() for c in commands] == ["make demo", "make test"]


def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        missing("mkdocs-material (pip install -e '.[dev]')")
    site = tmp_path / "site"
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(PROJECT_ROOT / "mkdocs.yml"), "-d", str(site)],
        cwd=PROJECT_ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (site / "index.html").is_file()


def test_every_test_the_docs_name_exists() -> None:
    """The docs' "shape → test" tables (formats, OpenTelemetry) name tests as ``tests/x.py::test_y``: each exists."""

    named = 0
    missing = []
    for page in sorted((PROJECT_ROOT / "docs").glob("*.md")):
        for path, name in set(re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", page.read_text())):
            named += 1
            source = PROJECT_ROOT / path
            if not source.exists() or not re.search(rf"^(async )?def {name}\(", source.read_text(), re.M):
                missing.append(f"{page.name}: {path}::{name}")
    assert named >= 40 and not missing, missing


def _architecture(text: str) -> str:
    return text.split("## Architecture")[1].split("\n## ")[0]


def test_architecture_names_every_stage_and_shared_layer() -> None:
    """The README's and the overview's architecture name each package of ``STAGES`` (a stage left out of
    them was invisible to a reader: ``evaluation/``, the release gate) and the overview every shared layer."""
    from vigil.app.wiring import STAGES

    packages = {f"{stage.name}/" for stage in STAGES}
    for page, text in (("README.md", README), ("docs/index.md", (DOCS / "index.md").read_text())):
        section = _architecture(text)
        absent = sorted(p for p in packages if f"`{p}`" not in section)
        assert not absent, f"{page}: the architecture section does not name {absent}"
    layers = {p.stem for p in (PROJECT_ROOT / "service" / "vigil").glob("*.py") if not p.stem.startswith("_")}
    layers |= {"rules/", "store/", "http/", "ui/"}
    overview = _architecture((DOCS / "index.md").read_text())
    absent = sorted(name for name in layers if f"`{name}`" not in overview)
    assert not absent, f"docs/index.md: the shared layers named do not include {absent}"


def test_every_migration_the_docs_name_is_a_revision() -> None:
    """A migration named in backticks is what ``vigil db downgrade REV`` takes: a revision id, not a file name
    (review.md named ``0009_triage_comments``, whose revision is ``0009_triage``)."""
    versions = PROJECT_ROOT / "service" / "vigil" / "migrations" / "versions"
    found = (re.search(r'^revision = "([^"]+)"', p.read_text(), re.M) for p in versions.glob("*.py"))
    revisions = {m.group(1) for m in found if m}
    named = {
        (page.name, rev)
        for page in [PROJECT_ROOT / "README.md", *DOCS.glob("*.md")]
        for rev in re.findall(r"`(\d{4}_[a-z0-9_]+)`", page.read_text())
    }
    assert len(named) >= 5
    assert not {(page, rev) for page, rev in named if rev not in revisions}


def test_queue_sorts_are_all_documented() -> None:
    """``vigil review queue --sort`` takes every sort of the queue (``updated`` was taken but named nowhere)."""
    import typer.main

    from vigil.review.insights import SORTS

    queue = typer.main.get_command(app).commands["review"].commands["queue"]  # type: ignore[attr-defined]
    (option,) = [p for p in queue.params if p.name == "sort"]
    row = next(line for line in CLI.splitlines() if line.startswith("| `vigil review queue [--json]`"))
    sorts = row.split("`--sort` (")[1].split(")")[0]
    for name in SORTS:
        assert name in option.help, name
        assert f"`{name}`" in sorts, name
