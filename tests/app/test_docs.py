"""Every setting and every CLI command is documented, the README's quickstart stays two commands, and the
docs site builds."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def test_the_cli_overview_names_every_command() -> None:
    """The overview table at the top of docs/cli.md lists every command, each subcommand of a group in its
    group's row (``vigil judge list`` · ``validate``): it lacked gate, rules, retention, rollups and
    ``db downgrade``, documented further down only."""
    overview = CLI.split("## Overview")[1].split("\n## ")[0]
    rows = [line for line in overview.splitlines() if line.startswith("| `vigil ")]
    missing = []
    for path in (p for p, cmd in _commands().items() if p and not hasattr(cmd, "commands")):
        group, _, sub = path.partition(" ")
        mine = [r.split(" | ")[0] for r in rows if re.search(rf"`vigil {re.escape(group)}(?![\w-])", r)]
        if not any(re.search(rf"(?<![\w-]){re.escape(sub or group)}(?![\w-])", r) for r in mine):
            missing.append(f"vigil {path}")
    assert not missing, f"missing from the overview of docs/cli.md: {missing}"


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


PAGES = [PROJECT_ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _commands() -> dict[str, Any]:
    """Every command path (``review queue``) with its click command; groups included."""
    import typer.main

    found: dict[str, Any] = {}

    def walk(cmd: Any, path: list[str]) -> None:
        found[" ".join(path)] = cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def _options(cmd: Any) -> set[str]:
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")} | {"--help"}


def _snippets(text: str) -> list[str]:
    """Code spans and the lines of code blocks: where the docs show a command as typed."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```[a-z]*\n.*?```", "", text, flags=re.S))
    return spans + [line for block in blocks for line in block.splitlines()]


def test_every_command_and_option_the_docs_show_exists() -> None:
    """A ``vigil ...`` command in any page names a real command, and each option shown with it is one of
    that command's (an option renamed or removed would otherwise live on in the docs)."""
    commands = _commands()
    shown, wrong = 0, []
    for page in PAGES:
        for snippet in _snippets(page.read_text()):
            for m in re.finditer(r"\bvigil((?: [a-z][a-z-]*)+)(.*)", snippet):
                words = m.group(1).split()
                paths = (" ".join(words[:i]) for i in range(len(words), 0, -1))
                path = next((p for p in paths if p in commands), None)
                if path is None:
                    wrong.append(f"{page.name}: no command `vigil {m.group(1).strip()}`")
                    continue
                shown += 1
                # what follows the command up to a shell pipe, a comment or the next command
                rest = re.split(r" \| | # |;|&&", m.group(0))[0]
                for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])\b", rest):
                    if flag not in _options(commands[path]):
                        wrong.append(f"{page.name}: `vigil {path}` has no option {flag}")
    assert shown >= 100 and not wrong, wrong


def _cli_page_parts() -> list[str]:
    """docs/cli.md cut into table rows, paragraphs and ``### `vigil ...``` sections."""
    parts: list[str] = []
    for section in re.split(r"\n(?=#)", CLI):
        if section.startswith("### "):
            parts.append(section)
        else:
            parts += [line for line in section.splitlines() if line.startswith("|")]
            parts += [p for p in section.split("\n\n") if not p.startswith("|")]
    return parts


def test_every_command_and_option_is_on_the_cli_page() -> None:
    """Each command and each of its options is on docs/cli.md, next to the command: in its table row or
    its section (``vigil review queue --sort updated`` was taken and named nowhere)."""
    commands = _commands()
    leaves = {path: cmd for path, cmd in commands.items() if path and not hasattr(cmd, "commands")}
    aliases = {
        path
        for path, cmd in leaves.items()
        for other, twin in leaves.items()
        if other < path and (cmd.help, _options(cmd)) == (twin.help, _options(twin))
    }
    parts = _cli_page_parts()
    missing = []
    for path, cmd in leaves.items():
        if path in aliases:
            continue
        near = " ".join(p for p in parts if f"`vigil {path}" in p)
        if not near:
            missing.append(f"vigil {path}")
            continue
        for p in cmd.params:
            names = [o for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
            if names and not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", near) for o in names):
                missing.append(f"vigil {path} {names[0]}")
    assert not missing, f"missing from docs/cli.md: {missing}"


# names the docs spell like metrics that are not: the verifiers taskset, the Inspect task, a plugin module
NOT_METRICS = {"vigil_verifiers", "vigil_regression", "vigil_rules"}
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("", "_bucket", "_count", "_sum"), "info": ("_info",)}


def _metrics() -> dict[str, tuple[str, ...]]:
    """Every name a real ``Metrics`` registry exposes (a histogram's family name too) with its labels."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics import MetricWrapperBase

    from vigil.metrics import Metrics

    made = [m for m in vars(Metrics(CollectorRegistry())).values() if isinstance(m, MetricWrapperBase)]
    return {m._name + suffix: m._labelnames for m in made for suffix in SUFFIXES[m._type]}


def test_every_metric_the_docs_name_is_exported_with_those_labels() -> None:
    """A metric named on any page exists under that name, and ``name{a,b}`` or ``name{a="x"}`` uses only
    its labels; and every metric Vigil exports is named on some page, with a word on when it appears."""
    metrics = _metrics()
    text = "\n".join(page.read_text() for page in PAGES)
    named = set(re.findall(r"\bvigil_[a-z0-9_]*[a-z0-9](?![\w*])", text)) - NOT_METRICS  # vigil_otlp_*: a family
    assert not named - set(metrics), f"the docs name metrics Vigil does not export: {sorted(named - set(metrics))}"
    wrong = [
        f"{name}{{{labels}}}"
        for name, labels in re.findall(r"\b(vigil_[a-z0-9_]+)\{([^}]*)\}", text)
        for label in re.findall(r"([a-z_]+)\s*(?:=~|!~|!=|=|,|$)", labels)
        if label not in metrics[name]
    ]
    assert not wrong, f"the docs give metrics labels they do not have: {wrong}"
    families = {re.sub(r"_(total|bucket|count|sum|info)$", "", n) for n in metrics}
    unnamed = sorted(f for f in families if not re.search(rf"\b{f}(_total|_info)?\b", text))
    assert not unnamed, f"metrics no page names: {unnamed}"
    core = (DOCS / "index.md").read_text().split("### Core metrics")[1].split("\n## ")[0]
    assert "only once" in core and "# TYPE" in core  # a labelled series appears with its first event


def test_every_api_route_and_parameter_the_docs_name_exists(tmp_path: Path) -> None:
    """``GET /v1/...`` on any page is a route of the API with that method, and ``?name=`` after it one of
    its query parameters (the OpenAPI document the running app serves is the reference)."""
    from prometheus_client import CollectorRegistry

    from tests.support.app import make_client, make_settings
    from vigil.app.runtime import build_runtime

    rt = build_runtime(make_settings(f"sqlite:///{tmp_path / 'v.db'}"), registry=CollectorRegistry())
    with make_client(rt) as c:
        paths = c.get("/openapi.json").json()["paths"]
    rt.close()
    routes = [
        (method.upper(), re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"), op)
        for path, ops in paths.items()
        for method, op in ops.items()
    ]
    named, wrong = 0, []
    shown = re.compile(r"\b(GET|POST|PUT|PATCH|DELETE) (/v1/[^\s`?\[\]),;]*)\[?(\?[^\s`)]*)?")
    for page in PAGES:
        for method, path, query in shown.findall(page.read_text()):
            named += 1
            found = [op for m, rx, op in routes if m == method and rx.match(path.rstrip(".:"))]
            if not found:
                wrong.append(f"{page.name}: no route {method} {path}")
                continue
            known = {p["name"] for p in found[0].get("parameters", []) if p["in"] == "query"}
            for name in re.findall(r"[?&]([a-z_]+)=", query):
                if name not in known:
                    wrong.append(f"{page.name}: {method} {path} has no parameter {name}")
    assert named >= 100 and not wrong, wrong


def test_every_variable_the_docs_name_is_a_setting_or_read_by_the_code() -> None:
    """``VIGIL_X`` on any page is a setting (or a family of them, ``VIGIL_KAFKA_*``), else a variable the
    tests, benchmarks or commands read (``VIGIL_TEST_TIME_SCALE``): never one nothing reads, such as a
    setting since removed or an opt-in no test has (``VIGIL_LIVE_LLM``)."""
    settings = {f"VIGIL_{name.upper()}" for name in Settings.model_fields}
    code = "\n".join(
        p.read_text() for folder in ("service", "tests", "bench") for p in (PROJECT_ROOT / folder).rglob("*.py")
    )
    unknown = set()
    for page in PAGES:
        for name in set(re.findall(r"\bVIGIL_[A-Z0-9_]*[A-Z0-9]\b(?!_\*)", page.read_text())):
            if name not in settings and not re.search(rf"[\"']{name}[\"']", code):
                unknown.add(f"{page.name}: {name}")
    assert not unknown, sorted(unknown)


UNITS = {"ms": 0.001, "s": 1, "minutes": 60, "hours": 3600, "days": 86400, "KiB": 1024, "MiB": 1024**2}
SETTING_UNITS = {"_MS": 0.001, "_SECONDS": 1, "_HOURS": 3600, "_DAYS": 86400}


def test_defaults_the_docs_give_in_passing_are_the_settings_defaults() -> None:
    """``VIGIL_X`` (N unit) in running text says the default: it must be the setting's, in its unit or
    another (``VIGIL_OUTCOME_ATTRIBUTION_WINDOW_HOURS`` (7 days) is 168 hours)."""
    fields = {f"VIGIL_{name.upper()}": field for name, field in Settings.model_fields.items()}
    given = re.compile(
        r"`(VIGIL_[A-Z0-9_]+)`\s*\((?:default\s+`([a-z_]+)`|(?:default\s+)?([0-9][0-9,]*(?:\.[0-9]+)?)\s*([A-Za-z]+)?)"
    )
    checked, wrong = 0, []
    for page in PAGES:
        text = page.read_text().split("<!-- settings-table:end -->")[-1]  # the table is checked whole above
        for name, word, number, unit in given.findall(text):
            default = fields[name].default if name in fields else None
            if default is None or (unit and unit not in UNITS) or (number and not isinstance(default, int | float)):
                continue
            if word:
                ok = str(default) == word
            else:
                scale = next((v for suffix, v in SETTING_UNITS.items() if name.endswith(suffix)), 1)
                value = float(number.replace(",", "")) * (UNITS[unit] / scale if unit else 1)
                ok = isinstance(default, int | float) and abs(value - default) < 1e-9
            checked += 1
            if not ok:
                wrong.append(f"{page.name}: {name} ({word or number} {unit}) but the default is {default!r}")
    assert checked >= 20 and not wrong, wrong
