"""The container image's recipe: every COPY source exists and ships, and every role is a real command."""

from __future__ import annotations

import fnmatch
import json
import shlex
from pathlib import Path

import typer.main

from vigil.app.cli import app
from vigil.settings import PROJECT_ROOT

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
    """The package is installed once (build stage); rules/, judges/ and dashboards/ sit in WORKDIR /app,
    where an installed Vigil resolves its defaults (see test_installed_package_resolves_defaults_from_cwd)."""
    text = DOCKERFILE.read_text()
    assert "WORKDIR /app" in text and "PYTHONPATH" not in text
    assert "COPY service" in text.split("FROM", 2)[1], "the build stage installs the package from source"
    assert "COPY service" not in text.split("FROM", 2)[2], "the final image copies the source a second time"
    for folder in ("rules", "judges", "dashboards"):
        assert f"COPY {folder} ./{folder}" in text
    assert Path(PROJECT_ROOT / "rules" / "default.yaml").exists()


def final_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for op, args in stages()[-1]:
        if op == "ENV":
            env.update(part.split("=", 1) for part in shlex.split(args) if "=" in part)  # type: ignore[misc]
    return env


def expand(text: str) -> str:
    """Substitute the final stage's ARG defaults (``${VIGIL_UID}``)."""
    for op, args in stages()[-1]:
        if op == "ARG" and "=" in args:
            name, value = args.split("=", 1)
            text = text.replace("${" + name + "}", value).replace("$" + name, value)
    return text


def owners() -> dict[str, str]:
    """Directory -> owner set by the final stage's ``install -d -o``, ``chown`` or ``COPY --chown``."""
    found: dict[str, str] = {}
    for op, args in stages()[-1]:
        if op == "COPY" and "--chown=" in args:
            parts = shlex.split(expand(args))
            owner = next(p for p in parts if p.startswith("--chown="))[len("--chown=") :]
            found[parts[-1].rstrip("/")] = owner.split(":")[0]
        if op != "RUN":
            continue
        for command in expand(args).replace(";", "&&").split("&&"):
            words = shlex.split(command)
            if words[:1] == ["install"] and "-d" in words and "-o" in words:
                owner = words[words.index("-o") + 1]
                skip = {i + 1 for i, w in enumerate(words) if w in ("-o", "-g", "-m")}
                for i, w in enumerate(words[1:], 1):
                    if i not in skip and not w.startswith("-"):
                        found[w.rstrip("/")] = owner
            elif words[:1] == ["chown"]:
                rest = [w for w in words[1:] if not w.startswith("-")]
                for path in rest[1:]:
                    found[path.rstrip("/")] = rest[0].split(":")[0]
    return found


def runtime_user() -> set[str]:
    """The final USER as every name it goes by (uid and, from useradd, the account name)."""
    user = expand([a for op, a in stages()[-1] if op == "USER"][-1]).split(":")[0]
    names = {user}
    for op, args in stages()[-1]:
        if op == "RUN" and "useradd" in args:
            words = shlex.split(expand(args).split("useradd", 1)[1].split("&&")[0])
            uid = words[words.index("--uid") + 1]
            if user in (uid, words[-1]):
                names |= {uid, words[-1]}
    return names


def test_default_database_lives_in_a_directory_the_runtime_user_owns() -> None:
    """``docker run vigil`` (CMD serve, SQLite by default) must be able to create its database file."""
    from vigil.settings import Settings

    url = final_env().get("VIGIL_DATABASE_URL", Settings.model_fields["database_url"].default.get_secret_value())
    assert url.startswith("sqlite:///"), f"the image's default database is no SQLite file: {url}"
    path = url[len("sqlite:///") :]
    workdir = [a for op, a in stages()[-1] if op == "WORKDIR"][-1]
    directory = str((Path(workdir) / path).parent) if not path.startswith("/") else str(Path(path).parent)
    owner = owners().get(directory)
    assert owner in runtime_user(), (
        f"the default database {url} sits in {directory}, owned by {owner or 'root'}, "
        f"not by the runtime user {sorted(runtime_user())}"
    )
    volumes = [a for op, a in stages()[-1] if op == "VOLUME"]
    assert any(directory in v for v in volumes), f"{directory} is no VOLUME: docker run --read-only cannot write it"
