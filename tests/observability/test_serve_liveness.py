"""``vigil serve`` runs its judge worker and detector in-process: its API's ``/healthz`` answers from their
loops' heartbeats, one per loop.

It used to answer 200 whatever those loops did, so a wedged or dead in-process judge worker or detector went
unnoticed; and the two shared one heartbeat, so one loop's beats would have hidden the other's stall."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.support.app import make_settings
from tests.support.judge_fakes import Scripted, judge_dir
from tests.support.waiting import wait_for
from vigil.app.runtime import build_runtime
from vigil.app.server import build_app, build_server_app
from vigil.app.wiring import wire
from vigil.detector.loop import Detector
from vigil.ingest.otlp.finisher import TraceFinisher
from vigil.ingest.otlp.grpc import GrpcReceiver
from vigil.judge.client import ClientOverride
from vigil.judge.stage import JudgeStage
from vigil.runtime import Runtime
from vigil.store.maintenance import Maintenance
from vigil.store.rollups import RollupStateRow

BOUND = 0.3  # VIGIL_LIVENESS_STALL_SECONDS of these tests: seconds, so that a wedge shows quickly


def settings(tmp_path: Path, **overrides: Any) -> Any:
    judges = judge_dir(tmp_path / "judges", **{"sampling": {"rate": 1.0}})
    return make_settings(
        f"sqlite:///{tmp_path / 'v.db'}",
        judges_dir=str(judges),
        judge_mode="live",
        judge_poll_interval_seconds=0.02,
        detector_interval_seconds=3600,  # one pass, then a wait far past the bound: not a stall
        liveness_stall_seconds=BOUND,
        **overrides,
    )


def serve_runtime(tmp_path: Path, **overrides: Any) -> Runtime:
    from prometheus_client import CollectorRegistry

    rt = build_runtime(settings(tmp_path, **overrides), registry=CollectorRegistry())
    rt.provide(ClientOverride(Scripted()))
    return wire(rt, {"serve"})


@contextmanager
def serving(rt: Runtime) -> Iterator[TestClient]:
    """The API as ``vigil serve`` runs it: its in-process loops started with the app, stopped with it."""
    with TestClient(build_app(rt, list(rt.hooks.background))) as client:
        yield client


def health(client: TestClient, status: int) -> dict[str, Any] | None:
    r = client.get("/healthz")
    return r.json() if r.status_code == status else None  # type: ignore[no-any-return]


def test_a_blocked_in_process_judge_loop_answers_503_naming_it_until_it_turns_again(tmp_path) -> None:
    rt = serve_runtime(tmp_path)
    worker = rt.get(JudgeStage).worker
    assert worker is not None
    blocked, released = threading.Event(), threading.Event()
    tick = worker.tick

    async def gated_tick(force_housekeeping: bool = False) -> int:
        while blocked.is_set() and not released.is_set():  # a claim that does not return; the event loop runs on
            await asyncio.sleep(0.01)
        return await tick(force_housekeeping)

    worker.tick = gated_tick  # type: ignore[method-assign]
    with serving(rt) as client:
        try:
            ok = wait_for(lambda: health(client, 200), what="200 while both loops turn")
            assert ok["status"] == "ok" and {"judge", "detector"} <= set(ok["loops"]), ok
            assert all(loop["age_seconds"] >= 0 for loop in ok["loops"].values())
            metrics = client.get("/metrics").text
            assert 'vigil_worker_heartbeat_age_seconds{loop="judge"}' in metrics
            assert 'vigil_worker_heartbeat_age_seconds{loop="detector"}' in metrics
            blocked.set()
            # (a probe the machine's load delayed may catch another loop's pass late: the next one does not)
            body = wait_for(
                lambda: (b := health(client, 503)) and set(b["failing"]) == {"judge"} and b,
                what="503 naming the judge loop alone while it is blocked",
            )
            assert body["status"] == "failing", body
            reason = body["failing"]["judge"]
            assert "the judge loop is stalled" in reason and "VIGIL_LIVENESS_STALL_SECONDS" in reason, reason
            assert body["loops"]["judge"]["problem"] == reason and "problem" not in body["loops"]["detector"]
        finally:
            released.set()
        wait_for(lambda: health(client, 200), what="200 once the judge loop turns again")
    rt.close()


def test_a_loop_that_beats_does_not_hide_another_loops_stall(tmp_path) -> None:
    """The detector's pass blocks while the judge worker keeps turning: one shared heartbeat said 200."""
    rt = serve_runtime(tmp_path)
    detector = rt.get(Detector)
    released = threading.Event()
    tick = detector.tick

    def gated_tick(now: Any = None) -> bool:
        released.wait()  # a pass that does not return (run off the event loop, as serve runs it)
        return tick(now)

    detector.tick = gated_tick  # type: ignore[method-assign]
    with serving(rt) as client:
        try:
            # the judge loop turns meanwhile (a probe the machine's load delayed past the bound may catch a turn
            # of it late: the next one does not)
            body = wait_for(
                lambda: (b := health(client, 503)) and set(b["failing"]) == {"detector"} and b,
                what="503 naming the detector alone while its pass blocks",
            )
            assert "the detector loop is stalled" in body["failing"]["detector"], body
            assert "problem" not in body["loops"]["judge"], body
        finally:
            released.set()
        # the pass ends; the wait for the next one (an hour) is not a stall
        ok = wait_for(lambda: health(client, 200), what="200 once the pass ended")
        assert ok["loops"]["detector"]["age_seconds"] >= 0
    rt.close()


def test_an_api_without_workers_runs_no_loops_and_answers_200(tmp_path) -> None:
    """``vigil serve --no-workers``: judges are configured, but the judge worker and detector run elsewhere."""
    app = build_server_app(settings(tmp_path), workers=False)
    rt: Runtime = app.state.runtime
    assert rt.heartbeats == {}
    with TestClient(app) as client:
        r = client.get("/healthz")
        assert r.status_code == 200 and r.json() == {"status": "ok", "loops": {}}, r.text
    rt.close()


def test_a_trace_finisher_sweep_that_hangs_or_a_finisher_that_stopped_answers_503_naming_it(tmp_path) -> None:
    """The idle-trace finisher ran in a thread nobody watched: a hung sweep or a dead thread still said 200."""
    rt = serve_runtime(tmp_path, otlp_finish_interval_seconds=0.05)
    finisher = rt.get(TraceFinisher)
    hang, released, sweeps = threading.Event(), threading.Event(), [0]
    run_once = finisher.run_once

    def gated_run_once() -> list[str]:
        if hang.is_set():
            released.wait()  # a sweep that does not return (a claim stuck on a lock)
        sweeps[0] += 1
        return run_once()

    finisher.run_once = gated_run_once  # type: ignore[method-assign]
    with serving(rt) as client:
        try:
            ok = wait_for(lambda: sweeps[0] >= 2 and health(client, 200), what="200 while the finisher sweeps")
            assert "trace_finisher" in ok["loops"], ok
            assert 'vigil_worker_heartbeat_age_seconds{loop="trace_finisher"}' in client.get("/metrics").text
            hang.set()
            body = wait_for(
                lambda: (b := health(client, 503)) and "trace_finisher" in b["failing"] and b,
                what="503 naming the finisher while a sweep hangs",
            )
            assert "the trace_finisher loop is stalled" in body["failing"]["trace_finisher"], body
            hang.clear()
        finally:
            released.set()
        wait_for(lambda: health(client, 200), what="200 once the sweep returned")
        finisher.stop_thread()  # the thread ends under a running server
        body = wait_for(lambda: health(client, 503), what="503 once the finisher's thread ended")
        assert set(body["failing"]) == {"trace_finisher"}, body
        assert body["failing"]["trace_finisher"] == "the trace_finisher loop has ended", body
    rt.close()


def loop_metrics(rt: Runtime, loop: str) -> dict[str, float]:
    """The loop's age, bound and up, as its process exports them."""
    names = {"age": "heartbeat_age_seconds", "bound": "heartbeat_bound_seconds", "up": "loop_up"}
    values = {k: rt.metrics.registry.get_sample_value(f"vigil_worker_{n}", {"loop": loop}) for k, n in names.items()}
    assert None not in values.values(), values
    return values  # type: ignore[return-value]


def test_a_loops_metrics_say_what_healthz_says_of_it_stalled_or_ended(tmp_path) -> None:
    """Only ``/healthz`` knew a loop had failed: its age grew past a bound Prometheus never saw (this loop's is
    the stall bound plus its sweep interval), and a loop that had ended showed an age still within it."""
    interval = 0.05
    rt = serve_runtime(tmp_path, otlp_finish_interval_seconds=interval)
    finisher = rt.get(TraceFinisher)
    hang, released, sweeps = threading.Event(), threading.Event(), [0]
    run_once = finisher.run_once

    def gated_run_once() -> list[str]:
        if hang.is_set():
            released.wait()  # a sweep that does not return
        sweeps[0] += 1
        return run_once()

    def failing(client: TestClient) -> dict[str, str]:
        r = client.get("/healthz").json()
        return r.get("failing", {})  # type: ignore[no-any-return]

    finisher.run_once = gated_run_once  # type: ignore[method-assign]
    with serving(rt) as client:
        try:
            # (a beat the machine's load delayed past this short bound may fail a probe: the next one passes)
            ok = wait_for(
                lambda: sweeps[0] >= 2 and (m := loop_metrics(rt, "trace_finisher"))["up"] == 1.0 and m,
                what="up while the finisher sweeps",
            )
            assert ok["bound"] == BOUND + interval, ok
            exposed = client.get("/metrics").text
            assert 'vigil_worker_heartbeat_bound_seconds{loop="trace_finisher"}' in exposed
            assert 'vigil_worker_loop_up{loop="trace_finisher"}' in exposed
            hang.set()
            wait_for(lambda: "trace_finisher" in failing(client), what="503 naming the finisher while a sweep hangs")
            stalled = loop_metrics(rt, "trace_finisher")
            assert stalled["up"] == 0.0 and stalled["age"] > stalled["bound"] == BOUND + interval, stalled
            hang.clear()
        finally:
            released.set()
        wait_for(lambda: loop_metrics(rt, "trace_finisher")["up"] == 1.0, what="up once the sweep returned")
        finisher.stop_thread()
        wait_for(lambda: "trace_finisher" in failing(client), what="503 once the finisher's thread ended")
        stopped = loop_metrics(rt, "trace_finisher")
        assert failing(client)["trace_finisher"] == "the trace_finisher loop has ended"
        # stopped as asked, as on shutdown: the metrics port still answers then, and must not page
        assert stopped["up"] == 1.0, stopped
    rt.close()


def test_a_loop_stopped_as_asked_is_not_down_while_one_that_raised_is_at_once(tmp_path) -> None:
    """A worker's metrics port answers until the process exits, after its loops have returned on SIGTERM: they
    were counted down (vigil_worker_loop_up 0), so a rolling deploy scraped in that window paged
    VigilLoopStalled. A loop that raised is down at once, however young its age."""
    rt = serve_runtime(tmp_path)
    stopped, crashed = rt.heartbeat("stopped"), rt.heartbeat("crashed")

    def run_stopped() -> None:
        with stopped.loop():
            stopped.beat()

    def run_crashed() -> None:
        try:
            with crashed.loop():
                raise RuntimeError("boom")
        except RuntimeError:
            pass

    for target in (run_stopped, run_crashed):
        t = threading.Thread(target=target)
        t.start()
        t.join()
    assert stopped.problem(BOUND) == "the stopped loop has ended"  # /healthz still says so
    assert loop_metrics(rt, "stopped")["up"] == 1.0
    down = loop_metrics(rt, "crashed")
    assert down["up"] == 0.0, down
    assert crashed.problem(BOUND) == "the crashed loop ended: RuntimeError: boom"
    rt.close()


UPKEEP = 0.2  # VIGIL_ROLLUP_INTERVAL_SECONDS of the upkeep tests: its loop's bound is this plus BOUND


def test_an_upkeep_pass_that_hangs_or_an_upkeep_loop_that_died_answers_503_naming_it(tmp_path) -> None:
    """The rollup and retention loop ran unwatched: a pass stuck in a statement, or a loop that had died (its
    task ended by an error), still said 200 while the rollups fell behind and old rows piled up."""
    rt = serve_runtime(tmp_path, rollup_interval_seconds=UPKEEP)
    upkeep = rt.get(Maintenance)
    hang, released, broken, passes = threading.Event(), threading.Event(), threading.Event(), [0]
    tick = upkeep.tick

    def gated_tick() -> None:
        if hang.is_set():
            released.wait()  # a pass that does not return (a statement waiting on a lock nobody releases)
        if broken.is_set():
            raise RuntimeError("the upkeep loop's state is broken")
        tick()
        passes[0] += 1

    upkeep.tick = gated_tick  # type: ignore[method-assign]
    with serving(rt) as client:
        try:
            ok = wait_for(lambda: passes[0] >= 2 and health(client, 200), what="200 while upkeep passes run")
            assert "maintenance" in ok["loops"], ok
            assert 'vigil_worker_heartbeat_age_seconds{loop="maintenance"}' in client.get("/metrics").text
            hang.set()
            body = wait_for(
                lambda: (b := health(client, 503)) and "maintenance" in b["failing"] and b,
                what="503 naming the upkeep loop while its pass hangs",
            )
            reason = body["failing"]["maintenance"]
            assert "the maintenance loop is stalled" in reason and "VIGIL_LIVENESS_STALL_SECONDS" in reason, body
            hang.clear()
        finally:
            released.set()
        wait_for(lambda: health(client, 200), what="200 once the pass returned")
        broken.set()  # the next pass raises out of the loop: its task ends
        body = wait_for(
            lambda: (b := health(client, 503)) and "maintenance" in b["failing"] and b,
            what="503 naming the upkeep loop once it died",
        )
        assert body["failing"]["maintenance"] == (
            "the maintenance loop ended: RuntimeError: the upkeep loop's state is broken"
        ), body
    rt.close()


def test_a_long_upkeep_pass_that_moves_on_is_not_a_stall(tmp_path) -> None:
    """A rebuild of the rollups (the first pass on a store) whose statements are slow runs for more than twice
    the loop's bound; each statement it begins beats, so no probe meanwhile names the upkeep loop (a beat per
    pass alone did)."""
    from sqlalchemy import event

    interval = 0.7  # the loop's bound: this plus BOUND, a second
    rt = serve_runtime(tmp_path, rollup_interval_seconds=interval)
    upkeep = rt.get(Maintenance)
    slowed, passes, failing = [0], [0], []

    def slow_statement(_state: Any) -> None:  # after the beat: the statement takes this long to run
        if slowed[0] < 12:
            slowed[0] += 1
            threading.Event().wait((interval + BOUND) / 5)  # a fifth of the bound each; twelve of them, 2.4 bounds

    event.listen(upkeep.sessions, "do_orm_execute", slow_statement)
    tick = upkeep.tick

    def counted_tick() -> None:
        tick()
        passes[0] += 1

    upkeep.tick = counted_tick  # type: ignore[method-assign]
    with serving(rt) as client:

        def probe() -> bool:
            r = client.get("/healthz").json()
            if "maintenance" in r.get("failing", {}):
                failing.append(r["failing"]["maintenance"])
            return passes[0] >= 1 and slowed[0] >= 12

        wait_for(probe, interval=0.02, what="the first pass, twelve slow statements long, to end")
        assert not failing, failing
        with rt.sessions() as session:  # the pass was the rebuild, and it completed
            assert session.get(RollupStateRow, "hourly").watermark is not None
    rt.close()


PROBE = 0.1  # the gRPC receiver's probe_seconds in these tests: its loop's bound is this plus BOUND


def grpc_runtime(tmp_path: Path) -> tuple[Runtime, GrpcReceiver]:
    """Serve with the OTLP/gRPC receiver on a free port, probed every PROBE seconds."""
    from tests.support.services import free_port

    rt = serve_runtime(tmp_path, otlp_grpc_port=free_port(), host="127.0.0.1")
    receiver = rt.get(GrpcReceiver)
    receiver.probe_seconds = PROBE
    return rt, receiver


def test_a_grpc_server_that_terminated_under_serve_answers_503_naming_it(tmp_path) -> None:
    """The OTLP/gRPC receiver's server could stop serving while /healthz said 200: exporters got refused
    connections and nothing restarted the process."""
    import time

    rt, receiver = grpc_runtime(tmp_path)
    with serving(rt) as client:
        wait_for(lambda: "otlp_grpc" in client.get("/healthz").json()["loops"], what="the receiver's loop listed")
        # its own probes reach it (the server's core answers a method no service has) for many of its bounds
        started, failing = time.monotonic(), list[str]()

        def watched() -> bool:
            if reason := client.get("/healthz").json().get("failing", {}).get("otlp_grpc"):
                failing.append(reason)
            return time.monotonic() - started > 5 * (PROBE + BOUND)

        wait_for(watched, interval=0.02, what="five of the receiver's bounds")
        assert not failing, failing
        assert 'vigil_worker_heartbeat_age_seconds{loop="otlp_grpc"}' in client.get("/metrics").text
        receiver.server.stop(0)  # the server terminates, not by the receiver's stop
        body = wait_for(
            lambda: (b := health(client, 503)) and "otlp_grpc" in b["failing"] and b,
            what="503 naming the gRPC receiver once its server terminated",
        )
        target = f"127.0.0.1:{receiver.port}"
        expected = f"the otlp_grpc loop ended: ServerStopped: the OTLP/gRPC server on {target} terminated"
        assert body["failing"]["otlp_grpc"] == expected, body
    rt.close()


def test_a_grpc_server_that_no_longer_answers_its_probe_answers_503_until_it_does(tmp_path) -> None:
    rt, receiver = grpc_runtime(tmp_path)
    wedged, probes = threading.Event(), [0]
    answers = receiver._answers  # noqa: SLF001

    def probed(probe: Any) -> bool:
        probes[0] += 1
        return not wedged.is_set() and answers(probe)  # unanswered while wedged, as a wedged server's

    receiver._answers = probed  # type: ignore[method-assign]  # noqa: SLF001
    with serving(rt) as client:
        wait_for(lambda: probes[0] >= 2 and health(client, 200), what="200 while the server answers")
        wedged.set()
        body = wait_for(
            lambda: (b := health(client, 503)) and "otlp_grpc" in b["failing"] and b,
            what="503 naming the gRPC receiver while it does not answer",
        )
        assert "the otlp_grpc loop is stalled" in body["failing"]["otlp_grpc"], body
        wedged.clear()
        wait_for(
            lambda: "otlp_grpc" not in client.get("/healthz").json().get("failing", {}),
            what="the receiver alive again once it answers",
        )
    rt.close()


def test_a_grpc_receiver_that_could_not_bind_is_not_a_failing_loop(tmp_path) -> None:
    """A taken port: serve keeps serving HTTP ingest, so /healthz must not restart it for that."""
    import socket

    from tests.support.services import free_port

    port = free_port()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        rt = serve_runtime(tmp_path, otlp_grpc_port=port, host="127.0.0.1")
        with serving(rt) as client:
            assert rt.get(GrpcReceiver).server is None
            assert "otlp_grpc" not in client.get("/healthz").json()["loops"]
    rt.close()
