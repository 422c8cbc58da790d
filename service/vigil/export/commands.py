"""``vigil export``: confirmed failures as eval tasks."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.markup import escape
from sqlalchemy.exc import IntegrityError

from vigil.http.params import MAX_ID
from vigil.runtime import Launcher


def export(
    ctx: typer.Context,
    format: Annotated[str, typer.Option("--format", help="native, inspect or verifiers.")] = "native",
    since: Annotated[
        int | None, typer.Option(min=0, max=MAX_ID, help="Only failures confirmed after this watermark.")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write the tasks here (default, or '-': standard output).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Also failures exported before in this format.")] = False,
    schema: Annotated[bool, typer.Option("--schema", help="Print the native task's JSON Schema.")] = False,
) -> None:
    """Export confirmed failures as eval tasks (PII redacted, near-duplicates grouped, incremental)."""
    from vigil.errors import VigilError
    from vigil.export.redact import Redactor
    from vigil.export.run import export as run

    if schema:
        from vigil.export.schema import json_schema

        sys.stdout.write(orjson.dumps(json_schema(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    try:
        rt = Launcher.of(ctx).runtime({"api"})
        with rt.sessions.begin() as s:
            result = run(
                s,
                {r.id: r for r in rt.rules.rules},
                Redactor.of(rt.settings),
                format,
                since,
                all_,
                os.environ.get("USER") or "cli",
                rt.metrics,
                min_severity=rt.settings.export_min_criterion_severity,
            )
            # write before the transaction commits: if writing fails, the next run exports these again
            data = b"".join(result.lines)
            if out is None or str(out) == "-":
                sys.stdout.buffer.write(data)
                sys.stdout.flush()
            else:
                _write(out, data)
    except (VigilError, OSError) as exc:
        Launcher.of(ctx).fail(str(exc))
    except IntegrityError:
        from vigil.export.api import CONCURRENT

        Launcher.of(ctx).fail(CONCURRENT)
    for cid, why in result.skipped.items():
        Launcher.of(ctx).console.print(f"[yellow]skipped {escape(cid)}: {escape(why)}[/yellow]")
    Launcher.of(ctx).console.print(
        f"{result.tasks} tasks ({result.grouped} near-duplicates grouped) in {format} format; "
        f"watermark {result.watermark} (next: --since {result.watermark})"
    )
    if result.tasks > result.checkable:
        only_graded = result.tasks - result.checkable
        Launcher.of(ctx).console.print(
            f"[yellow]{only_graded} of {result.tasks} tasks have no criterion the harnesses check mechanically: "
            "only a grader model can fail them, by their rubric (the reviewer's expected behaviour, or one "
            "derived from the confirmed failure). Run them with a grader: Inspect -T grader_model=... (default: "
            "the model under test), verifiers --env.taskset.task.judge.model ...; run with no grader (verifiers "
            "without a judge, Inspect with grader_model=none) they pass whatever the model does. "
            "VIGIL_EXPORT_MIN_CRITERION_SEVERITY decides which findings become criteria.[/yellow]"
        )


def register(app: typer.Typer) -> None:
    app.command("export")(export)


def _write(out: Path, data: bytes) -> None:
    """Write ``data`` to ``out`` whole or not at all. A regular file (or a new one) is replaced by a
    complete temporary beside it, so a reader never sees half a file; a link is followed to what it
    names (replacing the link itself turned /dev/stdout into a file); what is not a regular file (a
    pipe, a device) is written to directly. A directory is refused before anything is written."""
    target = out.resolve()
    if target.is_dir():
        raise IsADirectoryError(f"--out {out} is a directory; name a file")
    if target.exists() and not target.is_file():
        with target.open("wb") as fh:
            fh.write(data)
        return
    tmp = target.with_name(target.name + ".partial")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
