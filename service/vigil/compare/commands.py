"""``vigil compare``: the table teams look at before a rollout."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vigil.runtime import Launcher


def _pct(e: dict[str, Any], kind: str) -> str:
    v = e.get("value")
    if v is None:
        return "-"
    if kind == "rate":
        lo, hi = e.get("low"), e.get("high")
        inner = f" [{100 * lo:.1f}%, {100 * hi:.1f}%]" if lo is not None and hi is not None else ""
        return f"{100 * v:.1f}%{inner}"
    lo, hi = e.get("low"), e.get("high")
    inner = f" [{lo:.4g}, {hi:.4g}]" if lo is not None and hi is not None else ""
    return f"{v:.4g}{inner}"


def _corrected_row(cal: dict[str, Any]) -> tuple[str, str, str, str, str]:
    """A judge row's corrected rates (calibration stage), beside the raw rate on the judge's sample."""

    def side(c: dict[str, Any] | None) -> str:
        if c is None:
            return "-"
        corrected = _pct(c["corrected"], "rate") if c.get("corrected") else f"- ({c['reason']})"
        return f"{corrected} (raw on sample {_pct(c['raw'], 'rate')})"

    state = cal["state"] if cal["state"] == "calibrated" else "[red]UNCALIBRATED[/red]"
    return (f"  corrected, {state}", side(cal.get("baseline")), side(cal.get("candidate")), "", "")


def _side(values: list[dict[str, Any]]) -> str:
    if len(values) == 1:
        return str(values[0]["value"])
    return "; ".join(f"{v['value']} ({next(n for k, n in v.items() if k != 'value')})" for v in values)


def render(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from vigil.compare import present

    out = Console()
    b, c = result["baseline"], result["candidate"]
    out.print(f"[bold]{escape(result['headline']['text'])}[/bold]")
    tasks = result.get("tasks") or {}
    if tasks.get("paired"):
        out.print(f"{tasks['shared']} shared tasks: task rows are paired (SE of the per-task difference)")
    table = Table(
        title=f"{result['agent_id']}: {b['version']} ({b['conversations']} conv.) → "
        f"{c['version']} ({c['conversations']} conv.), 95% intervals"
    )
    for col in ("signal", "baseline", "candidate", "difference [95%]", "verdict"):
        table.add_column(col, overflow="fold")
    colour = {"better": "green", "worse": "red", "grader changed": "yellow"}
    shown, folded = present.ordered(result["signals"])
    for r in shown:
        verdict = r["verdict"] + (" (red flag)" if r["red_flag"] else "") + (" (info)" if r["informational"] else "")
        if r.get("grader_changed"):
            verdict += f": {r['grader_changed']}"
        style = colour.get(r["verdict"], "")
        diff = f"{present.difference(r)} {present.difference_interval(r)}"
        if se := present.standard_error(r):
            diff += f" {se}"
        table.add_row(
            escape(r["label"]),
            f"{present.value(r, r['baseline'])} {present.interval(r, r['baseline'])}",
            f"{present.value(r, r['candidate'])} {present.interval(r, r['candidate'])}",
            diff,
            f"[{style}]{escape(verdict)}[/{style}]" if style else escape(verdict),
        )
        if r.get("calibration"):
            table.add_row(*_corrected_row(r["calibration"]))
    out.print(table)
    ow = result.get("outcomes") or {}
    if ow.get("received_before"):

        def counted(side: str) -> str:
            n = ow.get(f"{side}_conversations") or 0
            return f"{n:,} of the {side}'s" if n else f"none of the {side}'s yet (no data)"

        out.print(
            f"Outcome rates count conversations received before {ow['received_before']:%Y-%m-%d %H:%M} UTC: "
            f"{counted('baseline')} and {counted('candidate')}; task success counts graded trials where both "
            "versions' conversations are trials of tasks."
        )
    if folded:
        out.print(f"{len(folded)} signals are 0 on both sides: {', '.join(r['signal'] for r in folded)}")
    m = result.get("multiplicity")
    if m:
        out.print(
            f"Verdicts are corrected for testing {m['signals']} signals at once ({m['method'].title()}); "
            "the intervals shown are raw 95% intervals; (info) rows are not tested."
        )
    for note in result["red_flags"]:
        out.print(f"[bold red]red flag:[/bold red] {escape(note)}")
    proto = result.get("protocol") or []
    if proto:
        t = Table("protocol", "baseline", "candidate", "", title="how each side was produced")
        for p in proto:
            t.add_row(
                p["key"],
                escape(_side(p["baseline"])[:80]),
                escape(_side(p["candidate"])[:80]),
                "same" if p["same"] else "[yellow]DIFFERS[/yellow]",
            )
        out.print(t)
        if not result.get("comparable", True):
            out.print("[yellow]the two versions were not produced the same way (see DIFFERS above)[/yellow]")


def register(app: typer.Typer) -> None:
    @app.command()
    def compare(
        ctx: typer.Context,
        baseline: Annotated[str, typer.Option("--baseline", help="Baseline agent version.")],
        candidate: Annotated[str, typer.Option("--candidate", help="Candidate agent version.")],
        agent: Annotated[str | None, typer.Option("--agent", help="Agent id (when versions are shared).")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    ) -> None:
        """Compare two agent versions: every signal with 95% intervals, a verdict and red flags."""
        import orjson

        from vigil.compare.api import run_compare
        from vigil.errors import VigilError
        from vigil.store.maintenance import refresh_rollups

        launch = Launcher.of(ctx)
        rt = launch.runtime({"replay"})
        # a one-off command, not a request: it may bring the rollups up to date itself (no upkeep runs here)
        refresh_rollups(rt.settings, rt.sessions, only_if_behind=True)
        try:
            result = run_compare(rt, baseline, candidate, agent, per_task=True)
        except VigilError as exc:
            launch.fail(exc)
        if as_json:
            typer.echo(
                orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z).decode()
            )
        else:
            render(result)
