"""The ``vigil`` command line (Typer): its own commands, then every stage's, from the one list of stages."""

from __future__ import annotations

import json
import sys
from typing import Annotated, NoReturn

import typer
from rich.markup import escape

from vigil import __version__
from vigil.app.console import checked_settings, console, fail, load_settings
from vigil.app.dead_letters import register as register_dead_letter_commands
from vigil.app.home.commands import register as register_home_commands
from vigil.app.wiring import STAGES
from vigil.errors import VigilError
from vigil.runtime import Launcher, Runtime
from vigil.settings import Settings
from vigil.tables import terminal_safe

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Vigil: watches LLM agents in production.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
app.add_typer(db_app, name="db")


def _build(settings: Settings, roles: frozenset[str] | None) -> Runtime:
    from vigil.app.runtime import LONG_RUNNING, build_runtime, settle_heap
    from vigil.app.wiring import wire

    rt = build_runtime(settings, roles=roles or ("replay",))
    rt = wire(rt) if roles is not None else rt
    settle_heap(long_running=bool(roles and roles & LONG_RUNNING))
    return rt


def _serve_metrics(rt: Runtime) -> None:
    from vigil.app.server import start_metrics_server

    try:
        start_metrics_server(rt)
    except VigilError as exc:
        fail(exc)


def launcher() -> Launcher:
    return Launcher(console, load_settings, _build, _serve_metrics)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"vigil {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print Vigil's version and exit.")
    ] = False,
) -> None:
    ctx.obj = launcher()


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply Alembic migrations to VIGIL_DATABASE_URL."""
    from vigil.store import db

    s = checked_settings()
    db.upgrade(s.database_url_str, revision)
    console.print(f"database at {revision}")


@db_app.command("downgrade")
def db_downgrade(revision: Annotated[str, typer.Argument(help="The revision an older release runs on.")]) -> None:
    """Take VIGIL_DATABASE_URL's schema back to REVISION before running an older release on it."""
    from vigil.store import db

    s = checked_settings()
    try:
        db.downgrade(s.database_url_str, revision)
    except VigilError as exc:
        fail(exc)
    console.print(f"database at {revision}")


retention_app = typer.Typer(no_args_is_help=True, help="Storage that rolls over: delete rows past retention.")
app.add_typer(retention_app, name="retention")
rollups_app = typer.Typer(no_args_is_help=True, help="Hourly rollups behind compare, quality and version lists.")
app.add_typer(rollups_app, name="rollups")


@retention_app.command("run")
def retention_run(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be deleted; delete nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Delete conversations (with their outcomes), outcomes whose conversation never came, findings, verdicts
    and dead letters older than their retention settings (labelled, queued and exported conversations are
    kept), after taking open review items nobody reviewed out of the queue once they are older than theirs.
    Also runs periodically in serve and detector."""
    from vigil.store import db, retention

    s = checked_settings()
    engine = db.make_engine(s.database_url_str)
    try:
        result = retention.run(db.make_sessionmaker(engine), s, dry_run=dry_run)
    finally:
        engine.dispose()
    if as_json:
        typer.echo(json.dumps(result.as_dict()))
        return
    verb = "would delete" if dry_run else "deleted"
    for table, n in result.deleted.items():
        console.print(f"{table}: {verb} {n:,} rows older than {result.cutoffs[table]:%Y-%m-%d %H:%M} UTC")
    for what, n in result.released.items():
        hours = s.review_assignment_timeout_hours
        console.print(f"{what}: {'would release' if dry_run else 'released'} {n:,} idle for {hours:g} hours")
    if not result.deleted and not result.released:
        console.print("every retention is 0 (keep forever): nothing to do")


@rollups_app.command("refresh")
def rollups_refresh(
    rebuild: Annotated[bool, typer.Option("--rebuild", help="Recompute every rollup from the base tables.")] = False,
) -> None:
    """Bring the rollups up to date now (serve and detector do it every rollup_interval_seconds)."""
    from vigil.store import db, maintenance, rollup_job

    s = checked_settings()
    engine = db.make_engine(s.database_url_str)
    sessions = db.make_sessionmaker(engine)
    try:
        # a rebuild on the job's snapshot and lock: what commits meanwhile is left to the next run, not lost
        result = rollup_job.refresh(sessions, rebuild_all=True) if rebuild else maintenance.refresh_rollups(s, sessions)
    finally:
        engine.dispose()
    if not result.ran:
        console.print("another process is refreshing the rollups")
        return
    how = "rebuilt" if result.rebuilt else "refreshed"
    console.print(f"rollups {how}: {result.added:,} conversations added, {result.recomputed:,} hours recomputed")


@app.command("settings")
def show_settings(
    markdown: Annotated[bool, typer.Option(help="Print the settings table of the docs instead.")] = False,
) -> None:
    """Print the effective settings (secrets masked), or every setting as a Markdown table."""
    from pydantic import SecretStr

    if markdown:
        print("| variable | default | description |\n|---|---|---|")
        for name, field in Settings.model_fields.items():
            default = field.get_default(call_default_factory=True)
            if isinstance(default, SecretStr):
                default = default.get_secret_value()
            shown = str(default).replace(str(Settings.model_fields["judges_dir"].default).rsplit("/", 1)[0], ".")
            print(f"| `VIGIL_{name.upper()}` | `{shown}` | {field.description} |")
        return
    s = checked_settings()
    for name in Settings.model_fields:
        value = getattr(s, name)
        masked = isinstance(value, SecretStr) and value.get_secret_value()
        print(f"VIGIL_{name.upper()}={'********' if masked else value}")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (VIGIL_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (VIGIL_PORT).")] = None,
    demo: Annotated[bool, typer.Option(help="Feed simulated traffic into the pipeline in-process.")] = False,
    workers: Annotated[
        bool, typer.Option(help="Also run the judge worker and detector in-process (--no-workers: API and UI only).")
    ] = True,
    demo_rate: Annotated[float, typer.Option(help="Demo conversations per second.")] = 20.0,
    demo_versions: Annotated[str, typer.Option(help="Demo versions as version:failure_rate,...")] = (
        "v1.4.0:0.04,v1.5.0:0.12"
    ),
) -> None:
    """Run the API, /metrics, the reviewer UI and the in-process workers (embedded defaults: SQLite, HTTP)."""
    import uvicorn

    from vigil.app.server import build_server_app

    s = checked_settings()  # a bad VIGIL_* variable, named: said in one line
    try:
        application = build_server_app(s, demo=demo, demo_rate=demo_rate, demo_versions=demo_versions, workers=workers)
    except VigilError as exc:
        fail(exc)
    from vigil.app.runtime import settle_heap
    from vigil.http.protocol import GuardedHttpProtocol

    settle_heap(long_running=True)
    uvicorn.run(
        application,
        host=host or s.host,
        port=port or s.port,
        log_level=s.log_level.lower(),
        http=GuardedHttpProtocol,  # uvicorn's own, with limits on slow and oversized requests
    )


for _stage in STAGES:
    if _stage.commands is not None:
        _stage.commands(app)
register_home_commands(app)
register_dead_letter_commands(app)


# The status of a process killed by SIGPIPE as a shell reports it (128 + 13): what `cat` or `grep` end with
# when the reader of their output goes first (`vigil conversations list | head -1`).
CLOSED_PIPE_STATUS = 141


def main() -> None:
    """The ``vigil`` command. Output whose reader has gone ends the command quietly with status 141, as a
    process killed by SIGPIPE; SIGPIPE itself stays ignored (Python's default), or a worker writing to a
    socket its peer closed would be killed instead of seeing the error it handles."""
    try:
        try:
            app()
        finally:
            sys.stdout.flush()  # what is still buffered, now rather than at exit, where a closed pipe is noise
    except BrokenPipeError:
        _output_closed()
    except SystemExit:
        # how Click (and the copy Typer carries) ends a command on EPIPE: stdout wrapped, status 1
        if type(sys.stdout).__name__ == "PacifyFlushWrapper":
            _output_closed()
        raise
    except VigilError as exc:
        console.print(f"[red]error:[/red] {escape(terminal_safe(str(exc)))}", soft_wrap=True, highlight=False)
        sys.exit(2)


def _output_closed() -> NoReturn:
    """Python's advice for a closed stdout: point it at /dev/null, so the flush at exit does not fail again."""
    import os

    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(CLOSED_PIPE_STATUS)


if __name__ == "__main__":
    main()
