"""Read endpoints: conversations with findings, dead letters, rules, the schema."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, HTTPException, Query, Request
from sqlalchemy.orm import Session

from vigil.http import runtime_of
from vigil.http.auth import require
from vigil.http.fastjson import OPTIONS, FastJSON
from vigil.http.params import MAX_OFFSET, AnyCaseSeverity, Instant
from vigil.rules import registered_rule_types
from vigil.runtime import Runtime
from vigil.schema import conversation_json_schema, dumps_exact
from vigil.store import reads
from vigil.store.models import ConversationRow

router = APIRouter(tags=["conversations"])


@router.get("/v1/schema/conversation", dependencies=[require("ingest", "reviewer")])
def conversation_schema() -> dict[str, Any]:
    """JSON Schema of the conversation format Vigil ingests (versioned)."""
    return conversation_json_schema()


@router.get("/v1/conversations", dependencies=[require("reviewer")])
def list_conversations(
    request: Request,
    agent: str | None = None,
    version: str | None = None,
    rule: str | None = None,
    severity: AnyCaseSeverity | None = Query(None, description="Minimum severity of any finding (any case)."),
    since: Instant | None = None,
    until: Instant | None = None,
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(
        0, ge=0, le=MAX_OFFSET, description="Rows to skip (bounded by list_max_offset; page deeper with cursor)."
    ),
    cursor: str | None = Query(None, description="next_cursor of the previous page (keyset pagination)."),
) -> dict[str, Any]:
    """Stored conversations, newest first; ``total`` counts up to list_count_cap (``total_capped`` beyond)."""
    rt = runtime_of(request)
    if offset > rt.settings.list_max_offset:
        raise HTTPException(422, f"offset above {rt.settings.list_max_offset}: page with cursor (next_cursor)")
    with rt.sessions() as s:
        try:
            return reads.list_conversations(
                s,
                limit,
                offset,
                cursor,
                rt.settings.list_count_cap,
                agent=agent,
                version=version,
                rule=rule,
                min_severity=severity,
                since=since,
                until=until,
            )
        except reads.BadCursor as exc:
            raise HTTPException(422, str(exc)) from None


@router.get(
    "/v1/conversations/{conversation_id:path}",
    dependencies=[require("reviewer")],
    response_class=FastJSON,
    response_model=dict[str, Any],
)
def get_conversation(request: Request, conversation_id: str) -> FastJSON:
    found = full_conversation(runtime_of(request), conversation_id, "api")
    if found is None:
        raise HTTPException(404, f"no conversation {conversation_id!r}")
    return FastJSON(found)


def full_conversation(rt: Runtime, conversation_id: str, reader: str) -> dict[str, Any] | None:
    """A stored conversation as the API answers it: findings, outcomes, what each stage adds (verdicts,
    review, trace), and the document ready to write (see :func:`document_json`). ``reader`` labels
    ``vigil_unreadable_documents_total`` when the document cannot be read (None: no such conversation)."""
    with rt.sessions() as s:
        found = reads.get_conversation(
            s, conversation_id, lambda _cid: rt.metrics.unreadable_documents.labels(reader).inc()
        )
        if found is None:
            return None
        for enrich in rt.hooks.conversation_enrichers:
            enrich(s, found)
        if found["conversation"] is not None:
            found["conversation"] = orjson.Fragment(document_json(s, conversation_id, found["conversation"]))
        return found


def document_json(session: Session, conversation_id: str, document: dict[str, Any]) -> bytes | str:
    """The conversation as JSON. Ingest accepts what orjson reads, 1,024 levels deep and integers of any
    size, and JSON writers stop sooner (orjson at 255 levels and 64 bits, pydantic at about as deep): such a
    document is answered as it is stored, strict JSON as ingest wrote it, instead of failing with a 500."""
    try:
        return orjson.dumps(document, option=OPTIONS)
    except TypeError:  # orjson.JSONEncodeError: nested too deep, or an integer beyond 64 bits
        row = session.get(ConversationRow, conversation_id)  # in the session already: no second query
        return row.document if row is not None else dumps_exact(document)


@router.get("/v1/dead-letters", dependencies=[require("admin")])
def dead_letters(
    request: Request, reason: str | None = None, source: str | None = None, limit: int = Query(50, ge=1, le=500)
) -> list[dict[str, Any]]:
    """Refused input, newest first; ``replayed_at`` says when one was re-sent and taken
    (``POST /v1/dead-letters/{id}/replay``)."""
    with runtime_of(request).sessions() as s:
        return reads.list_dead_letters(s, limit, reason, source)


@router.get("/v1/rules", dependencies=[require("reviewer", "ingest")])
def rules(request: Request) -> dict[str, Any]:
    engine = runtime_of(request).rules
    return {
        "rules": [
            {
                "id": r.id,
                "pack": r.pack,
                "type": r.type.name,
                "severity": r.spec.severity,
                "description": r.spec.description,
                "applies_to": r.spec.applies_to.model_dump(),
                "args": r.args.model_dump(),
            }
            for r in engine.rules
        ],
        "rule_types": {
            name: {"doc": t.doc, "args": t.args_model.model_json_schema()}
            for name, t in sorted(registered_rule_types().items())
        },
    }
