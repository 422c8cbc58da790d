"""Assembles each role's process: the API server with its in-process workers, and the consumer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from .pipeline import Envelope
from .runtime import Runtime, build_runtime
from .schema import Conversation
from .settings import Settings

log = logging.getLogger(__name__)


class DemoTraffic:
    """Feeds simulated conversations through the pipeline while the server runs (``--demo``)."""

    def __init__(self, runtime: Runtime, rate: float, versions: str, batch: int = 10) -> None:
        from .simulate import Simulator, parse_versions

        self.runtime = runtime
        self.sim = Simulator(parse_versions(versions), seed=None or 0)
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
        feed_outcomes = self.runtime.extras.get("outcome_sink")
        if feed_outcomes:
            feed_outcomes([o for c in convs for o in self.sim.outcomes_for(c)])

    async def _run(self) -> None:
        while True:
            try:
                await run_in_threadpool(self._feed)
            except Exception:  # the demo must keep going whatever one batch does
                log.exception("demo batch failed")
            await asyncio.sleep(self.batch / self.rate)


def consumer_handlers(rt: Runtime) -> dict[str, Callable[[Sequence[Envelope]], Any]]:
    """Topic → handler for ``vigil consume``; later stages add theirs through ``rt.extras``."""
    handlers: dict[str, Callable[[Sequence[Envelope]], Any]] = {
        rt.settings.kafka_conversations_topic: rt.pipeline.process_raw
    }
    handlers.update(rt.extras.get("topic_handlers", {}))
    return handlers


def start_metrics_server(rt: Runtime) -> None:
    from prometheus_client import start_http_server

    if rt.settings.metrics_port:
        start_http_server(
            rt.settings.metrics_port, addr=rt.settings.metrics_host, registry=rt.metrics.registry
        )
        log.info("metrics on %s:%d/metrics", rt.settings.metrics_host, rt.settings.metrics_port)


def build_server_app(
    settings: Settings,
    demo: bool = False,
    demo_rate: float = 20.0,
    demo_versions: str = "v1.4.0:0.04,v1.5.0:0.12",
    runtime: Runtime | None = None,
    workers: bool = True,
) -> FastAPI:
    """``workers=False`` serves the API and UI only (role ``api``); judge worker and detector run elsewhere."""
    from .api.app import create_app
    from .wiring import wire

    rt = runtime or wire(build_runtime(settings), {"serve"} if workers else {"api"})
    background: list[Any] = list(rt.extras.get("background", []))
    if demo:
        background.append(DemoTraffic(rt, demo_rate, demo_versions))
    return create_app(rt, background)
