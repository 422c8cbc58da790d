"""The FastAPI application: API, ``/metrics``, health, OpenAPI, and (later stages) the reviewer UI."""

from __future__ import annotations

import gzip
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client.exposition import choose_encoder
from sqlalchemy import text
from sqlalchemy.exc import DataError, InterfaceError, OperationalError
from starlette.requests import ClientDisconnect

from vigil import __version__
from vigil.errors import without_frames
from vigil.heartbeat import check
from vigil.http import conversations, dead_letters, erasure
from vigil.http.auth import KeyRing
from vigil.http.body import IngestBusy, LimitBodies
from vigil.http.guard import NUL_TEXT_DETAIL, RefuseNul
from vigil.http.head import HeadAsGet
from vigil.http.unencodable import surrogate_response, validation_response
from vigil.runtime import Runtime
from vigil.schema import Conversation
from vigil.store.db import StoreUnavailable, db_detail

log = logging.getLogger(__name__)


def create_app(runtime: Runtime, background: list | None = None) -> FastAPI:  # type: ignore[type-arg]
    """``background``: objects with async ``start()``/``stop()`` run for the app's lifetime (workers)."""
    tasks = background or []

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        for t in tasks:
            await t.start()
        try:
            yield
        finally:
            for t in reversed(tasks):
                await t.stop()

    app = FastAPI(
        title="Vigil",
        version=__version__,
        description="Watches LLM agents in production: rule checks, calibrated judge, outcomes, alerts, review.",
        lifespan=lifespan,
    )
    app.add_middleware(RefuseNul)
    app.add_middleware(LimitBodies, limit=runtime.settings.max_request_bytes)
    app.add_middleware(HeadAsGet)  # outermost of these: every guard and check runs as for the GET
    app.state.runtime = runtime
    app.state.keyring = KeyRing.from_settings(runtime.settings)
    runtime.provide(app.state.keyring)  # the OTLP/gRPC receiver checks the same keys
    app.include_router(conversations.router)
    app.include_router(dead_letters.router)
    app.include_router(erasure.router)
    for router in runtime.hooks.routers:
        app.include_router(router)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> JSONResponse:
        """Liveness: 200, or 503 naming each in-process loop (``vigil serve``'s judge worker, detector, trace
        finisher, upkeep and OTLP/gRPC receiver) that has stalled past VIGIL_LIVENESS_STALL_SECONDS or ended,
        with the reason. No database query: a database that is away makes the process unready (``/readyz``),
        not dead. ``--no-workers`` runs only the gRPC receiver's loop (while it serves)."""
        # answered on the event loop itself: no wait for a worker thread while requests are being checked
        problems, loops = check(runtime.heartbeats, runtime.settings.liveness_stall_seconds)
        if problems:
            return JSONResponse({"status": "failing", "failing": problems, "loops": loops}, 503)
        return JSONResponse({"status": "ok", "loops": loops})

    app.state.unready = None  # the reason the last readiness check failed, while it fails

    @app.get("/readyz", tags=["ops"])
    def readyz() -> Response:
        try:
            with runtime.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:  # readiness reports any failure to reach the database
            # the answer needs no key: it says the database is away, the log says why (its text names the
            # database's host, port and name); logged when the reason changes, not on every probe
            reason = db_detail(exc)
            if app.state.unready != reason:
                log.warning("not ready: readiness check could not reach the database: %s", reason)
                app.state.unready = reason
            return JSONResponse({"status": "unavailable", "database": "unreachable", "error": type(exc).__name__}, 503)
        if app.state.unready is not None:
            log.info("ready: the database answers again")
            app.state.unready = None
        return JSONResponse({"status": "ready", "rules": len(runtime.rules.rules)})

    @app.get("/metrics", tags=["ops"])
    def metrics(request: Request) -> Response:
        """Prometheus text or OpenMetrics (by ``Accept``), gzip-compressed when the scraper accepts it."""
        encoder, media_type = choose_encoder(request.headers.get("accept", ""))
        body = encoder(runtime.metrics.registry)
        headers = {"vary": "Accept, Accept-Encoding"}
        if "gzip" in request.headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=5)
            headers["content-encoding"] = "gzip"
        return Response(body, headers=headers, media_type=media_type)

    @app.exception_handler(DataError)
    async def data_error(request: Request, exc: DataError) -> JSONResponse:
        if "NUL" in str(exc.orig):  # PostgreSQL: "text fields cannot contain NUL (0x00) bytes"
            return JSONResponse({"detail": NUL_TEXT_DETAIL}, 400)
        return await unhandled(request, exc)

    @app.exception_handler(StoreUnavailable)
    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def database_away(request: Request, exc: Exception) -> Response:
        return database_unavailable(request, exc)

    @app.exception_handler(IngestBusy)
    async def ingest_busy(request: Request, exc: IngestBusy) -> Response:
        log.warning("refused a request body: %s", exc)
        request.app.state.runtime.metrics.ingest_errors.labels("http").inc()
        return JSONResponse({"detail": str(exc), "reason": "busy"}, 503, headers={"Retry-After": "1"})

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, exc: ClientDisconnect) -> Response:
        # the client hung up while its body was read: nothing was stored and nobody reads the answer; as an
        # unhandled error it logged two tracebacks per request, which any ingest key could repeat at will
        path = request.url.path.encode("unicode_escape").decode("ascii")
        log.info("client disconnected before its request body was read whole: %s %s", request.method, path)
        return Response(status_code=400)

    @app.exception_handler(UnicodeEncodeError)
    async def lone_surrogate(request: Request, exc: UnicodeEncodeError) -> JSONResponse:
        # raised where the text is written (the database driver, a response): before anything commits
        return surrogate_response()

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_response(exc)

    @app.exception_handler(Exception)
    async def unhandled(request: Request, exc: Exception) -> JSONResponse:
        path = request.url.path.encode("unicode_escape").decode("ascii")  # no control characters in the log
        log.exception("unhandled error on %s %s", request.method, path)
        return JSONResponse({"detail": f"internal error: {type(exc).__name__}"}, 500)

    _register_schema(app)
    return app


def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """503 with Retry-After for a request the database could not serve (down, restarting, locked past its
    timeout): the client tries again later; nothing was changed. Logged in one line, not a traceback per
    request, which during an outage flooded the log."""
    rt = request.app.state.runtime
    log.warning(
        "database unavailable on %s %s: %s",
        request.method,
        request.url.path.encode("unicode_escape").decode("ascii"),
        db_detail(exc),
    )
    # its frames (and its cause's) hold what the request had decoded (outcomes, spans, a page's rows), in a cycle
    # through SQLAlchemy's: freed with the answer rather than at the collector's next run
    without_frames(exc)
    retry = str(max(1, round(rt.settings.store_retry_after_seconds)))
    return JSONResponse(
        {"detail": "the database is unavailable; nothing was changed, try again later"},
        503,
        headers={"Retry-After": retry},
    )


def _register_schema(app: FastAPI) -> None:
    original = app.openapi

    def openapi():  # type: ignore[no-untyped-def]
        if app.openapi_schema:
            return app.openapi_schema
        schema = original()
        defs = Conversation.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(defs.pop("$defs", {}))
        components["Conversation"] = defs
        # A 422 is either FastAPI's list of field errors or Vigil's own sentence (an unknown category,
        # a bad rule pattern): the document says so, so clients and schema checks accept both.
        validation = components.get("HTTPValidationError", {}).get("properties", {})
        if "detail" in validation:
            listed = validation["detail"]
            validation["detail"] = {
                "title": "Detail",
                "anyOf": [{k: v for k, v in listed.items() if k != "title"}, {"type": "string"}],
            }
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
