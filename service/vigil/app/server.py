"""Assembles each role's process: the API server with its in-process workers, and the consumer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from vigil.app.runtime import build_runtime
from vigil.runtime import Background, Runtime
from vigil.schema import Conversation
from vigil.settings import Settings

log = logging.getLogger(__name__)


class DemoTraffic:
    """Feeds simulated conversations through the pipeline while the server runs (``--demo``)."""

    def __init__(self, runtime: Runtime, rate: float, versions: str, batch: int = 10) -> None:
        import secrets

        from vigil.ingest.simulate import Simulator, parse_versions

        self.runtime = runtime
        # a fresh seed each start: seed 0 every time made a restarted demo on the same database send the
        # conversations it had stored before, all duplicates (40,000 of them: 40 minutes of nothing new)
        self.sim = Simulator(parse_versions(versions), seed=secrets.randbelow(2**31))
        self.rate = rate
        self.batch = batch
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()

    def _feed(self) -> None:
        convs = list(self.sim.stream(self.batch))
        self.runtime.pipeline.process([Conversation.model_validate(c) for c in convs], "demo")
        feed_outcomes = self.runtime.hooks.outcome_sink
        if feed_outcomes:
            feed_outcomes([o for c in convs for o in self.sim.outcomes_for(c)])

    async def _run(self) -> None:
        while True:
            try:
                await run_in_threadpool(self._feed)
            except Exception:  # the demo must keep going whatever one batch does
                log.exception("demo batch failed")
            await asyncio.sleep(self.batch / self.rate)


def worker_http_app(rt: Runtime) -> Callable[..., Iterable[bytes]]:
    """A worker's metrics port: ``/healthz`` answers from its loops' heartbeats (200 ``ok``, or 503 with each
    failing loop's reason on a line of its own), every other path is Prometheus' exposition as before; HEAD
    answers as GET does, without the body. Served
    from a thread of its own, the port answers while a loop is wedged: the heartbeat is what tells the liveness
    probe so."""
    from prometheus_client import make_wsgi_app

    from vigil.heartbeat import check

    metrics = make_wsgi_app(rt.metrics.registry)
    beats, stall = rt.heartbeats, rt.settings.liveness_stall_seconds

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/healthz":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        problems, _ = check(beats, stall)
        body = "\n".join([*problems.values(), ""] if problems else ["ok", ""]).encode()
        headers = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
        start_response("503 Service Unavailable" if problems else "200 OK", headers)
        return [body]

    return head_as_get(app)


def head_as_get(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """A HEAD request answered as its GET, status and headers (``Content-Length`` included) without the body.
    wsgiref sends whatever the app returns: ``/healthz`` wrote its body after a HEAD's headers (a keep-alive
    client then read it as the next answer), and prometheus_client's exposition answered HEAD with a 405."""

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") != "HEAD":
            return app(environ, start_response)
        answer: list[Any] = []
        body = app({**environ, "REQUEST_METHOD": "GET"}, lambda *args: answer.extend(args))
        try:
            size = sum(len(chunk) for chunk in body)  # wsgiref counts a GET's body; a HEAD's is empty
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
        status, headers, *rest = answer
        if not any(name.lower() == "content-length" for name, _ in headers):
            headers = [*headers, ("Content-Length", str(size))]
        start_response(status, headers, *rest)
        return []

    return wrapped


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a probe every few seconds is not news
        pass


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def start_metrics_server(rt: Runtime) -> WSGIServer | None:
    """Serve the worker's port (:func:`worker_http_app`) from a daemon thread; None with the port 0 (off)."""
    import socket
    import threading

    from vigil.errors import ConfigError

    s = rt.settings
    if not s.metrics_port:
        return None
    try:
        family, _, _, _, address = socket.getaddrinfo(
            s.metrics_host, s.metrics_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        server_class = type("WorkerServer", (_ThreadingServer,), {"address_family": family})
        httpd: WSGIServer = make_server(
            str(address[0]), s.metrics_port, worker_http_app(rt), server_class, _QuietHandler
        )
    except OSError as exc:  # another worker on this host has it: the default is the same for every role
        raise ConfigError(
            f"cannot serve /metrics on {s.metrics_host}:{s.metrics_port} ({exc.strerror or exc}): give each "
            "worker on one host its own VIGIL_METRICS_PORT, or 0 for none"
        ) from exc
    threading.Thread(target=httpd.serve_forever, name="vigil-metrics", daemon=True).start()
    log.info("metrics on %s:%d/metrics, liveness on /healthz", s.metrics_host, s.metrics_port)
    return httpd


def build_server_app(
    settings: Settings,
    demo: bool = False,
    demo_rate: float = 20.0,
    demo_versions: str = "v1.4.0:0.04,v1.5.0:0.12",
    runtime: Runtime | None = None,
    workers: bool = True,
) -> FastAPI:
    """``workers=False`` serves the API and UI only (role ``api``); judge worker and detector run elsewhere."""
    from vigil.app.wiring import wire

    rt = runtime or wire(build_runtime(settings, roles={"serve"} if workers else {"api"}))
    background: list[Background] = list(rt.hooks.background)
    if demo:
        background.append(DemoTraffic(rt, demo_rate, demo_versions))
    return build_app(rt, background)


def build_app(rt: Runtime, background: list[Background] | None = None) -> FastAPI:
    """The API with every wired stage's routers, and the web UI (its sessions, log-in and static files)."""
    from vigil.http.app import create_app
    from vigil.ui import errors, pages, session

    app = create_app(rt, background)
    session.install(app, rt.settings, announce=rt.has_role("serve", "api"), db=rt.sessions, now=rt.now)
    errors.install(app)
    app.include_router(pages.router)
    return app
