"""``POST /v1/traces`` and ``POST /v1/logs``: OTLP/HTTP export (protobuf or JSON) from traced agents."""

from __future__ import annotations

import logging

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from vigil.errors import without_frames
from vigil.http import runtime_of
from vigil.http.auth import require
from vigil.http.body import BodyTooLarge, IngestBusy, hold_decoded, inflate_held, pooled_body
from vigil.http.encoding import Undecodable, encoding_of
from vigil.ingest.otlp.ingest import TraceIngest
from vigil.ingest.otlp.otlp import (
    JSON,
    PROTOBUF,
    OtlpError,
    decompress,
    logs_response,
    parse,
    parse_logs,
    protobuf_response,
)
from vigil.runtime import Runtime
from vigil.schema import too_dense
from vigil.store.writes import DeadLetter

log = logging.getLogger(__name__)

router = APIRouter(tags=["ingest"])

# Python memory a request takes per byte of its (inflated) body while it is parsed, assembled and stored,
# the body included, by (logs, media): measured on requests of 512 GenAI spans, or the log records of
# their messages, made from the τ² results files (bench.bench_decoded_memory otlp): protobuf spans 2.5 to
# 3.5, protobuf log records 6.2 to 11.5, JSON spans 14.6 to 16.8, JSON log records 16.3 to 17.6.
DECODED_BYTES_PER_BODY_BYTE = {(False, PROTOBUF): 4, (True, PROTOBUF): 12, (False, JSON): 17, (True, JSON): 18}


def _answer(media: str, rejected: int = 0, message: str = "", status: int = 200, logs: bool = False) -> Response:
    if media == PROTOBUF:
        encode = logs_response if logs else protobuf_response
        return Response(encode(rejected, message), status, media_type=PROTOBUF)
    body: dict[str, object] = {}
    if rejected or message:
        body["partialSuccess"] = {"rejectedLogRecords" if logs else "rejectedSpans": rejected, "errorMessage": message}
    return Response(orjson.dumps(body), status, media_type=JSON)


def _error(media: str, status: int, message: str) -> Response:
    if media == PROTOBUF:
        from google.rpc.status_pb2 import Status

        return Response(Status(code=3, message=message).SerializeToString(), status, media_type=PROTOBUF)
    return Response(orjson.dumps({"code": 3, "message": message}), status, media_type=JSON)


_REASONS = {400: "malformed_otlp", 413: "oversized", 415: "unsupported_media"}


async def _reject(request: Request, media: str, status: int, message: str, body: bytes, note: str = "") -> Response:
    """Answer a request that cannot be read, keeping its body as a dead letter (source ``otlp``); ``note`` is
    added to the letter's detail only."""
    rt = runtime_of(request)
    h = request.headers
    detail = f"{message} (content-type {h.get('content-type')!r}, content-encoding {h.get('content-encoding')!r})"
    if note:
        detail = f"{detail}; {note}"
    letter = DeadLetter("otlp", _REASONS.get(status, "malformed_otlp"), detail, body)
    try:
        await run_in_threadpool(rt.pipeline.store, [], [letter], "otlp")
    except Exception:  # answering 4xx now would lose the body: the exporter retries on 503
        log.exception("keeping a rejected OTLP request as a dead letter failed")
        rt.metrics.ingest_errors.labels("otlp").inc()
        return _error(media, 503, "storage unavailable; retry later")
    return _error(media, status, message)


_RESPONSES: dict[int | str, dict[str, object]] = {
    400: {"description": "Not an OTLP request (kept as a dead letter)"},
    413: {"description": "Body too large"},
    415: {"description": "Unsupported content type"},
    503: {"description": "Storage unavailable; retry"},
}


@router.post(
    "/v1/traces",
    dependencies=[require("ingest")],
    summary="OTLP/HTTP trace export (GenAI, OpenInference, Langfuse and OpenLLMetry spans)",
    responses={200: {"description": "Spans accepted (partialSuccess names rejected ones)"}, **_RESPONSES},
)
async def export_traces(request: Request) -> Response:
    """Store spans; a request that cannot be read is answered 4xx and kept as a dead letter."""
    return await _export(request, logs=False)


@router.post(
    "/v1/logs",
    dependencies=[require("ingest")],
    summary="OTLP/HTTP log export: GenAI events (message content) joined to their spans",
    responses={200: {"description": "Log records accepted"}, **_RESPONSES},
)
async def export_logs(request: Request) -> Response:
    """Store GenAI log records (by trace and span id); a request that cannot be read is answered 4xx and kept."""
    return await _export(request, logs=True)


async def _export(request: Request, logs: bool) -> Response:
    rt = runtime_of(request)
    s = rt.settings
    ctype = request.headers.get("content-type")
    media = PROTOBUF if (ctype or "").lower().startswith(PROTOBUF) else JSON
    if not s.otlp_ingest_enabled:
        return _error(media, 404, "OTLP ingest is disabled (VIGIL_OTLP_INGEST_ENABLED=false)")
    # the smaller limit applies, and the 413 names the setting it comes from
    if s.otlp_max_body_bytes <= s.max_request_bytes:
        limit, setting = s.otlp_max_body_bytes, "VIGIL_OTLP_MAX_BODY_BYTES"
    else:
        limit, setting = s.max_request_bytes, "VIGIL_MAX_REQUEST_BYTES"
    try:
        async with pooled_body(request, limit, s.max_inflight_bytes, encoded=True, setting=setting) as body:
            return await _store(request, rt, body, media, ctype, logs)
    except BodyTooLarge as exc:
        return await _reject(request, media, 413, str(exc), exc.prefix, exc.kept)
    except IngestBusy as exc:  # exporters retry a 503 after Retry-After
        log.warning("refused an OTLP body: %s", exc)
        rt.metrics.ingest_errors.labels("otlp").inc()
        busy = _error(media, 503, str(exc))
        busy.headers["Retry-After"] = "1"
        return busy


async def _store(
    request: Request, rt: Runtime, body: memoryview, media: str, ctype: str | None, logs: bool
) -> Response:
    """``body`` is a view of a pooled buffer (see :func:`limited_body`): valid only while this runs, so
    what is kept of it (a dead letter) is copied."""
    s = rt.settings
    try:
        # inflating and parsing protobuf is CPU work: off the event loop (inflated bytes held from the budget)
        encoding = encoding_of(request.headers.get("content-encoding"))
        if encoding is None:
            data: bytes | memoryview = decompress(body, None, s.otlp_max_body_bytes)
        else:
            try:
                data = await inflate_held(request, body, encoding, s.otlp_max_body_bytes, "VIGIL_OTLP_MAX_BODY_BYTES")
            except Undecodable as exc:
                raise OtlpError(str(exc), exc.status) from None
        if media == JSON and (why := await run_in_threadpool(too_dense, data, s.max_json_expansion)) is not None:
            raise OtlpError(why, 413)  # a flood of empty objects: refused before it is decoded
        # what its decoded spans or records take, held while they are decoded and stored (the compressed
        # body, which the pooled buffer still holds, besides)
        decoded = len(data) * DECODED_BYTES_PER_BODY_BYTE[logs, media]
        await hold_decoded(request, decoded + (len(body) if encoding is not None else 0))
        # too many spans or log records: 413 before they are decoded (see otlp.too_many)
        items, media = await run_in_threadpool(parse_logs if logs else parse, data, ctype, s.otlp_max_spans_per_request)
    except OtlpError as exc:
        # raised in a worker thread, its traceback holds the frames of decompressing and parsing, whose locals
        # are the inflated body (up to VIGIL_OTLP_MAX_BODY_BYTES), in a cycle through the thread pool's frames:
        # each gzip body refused after inflating to 15 MB kept those 15 MB until a full collection (60 of
        # them, under 1 MB sent, took a server from 240 MB to 1.1 GB). The answer needs only the message.
        without_frames(exc)
        (rt.metrics.otlp_log_records if logs else rt.metrics.otlp_spans).labels("malformed_request").inc()
        return await _reject(request, media, exc.status, str(exc), bytes(body))
    ingest = rt.get(TraceIngest)
    try:
        result = await run_in_threadpool(ingest.ingest_logs if logs else ingest.ingest, items)
    except Exception:  # the database is unavailable: the exporter retries on 503
        log.exception("storing %d OTLP %s failed", len(items), "log records" if logs else "spans")
        rt.metrics.ingest_errors.labels("otlp").inc()
        return _error(media, 503, "storage unavailable; retry later")
    return _answer(media, result.refused, result.message(), logs=logs)
