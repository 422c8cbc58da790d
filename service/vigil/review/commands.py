"""``vigil review queue|enqueue|labels|clusters|progress|policy`` (triage commands: :mod:`.triage_commands`)."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.markup import escape

from vigil.review.stage import ReviewStage
from vigil.runtime import Launcher
from vigil.tables import print_json, print_table, terminal_safe
from vigil.ui.labels import reason_key

console = Console(stderr=True)
review_app = typer.Typer(no_args_is_help=True, help="Human review queue: inspect, enqueue, export labels.")


def _stage(ctx: typer.Context) -> ReviewStage:
    from vigil.errors import VigilError

    launch = Launcher.of(ctx)
    try:
        return ReviewStage.from_runtime(launch.core())
    except VigilError as exc:
        launch.fail(exc)


@review_app.command("queue")
def queue_cmd(
    ctx: typer.Context,
    status: Annotated[str, typer.Option(help="open, available, claimed, done, waiting or all.")] = "open",
    agent: Annotated[str | None, typer.Option(help="Only this agent.")] = None,
    version: Annotated[str | None, typer.Option(help="Only this agent version.")] = None,
    reason: Annotated[str | None, typer.Option(help="Only items flagged for this reason kind.")] = None,
    rule: Annotated[str | None, typer.Option(help="Only conversations with a finding of this rule.")] = None,
    severity: Annotated[str | None, typer.Option(help="Only conversations whose worst finding is this bad.")] = None,
    search: Annotated[
        str | None, typer.Option("--search", "-q", help="Part of the conversation id, task, user id or message text.")
    ] = None,
    sort: Annotated[
        str, typer.Option(help="priority, flagged, received, agent, version, messages, findings or updated.")
    ] = "priority",
    ascending: Annotated[bool, typer.Option("--asc", help="Ascending order (default: descending for times).")] = False,
    limit: Annotated[int, typer.Option(min=1, max=500, help="Items to show.")] = 20,
    cursor: Annotated[
        str | None, typer.Option(help="The next page: the cursor the previous page printed (default order).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (counts, items, next_cursor).")] = False,
) -> None:
    """Show queue counts and the highest-priority items; the next page is --cursor of the one printed last."""
    from vigil.review.errors import Invalid
    from vigil.review.insights import SORTS, STATUSES, list_queue
    from vigil.review.queue import QueueFilter
    from vigil.store.reads import BadCursor

    if status not in STATUSES:
        console.print(f"[red]error:[/red] --status must be one of {', '.join(STATUSES)}")
        raise typer.Exit(2)
    if sort not in SORTS:
        console.print(f"[red]error:[/red] --sort must be one of {', '.join(SORTS)}")
        raise typer.Exit(2)
    st = _stage(ctx)
    f = QueueFilter(agent, version, rule, reason=reason, severity=severity, search=search)
    try:
        f.check()  # a mistyped severity or reason is an error, as over HTTP, not an empty queue
        with st.sessions() as s:
            data = list_queue(s, f, status, limit, cursor=cursor, sort=sort, descending=False if ascending else None)
    except (BadCursor, Invalid) as exc:
        console.print(f"[red]error:[/red] {escape(terminal_safe(str(exc)))}", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None
    if as_json:
        print_json(data)
        return
    if data["next_cursor"]:
        console.print(f"older: --cursor {data['next_cursor']}", soft_wrap=True, highlight=False)
    c = data["count_text"]
    console.print(f"available {c['available']} · claimed {c['claimed']} · done {c['done']} · waiting {c['waiting']}")
    rows = [
        [
            f"{it['priority']:.0f}",
            it["conversation_id"],
            f"{it['agent_id']} {it['agent_version']}",
            it["state"] + (f" ({it['claimed_by']})" if it["claimed_by"] else ""),
            ", ".join(f"{r['kind']}:{reason_key(r)}" for r in it["reasons"][:3]),
            f"{it['received_at']:%m-%d %H:%M}" if it["received_at"] else "",
            it["snippet"],
        ]
        for it in data["items"]
    ]
    print_table(["priority", "conversation", "agent", "state", "reasons", "received", "first message"], rows)


@review_app.command("enqueue")
def enqueue_cmd(
    ctx: typer.Context,
    conversation_ids: Annotated[list[str], typer.Argument(help="Stored conversation ids.")],
    note: Annotated[str, typer.Option(help="Why (shown to reviewers).")] = "",
    weight: Annotated[float, typer.Option(help="Priority this reason adds.")] = 50.0,
    actor: Annotated[str, typer.Option(help="Name recorded in the audit log.")] = "cli",
) -> None:
    """Put stored conversations in the review queue by hand."""
    from sqlalchemy import select

    from vigil.review.flagger import enqueue
    from vigil.review.policy import Reason
    from vigil.store.models import ConversationRow

    st = _stage(ctx)
    with st.sessions.begin() as s:
        rows = s.execute(
            select(ConversationRow.conversation_id, ConversationRow.agent_id, ConversationRow.agent_version).where(
                ConversationRow.conversation_id.in_(conversation_ids)
            )
        ).all()
        known = {r[0]: (r[1], r[2]) for r in rows}
        unknown = [c for c in conversation_ids if c not in known]
        new = enqueue(s, st.policy, {c: [Reason("manual", actor, weight, note)] for c in known}, known, actor=actor)
    console.print(f"{len(new)} added to the queue, {len(known) - len(new)} already there")
    if unknown:
        console.print(f"[yellow]not stored, skipped:[/yellow] {escape(', '.join(unknown))}", highlight=False)
        raise typer.Exit(1)


@review_app.command("labels")
def labels_cmd(
    ctx: typer.Context,
    out: Annotated[Path | None, typer.Option(help="Write JSONL here (default: stdout).")] = None,
    since: Annotated[datetime | None, typer.Option(help="Only labels saved at or after this time.")] = None,
    all_versions: Annotated[bool, typer.Option("--all-versions", help="Include superseded versions.")] = False,
) -> None:
    """Export reviewers' labels as JSON lines."""
    from vigil.review.insights import labels_export

    st = _stage(ctx)
    n, offset, page = 0, 0, 5000
    fh = out.open("wb") if out else sys.stdout.buffer
    try:
        with st.sessions() as s:
            while batch := labels_export(s, since, not all_versions, page, offset):
                fh.write(b"".join(orjson.dumps(r) + b"\n" for r in batch))
                n += len(batch)
                offset += page
    finally:
        if out:
            fh.close()
    console.print(f"{n} labels")


@review_app.command("clusters")
def clusters_cmd(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Confirmed failures grouped by category, rule and tool."""
    from vigil.review.failures import clusters

    st = _stage(ctx)
    with st.sessions() as s:
        data = clusters(s, st.rule_descriptions)
    if as_json:
        sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    for c in data["clusters"]:
        where = " · ".join(x for x in (c["category"], c["rule_id"], c["tool"]) if x)
        Console().print(f"{escape(c['summary'])}  [dim]({escape(where)})[/dim]", highlight=False)
    if not data["clusters"]:
        console.print("no confirmed failures yet")


@review_app.command("progress")
def progress_cmd(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (reviewers and agreement).")] = False,
) -> None:
    """Per-reviewer counts and inter-reviewer agreement."""
    from vigil.review.reviewers import progress

    launch = Launcher.of(ctx)
    st = _stage(ctx)
    with st.sessions() as s:
        data = progress(s, launch.settings().agreement_max_labels)
    if as_json:
        print_json(data)
        return
    rows = [
        [
            p["reviewer"],
            str(p["labels"]),
            str(p["by_label"].get("confirmed_failure", 0)),
            str(p["by_label"].get("not_a_failure", 0)),
            str(p["by_label"].get("unsure", 0)),
            str(p["last_24h"]),
            str(p["holding"]),
        ]
        for p in data["reviewers"]
    ]
    print_table(["reviewer", "labels", "confirmed", "not a failure", "unsure", "last 24h", "holding"], rows)
    a = data["agreement"]
    rate = "–" if a["rate"] is None else f"{a['rate']:.0%}"
    bound = f" (the newest {a['labels_considered']} labels only)" if a["bounded"] else ""
    console.print(f"agreement: {rate} on {a['items']} items labelled by two or more reviewers{bound}")


@review_app.command("policy")
def policy_cmd(
    ctx: typer.Context,
    path: Annotated[Path | None, typer.Argument(help="Policy file (default: VIGIL_REVIEW_POLICY).")] = None,
) -> None:
    """Validate a flagging policy and print it as the flagger reads it."""
    from vigil.errors import VigilError
    from vigil.review.policy import FlaggingPolicy
    from vigil.rules import RuleEngine, load_plugins
    from vigil.schema import outcome_types

    try:
        settings = Launcher.of(ctx).settings()
        source = path or settings.review_policy or None
        policy = FlaggingPolicy.load(source)
        policy.check_outcome_types(outcome_types(settings.outcome_types), str(source or "flagging policy"))
    except VigilError as exc:
        console.print(f"[red]error:[/red] {escape(terminal_safe(str(exc)))}", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None
    try:
        load_plugins(settings.rule_plugins)
        rule_ids = [r.id for r in RuleEngine.from_paths(settings.rule_pack_paths()).rules]
        unknown = policy.unknown_rules(rule_ids)
        warning = f"findings.rules names no enabled rule of VIGIL_RULE_PACKS: {', '.join(unknown)}" if unknown else ""
    except (VigilError, ImportError) as exc:
        warning = f"findings.rules not checked against the rule packs: {exc}"
    if warning:
        console.print(f"[yellow]warning:[/yellow] {escape(terminal_safe(warning))}", soft_wrap=True, highlight=False)
    sys.stdout.write(orjson.dumps(policy.model_dump(), option=orjson.OPT_INDENT_2).decode() + "\n")


def register(app: typer.Typer) -> None:
    from vigil.review.triage_commands import triage_app

    known = review_app.registered_commands
    known += [c for c in triage_app.registered_commands if c not in known]
    app.add_typer(review_app, name="review")
