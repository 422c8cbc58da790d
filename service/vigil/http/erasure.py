"""Erasing conversations on request (admin): ``DELETE /v1/conversations/{id}``, ``POST /v1/conversations/erase``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from vigil.http import runtime_of
from vigil.http.auth import Principal, require
from vigil.runtime import Runtime
from vigil.store import erasure

router = APIRouter(tags=["erasure"])


class EraseRequest(BaseModel):
    """Either the ids to erase, or a metadata value: every conversation whose ``metadata`` holds it."""

    conversation_ids: list[str] = Field(default_factory=list, max_length=erasure.MAX_MATCHES)
    metadata: dict[str, Any] = Field(default_factory=dict, max_length=1)
    tombstone: bool = True
    dry_run: bool = False


def erase_ids(rt: Runtime, ids: list[str], actor: str, tombstone: bool) -> list[dict[str, Any]]:
    return erasure.erase_each(rt.sessions, ids, rt.hooks.erasers, actor, tombstone)


def matching(rt: Runtime, metadata: dict[str, Any]) -> list[str]:
    ((key, value),) = metadata.items()
    with rt.sessions() as s:
        return erasure.matching_metadata(s, key, value)


@router.delete("/v1/conversations/{conversation_id:path}")
async def erase_conversation(
    request: Request,
    conversation_id: str,
    tombstone: bool = Query(True, description="Keep the id's hash so ingest drops the conversation if re-sent."),
    p: Principal = require("admin"),
) -> dict[str, Any]:
    """Erase one conversation and every row derived from it, whatever its state (labelled, queued, exported):
    200 with the rows removed per table, 404 when nothing of that id is stored."""
    rt = runtime_of(request)
    (result,) = await run_in_threadpool(erase_ids, rt, [conversation_id], p.name, tombstone)
    if result["status"] == "not_found":
        raise HTTPException(404, f"nothing of conversation {conversation_id!r} is stored")
    return result


@router.post("/v1/conversations/erase")
async def erase_conversations(request: Request, body: EraseRequest, p: Principal = require("admin")) -> dict[str, Any]:
    """Erase the given ids, or every conversation whose stored ``metadata`` has the given value (at most
    ``MAX_MATCHES``), answering per id; ``dry_run`` lists what a metadata value matches without erasing."""
    if bool(body.conversation_ids) == bool(body.metadata):
        raise HTTPException(422, "give either conversation_ids or metadata (one key and its value)")
    rt = runtime_of(request)
    ids = body.conversation_ids or await run_in_threadpool(matching, rt, body.metadata)
    if body.dry_run:
        return {"dry_run": True, "conversation_ids": ids, "limit": erasure.MAX_MATCHES}
    results = await run_in_threadpool(erase_ids, rt, ids, p.name, body.tombstone)
    return {"dry_run": False, "results": results, "erased": sum(r["status"] == "erased" for r in results)}
