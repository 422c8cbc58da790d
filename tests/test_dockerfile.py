"""The container image's recipe: every COPY source exists and ships, and every role is a real command."""

from __future__ import annotations

import fnmatch
import json
import shlex
from pathlib import Path

import typer.main

from service.cli import app
from service.settings import PROJECT_ROOT

DOCKERFILE = PROJECT_ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def ignored(path: str) -> bool:
    patterns = [
        p.strip()
        for p in (PROJECT_ROOT / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path.split("/")[0], p) for p in patterns)


def cli_commands() -> set[str]:
    return set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_every_copy_source_exists_and_is_not_dockerignored() -> None:
    copies = [args for stage in stages() for op, args in stage if op == "COPY" and "--from=" not in args]
    assert copies, "the Dockerfile copies nothing from the build context"
    for args in copies:
        parts = [p for p in shlex.split(args) if not p.startswith("--")]
        for src in parts[:-1]:
            assert (PROJECT_ROOT / src).exists(), f"COPY {src}: no such path in the repository"
            assert not ignored(src), f"COPY {src}: excluded by .dockerignore"


def test_final_stage_runs_as_non_root_without_build_tools() -> None:
    build, final = stages()[0], stages()[-1]
    assert len(stages()) >= 2, "multi-stage: dependencies are built apart from the final image"
    assert any(op == "COPY" and "--from=build" in args for op, args in final)
    users = [args for op, args in final if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    for op, args in final:
        if op == "RUN":
            for tool in ("gcc", "build-essential", "make ", "pip install"):
                assert tool not in args, f"final image runs {tool!r}: build in the build stage"
    assert build[0][1].split()[0].endswith("-slim") or "-slim" in build[0][1]
    assert "-slim" in final[0][1]


def test_entrypoint_and_every_role_are_vigil_commands() -> None:
    ins = dict(instructions())
    assert json.loads(ins["ENTRYPOINT"]) == ["vigil"]
    commands = cli_commands()
    cmd = json.loads(ins["CMD"])
    assert cmd[0] in commands, f"CMD {cmd} is not a vigil command ({sorted(commands)})"
    roles_label = next(a for op, a in instructions() if op == "LABEL" and "dev.vigil.roles" in a)
    roles = shlex.split(roles_label.split("dev.vigil.roles=", 1)[1])[0].split()
    assert {"serve", "consume", "judge-worker", "detector"} <= set(roles)
    missing = [r for r in roles if r not in commands]
    assert not missing, f"roles without a vigil command: {missing} (commands: {sorted(commands)})"


def test_baked_in_defaults_resolve_inside_the_image() -> None:
    """PYTHONPATH=/app makes Vigil's project root /app, where rules/, judges/ and dashboards/ are copied."""
    text = DOCKERFILE.read_text()
    assert "PYTHONPATH=/app" in text and "WORKDIR /app" in text
    for folder in ("service", "rules", "judges", "dashboards"):
        assert f"COPY {folder} ./{folder}" in text
    assert Path(PROJECT_ROOT / "rules" / "default.yaml").exists()
