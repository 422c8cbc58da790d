"""``vigil calibrate`` and ``vigil export``."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vigil.runtime import Launcher

console = Console(stderr=True)


def _est(e: dict[str, Any], pct: bool = True) -> str:
    if e.get("value") is None:
        return "–"
    f = (lambda x: f"{100 * x:.1f}%") if pct else (lambda x: f"{x:.3f}")
    if e.get("low") is not None:
        return f"{f(e['value'])}  [{f(e['low'])}, {f(e['high'])}]"
    # a value without an interval says why (a kappa on too few items: "n too small")
    return f(e["value"]) + ("  " + escape(f"[{e['note']}]") if e.get("note") else "")


def print_report(result: dict[str, Any]) -> None:
    out = Console()
    out.print(
        f"[b]{result['judge']}[/b] on {result['source']} ({result['mode']})"
        + (f", {result['unsure']} unsure left out" if result.get("unsure") else "")
    )
    if result.get("missing"):
        out.print(
            f"[yellow]{len(result['missing'])} labelled conversations had no verdict or document: "
            f"{', '.join(result['missing'][:5])}{' …' if len(result['missing']) > 5 else ''}[/yellow]"
        )
    if result.get("mode") == "offline":
        out.print(
            "[yellow]no provider key: this measured the offline judge, and calibrates only the offline judge, "
            "not the model[/yellow]"
        )
    for v in result["versions"]:
        a = v["agreement"]
        c = a["confusion"]
        colour = "green" if v["state"] == "calibrated" else "red"
        out.print(
            f"version {v['judge_version']}: [{colour}]{v['state']}[/{colour}] ({v['state_reason']}); "
            f"{a['n']} scored, {v['unscored']} unscored"
        )
        table = Table("", "human fail", "human pass", title="confusion (rows: judge)")
        table.add_row("judge fail", str(c["tp"]), str(c["fp"]))
        table.add_row("judge pass", str(c["fn"]), str(c["tn"]))
        out.print(table)
        stats = Table("measure", "value [95% interval]")
        for key, name in (
            ("percent_agreement", "agreement"),
            ("kappa", "Cohen's kappa"),
            ("tpr", "TPR (sensitivity)"),
            ("tnr", "TNR (specificity)"),
            ("precision", "precision"),
        ):
            stats.add_row(name, _est(a[key], key != "kappa"))
        cat = v["categories"]["rate"]
        if cat["n"]:
            stats.add_row("category match", _est(cat))
        out.print(stats)
    if result.get("position_bias"):
        pb = result["position_bias"]
        out.print(f"position bias: {_est(pb['rate'])} of {pb['comparisons']} comparisons flip when swapped")
    for name, tw in (result.get("three_way") or {}).items():
        out.print(
            f"three-way (A / B / tie) agreement, {name.replace('_', ' ')}: {_est(tw['percent_agreement'])}, "
            f"kappa {_est(tw['kappa'], False)} on {tw['n']} pairs (ties: human {tw['ties']['human']}, "
            f"judge {tw['ties']['judge']})"
        )


def calibrate(
    ctx: typer.Context,
    judge: Annotated[str, typer.Argument(help="Judge name (as in judges/<name>/).")],
    labels: Annotated[
        list[Path] | None,
        typer.Option(
            "--labels",
            help="Labelled set JSONL (repeatable); default: judges/<name>/calibration/*.jsonl.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    verdicts: Annotated[
        Path | None,
        typer.Option(
            help="The judge's recorded verdicts (JSONL): measure them instead of running the judge.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    pairwise: Annotated[
        Path | None,
        typer.Option(
            help="Pairwise choices in both orders (JSONL), for the position-bias rate.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    save: Annotated[bool, typer.Option(help="Store the result as the version's latest labelled-set run.")] = True,
) -> None:
    """Compare a judge with human labels: agreement, kappa, TPR/TNR with intervals; calibrated or not."""
    from vigil.calibration.calibrate import calibrate as run
    from vigil.calibration.errors import CalibrationError
    from vigil.calibration.labelsets import (
        judge_sets,
        load_labels,
        load_pairwise,
        load_pairwise_human,
        load_verdicts,
    )
    from vigil.calibration.overview import save_run
    from vigil.errors import VigilError

    try:
        rt = Launcher.of(ctx).runtime({"api"})
    except VigilError as exc:
        Launcher.of(ctx).fail(str(exc))
    files = labels or judge_sets(rt.settings.judges_dir, judge)
    if not files:
        missing = Path(rt.settings.judges_dir) / judge / "calibration"
        Launcher.of(ctx).fail(f"no --labels given and no {missing}/*.jsonl")
    results = []
    try:
        recorded = load_verdicts(verdicts) if verdicts else None
        pairs = load_pairwise(pairwise) if pairwise else None
        humans = load_pairwise_human(pairwise) if pairwise else None
        for f in files:
            result = asyncio.run(run(rt, judge, load_labels(f), recorded, pairs, humans))
            if save:
                with rt.sessions.begin() as s:
                    result["run_ids"] = save_run(s, judge, str(f), result["mode"], result)
            results.append(result)
    except CalibrationError as exc:
        Launcher.of(ctx).fail(str(exc))
    if as_json:
        sys.stdout.write(
            orjson.dumps(results[0] if len(results) == 1 else results, option=orjson.OPT_INDENT_2).decode() + "\n"
        )
    else:
        for r in results:
            print_report(r)
    if any(v["state"] != "calibrated" for r in results for v in r["versions"]):
        raise typer.Exit(1)
    if not any(r["versions"] for r in results):  # nothing was measured: not a pass for a CI gate
        Launcher.of(ctx).console.print(
            "[red]no judge version was measured: no label had a verdict and a stored conversation[/red]"
        )
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)
