"""``POST /v1/conversations``: one conversation or a batch; valid items are kept, invalid ones named."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from ..decode import DecodeError, decode_conversation
from ..schema import Conversation
from ..store.writes import DeadLetter
from .auth import require

router = APIRouter(tags=["ingest"])

MAX_BATCH = 1000


def _errors(exc: ValidationError) -> list[dict[str, str]]:
    return [
        {"field": ".".join(str(p) for p in e["loc"]) or "(root)", "message": e["msg"]}
        for e in exc.errors()[:20]
    ]


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
    rt = request.app.state.runtime
    limit = rt.settings.max_message_bytes
    body = await request.body()
    if not body:
        return JSONResponse({"detail": "empty body; send a conversation object or an array of them"}, 400)
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        rt.pipeline.store([], [DeadLetter("http", "malformed_json", str(exc), body)], "http")
        return JSONResponse({"detail": f"body is not JSON: {exc}"}, 400)
    items: list[Any] = payload if isinstance(payload, list) else [payload]
    if len(items) > MAX_BATCH:
        return JSONResponse({"detail": f"batch of {len(items)} exceeds {MAX_BATCH} items"}, 413)
    valid: list[Conversation] = []
    docs: list[str] = []
    errors: list[dict[str, Any]] = []
    dead: list[DeadLetter] = []
    for index, item in enumerate(items):
        raw = orjson.dumps(item)
        try:
            if len(raw) > limit:
                decode_conversation(raw, limit)
            conv = Conversation.model_validate(item)
        except DecodeError as exc:
            errors.append({"index": index, "errors": [{"field": "(root)", "message": exc.detail}]})
            dead.append(DeadLetter("http", exc.reason, exc.detail, raw))
            continue
        except ValidationError as exc:
            errs = _errors(exc)
            errors.append({"index": index, "errors": errs})
            detail = "; ".join(f"{e['field']}: {e['message']}" for e in errs)
            dead.append(DeadLetter("http", "schema_invalid", detail, raw))
            continue
        valid.append(conv)
        docs.append(raw.decode())

    def check_and_store():  # type: ignore[no-untyped-def]
        checked = [rt.pipeline.check(c, d) for c, d in zip(valid, docs, strict=True)]
        return rt.pipeline.store(checked, dead, "http")

    result = await run_in_threadpool(check_and_store)
    body_out = {
        "accepted": len(valid),
        "stored": len(result.stored),
        "duplicates": result.duplicates,
        "rejected": len(errors),
        "errors": errors,
        "conversation_ids": [c.conversation_id for c in valid],
    }
    return JSONResponse(body_out, status_code=422 if errors else 202)
