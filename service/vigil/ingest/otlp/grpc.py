"""OTLP/gRPC receiver (traces and logs) on ``VIGIL_OTLP_GRPC_PORT`` (4317), run by ``vigil serve`` and the api role.

Same keys as HTTP: metadata ``authorization: Bearer KEY`` with the ``ingest`` (or ``admin``) role. A
request that cannot be stored answers ``UNAVAILABLE`` (exporters retry); one with no valid key
``UNAUTHENTICATED`` or ``PERMISSION_DENIED``. One that is not OTLP (not protobuf, a string not UTF-8) or
carries more than ``VIGIL_OTLP_MAX_SPANS_PER_REQUEST`` spans answers ``INVALID_ARGUMENT`` (never retried)
and is kept as a dead letter (source ``otlp``), like a 400 or 413 over HTTP: requests arrive as bytes and
are read by the HTTP receiver's code, not by gRPC's deserializer (whose failure answers ``INTERNAL``).
One over ``VIGIL_OTLP_MAX_BODY_BYTES`` is ``INVALID_ARGUMENT`` too, its first 64 KiB kept (``oversized``);
past twice that gRPC itself refuses the message (``RESOURCE_EXHAUSTED``) before Vigil sees it.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent import futures
from typing import Any, NoReturn

from vigil.errors import ConfigError
from vigil.http.body import PREFIX_BYTES, BodyTooLarge
from vigil.ingest.otlp.ingest import TraceIngest
from vigil.ingest.otlp.otlp import OtlpError
from vigil.runtime import Runtime
from vigil.store.writes import DeadLetter

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES_FLOOR = 4 * 1024 * 1024
TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
_REASONS = {413: "oversized"}  # else malformed_otlp, as over HTTP


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

    def _call(self, context: Any, fn: Any, parse: Any, data: bytes, logs: bool) -> Any:
        """Check the caller, read the request's bytes with ``parse`` (the HTTP receiver's) and store its items."""
        import grpc

        self._principal(context)
        s = self.rt.settings
        if not s.otlp_ingest_enabled:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "OTLP ingest is disabled (VIGIL_OTLP_INGEST_ENABLED=false)")
        if len(data) > s.otlp_max_body_bytes:  # past the limit, short of gRPC's own (see start_server)
            too_big = BodyTooLarge(len(data), s.otlp_max_body_bytes, setting="VIGIL_OTLP_MAX_BODY_BYTES")
            exc = OtlpError(
                f"{too_big}: send smaller batches; the dead letter keeps its first {PREFIX_BYTES} bytes", 413
            )
            self._reject(context, exc, data[:PREFIX_BYTES], logs)
        try:
            items = parse(data, s.otlp_max_spans_per_request)
        except OtlpError as exc:
            self._reject(context, exc, data, logs)
        try:
            return fn(items)
        except Exception:  # the database is unavailable: the exporter retries on UNAVAILABLE
            log.exception("storing %d OTLP items received over gRPC failed", len(items))
            self.rt.metrics.ingest_errors.labels("otlp").inc()
            context.abort(grpc.StatusCode.UNAVAILABLE, "storage unavailable; retry later")

    def _reject(self, context: Any, exc: OtlpError, data: bytes, logs: bool) -> NoReturn:
        """Abort with ``INVALID_ARGUMENT``, keeping the request as a dead letter (``UNAVAILABLE`` if it cannot
        be kept: refusing it for good would lose it). A request with too many spans gets ``INVALID_ARGUMENT``
        too, not ``RESOURCE_EXHAUSTED``, which OTLP exporters (the Python SDK's among them) retry."""
        import grpc

        m = self.rt.metrics
        (m.otlp_log_records if logs else m.otlp_spans).labels("malformed_request").inc()
        service = LOGS_SERVICE if logs else TRACE_SERVICE
        letter = DeadLetter("otlp", _REASONS.get(exc.status, "malformed_otlp"), f"{exc} (OTLP/gRPC {service})", data)
        try:
            self.rt.pipeline.store([], [letter], "otlp")
        except Exception:
            log.exception("keeping a rejected OTLP/gRPC request as a dead letter failed")
            m.ingest_errors.labels("otlp").inc()
            context.abort(grpc.StatusCode.UNAVAILABLE, "storage unavailable; retry later")
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        raise exc  # abort raises; this line is never reached

    def start_server(self) -> int:
        import grpc

        from vigil.ingest.otlp.otlp import logs_response, parse_logs_protobuf, parse_protobuf, protobuf_response

        def export_traces(data: bytes, context: Any) -> bytes:
            res = self._call(context, self.ingest.ingest, parse_protobuf, data, logs=False)
            return protobuf_response(res.refused, res.message())  # the answer OTLP/HTTP gives, as bytes

        def export_logs(data: bytes, context: Any) -> bytes:
            res = self._call(context, self.ingest.ingest_logs, parse_logs_protobuf, data, logs=True)
            return logs_response(res.refused, res.message())

        def export(handler: Any) -> Any:
            # no request deserializer: the handler gets the request's bytes, and answers with bytes
            return grpc.unary_unary_rpc_method_handler(handler)

        s = self.rt.settings
        # gRPC refuses a larger message itself, RESOURCE_EXHAUSTED, which exporters retry and the handler
        # never sees; up to twice the limit the handler refuses it for good and keeps a dead letter
        limit = max(MAX_MESSAGE_BYTES_FLOOR, 2 * s.otlp_max_body_bytes)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="vigil-otlp-grpc"),
            # gRPC binds with SO_REUSEPORT unless told not to: a second process on the same port would share
            # the exporters' connections with this one (each storing in its own database) instead of failing
            options=[("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)],
            compression=None,
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(TRACE_SERVICE, {"Export": export(export_traces)}),
                grpc.method_handlers_generic_handler(LOGS_SERVICE, {"Export": export(export_logs)}),
            )
        )
        try:  # a taken port: older grpcio releases answer 0, newer ones raise RuntimeError
            port = server.add_insecure_port(f"{s.host}:{s.otlp_grpc_port}")
        except RuntimeError:
            port = 0
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
