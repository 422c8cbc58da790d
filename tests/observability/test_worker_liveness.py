"""``/healthz`` on a worker's metrics port answers from its loop's heartbeat, not from the metrics thread.

It used to be the metrics server's own answer (prometheus_client serves the exposition on every path), so a
worker whose loop was wedged (a poll that never returned, an event loop blocked, a loop thread that died)
still answered 200 and Kubernetes never restarted it."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import make_settings
from tests.support.judge_fakes import PASS
from tests.support.services import free_port
from tests.support.waiting import scaled, wait_for
from vigil.app.runtime import build_runtime
from vigil.app.server import start_metrics_server
from vigil.heartbeat import Heartbeat
from vigil.ingest.kafka import ConsumerWorker
from vigil.judge.client import Reply
from vigil.runtime import Runtime

BOUND = 0.3  # VIGIL_LIVENESS_STALL_SECONDS of these tests: seconds, so that a wedge shows quickly


def healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=scaled(5)) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def answers(port: int, status: int, says: str = "") -> tuple[int, str] | None:
    got = healthz(port)
    return got if got[0] == status and says in got[1] else None


@contextmanager
def worker_port(rt: Runtime) -> Iterator[int]:
    server = start_metrics_server(rt)
    assert server is not None
    try:
        yield rt.settings.metrics_port
    finally:
        server.shutdown()
        server.server_close()


def runtime(tmp_path: Path, **settings: Any) -> Runtime:
    s = make_settings(
        f"sqlite:///{tmp_path / 'v.db'}",
        metrics_port=free_port(),
        metrics_host="127.0.0.1",
        **{"liveness_stall_seconds": BOUND, **settings},
    )
    return build_runtime(s, registry=CollectorRegistry())


class Consumer:
    """The consumer interface the worker uses: empty polls, or a poll that blocks while ``wedged`` is set."""

    def __init__(self) -> None:
        self.wedged, self.released, self.fail = threading.Event(), threading.Event(), False

    def poll(self, timeout_ms: int, max_records: int) -> dict[Any, Any]:
        if self.fail:
            raise RuntimeError("the client's state is broken")
        if self.wedged.is_set():
            self.released.wait()  # a poll that does not return, as a hung client's
            self.wedged.clear()
        self.released.wait(0.01)
        return {}

    def assignment(self) -> set[Any]:
        return set()

    def highwater(self, part: Any) -> int:
        return 0

    def end_offsets(self, parts: Any, timeout_ms: int | None = None) -> dict[Any, int]:
        return {}

    def close(self, autocommit: bool = False) -> None:
        pass


def test_a_consumer_whose_poll_blocks_answers_503_until_it_returns(tmp_path) -> None:
    rt = runtime(tmp_path)
    consumer = Consumer()
    worker = ConsumerWorker(rt, consumer, {"t": lambda envs: None})
    loop = threading.Thread(target=worker.run, name="consumer-loop")
    with worker_port(rt) as port:
        loop.start()
        try:
            assert wait_for(lambda: answers(port, 200, "ok"), what="200 while polling")
            consumer.wedged.set()
            status, reason = wait_for(lambda: answers(port, 503, "stalled"), what="503 once a poll blocks")
            assert "VIGIL_LIVENESS_STALL_SECONDS" in reason and len(reason) < 200
            consumer.released.set()
            assert wait_for(lambda: answers(port, 200, "ok"), what="200 again once the poll returned")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=scaled(5)) as r:
                assert 'vigil_worker_heartbeat_age_seconds{loop="consumer"} ' in r.read().decode()  # /metrics as before
        finally:
            worker.stop()
            consumer.released.set()
            loop.join(scaled(30))
        assert not loop.is_alive()
        assert answers(port, 503, "ended"), "a stopped loop is not alive"
    rt.close()


def test_a_consumer_loop_that_died_answers_503(tmp_path) -> None:
    rt = runtime(tmp_path, liveness_stall_seconds=3600)  # the bound plays no part: the loop is gone
    consumer = Consumer()
    consumer.fail = True
    worker = ConsumerWorker(rt, consumer, {"t": lambda envs: None})

    def dies() -> None:
        with pytest.raises(RuntimeError):
            worker.run()

    loop = threading.Thread(target=dies, name="consumer-loop")
    with worker_port(rt) as port:
        loop.start()
        loop.join(scaled(30))
        assert not loop.is_alive()
        status, reason = healthz(port)
        assert status == 503 and "RuntimeError: the client's state is broken" in reason, reason
    rt.close()


def test_a_heartbeat_allows_the_loops_own_wait_between_passes() -> None:
    now = [0.0]
    beat = Heartbeat(clock=lambda: now[0])
    beat.beat(idle=60)  # a detector between passes
    now[0] = 60 + BOUND / 2
    assert beat.problem(BOUND) is None and beat.age() == now[0]
    now[0] = 60 + 2 * BOUND
    assert "stalled" in (beat.problem(BOUND) or "")
    beat.beat()
    assert beat.problem(BOUND) is None


def test_a_loop_whose_thread_ended_under_it_is_not_alive() -> None:
    """An async loop (the judge worker's) left suspended when its event loop's thread ended."""
    beat, kept = Heartbeat(), []

    async def forever() -> None:
        with beat.loop():
            await asyncio.Event().wait()

    def thread_body() -> None:
        loop = asyncio.new_event_loop()
        kept.append((loop, loop.create_task(forever())))  # kept: collected, the coroutine would be closed
        loop.run_until_complete(asyncio.sleep(0))  # the task enters its loop and waits; the thread then ends

    thread = threading.Thread(target=thread_body, name="event-loop")
    thread.start()
    thread.join(scaled(30))
    assert beat.problem(3600) == "the worker loop's thread event-loop is no longer running"
    loop, task = kept[0]
    task.cancel()
    loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    loop.close()


def test_a_detector_pass_that_blocks_answers_503_and_its_wait_between_passes_does_not(tmp_path) -> None:
    from vigil.app.wiring import wire
    from vigil.detector.loop import Detector
    from vigil.store.maintenance import Maintenance

    rt = wire(runtime(tmp_path, detector_interval_seconds=3600), {"detector"})
    detector = rt.get(Detector)
    released, passes = threading.Event(), [0]
    tick = detector.tick

    def gated_tick() -> bool:
        released.wait()  # the first pass does not end until the test says
        passes[0] += 1
        return tick()

    detector.tick = gated_tick  # type: ignore[method-assign]
    stop = threading.Event()
    loop = threading.Thread(target=detector.run, args=(stop,), name="detector-loop")
    with worker_port(rt) as port:
        upkeep = rt.get(Maintenance).thread(stop)  # rollups and retention beside it, as `vigil detector` runs them
        loop.start()
        try:
            wait_for(lambda: answers(port, 503, "the detector loop is stalled"), what="503 while a pass blocks")
            released.set()
            wait_for(lambda: answers(port, 200, "ok"), what="200 once the pass ended")
            # VIGIL_DETECTOR_INTERVAL_SECONDS between passes, far past the bound: not a stall
            wait_for(lambda: passes[0] == 1 and detector.heartbeat.age() > 2 * BOUND, what="a wait past the bound")
            assert answers(port, 200, "ok"), healthz(port)
        finally:
            stop.set()
            released.set()
            loop.join(scaled(60))
            upkeep.join(scaled(60))
    rt.close()


class Hanging:
    """A judge model whose calls take as long as the test says (``release``), far past the bound."""

    def __init__(self) -> None:
        self.release, self.calls = threading.Event(), 0

    async def complete(self, model: str, messages: list[dict[str, str]], **params: Any) -> Reply:
        self.calls += 1
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        return Reply(PASS, 120, 30, 0.001)


def judge_worker(tmp_path: Path, client: Any) -> tuple[Runtime, Any]:
    from tests.judge.test_judge_worker import feed, setup

    rt, stage = setup(f"sqlite:///{tmp_path / 'v.db'}", tmp_path, client)
    rt.settings = rt.settings.model_copy(
        update={"metrics_port": free_port(), "metrics_host": "127.0.0.1", "liveness_stall_seconds": BOUND}
    )
    feed(rt, 1)
    return rt, stage.worker


@contextmanager
def running(worker: Any) -> Iterator[threading.Thread]:
    """The judge worker on an event loop of its own thread, as ``vigil judge-worker`` runs it."""
    done = threading.Event()

    async def main() -> None:
        await worker.start()
        while not done.is_set():
            await asyncio.sleep(0.02)
        await worker.stop(grace=0)

    thread = threading.Thread(target=asyncio.run, args=(main(),), name="judge-loop")
    thread.start()
    try:
        yield thread
    finally:
        done.set()
        thread.join(scaled(60))


def test_a_judge_call_far_past_the_bound_is_not_a_stall(tmp_path) -> None:
    client = Hanging()
    rt, worker = judge_worker(tmp_path, client)
    with worker_port(rt) as port, running(worker):
        try:
            wait_for(lambda: client.calls == 1, what="a judge call in flight")
            began = time.monotonic()
            # a probe past the bound answers 200 while the call is still in flight (one the machine's load
            # delayed past the bound may not: the next one does)
            wait_for(
                lambda: time.monotonic() - began > 3 * BOUND and answers(port, 200, "ok"),
                what="200 with the call outlasting the bound",
            )
            assert worker.in_flight == 1 and client.calls == 1
        finally:
            client.release.set()
        wait_for(lambda: worker.judged == 1, what="the verdict")
    rt.close()


def test_a_judge_worker_whose_event_loop_is_blocked_answers_503_until_it_runs_again(tmp_path) -> None:
    client = Hanging()
    client.release.set()
    rt, worker = judge_worker(tmp_path, client)
    blocked, released = threading.Event(), threading.Event()
    tick = worker.tick

    async def gated_tick(force_housekeeping: bool = False) -> int:
        if blocked.is_set():
            released.wait()  # blocks the whole event loop, as a synchronous call made on it would
            blocked.clear()
        return await tick(force_housekeeping)

    worker.tick = gated_tick
    with worker_port(rt) as port, running(worker):
        try:
            wait_for(lambda: answers(port, 200, "ok"), what="200 while the worker runs")
            blocked.set()
            wait_for(lambda: answers(port, 503, "stalled"), what="503 while the event loop is blocked")
        finally:
            released.set()
        wait_for(lambda: answers(port, 200, "ok"), what="200 once it runs again")
    rt.close()


def raw(port: int, method: str, path: str) -> tuple[str, dict[str, str], bytes]:
    """One request on a connection of its own, the answer read to its close: status line, headers, and every
    byte after the headers (a HEAD's must be none)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=scaled(5)) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    headers.pop("date", None)
    return status, headers, rest


def test_head_on_a_workers_port_answers_as_get_without_the_body(tmp_path) -> None:
    """A HEAD got ``/healthz``'s body after its headers, and a 405 from the exposition on ``/metrics``."""
    rt = runtime(tmp_path)
    beat = rt.heartbeat("consumer")
    with worker_port(rt) as port:
        for path in ("/healthz", "/metrics"):
            status, headers, body = raw(port, "GET", path)
            assert status.endswith("200 OK") and body, (path, status)
            head = raw(port, "HEAD", path)
            assert head[0] == status and head[2] == b"", (path, head)
            assert head[1].keys() == headers.keys() and head[1]["content-type"] == headers["content-type"], head
            assert int(head[1]["content-length"]) > 0, head
        assert raw(port, "HEAD", "/healthz")[1] == raw(port, "GET", "/healthz")[1]
        with beat.loop():  # the loop ends: a HEAD says 503 too
            pass
        status, headers, body = raw(port, "HEAD", "/healthz")
        assert status.endswith("503 Service Unavailable") and body == b"", (status, body)
        assert headers == raw(port, "GET", "/healthz")[1]
    rt.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread dies so
def test_the_detectors_upkeep_thread_that_died_answers_503_naming_it(tmp_path) -> None:
    """`vigil detector` runs rollups and retention in a thread beside its loop: one that died said 200."""
    from vigil.app.wiring import wire
    from vigil.store.maintenance import Maintenance

    rt = wire(runtime(tmp_path, liveness_stall_seconds=3600), {"detector"})  # the bound plays no part
    upkeep = rt.get(Maintenance)

    def broken_tick() -> None:
        raise RuntimeError("the upkeep's state is broken")

    upkeep.tick = broken_tick  # type: ignore[method-assign]
    stop = threading.Event()
    with worker_port(rt) as port:
        thread = upkeep.thread(stop)
        thread.join(scaled(30))
        assert not thread.is_alive()
        status, reason = healthz(port)
        assert status == 503 and reason == "the maintenance loop ended: RuntimeError: the upkeep's state is broken\n"
    rt.close()
