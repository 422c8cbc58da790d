"""OTLP/gRPC receiver (traces and logs) on ``VIGIL_OTLP_GRPC_PORT`` (4317), run by ``vigil serve`` and the api role.

Same keys as HTTP: metadata ``authorization: Bearer KEY`` with the ``ingest`` (or ``admin``) role. A
request that cannot be stored answers ``UNAVAILABLE`` (exporters retry); one with no valid key
``UNAUTHENTICATED`` or ``PERMISSION_DENIED``.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent import futures
from typing import Any

from vigil.errors import ConfigError
from vigil.ingest.otlp.ingest import TraceIngest
from vigil.runtime import Runtime

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES_FLOOR = 4 * 1024 * 1024


class GrpcReceiver:
    def __init__(self, rt: Runtime, ingest: TraceIngest, keyring: Any = None) -> None:
        self.rt = rt
        self.ingest = ingest
        self.keyring = keyring
        self.server: Any = None
        self.port = 0

    def _principal(self, context: Any) -> None:
        import grpc

        header = dict(context.invocation_metadata()).get("authorization", "")
        principal = self.keyring.lookup(header[7:].strip()) if header[:7].lower() == "bearer " else None
        if principal is None:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or unknown API key")
            return  # abort raises; this line is never reached
        if not principal.can("ingest"):
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"role {principal.role!r} may not do this; needs ingest")

    def _call(self, context: Any, fn: Any, items: list[dict[str, Any]]) -> Any:
        import grpc

        self._principal(context)
        if not self.rt.settings.otlp_ingest_enabled:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "OTLP ingest is disabled (VIGIL_OTLP_INGEST_ENABLED=false)")
        try:
            return fn(items)
        except Exception:  # the database is unavailable: the exporter retries on UNAVAILABLE
            log.exception("storing %d OTLP items received over gRPC failed", len(items))
            self.rt.metrics.ingest_errors.labels("otlp").inc()
            context.abort(grpc.StatusCode.UNAVAILABLE, "storage unavailable; retry later")

    def start_server(self) -> int:
        import grpc
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        from vigil.ingest.otlp.otlp import records_of_request, spans_of_request

        receiver = self

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the service's method name)
                res = receiver._call(context, receiver.ingest.ingest, spans_of_request(request))
                resp = trace_service_pb2.ExportTraceServiceResponse()
                if res.rejected or res.problems:
                    resp.partial_success.rejected_spans = res.rejected
                    resp.partial_success.error_message = res.message()
                return resp

        class Logs(logs_service_pb2_grpc.LogsServiceServicer):  # type: ignore[misc]
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
                res = receiver._call(context, receiver.ingest.ingest_logs, records_of_request(request))
                resp = logs_service_pb2.ExportLogsServiceResponse()
                if res.rejected or res.problems:
                    resp.partial_success.rejected_log_records = res.rejected
                    resp.partial_success.error_message = res.message()
                return resp

        s = self.rt.settings
        limit = max(MAX_MESSAGE_BYTES_FLOOR, s.otlp_max_body_bytes)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="vigil-otlp-grpc"),
            options=[("grpc.max_receive_message_length", limit)],
            compression=None,
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
        port = server.add_insecure_port(f"{s.host}:{s.otlp_grpc_port}")
        if port == 0:
            raise ConfigError(f"cannot listen for OTLP/gRPC on {s.host}:{s.otlp_grpc_port} (VIGIL_OTLP_GRPC_PORT)")
        server.start()
        self.server, self.port = server, port
        log.info("OTLP/gRPC on %s:%d", s.host, port)
        return port

    def stop_server(self, grace: float = 5.0) -> None:
        if self.server is not None:
            self.server.stop(grace).wait(grace + 1)
            self.server = None

    # the ``background`` protocol of ``vigil serve``
    async def start(self) -> None:
        from vigil.http.auth import KeyRing

        # the API's own keys (with no VIGIL_API_KEYS, the admin key it generated and logged)
        self.keyring = self.keyring or self.rt.find(KeyRing) or KeyRing.from_settings(self.rt.settings)
        try:
            await asyncio.to_thread(self.start_server)
        except ConfigError:  # the port is taken: HTTP ingest (/v1/traces) still works, so keep serving it
            log.error("OTLP/gRPC receiver not started", exc_info=True)

    async def stop(self) -> None:
        await asyncio.to_thread(self.stop_server)
