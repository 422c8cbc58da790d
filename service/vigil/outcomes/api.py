"""``POST /v1/outcomes`` (one outcome or a batch) and ``GET /v1/outcome-types``."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.concurrency import run_in_threadpool

from vigil.http import runtime_of
from vigil.http.auth import require
from vigil.http.body import ENCODED_BODIES, BodyTooLarge, EncodedBody, hold_decoded, limited_body
from vigil.http.encoding import Undecodable, reason_of
from vigil.outcomes.ingest import OutcomeIn, OutcomeStore
from vigil.schema import UnreadableJson, read_items, too_dense
from vigil.store.db import StoreUnavailable
from vigil.store.writes import DeadLetter

log = logging.getLogger(__name__)
router = APIRouter(tags=["outcomes"])

_ONE = OutcomeIn.model_json_schema()

MAX_BATCH = 5000
# Python memory a request takes per byte of its body while it is parsed, validated and stored, the body
# included: measured 20.3 to 21.8 on batches of 500 and 5,000 outcomes (bench.bench_decoded_memory outcomes)
DECODED_BYTES_PER_BODY_BYTE = 22


def _store(request: Request) -> OutcomeStore:
    return runtime_of(request).get(OutcomeStore)


@router.post(
    "/v1/outcomes",
    dependencies=[require("ingest")],
    responses={
        202: {"description": "All items accepted"},
        400: {"description": "Empty body, not JSON or broken gzip/deflate (kept as a dead letter)"},
        413: {"description": "Body (as inflated) over VIGIL_MAX_REQUEST_BYTES, or more than 5000 items"},
        415: {"description": "A Content-Encoding other than gzip or deflate: send it as gzip, deflate or uncompressed"},
        422: {"description": "Some items invalid; valid ones kept"},
        503: {"description": "Storage busy or unavailable; nothing stored, retry after Retry-After"},
    },
    openapi_extra={
        "requestBody": {
            "description": ENCODED_BODIES,
            "content": {"application/json": {"schema": {"oneOf": [_ONE, {"type": "array", "items": _ONE}]}}},
        }
    },
)
async def post_outcomes(request: Request) -> JSONResponse:
    """Store outcome signals. Duplicate idempotency keys change nothing; outcomes for conversations
    not yet stored are kept and joined when the conversation arrives."""
    store = _store(request)
    s = runtime_of(request).settings
    try:
        async with limited_body(request, s.max_request_bytes, s.max_inflight_bytes) as body:
            await hold_decoded(request, len(body) * DECODED_BYTES_PER_BODY_BYTE)
            return await _post_outcomes(store, body, s.max_json_expansion)
    except BodyTooLarge as exc:  # a note of what was read of it, as for conversations
        try:
            await run_in_threadpool(
                store.ingest_dead, DeadLetter("http", "oversized", str(exc), exc.prefix, size=exc.sent)
            )
        except Exception:  # the answer is 413 either way; the note is what could be kept
            log.warning("keeping a note of an oversized outcomes request failed", exc_info=True)
        return JSONResponse({"detail": str(exc), "reason": "oversized"}, 413)
    except EncodedBody as exc:
        return JSONResponse({"detail": str(exc), "reason": "unsupported_encoding"}, 415)
    except Undecodable as exc:  # gzip or deflate that cannot be undone: a note of what was sent
        try:
            letter = DeadLetter("http", reason_of(exc), f"{exc}; {exc.kept}", exc.body)
            await run_in_threadpool(store.ingest_dead, letter)
        except Exception:
            log.warning("keeping a note of an undecodable outcomes request failed", exc_info=True)
        return JSONResponse({"detail": str(exc), "reason": reason_of(exc)}, exc.status)
    except (StoreUnavailable, OperationalError, InterfaceError):
        # answered 503 by the app's handler; counted as POST /v1/conversations counts its own (IngestStoreFailing)
        runtime_of(request).metrics.ingest_errors.labels("store").inc()
        raise


async def _post_outcomes(store: Any, body: bytes, expansion: float) -> JSONResponse:
    if not body.strip():  # as POST /v1/conversations answers one: a 400 with its reason, and a letter of it
        empty = "empty body; send an outcome object or an array of them"
        await run_in_threadpool(store.ingest_dead, DeadLetter("http", "empty", empty, body))
        return JSONResponse({"detail": empty, "reason": "empty"}, 400)
    # decoding it would take far more memory than its size; counting is CPU work on up to 32 MiB: off the loop
    why = await run_in_threadpool(too_dense, body, expansion)
    if why is not None:
        await run_in_threadpool(store.ingest_dead, DeadLetter("http", "oversized", why, body))
        return JSONResponse({"detail": why, "reason": "oversized"}, 413)
    try:  # a NaN or lone surrogate refuses only the item holding it
        items, refused = await run_in_threadpool(read_items, body)
    except UnreadableJson as exc:
        await run_in_threadpool(store.ingest_dead, DeadLetter("http", "malformed_json", str(exc), body))
        return JSONResponse({"detail": str(exc), "reason": "malformed_json"}, 400)
    if len(items) > MAX_BATCH:
        why = f"batch of {len(items)} exceeds {MAX_BATCH} items; split it"
        await run_in_threadpool(store.ingest_dead, DeadLetter("http", "batch_too_large", why, body))
        return JSONResponse({"detail": why, "reason": "batch_too_large"}, 413)
    result = await run_in_threadpool(store.ingest, items, "http", None, refused)
    out = {
        "accepted": result.received - len(result.errors),
        "stored": result.stored,
        "duplicates": result.duplicates,
        "rejected": len(result.errors),
        "errors": [{"index": e.index, "reason": e.reason, "errors": e.errors} for e in result.errors],
    }
    return JSONResponse(out, status_code=422 if result.errors else 202)


def replay(store: OutcomeStore, raw: bytes, expansion: float) -> tuple[int, dict[str, Any]]:
    """``rt.hooks.replayers["outcomes"]``: a dead letter's body read as ``POST /v1/outcomes`` reads one, answered
    as it answers, keeping no new dead letter of a refusal (the letter re-sent stays)."""
    if not raw.strip():
        return 400, {"detail": "empty body; send an outcome object or an array of them", "reason": "empty"}
    why = too_dense(raw, expansion)
    if why is not None:
        return 413, {"detail": why, "reason": "oversized"}
    try:
        items, refused = read_items(raw)
    except UnreadableJson as exc:
        return 400, {"detail": str(exc), "reason": "malformed_json"}
    if len(items) > MAX_BATCH:
        return 413, {
            "detail": f"batch of {len(items)} exceeds {MAX_BATCH} items; split it",
            "reason": "batch_too_large",
        }
    result = store.ingest(items, "replay", None, refused, keep_letters=False)
    out = {
        "accepted": result.received - len(result.errors),
        "stored": result.stored,
        "duplicates": result.duplicates,
        "rejected": len(result.errors),
        "errors": [{"index": e.index, "reason": e.reason, "errors": e.errors} for e in result.errors],
    }
    return (422 if result.errors else 202), out


@router.get("/v1/outcome-types", dependencies=[require("ingest", "reviewer")])
def outcome_types(request: Request) -> dict[str, Any]:
    """Outcome types Vigil accepts, with their kind (bad, good, score) and the attribution window."""
    store = _store(request)
    return {
        "types": {name: t.kind for name, t in sorted(store.types.items())},
        "attribution_window_hours": store.settings.outcome_attribution_window_hours,
        "schema": OutcomeIn.model_json_schema(),
    }
