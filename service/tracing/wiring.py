"""Wires the tracing stage: Vigil's own tracing (if asked for) and the OTLP trace ingest endpoint."""

from __future__ import annotations

from ..runtime import Runtime
from . import spans
from .api import router
from .ingest import TraceIngest


def wire(rt: Runtime) -> None:
    spans.configure(rt.settings)
    rt.extras["trace_ingest"] = TraceIngest(rt)
    if router not in rt.extras["routers"]:
        rt.extras["routers"].append(router)
