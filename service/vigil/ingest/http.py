"""``POST /v1/conversations``: one conversation or a batch; valid items are kept, invalid ones named."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from vigil.http import runtime_of
from vigil.http.auth import require
from vigil.ingest.decode import strip_nul
from vigil.ingest.pipeline import Envelope
from vigil.schema import Conversation
from vigil.store.writes import DeadLetter

router = APIRouter(tags=["ingest"])

MAX_BATCH = 1000


def _errors(exc: ValidationError) -> list[dict[str, str]]:
    return [{"field": ".".join(str(p) for p in e["loc"]) or "(root)", "message": e["msg"]} for e in exc.errors()[:20]]


@router.post(
    "/v1/conversations",
    dependencies=[require("ingest")],
    responses={
        202: {"description": "All items accepted"},
        422: {"description": "Some items invalid; valid ones kept"},
    },
    openapi_extra={
        "requestBody": {
            "content": {
                "application/json": {
                    "schema": {
                        "oneOf": [
                            {"$ref": "#/components/schemas/Conversation"},
                            {"type": "array", "items": {"$ref": "#/components/schemas/Conversation"}},
                        ]
                    }
                }
            }
        }
    },
)
async def ingest_conversations(request: Request) -> JSONResponse:
    rt = runtime_of(request)
    pipeline = rt.pipeline
    limit = rt.settings.max_message_bytes
    body = await request.body()
    if not body:
        return JSONResponse({"detail": "empty body; send a conversation object or an array of them"}, 400)
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        await run_in_threadpool(pipeline.store, [], [DeadLetter("http", "malformed_json", str(exc), body)], "http")
        return JSONResponse({"detail": f"body is not JSON: {exc}"}, 400)
    single = not isinstance(payload, list)
    items: list[Any] = [payload] if single else payload
    if len(items) > MAX_BATCH:
        detail = f"batch of {len(items)} exceeds {MAX_BATCH} items; split it"
        await run_in_threadpool(pipeline.store, [], [DeadLetter("http", "batch_too_large", detail, body)], "http")
        return JSONResponse({"detail": detail}, 413)
    valid: list[tuple[Conversation, str, Envelope]] = []
    index_of: dict[str, int] = {}
    errors: list[dict[str, Any]] = []
    dead: list[DeadLetter] = []
    for index, item in enumerate(items):
        # a single object keeps the exact bytes received; batch items are re-encoded one by one
        raw = strip_nul(body if single else orjson.dumps(item))
        if len(raw) > limit:
            detail = f"{len(raw)} bytes exceeds the limit of {limit}"
            errors.append({"index": index, "errors": [{"field": "(root)", "message": detail}]})
            dead.append(DeadLetter("http", "oversized", detail, raw))
            continue
        try:
            conv = Conversation.model_validate_json(raw)
        except ValidationError as exc:
            errs = _errors(exc)
            errors.append({"index": index, "errors": errs})
            detail = "; ".join(f"{e['field']}: {e['message']}" for e in errs)
            dead.append(DeadLetter("http", "schema_invalid", detail, raw))
            continue
        valid.append((conv, raw.decode(), Envelope(raw, "http", key=conv.conversation_id)))
        index_of[conv.conversation_id] = index
    result = await run_in_threadpool(pipeline.process_documents, valid, dead, "http")
    rejected_ids = {d.key for d in result.dead_letters if d.reason == "store_rejected"}
    for cid in sorted(rejected_ids, key=lambda c: index_of.get(c or "", -1)):
        message = "the database refused this conversation; it is kept as a dead letter"
        errors.append({"index": index_of.get(cid or "", -1), "errors": [{"field": "(root)", "message": message}]})
    accepted = [c.conversation_id for c, _, _ in valid if c.conversation_id not in rejected_ids]
    body_out = {
        "accepted": len(accepted),
        "stored": len(result.stored),
        "duplicates": result.duplicates,
        "rejected": len(errors),
        "errors": errors,
        "conversation_ids": accepted,
    }
    return JSONResponse(body_out, status_code=422 if errors else 202)
