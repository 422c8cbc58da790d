"""Wires ingest: ``POST /v1/conversations``, OTLP ``/v1/traces`` and ``/v1/logs`` (HTTP, and gRPC in serve and
api), the idle-trace finisher (serve and consume) and the trace view of a conversation."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from vigil.ingest import http
from vigil.ingest.otlp.api import router as otlp_router
from vigil.ingest.otlp.assemble import ordered_tree
from vigil.ingest.otlp.erase import erase_traces
from vigil.ingest.otlp.finisher import TraceFinisher
from vigil.ingest.otlp.grpc import GrpcReceiver
from vigil.ingest.otlp.ingest import TraceIngest, TraceMarker
from vigil.runtime import Runtime


def wire(rt: Runtime) -> None:
    rt.hooks.add_router(http.router)
    rt.hooks.replayers["conversations"] = lambda raw, params: http.replay(rt, raw, params)
    rt.hooks.add_router(otlp_router)
    if erase_traces not in rt.hooks.erasers:
        rt.hooks.erasers.append(erase_traces)
    ingest = TraceIngest(rt)
    rt.provide(ingest)
    rt.hooks.downstream.append(TraceMarker(rt.metrics, ingest.note_stale, rt.settings.otlp_max_spans_per_conversation))

    def trace_view(session: Session, conv: dict[str, Any]) -> None:
        """``conversation_enrichers``: a traced conversation's session, user and the others sharing them."""
        meta = (conv.get("conversation") or {}).get("metadata") or {}
        if meta.get("source") != "otlp":
            return
        spans = (meta.get("trace") or {}).get("spans") or []
        conv["trace"] = {"spans": ordered_tree(spans), **(ingest.related(session, conv["conversation_id"]) or {})}

    rt.hooks.conversation_enrichers.append(trace_view)
    s = rt.settings
    if rt.has_role("serve", "consume"):
        finisher = TraceFinisher(ingest, s.otlp_finish_interval_seconds, rt.heartbeat("trace_finisher"))
        rt.provide(finisher)
        if rt.has_role("serve"):
            rt.hooks.background.append(finisher)
    if rt.has_role("serve", "api") and s.otlp_grpc_port and s.otlp_ingest_enabled:
        receiver = GrpcReceiver(rt, ingest)
        rt.provide(receiver)
        rt.hooks.background.append(receiver)
