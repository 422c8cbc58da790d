"""OTLP/gRPC receiver (traces and logs) on ``VIGIL_OTLP_GRPC_PORT`` (4317), run by ``vigil serve`` and the api role.

Same keys as HTTP: metadata ``authorization: Bearer KEY`` with the ``ingest`` (or ``admin``) role. A
request that cannot be stored answers ``UNAVAILABLE`` (exporters retry); one with no valid key
``UNAUTHENTICATED`` or ``PERMISSION_DENIED``. One that is not OTLP (not protobuf, a string not UTF-8) or
carries more than ``VIGIL_OTLP_MAX_SPANS_PER_REQUEST`` spans answers ``INVALID_ARGUMENT`` (never retried)
and is kept as a dead letter (source ``otlp``), like a 400 or 413 over HTTP: requests arrive as bytes and
are read by the HTTP receiver's code, not by gRPC's deserializer (whose failure answers ``INTERNAL``).
One over ``VIGIL_OTLP_MAX_BODY_BYTES`` is ``INVALID_ARGUMENT`` too, its first 64 KiB kept (``oversized``);
past twice that gRPC itself refuses the message (``RESOURCE_EXHAUSTED``) before Vigil sees it.

Once serving, a thread watches the server under the ``otlp_grpc`` heartbeat (``/healthz``): every
``probe_seconds`` it calls a method no service has over loopback, which gRPC's own serving thread answers
``UNIMPLEMENTED`` without the handlers' pool (a pool busy storing while the database is away is no stall), and
beats on the answer. A server that no longer answers stalls it; one that terminated other than by
:meth:`GrpcReceiver.stop_server` ends it. ``/healthz`` itself only reads the heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent import futures
from typing import Any, NoReturn

from vigil.errors import ConfigError, VigilError
from vigil.heartbeat import Heartbeat
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
PROBE_SECONDS = 10.0  # between two liveness probes of the server; its heartbeat allows this beyond the bound
PROBE_TIMEOUT = 5.0  # a loopback call the server's own thread answers: far longer only when it is wedged
PROBE_METHOD = "/vigil.liveness.v1.Probe/Probe"  # no service has it: answered UNIMPLEMENTED, no handler runs


class ServerStopped(VigilError):
    """The gRPC server terminated while Vigil still meant it to serve."""


class GrpcReceiver:
    def __init__(self, rt: Runtime, ingest: TraceIngest, keyring: Any = None) -> None:
        self.rt = rt
        self.ingest = ingest
        self.keyring = keyring
        self.server: Any = None
        self.port = 0
        self.probe_seconds = PROBE_SECONDS
        # made once the server serves: a receiver that could not bind (HTTP ingest still serves) is no failure
        self.heartbeat: Heartbeat | None = None
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

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
        self._stopping.clear()
        self.heartbeat = self.rt.heartbeat("otlp_grpc")
        self._watcher = threading.Thread(
            target=self._watch, args=(server, self.heartbeat), name="vigil-otlp-grpc-watch", daemon=True
        )
        self._watcher.start()
        return port

    def _target(self) -> str:
        """Where this process reaches its own server: loopback for a wildcard bind."""
        host = self.rt.settings.host.strip("[]")
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def _watch(self, server: Any, heartbeat: Heartbeat) -> None:
        """Beat while the server answers a probe; end (a failing ``/healthz``) once it terminated unasked."""
        import grpc

        target = self._target()
        try:
            with heartbeat.loop():
                heartbeat.beat(idle=self.probe_seconds)
                # no proxy: an HTTP(S)_PROXY in the environment must not carry a call to this very process
                with grpc.insecure_channel(target, options=[("grpc.enable_http_proxy", 0)]) as channel:
                    probe = channel.unary_unary(PROBE_METHOD)
                    while server.wait_for_termination(self.probe_seconds):  # True: still serving
                        if self._answers(probe):
                            heartbeat.beat(idle=self.probe_seconds)
                if not self._stopping.is_set():
                    raise ServerStopped(f"the OTLP/gRPC server on {target} terminated")
        except ServerStopped as exc:  # the heartbeat keeps the reason: /healthz fails until a restart
            log.error("%s; OTLP/gRPC ingest is down until the process restarts", exc)

    def _answers(self, probe: Any) -> bool:
        import grpc

        try:
            probe(b"", timeout=min(PROBE_TIMEOUT, self.rt.settings.liveness_stall_seconds))
        except grpc.RpcError as exc:
            return exc.code() is grpc.StatusCode.UNIMPLEMENTED  # type: ignore[no-any-return]
        return True

    def stop_server(self, grace: float = 5.0) -> None:
        self._stopping.set()
        if self.server is not None:
            self.server.stop(grace).wait(grace + 1)
            self.server = None
        if self._watcher is not None:
            self._watcher.join(grace + 1)
            self._watcher = None

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
