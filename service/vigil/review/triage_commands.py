"""``vigil review bulk|near-duplicates|label-cluster|comment|pairwise``: triage from the command line."""

from __future__ import annotations

import sys
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
triage_app = typer.Typer()  # its commands join ``vigil review`` (see commands.register)


def _stage(ctx: typer.Context) -> ReviewStage:
    from vigil.errors import VigilError

    launch = Launcher.of(ctx)
    try:
        return ReviewStage.from_runtime(launch.core())
    except VigilError as exc:
        launch.fail(exc)


def _fail(exc: Exception) -> None:
    console.print(f"[red]error:[/red] {escape(terminal_safe(str(exc)))}", soft_wrap=True, highlight=False)
    raise typer.Exit(2)


@triage_app.command("bulk")
def bulk_cmd(
    ctx: typer.Context,
    action: Annotated[str, typer.Argument(help="skip, assign or unassign.")],
    conversation_ids: Annotated[list[str], typer.Argument(help="Queue items (conversation ids).")],
    actor: Annotated[str, typer.Option("--as", help="Reviewer acting (skips are theirs; recorded in the audit).")],
    to: Annotated[str | None, typer.Option(help="For assign: the reviewer to assign the items to.")] = None,
) -> None:
    """Skip, assign or unassign many queue items at once; items that cannot change are listed with why.

    ``--to`` must name a reviewer or admin key of ``VIGIL_API_KEYS``, as the API requires (not checked when
    no keys are set: then there is nobody to check against)."""
    from vigil.errors import ConfigError
    from vigil.review.errors import ReviewError
    from vigil.review.triage import bulk, reviewer_names

    launch = Launcher.of(ctx)
    try:
        keys = launch.settings().parsed_api_keys()
    except ConfigError as exc:
        launch.fail(exc)
    names = reviewer_names(keys) if keys else None
    st = _stage(ctx)
    try:
        with st.sessions.begin() as s:
            out = bulk(s, action, conversation_ids, actor, to, reviewers=names)
    except ReviewError as exc:
        _fail(exc)
    console.print(f"{escape(action)}: {len(out['done'])} done, {len(out['skipped'])} left as they were")
    for left in out["skipped"]:
        console.print(f"  {escape(left['conversation_id'])}: {escape(left['why'])}", highlight=False)


@triage_app.command("near-duplicates")
def near_duplicates_cmd(
    ctx: typer.Context,
    min_size: Annotated[int, typer.Option(help="Smallest cluster to list.")] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (with every member).")] = False,
) -> None:
    """Near-duplicate clusters of the open queue (same main reason, nearly the same first user message)."""
    from vigil.review.clusters import open_clusters

    st = _stage(ctx)
    with st.sessions() as s:
        found = [c.as_dict() for c in open_clusters(s, min_size)]
    if as_json:
        print_json({"clusters": found})
        return
    rows = [[c["id"], str(c["size"]), f"{c['reason']['kind']}:{reason_key(c['reason'])}", c["snippet"]] for c in found]
    print_table(["cluster", "items", "flagged for", "first message"], rows)


@triage_app.command("label-cluster")
def label_cluster_cmd(
    ctx: typer.Context,
    cluster_id: Annotated[str, typer.Argument(help="A cluster id from `vigil review near-duplicates`.")],
    actor: Annotated[str, typer.Option("--as", help="The reviewer who read the sample and labels the cluster.")],
    label: Annotated[str, typer.Option(help="confirmed_failure, not_a_failure or unsure.")],
    category: Annotated[str | None, typer.Option(help="Failure category (needed for confirmed_failure).")] = None,
    severity: Annotated[str | None, typer.Option(help="Severity.")] = None,
    notes: Annotated[str, typer.Option(help="Notes.")] = "",
) -> None:
    """Label a cluster's sample and apply the label to all its members in one action."""
    from vigil.review import queue
    from vigil.review.clusters import find, label_cluster
    from vigil.review.errors import ReviewError

    st = _stage(ctx)
    try:
        with st.sessions.begin() as s:
            cluster = find(s, cluster_id, actor)
            if cluster is None:
                raise typer.BadParameter(f"no open cluster {cluster_id!r}", param_hint="CLUSTER_ID")
            members = [m.conversation_id for m in cluster.members]
            data = queue.LabelIn(label, category, severity, notes)
            out = label_cluster(s, members[0], members, actor, data, st.policy, st.metrics)
    except ReviewError as exc:
        _fail(exc)
    console.print(f"labelled {len(out['labelled'])} ({len(out['labelled']) - 1} from {escape(str(out['sample']))})")
    for left in out["skipped"]:
        console.print(f"  left {escape(left['conversation_id'])}: {escape(left['why'])}", highlight=False)


@triage_app.command("comment")
def comment_cmd(
    ctx: typer.Context,
    conversation_id: Annotated[str, typer.Argument(help="A stored conversation.")],
    text: Annotated[str, typer.Argument(help="The comment.")],
    actor: Annotated[str, typer.Option("--as", help="Author's name.")],
    message: Annotated[int | None, typer.Option(help="Comment on this message (0-based index).")] = None,
) -> None:
    """Comment on a conversation or one of its messages."""
    from vigil.review.errors import ReviewError
    from vigil.review.triage import add_comment

    st = _stage(ctx)
    try:
        with st.sessions.begin() as s:
            add_comment(s, conversation_id, actor, text, message)
    except ReviewError as exc:
        _fail(exc)
    console.print("comment added")


@triage_app.command("pairwise")
def pairwise_cmd(
    ctx: typer.Context,
    task: Annotated[str | None, typer.Option(help="Only this task.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write JSONL here (default: stdout).")] = None,
) -> None:
    """Export reviewers' side-by-side choices as JSON lines (``human``: a, b or tie)."""
    from vigil.review.side_by_side import choices

    st = _stage(ctx)
    with st.sessions() as s:
        rows = choices(s, task, limit=1_000_000)
    data = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    if out:
        out.write_bytes(data)
    else:
        sys.stdout.buffer.write(data)
    console.print(f"{len(rows)} choices")
