"""Wires ingest: ``POST /v1/conversations`` and OTLP ``/v1/traces`` (``vigil consume`` reads the topics)."""

from __future__ import annotations

from vigil.ingest import http
from vigil.ingest.otlp.api import router as otlp_router
from vigil.ingest.otlp.ingest import TraceIngest
from vigil.runtime import Runtime


def wire(rt: Runtime) -> None:
    rt.hooks.add_router(http.router)
    rt.hooks.add_router(otlp_router)
    rt.provide(TraceIngest(rt))
