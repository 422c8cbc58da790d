"""``vigil rules check``, ``vigil rules evaluate`` and ``vigil gate``."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vigil.runtime import Launcher

rules_app = typer.Typer(
    no_args_is_help=True, help="Rule packs: check them before deploying, measure how well they find failures."
)


def _pct(e: dict[str, Any]) -> str:
    if e.get("value") is None:
        return "–"
    return f"{e['x']}/{e['n']} {100 * e['value']:.0f}% [{100 * e['low']:.0f}–{100 * e['high']:.0f}%]"


def _ratio(e: dict[str, Any]) -> str:
    if e.get("value") is None and not e.get("infinite"):
        return "–"
    value = "∞" if e.get("infinite") else f"{e['value']:.2f}×"
    return f"{value} [{e['low']:.2f}–{e['high']:.2f}]"


def _row(table: Table, name: str, m: dict[str, Any]) -> None:
    table.add_row(
        name,
        _pct(m["firing_at_failure"]),
        _pct(m["firing_at_success"]),
        _pct(m["precision"]),
        _ratio(m["lift"]),
    )


def print_quality(report: dict[str, Any], out: Console, rules: bool = True) -> None:
    out.print(
        f"outcome [b]{report['outcome']}[/b]: {report['conversations']} conversations, "
        f"{report['failures']} failed; {report['without_outcome']} without the outcome left out; "
        f"review queue threshold: severity ≥ {report['review_threshold'] or 'none'}"
    )
    for pack in report["packs"]:
        table = Table(
            "signal",
            "fired at failure (recall)",
            "fired at success",
            "precision",
            "lift [95%]",
            title=f"pack {pack['pack']} ({pack['any']['conversations']} conversations, "
            f"{pack['any']['failures']} failed)",
            title_justify="left",
        )
        _row(table, "queues for review", pack["review"])
        _row(table, "any finding", pack["any"])
        for level in pack["at_or_above"]:
            _row(table, f"severity ≥ {level['severity']}", level)
        if rules:
            for r in pack["rules"]:
                _row(table, f"  {r['rule_id']} ({r['severity']})", r)
        out.print(table)


def _engine(settings: Any, packs: list[Path] | None) -> Any:
    from vigil.rules import RuleEngine, load_plugins

    load_plugins(settings.rule_plugins)
    return RuleEngine.from_paths(packs or settings.rule_pack_paths())


def check(
    ctx: typer.Context,
    packs: Annotated[
        list[Path] | None, typer.Argument(help="Rule pack YAML files; default: the packs VIGIL_RULE_PACKS names.")
    ] = None,
) -> None:
    """Load and check rule packs as start-up does; exit 2 with the file, rule and field on the first error."""
    from vigil.errors import VigilError
    from vigil.rules import RuleEngine, load_packs, load_plugins

    launcher = Launcher.of(ctx)
    try:
        settings = launcher.settings()
        load_plugins(settings.rule_plugins)
        loaded = load_packs(packs or settings.rule_pack_paths())  # every pack, ids unique across them
        RuleEngine.from_packs(loaded)
    except VigilError as exc:
        launcher.fail(exc)
    for pack in loaded:
        spec = pack.spec
        agents = sorted({a for r in spec.rules for a in r.applies_to.agents})
        line = (
            f"ok: {pack.path}: pack {spec.pack} v{spec.version}, {len(pack.rules)} of {len(spec.rules)} rules enabled"
        )
        Console(highlight=False, soft_wrap=True).print(escape(f"{line}, agents {', '.join(agents)}"))


def evaluate(
    ctx: typer.Context,
    files: Annotated[
        list[Path] | None,
        typer.Argument(help="Recorded conversations in any format `vigil replay` reads (τ² results, JSONL...)."),
    ] = None,
    outcome: Annotated[str, typer.Option(help="The outcome that says whether a conversation went well.")] = (
        "task_success"
    ),
    polarity: Annotated[
        str,
        typer.Option(
            help="good: failure is a value below the bar (1, or the flagging policy's `below`); bad: failure is "
            "the outcome happening (value above 0); auto: bad if the flagging policy flags it when it happens."
        ),
    ] = "auto",
    packs: Annotated[
        list[Path] | None, typer.Option("--packs", help="Rule pack YAML (repeatable); default: VIGIL_RULE_PACKS.")
    ] = None,
    stored: Annotated[bool, typer.Option(help="Measure on stored traffic instead of files.")] = False,
    since: Annotated[datetime | None, typer.Option(help="Stored traffic received since (ISO time).")] = None,
    agent: Annotated[str | None, typer.Option(help="Stored traffic of this agent id only.")] = None,
    version: Annotated[str | None, typer.Option(help="Stored traffic of this agent version only.")] = None,
    half: Annotated[
        str | None,
        typer.Option(help="Only tasks whose id hashes to this half (a or b): design checks on one, report the other."),
    ] = None,
    no_rules: Annotated[bool, typer.Option("--no-rules", help="Per pack only, not per rule.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Each pack's, severity's and rule's firing rate, precision, recall and lift against an outcome."""
    from vigil.errors import VigilError
    from vigil.evaluation import quality, sources
    from vigil.review import FlaggingPolicy

    launcher = Launcher.of(ctx)
    if polarity not in ("auto", "good", "bad"):
        launcher.fail(f"--polarity must be auto, good or bad, not {polarity!r}")
    if half not in (None, "a", "b"):
        launcher.fail(f"--half must be a or b, not {half!r}")
    if bool(files) == stored:
        launcher.fail("give result FILES or --stored (not both)")
    try:
        if stored:
            rt = launcher.core()
            settings, engine = rt.settings, _engine(rt.settings, packs) if packs else rt.rules
        else:
            settings = launcher.settings()
            engine = _engine(settings, packs)
        policy = FlaggingPolicy.load(settings.review_policy or None)
        judge = sources.Judge(outcome, polarity, policy)  # type: ignore[arg-type]
        if stored:
            with rt.sessions() as session:
                obs, left_out = sources.from_store(session, engine, policy, judge, since, agent, version)
        else:
            obs, left_out = sources.from_conversations(sources.conversations(files or []), engine, policy, judge, half)
    except VigilError as exc:
        launcher.fail(exc)
    if not obs:
        scope = sources.stored_scope(agent, version, since) if stored else ""
        launcher.fail(f"no conversation{scope} has the outcome {outcome!r} ({left_out} without it)")
    report = quality.evaluate(
        obs, sources.rule_infos(engine), outcome, sources.review_threshold(policy), left_out
    ).as_dict()
    if as_json:
        sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_quality(report, Console(width=200), rules=not no_rules)


def gate(
    ctx: typer.Context,
    baseline: Annotated[Path, typer.Option(help="Results of the last good run (.eval/.json, τ² results, JSONL).")],
    candidate: Annotated[Path, typer.Option(help="Results of the run to release.")],
    packs: Annotated[
        list[Path] | None,
        typer.Option("--packs", help="Rule packs for the forbidden-tool rate (repeatable); default: VIGIL_RULE_PACKS."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Release gate: exits 1 when the candidate is significantly worse than the baseline, 2 on bad input."""
    from vigil.errors import VigilError
    from vigil.evaluation.gate import gate as run_gate
    from vigil.evaluation.gate import print_gate
    from vigil.evaluation.runs import read_run

    launcher = Launcher.of(ctx)
    try:
        engine = _engine(launcher.settings(), packs)
        base = read_run(baseline, engine)
        cand = read_run(candidate, engine)
    except VigilError as exc:
        launcher.fail(exc)
    result = run_gate(base, cand)
    if as_json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n")
    else:
        print_gate(result, Console(width=200))
    raise typer.Exit(1 if result["regression"] else 0)


def register(app: typer.Typer) -> None:
    rules_app.command("check")(check)
    rules_app.command("evaluate")(evaluate)
    app.add_typer(rules_app, name="rules")
    app.command("gate")(gate)
