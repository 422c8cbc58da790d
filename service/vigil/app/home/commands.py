"""``vigil status``: what the console's home page says, on the command line; ``vigil conversations list|show``:
what ``/ui/conversations`` finds."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from vigil.money import usd
from vigil.runtime import Launcher


def pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def print_status(data: dict[str, Any]) -> None:
    from vigil.tables import print_table

    typer.echo(f"active alerts: {len(data['alerts'])}")
    if data["alerts"]:
        print_table(
            ["agent", "version", "signal", "rate", "baseline", "since"],
            [
                [
                    a["agent_id"],
                    a["agent_version"],
                    a["signal"],
                    pct(a["rate_at_start"]),
                    f"{pct(a['baseline_rate'])} ({a['baseline']})",
                    str(a["started_at"])[:16],
                ]
                for a in data["alerts"]
            ],
        )
    print_table(
        ["agent", "version", "last hour", "flagged", "last day", "flagged"],
        [
            [
                t["agent"],
                t["version"],
                t["conversations"]["hour"],
                pct(t["flag_rate"]["hour"]),
                t["conversations"]["day"],
                pct(t["flag_rate"]["day"]),
            ]
            for t in data["traffic"]
        ],
    )
    q = data["queue"]
    typer.echo(
        f"review queue: {q['open']} open; labelled {q['labelled']['hour']} last hour, {q['labelled']['day']} last day"
    )
    for j in data["judges"]:
        typer.echo(f"judge {j['name']}: {usd(j['spent_today_usd'])} of {usd(j['budget_usd'])} today ({j['state']})")


def register(app: typer.Typer) -> None:
    register_conversations(app)

    @app.command()
    def status(
        ctx: typer.Context,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """What is happening now: active alerts, traffic and flag rate per version, review queue, judge spend."""
        from vigil.app.home import now
        from vigil.tables import print_json

        rt = Launcher.of(ctx).runtime({"api"})
        data = now.as_json(now.snapshot(rt))
        if as_json:
            print_json(data)
            return
        print_status(data)


SUMMARY_COLUMNS = ["conversation", "agent", "version", "task", "status", "received", "messages"]
SUMMARY_COLUMNS += ["tool errors", "cost", "findings"]


def _summary_rows(items: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            c["conversation_id"],
            c["agent_id"],
            c["agent_version"] or "",
            c["task_id"] or "",
            c["status"] or "",
            str(c["received_at"])[:19],
            str(c["message_count"]),
            f"{c['tool_error_count']}/{c['tool_call_count']}",
            usd(c["cost_usd"]),
            f"{c['finding_count']} ({c['max_severity']})" if c["finding_count"] else "0",
        ]
        for c in items
    ]


def register_conversations(app: typer.Typer) -> None:
    conversations = typer.Typer(no_args_is_help=True, help="Stored conversations: find them, show one.")
    app.add_typer(conversations, name="conversations")

    @conversations.command("list")
    def list_conversations(
        ctx: typer.Context,
        agent: Annotated[str | None, typer.Option(help="Only this agent.")] = None,
        version: Annotated[str | None, typer.Option(help="Only this agent version.")] = None,
        rule: Annotated[str | None, typer.Option(help="Only conversations with a finding of this rule.")] = None,
        severity: Annotated[
            str | None, typer.Option(help="Only conversations with a finding at least this bad (info ... critical).")
        ] = None,
        since: Annotated[str | None, typer.Option(help="Received at or after (ISO time, UTC unless given).")] = None,
        until: Annotated[str | None, typer.Option(help="Received before (ISO time).")] = None,
        limit: Annotated[int, typer.Option(min=1, max=500, help="Conversations per page.")] = 50,
        cursor: Annotated[str | None, typer.Option(help="The next page: the cursor the previous page printed.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON (total, items, next_cursor).")] = False,
    ) -> None:
        """Stored conversations, newest first; the next page is --cursor of the one printed last."""
        from vigil.app.home import browse
        from vigil.errors import VigilError
        from vigil.tables import print_json, print_table

        launch = Launcher.of(ctx)
        try:
            filters = browse.Filters.read(agent, version, rule, severity, since, until)
        except browse.FindError as exc:
            launch.fail(exc)
        try:
            rt = launch.core()
        except VigilError as exc:
            launch.fail(exc)
        try:
            with rt.sessions() as s:
                data = browse.page(s, filters, cursor, rt.settings.list_count_cap, limit)
        except browse.FindError as exc:
            launch.fail(exc)
        if as_json:
            print_json(data)
            return
        typer.echo(f"{data['total_text']} matching", err=True)
        print_table(
            SUMMARY_COLUMNS,
            _summary_rows(data["items"]),
        )
        if data["next_cursor"]:
            typer.echo(f"older: --cursor {data['next_cursor']}", err=True)

    @conversations.command("show")
    def show_conversation(
        ctx: typer.Context,
        conversation_id: Annotated[str, typer.Argument(help="The conversation's id.")],
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the stored document with findings and outcomes.")
        ] = False,
    ) -> None:
        """One stored conversation: its summary, findings and outcomes (--json: the whole document)."""
        from vigil.errors import VigilError
        from vigil.store import reads
        from vigil.tables import print_json, print_table

        launch = Launcher.of(ctx)
        try:
            # --json answers what GET /v1/conversations/{id} does, so the stages add their parts (verdicts,
            # review, trace) as they do to the API's answer
            rt = launch.runtime({"replay"}) if as_json else launch.core()
        except VigilError as exc:
            launch.fail(exc)
        if as_json:
            from vigil.http.conversations import full_conversation

            found = full_conversation(rt, conversation_id, "cli")
        else:
            with rt.sessions() as s:
                found = reads.get_conversation(
                    s, conversation_id, lambda _cid: rt.metrics.unreadable_documents.labels("cli").inc()
                )
        if found is None:
            launch.fail(f"no conversation has the id {conversation_id!r}", code=1)
        if as_json:
            print_json(found)
            return
        print_table(
            SUMMARY_COLUMNS,
            _summary_rows([found]),
        )
        if found["findings"]:
            typer.echo("")
            print_table(
                ["rule", "severity", "message"],
                [[f["rule_id"], f["severity"], f["message"]] for f in found["findings"]],
            )
        if found["outcomes"]:
            typer.echo("")
            print_table(
                ["outcome", "value", "occurred"],
                [[o["type"], str(o["value"]), str(o["occurred_at"])[:19]] for o in found["outcomes"]],
            )
        if found["conversation"] is None:
            typer.echo("its stored document cannot be read (the summary above is from its row)", err=True)

    @conversations.command("erase")
    def erase_conversations(
        ctx: typer.Context,
        conversation_ids: Annotated[list[str] | None, typer.Argument(help="Conversation ids.")] = None,
        where_metadata: Annotated[
            str | None,
            typer.Option(
                "--where-metadata", metavar="KEY=VALUE", help="Every conversation whose metadata has KEY set to VALUE."
            ),
        ] = None,
        yes: Annotated[bool, typer.Option("--yes", help="Erase without listing first and asking.")] = False,
        tombstone: Annotated[
            bool, typer.Option(help="Keep each id's hash so ingest drops the conversation if it is sent again.")
        ] = True,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON (no --yes: what would go).")] = False,
    ) -> None:
        """Erase conversations and every row derived from them (labelled, queued and exported ones too), keeping a
        record without their content. Without --yes, lists what would go and asks first (--json: lists only).
        Exits 1 when an id is not stored."""
        from vigil.errors import VigilError
        from vigil.store import erasure
        from vigil.tables import print_json, print_table

        launch = Launcher.of(ctx)
        if bool(conversation_ids) == bool(where_metadata):
            launch.fail("give conversation ids or --where-metadata KEY=VALUE (one of them)")
        key, sep, value = (where_metadata or "").partition("=")
        if where_metadata and (not sep or not key):
            launch.fail(f"--where-metadata wants KEY=VALUE, not {where_metadata!r}")
        try:
            rt = launch.runtime({"replay"})
        except VigilError as exc:
            launch.fail(exc)
        ids = list(conversation_ids or [])
        if where_metadata:
            with rt.sessions() as s:
                ids = erasure.matching_metadata(s, key, value)
            if not ids:
                launch.fail(f"no stored conversation has metadata {key}={value!r}", code=1)
        if not yes:
            if as_json:
                print_json({"dry_run": True, "conversation_ids": ids, "limit": erasure.MAX_MATCHES})
                return
            for cid in ids:
                typer.echo(cid)
            if len(ids) >= erasure.MAX_MATCHES:
                typer.echo(f"(the first {erasure.MAX_MATCHES}: erase them, then run again for the rest)", err=True)
            if not typer.confirm(f"erase {len(ids)} conversation(s) and everything derived from them?", err=True):
                launch.fail("nothing erased", code=1)
        results = erasure.erase_each(rt.sessions, ids, rt.hooks.erasers, _actor(), tombstone)
        missing = [r["conversation_id"] for r in results if r["status"] == "not_found"]
        if as_json:
            print_json({"results": results, "erased": len(results) - len(missing)})
        else:
            print_table(
                ["conversation", "status", "rows removed"],
                [[r["conversation_id"], r["status"], str(sum(r.get("removed", {}).values()))] for r in results],
            )
        if missing:
            raise typer.Exit(1)


def _actor() -> str:
    import getpass

    try:
        return f"cli:{getpass.getuser()}"[:128]
    except (OSError, KeyError):  # no user name for this uid (a container's)
        return "cli"
