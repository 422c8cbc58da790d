"""``POST /v1/outcomes`` (one outcome or a batch) and ``GET /v1/outcome-types``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
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
from vigil.runtime import BadParameter
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
    # counting and decoding are CPU work on up to 32 MiB, storing waits on the database: off the loop
    status, out = await run_in_threadpool(answer, store, body, expansion, "http", True)
    return JSONResponse(out, status_code=status)


def answer(
    store: OutcomeStore, raw: bytes, expansion: float, source: str, keep_letters: bool
) -> tuple[int, dict[str, Any]]:
    """``POST /v1/outcomes``'s answer to ``raw`` (status and body), storing what it takes. ``keep_letters``: a
    refusal is kept as a dead letter (the endpoint); a re-sent letter (``rt.hooks.replayers["outcomes"]``,
    :func:`replay`) keeps none, as the letter re-sent stays."""

    def refuse(status: int, reason: str, why: str) -> tuple[int, dict[str, Any]]:
        if keep_letters:
            store.ingest_dead(DeadLetter(source, reason, why, raw))
        return status, {"detail": why, "reason": reason}

    if not raw.strip():  # as POST /v1/conversations answers one: a 400 with its reason, and a letter of it
        return refuse(400, "empty", "empty body; send an outcome object or an array of them")
    # decoding it would take far more memory than its size
    why = too_dense(raw, expansion)
    if why is not None:
        return refuse(413, "oversized", why)
    try:  # a NaN or lone surrogate refuses only the item holding it
        items, refused = read_items(raw)
    except UnreadableJson as exc:
        return refuse(400, "malformed_json", str(exc))
    if len(items) > MAX_BATCH:
        return refuse(413, "batch_too_large", f"batch of {len(items)} exceeds {MAX_BATCH} items; split it")
    result = store.ingest(items, source, None, refused, keep_letters=keep_letters)
    out = {
        "accepted": result.received - len(result.errors),
        "stored": result.stored,
        "duplicates": result.duplicates,
        "rejected": len(result.errors),
        "errors": [{"index": e.index, "reason": e.reason, "errors": e.errors} for e in result.errors],
    }
    return (422 if result.errors else 202), out


def replay(
    store: OutcomeStore, raw: bytes, expansion: float, params: Mapping[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """``rt.hooks.replayers["outcomes"]``: a dead letter's body read as ``POST /v1/outcomes`` reads one, answered
    as it answers, keeping no new dead letter of a refusal (the letter re-sent stays). The endpoint reads no
    query parameter: one given (``?format=``) raises :class:`BadParameter` rather than being passed over, as
    if the body had been read in that format."""
    if params:
        name = next(iter(params))
        why = "POST /v1/outcomes reads no query parameters: an outcome letter goes back as it was sent"
        raise BadParameter(name, f"{why} (leave {name} out)")
    return answer(store, raw, expansion, "replay", keep_letters=False)


@router.get("/v1/outcome-types", dependencies=[require("ingest", "reviewer")])
def outcome_types(request: Request) -> dict[str, Any]:
    """Outcome types Vigil accepts, with their kind (bad, good, score) and the attribution window."""
    store = _store(request)
    return {
        "types": {name: t.kind for name, t in sorted(store.types.items())},
        "attribution_window_hours": store.settings.outcome_attribution_window_hours,
        "schema": OutcomeIn.model_json_schema(),
    }
