"""``vigil detector`` (the standalone detector worker) and ``vigil alerts``."""

from __future__ import annotations

from typing import Annotated

import typer

from vigil.runtime import Launcher


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
        """List the detector's current and past detections."""

        from vigil.detector.api import list_alerts
        from vigil.tables import print_json, print_table

        rt = Launcher.of(ctx).core()
        with rt.sessions() as session:
            found = list_alerts(session, True if active else None)
        if as_json:
            print_json(found)
            return
        rows = [
            [
                "ACTIVE" if d["active"] else "past",
                d["agent_id"],
                d["agent_version"],
                d["signal"],
                f"{100 * d['rate_at_start']:.2f}%",
                f"{100 * d['baseline_rate']:.2f}% ({d['baseline']})",
                str(d["started_at"])[:19],
                str(d["ended_at"] or "")[:19],
            ]
            for d in found["active"] + found["past"]
        ]
        print_table(["state", "agent", "version", "signal", "rate", "baseline", "started", "ended"], rows)
