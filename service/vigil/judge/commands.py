"""``vigil judge-worker`` and ``vigil judge list|validate|run|resume``."""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from vigil.judge.stage import JudgeStage
from vigil.money import usd
from vigil.runtime import Launcher
from vigil.tables import print_json, print_table, terminal_safe

console = Console(stderr=True)
judge_app = typer.Typer(no_args_is_help=True, help="LLM judges: list, validate, run one, resume.")


def judge_worker(
    ctx: typer.Context,
    once: Annotated[
        bool,
        typer.Option(
            help="Judge what is due, then exit: 0 when done, 3 when requests wait on a judge that cannot take "
            "them (circuit open, budget paused, configuration error)."
        ),
    ] = False,
) -> None:
    """Judge worker: claims due judge requests, calls the judge models, stores verdicts."""
    rt = Launcher.of(ctx).runtime({"judge-worker"})
    stage = rt.get(JudgeStage)
    if stage.worker is None:
        console.print("[yellow]no judges defined in VIGIL_JUDGES_DIR (or VIGIL_JUDGE_ENABLED=false)[/yellow]")
        raise typer.Exit(1)
    worker = stage.worker
    for lane in stage.engine.lanes.values():
        console.print(
            f"judge {escape(lane.name)} v{escape(str(lane.judge.version))}: "
            + escape("offline judge" if lane.offline else str(lane.model)),
            highlight=False,
        )
    if once:
        n = asyncio.run(worker.run_until_idle(timeout=3600))
        console.print(f"{n} verdicts stored")
        from vigil.judge.store import queue_depth

        with rt.sessions() as s:
            waiting = queue_depth(s)
        blocked = 0
        for lane in stage.engine.lanes.values():
            if not stage.engine.accepting(lane):  # its requests stay queued for a later run
                pending = waiting.get(lane.name, 0)
                blocked += pending
                console.print(
                    f"[yellow]judge {escape(lane.name)} is {escape(str(lane.state))}[/yellow]: "
                    + escape(lane.detail or "")
                    + (f" ({pending} requests wait)" if pending else ""),
                    soft_wrap=True,
                )
        for name in sorted(set(waiting) - set(stage.engine.lanes)):  # a judge removed or renamed
            blocked += waiting[name]
            console.print(
                f"[yellow]{waiting[name]} requests wait for judge {escape(name)}, which no definition in "
                "VIGIL_JUDGES_DIR defines (removed or renamed?)[/yellow]: they stay queued until it is defined "
                "again",
                soft_wrap=True,
            )
        if blocked:  # a scheduled run must not look successful while work cannot proceed
            raise typer.Exit(3)
        return
    Launcher.of(ctx).serve_metrics(rt)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, done.set)
        await worker.start()
        await done.wait()
        console.print("stopping: finishing calls in flight")
        await worker.stop()
        console.print(f"stopped after {worker.judged} verdicts")

    asyncio.run(main())


@judge_app.command("list")
def list_judges(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (every field of GET /v1/judges).")] = False,
) -> None:
    """Judges with model, mode, sample rate, budget, spend today, queue depth and state."""
    from vigil.judge.api import judge_info

    rt = Launcher.of(ctx).runtime({"api"})
    stage = rt.get(JudgeStage)
    with rt.sessions() as s:
        infos = judge_info(stage, s, sorted(stage.engine.lanes))
    if as_json:
        print_json(infos)
        return
    rows = [
        [
            i["name"],
            i["version"],
            i["judge_label"],
            i["mode"],
            f"{i['sample_rate']:.2%}",
            usd(i["budget_usd"]),
            usd(i["spent_today_usd"]),
            str(i["queue_depth"]),
            i["state"],
        ]
        for i in infos
    ]
    print_table(["judge", "version", "model", "mode", "rate", "budget/day", "spent today", "queue", "state"], rows)


@judge_app.command("validate")
def validate(ctx: typer.Context) -> None:
    """Load and check every judge definition; exit 2 with the file and field on the first error."""
    from vigil.errors import VigilError
    from vigil.judge.definitions import load_judges

    try:
        judges = load_judges(Launcher.of(ctx).settings())
    except VigilError as exc:
        console.print(f"[red]error:[/red] {escape(terminal_safe(str(exc)))}", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None
    for j in judges.values():
        console.print(
            f"ok: {escape(f'{j.name} v{j.version} ({j.spec.model})')}, prompt {j.prompt_hash[:12]}", highlight=False
        )


@judge_app.command("run")
def run(
    ctx: typer.Context,
    judge: Annotated[str, typer.Argument(help="Judge name.")],
    conversation_id: Annotated[str, typer.Argument(help="A stored conversation.")],
) -> None:
    """Judge one stored conversation now (a manual request, judged in this process), print the verdict."""
    from vigil.judge.stage import verdict_dict
    from vigil.judge.worker import JudgeWorker

    rt = Launcher.of(ctx).runtime({"api"})
    stage = rt.get(JudgeStage)
    if judge not in stage.engine.lanes:
        console.print(f"[red]error:[/red] {escape(f'no judge {judge!r}; judges: {sorted(stage.engine.lanes)}')}")
        raise typer.Exit(2)
    with rt.sessions.begin() as s:
        try:
            requested = stage.sampler.enqueue_manual(s, stage.engine.judges[judge], conversation_id)
        except LookupError:
            console.print(f"[red]error:[/red] no conversation {escape(repr(conversation_id))}")
            raise typer.Exit(2) from None
        if requested is None:  # each (judge, conversation, revision) is requested once: say so, not a new verdict
            from vigil.store.models import ConversationRow

            stored = s.get(ConversationRow, conversation_id)
            revision = stored.revision if stored is not None else "?"
            said = f"revision {revision} was already queued or judged by {judge}: not requested again, its verdict is"
            console.print(f"[yellow]{escape(said)}[/yellow]", highlight=False)
    only = {judge: stage.engine.lanes[judge]}
    stage.engine.lanes, others = only, stage.engine.lanes
    try:
        worker = JudgeWorker(stage.engine, rt.hooks.verdict_listeners, only_conversation=conversation_id)
        asyncio.run(worker.run_until_idle(timeout=600))
    finally:
        stage.engine.lanes = others
    from vigil.judge.store import verdicts_for

    with rt.sessions() as s:
        mine = [verdict_dict(v) for v in verdicts_for(s, conversation_id) if v.judge == judge]
    if not mine:
        console.print("[yellow]no verdict yet (retrying later, or the judge is paused or stopped)[/yellow]")
        raise typer.Exit(1)
    v = mine[-1]
    console.print(escape(f"{judge} v{v['judge_version']} ({v['judge_label']}): {v['verdict']}"), highlight=False)
    print_json(v)


@judge_app.command("resume")
def resume(ctx: typer.Context, judge: Annotated[str, typer.Argument(help="Judge name.")]) -> None:
    """Resume a judge stopped by a configuration error (workers pick it up within seconds)."""
    from vigil.judge.store import request_resume

    rt = Launcher.of(ctx).runtime({"api"})
    if judge not in rt.get(JudgeStage).engine.lanes:
        console.print(f"[red]error:[/red] no judge {escape(repr(judge))}")
        raise typer.Exit(2)
    with rt.sessions.begin() as s:
        request_resume(s, judge, rt.get(JudgeStage).engine.now(s))
    console.print(f"resume requested for {escape(judge)}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("judge-worker")(judge_worker)
    app.add_typer(judge_app, name="judge")
