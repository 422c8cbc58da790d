"""``vigil dead-letters``: list refused input and re-send it through its intake (as the API's
``GET /v1/dead-letters`` and ``POST /v1/dead-letters/{id}/replay``)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from vigil.http.params import MAX_ID
from vigil.runtime import Launcher

LETTER_COLUMNS = ("id", "received", "source", "reason", "size", "replayed", "detail")
_DETAIL_ON_TERMINAL = 80  # piped, the detail is printed whole


def _rows(letters: list[dict[str, Any]]) -> list[list[str]]:
    cut = sys.stdout.isatty()
    rows = []
    for d in letters:
        detail = d["detail"]
        if cut and len(detail) > _DETAIL_ON_TERMINAL:
            detail = detail[: _DETAIL_ON_TERMINAL - 1] + "…"
        replayed = d["replayed_at"]
        rows.append(
            [
                str(d["id"]),
                f"{d['created_at']:%Y-%m-%d %H:%M:%S}",
                d["source"],
                d["reason"],
                str(d["raw_size"]),
                f"{replayed:%Y-%m-%d %H:%M:%S}" if replayed else "",
                detail,
            ]
        )
    return rows


def _unreplayed(rt: Any, reason: str | None, source: str | None) -> list[int]:
    from sqlalchemy import select

    from vigil.store.models import DeadLetterRow

    q = select(DeadLetterRow.id).where(DeadLetterRow.replayed_at.is_(None)).order_by(DeadLetterRow.id)
    if reason:
        q = q.where(DeadLetterRow.reason == reason)
    if source:
        q = q.where(DeadLetterRow.source == source)
    with rt.sessions() as s:
        return list(s.scalars(q))


def register(app: typer.Typer) -> None:
    group = typer.Typer(no_args_is_help=True, help="Refused input kept as dead letters: list them, re-send them.")
    app.add_typer(group, name="dead-letters")

    @group.command("list")
    def list_letters(
        ctx: typer.Context,
        reason: Annotated[
            str | None, typer.Option(help="Only this reason (schema_invalid, occurred_in_future...).")
        ] = None,
        source: Annotated[str | None, typer.Option(help="Only this source (http, kafka, otlp, replay...).")] = None,
        limit: Annotated[int, typer.Option(min=1, max=500, help="Letters to list, newest first.")] = 50,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON, as GET /v1/dead-letters answers.")] = False,
    ) -> None:
        """Dead letters, newest first: why each was refused, where from, and whether it was re-sent."""
        from vigil.store import reads
        from vigil.tables import print_json, print_table

        rt = Launcher.of(ctx).core()
        with rt.sessions() as s:
            letters = reads.list_dead_letters(s, limit, reason, source)
        if as_json:
            print_json(letters)
            return
        print_table(LETTER_COLUMNS, _rows(letters))

    @group.command("replay")
    def replay_letters(
        ctx: typer.Context,
        ids: Annotated[
            list[int] | None,
            typer.Argument(min=1, max=MAX_ID, help="The letters' ids (vigil dead-letters list)."),
        ] = None,
        replay_all: Annotated[
            bool, typer.Option("--all", help="Every letter not yet re-sent (of --reason and --source if given).")
        ] = False,
        reason: Annotated[str | None, typer.Option(help="With --all: only this reason.")] = None,
        source: Annotated[str | None, typer.Option(help="With --all: only this source.")] = None,
        fmt: Annotated[
            str | None,
            typer.Option(
                "--format",
                help="Read the raw bytes in this format (as ?format=) instead of the one the letter's request "
                "named; native: Vigil's own schema.",
            ),
        ] = None,
        intake: Annotated[
            str | None, typer.Option(help="conversations or outcomes: overrides the intake found.")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print each answer as the API gives it.")] = False,
    ) -> None:
        """Re-send letters through the intake their source used; exits 1 when any is refused (again, or as one
        that cannot go back: kept truncated, an OTLP body, several Kafka messages in one row)."""
        from vigil.http.dead_letters import CONVERSATIONS, OUTCOMES, refusal_text, replay_letter
        from vigil.tables import print_json

        launch = Launcher.of(ctx)
        if bool(ids) == replay_all:
            launch.fail("name the letters' ids, or --all (with --reason or --source to narrow it)")
        if not replay_all and (reason or source):
            launch.fail("--reason and --source choose letters with --all")
        if intake is not None and intake not in (CONVERSATIONS, OUTCOMES):
            launch.fail(f"--intake must be {CONVERSATIONS} or {OUTCOMES}, not {intake!r}")
        rt = launch.runtime({"replay"})
        chosen = _unreplayed(rt, reason, source) if replay_all else list(ids or [])
        answers, refused = [], 0
        for letter_id in chosen:
            status, answer = replay_letter(rt, letter_id, fmt, intake)
            answers.append({"id": letter_id, "status": status, **answer})
            if status != 200:
                refused += 1
            if as_json:
                continue
            if status == 200:
                result = answer["result"]
                launch.console.print(
                    f"{letter_id}: replayed through {answer['intake']} (stored {result.get('stored', 0)}, "
                    f"duplicates {result.get('duplicates', 0)})",
                    highlight=False,
                )
            else:
                launch.console.print(
                    f"{letter_id}: refused ({status}): {refusal_text(answer)}",
                    soft_wrap=True,
                    highlight=False,
                    markup=False,
                )
        if as_json:
            print_json(answers)
        elif not chosen:
            launch.console.print("no dead letter to replay")
        if refused:
            raise typer.Exit(1)
