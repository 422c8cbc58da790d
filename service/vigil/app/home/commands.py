"""``vigil status``: what the console's home page says, on the command line."""

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
