"""``vigil detector`` (the standalone detector worker) and ``vigil alerts``."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from vigil.runtime import Launcher

ALERT_COLUMNS = ["id", "state", "agent", "version", "signal", "rate", "baseline", "started", "ended", "folded into"]


def alert_rows(alerts: list[dict[str, Any]], indent: bool) -> list[list[str]]:
    """``vigil alerts``' rows: every alert, each one folded into another (``folded_into``) right under it,
    its signal indented on a terminal (piped, the signal stays as it is and ``folded into`` says it)."""
    listed = {a["id"] for a in alerts}
    under: dict[int, list[dict[str, Any]]] = {}
    for a in alerts:
        if a.get("folded_into") in listed:
            under.setdefault(a["folded_into"], []).append(a)

    def row(d: dict[str, Any], folded: bool) -> list[str]:
        return [
            str(d["id"]),
            "ACTIVE" if d["active"] else "past",
            d["agent_id"],
            d["agent_version"],
            f"└ {d['signal']}" if folded and indent else d["signal"],
            f"{100 * d['rate_at_start']:.2f}%",
            f"{100 * d['baseline_rate']:.2f}% ({d['baseline']})",
            str(d["started_at"])[:19],
            str(d["ended_at"] or "")[:19],
            "" if d.get("folded_into") is None else str(d["folded_into"]),
        ]

    out = []
    for a in alerts:
        if a.get("folded_into") in listed:
            continue
        out.append(row(a, False))
        out.extend(row(t, True) for t in under.get(a["id"], []))
    return out


def register(app: typer.Typer) -> None:
    @app.command()
    def detector(
        ctx: typer.Context,
        once: Annotated[bool, typer.Option("--once", help="Run one pass and exit.")] = False,
    ) -> None:
        """Run the regression detector (one active instance per database, elected by a lease)."""
        import signal
        import threading

        from vigil.detector.loop import Detector
        from vigil.store.maintenance import Maintenance

        launch = Launcher.of(ctx)
        s = launch.settings()
        rt = launch.runtime({"detector"}, s)
        worker = rt.get(Detector)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        upkeep = rt.find(Maintenance)
        if upkeep is not None and once:  # rollups and retention run beside the detector's passes
            upkeep.tick()
        elif upkeep is not None:
            upkeep.thread(stop)
        if not once:
            launch.serve_metrics(rt)
            launch.console.print(
                f"detector {worker.holder}: every {s.detector_interval_seconds}s, threshold {worker.h:.2f}"
            )
        worker.run(stop, once=once)
        if once:
            launch.console.print(
                "leader: folded new data" if worker.led_last_pass else "another detector holds the lease"
            )

    @app.command()
    def alerts(
        ctx: typer.Context,
        active: Annotated[bool, typer.Option("--active", help="Only active detections.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """List the detector's current and past detections; one that repeats another is listed under it."""

        from vigil.detector.api import list_alerts
        from vigil.detector.twins import fed_by_rules
        from vigil.tables import print_json, print_table

        rt = Launcher.of(ctx).core()
        with rt.sessions() as session:
            found = list_alerts(session, fed_by_rules(rt.rules), True if active else None)
        if as_json:
            print_json(found)
            return
        print_table(ALERT_COLUMNS, alert_rows(found["active"] + found["past"], indent=sys.stdout.isatty()))
