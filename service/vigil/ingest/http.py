"""``POST /v1/conversations``: one conversation or a batch; valid items are kept, invalid ones named.

The handler only reads the body (under ``VIGIL_MAX_REQUEST_BYTES``); decoding, rules and storing run
in a worker thread, so a hostile or huge request never holds up the event loop (``/healthz`` answers
meanwhile). Invalid items of one request become one dead letter per reason, holding the invalid items
(up to ``VIGIL_DEAD_LETTER_RAW_BYTES``) and every item's errors, never one row per item.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from vigil.errors import without_frames
from vigil.http import runtime_of
from vigil.http.auth import require
from vigil.http.body import ENCODED_BODIES, BodyTooLarge, EncodedBody, hold_decoded, limited_body
from vigil.http.encoding import Undecodable, reason_of
from vigil.ingest.decode import DecodeError, Item, decode_batch
from vigil.ingest.importers import FORMATS, MALFORMED
from vigil.ingest.pipeline import Envelope
from vigil.runtime import BadParameter, Pipeline, Runtime
from vigil.schema import Conversation, loads_exact, outcome_types, too_dense
from vigil.store.db import StoreUnavailable
from vigil.store.writes import BatchResult, Checked, DeadLetter

log = logging.getLogger(__name__)

router = APIRouter(tags=["ingest"])

MAX_BATCH = 1000
# Python memory a request takes per byte of its body while it is parsed, converted, checked and stored,
# the body included: measured 14.6 to 20.3 on the τ² results files, sent as tau2 and converted to the
# native schema, openai, anthropic and langsmith (bench.bench_decoded_memory), alike across formats.
DECODED_BYTES_PER_BODY_BYTE = 21
_STATUS = {"empty": 400, "malformed_json": 400, "batch_too_large": 413, "oversized": 413}
# what POST /v1/conversations reads of its query; ``agent_id`` and ``agent_version`` only with ``format``
PARAMETERS = ("format", "agent_id", "agent_version")
NATIVE = "native"  # a replay's ?format= for Vigil's own schema, the letter's recorded parameters left out


def read_params(fmt: str | None, agent_id: str | None, agent_version: str | None) -> dict[str, str] | None:
    """The query parameters a letter of a refused body records, as this intake read them: none without a
    format (the agent's are read only with one)."""
    if fmt is None:
        return None
    given = {"format": fmt, "agent_id": agent_id, "agent_version": agent_version}
    return {name: value for name, value in given.items() if value is not None}


@dataclass(slots=True)
class Answer:
    status: int
    body: dict[str, Any]


def grouped_letters(items: list[Item], source: str, detail_chars: int = 4000) -> list[DeadLetter]:
    """One dead letter per reason: the invalid items as a JSON array, and each one's errors."""
    by_reason: dict[str, list[Item]] = {}
    for item in items:
        assert item.error is not None
        by_reason.setdefault(item.error.reason, []).append(item)
    letters = []
    for reason, group in by_reason.items():
        lines = []
        for item in group:
            errs = "; ".join(f"{e['field']}: {e['message']}" for e in item.error.errors)  # type: ignore[union-attr]
            lines.append(f"item {item.index}: {errs}")
        detail = f"{len(group)} invalid item(s): " + " | ".join(lines)
        raw = b"[" + b",".join(i.raw for i in group) + b"]" if len(group) > 1 else group[0].raw
        letters.append(DeadLetter(source, reason, detail[:detail_chars], raw, messages=len(group)))
    return letters


def hint(item: Item) -> dict[str, str]:
    """For an item refused by the schema that another format reads: which, and how to send it."""
    if item.error is None or item.error.reason != "schema_invalid":
        return {}
    import orjson

    from vigil.ingest.importers import matches

    try:
        found = matches(orjson.loads(item.raw))
    except (orjson.JSONDecodeError, RecursionError):
        return {}
    except MALFORMED:  # a hint is a courtesy: never the reason a request fails
        return {}
    other = {name: why for name, why in found.items() if name != "openai"}
    if len(other) != 1:
        return {}
    [(name, why)] = other.items()
    return {"hint": f"this looks like {name} ({why}): send it with ?format={name} (or ?format=auto)"}


def _too_dense(rt: Runtime, body: bytes, params: dict[str, str] | None = None) -> Answer | None:
    """413 for a body that would decode to far more memory than its size (see ``schema.too_dense``), kept
    as a dead letter (with the query ``params`` it was sent with); None for any other."""
    why = too_dense(body, rt.settings.max_json_expansion)
    if why is None:
        return None
    rt.pipeline.store([], [DeadLetter("http", "oversized", why, body, params=params)], "http")
    return Answer(413, {"detail": why, "reason": "oversized"})


def stored_warnings(rt: Runtime, convs: list[tuple[int, Conversation]]) -> list[dict[str, Any]]:
    """What was stored but reads oddly: an end before the start (kept as sent), and an inline outcome of a
    type neither built in nor declared in ``VIGIL_OUTCOME_TYPES``, which is stored with its conversation
    (declared later, comparisons read it from then on) but feeds no signal until then, where
    ``POST /v1/outcomes`` refuses it: the answer says so instead of keeping quiet about a typo."""
    out = [
        {
            "index": index,
            "conversation_id": conv.conversation_id,
            "field": "ended_at",
            "message": f"ended_at ({conv.ended_at.isoformat()}) is before started_at "
            f"({conv.started_at.isoformat()}): stored as sent; its duration reads as negative",
        }
        for index, conv in convs
        if conv.started_at is not None and conv.ended_at is not None and conv.ended_at < conv.started_at
    ]
    if not any(c.outcomes for _, c in convs):
        return out
    known = outcome_types(rt.settings.outcome_types)
    for index, conv in convs:
        for o in conv.outcomes:
            if o.type not in known:
                out.append(
                    {
                        "index": index,
                        "conversation_id": conv.conversation_id,
                        "field": "outcomes.type",
                        "message": f"outcome type {o.type!r} is not declared (known: {', '.join(sorted(known))}; "
                        "declare others in VIGIL_OUTCOME_TYPES): stored, but no comparison, alert or metric "
                        "reads it until it is declared",
                    }
                )
    if out:
        log.warning("%d warning(s) on stored conversations, e.g. %s", len(out), out[0]["message"])
    return out


def ingest_body(rt: Runtime, body: bytes) -> Answer:
    """Decode, check and store one request body (runs in a worker thread)."""
    pipeline = rt.pipeline
    refused = _too_dense(rt, body)
    if refused is not None:
        return refused
    try:
        batch = decode_batch(body, rt.settings.max_message_bytes, MAX_BATCH, rt.future_bound.latest_allowed())
    except DecodeError as exc:
        pipeline.store([], [DeadLetter("http", exc.reason, exc.detail, body)], "http")
        return Answer(_STATUS.get(exc.reason, 400), {"detail": exc.detail, "reason": exc.reason})
    valid: list[tuple[Conversation, str, Envelope]] = []
    index_of: dict[str, int] = {}
    for item in batch.valid():
        conv = item.conversation
        assert conv is not None
        valid.append((conv, item.raw.decode(), Envelope(item.raw, "http", key=conv.conversation_id)))
        index_of[conv.conversation_id] = item.index
    invalid = list(batch.invalid())
    errors: list[dict[str, Any]] = [
        {"index": i.index, "reason": i.error.reason, "errors": i.error.errors, **hint(i)}  # type: ignore[union-attr]
        for i in invalid
    ]
    result = pipeline.process_documents(valid, grouped_letters(invalid, "http") if invalid else [], "http")
    rejected_ids = {d.key for d in result.dead_letters if d.reason == "store_rejected"}
    for cid in sorted(rejected_ids, key=lambda c: index_of.get(c or "", -1)):
        message = "the database refused this conversation; it is kept as a dead letter"
        errors.append(
            {
                "index": index_of.get(cid or "", -1),
                "reason": "store_rejected",
                "errors": [{"field": "(root)", "message": message}],
            }
        )
    accepted = [c.conversation_id for c, _, _ in valid if c.conversation_id not in rejected_ids]
    out = {
        "accepted": len(accepted),
        "stored": len(result.stored),
        "duplicates": result.duplicates,
        "erased": result.erased,
        "rejected": len(errors),
        "errors": errors,
        "warnings": stored_warnings(rt, [(index_of[c.conversation_id], c) for c, _, _ in valid]),
        "conversation_ids": accepted,
    }
    return Answer(422 if errors else 202, out)


def ingest_formatted(rt: Runtime, body: bytes, fmt: str, agent_id: str | None, agent_version: str | None) -> Answer:
    """A body in another format (``?format=``): converted by the importers, then decoded and stored as any
    native conversation. The answer says which format was read; a shape no format (or several) reads is
    refused whole, naming the formats tried, and kept as a dead letter with the query parameters read (a
    converted conversation refused is kept in Vigil's schema, read back without them)."""
    import orjson

    from vigil.ingest.decode import decode_document, encode_conversation
    from vigil.ingest.importers import BOM, ImportError_, convert_data, malformed

    pipeline = rt.pipeline
    params = read_params(fmt, agent_id, agent_version)
    refused = _too_dense(rt, body, params)
    if refused is not None:
        return refused
    try:
        # as Vigil's own schema is read: integers beyond 64 bits kept exact, a byte order mark skipped
        data = loads_exact(body.removeprefix(BOM))
    except orjson.JSONDecodeError as exc:
        pipeline.store([], [DeadLetter("http", "malformed_json", str(exc), body, params=params)], "http")
        return Answer(400, {"detail": f"body is not JSON: {exc}", "reason": "malformed_json"})
    try:
        try:
            imported = convert_data(data, fmt, Path("body"), agent_id, agent_version)
        except MALFORMED as exc:  # convert_data refuses these itself; a body is never the cause of a 500
            log.warning("importer %s failed on a request body", fmt, exc_info=True)
            raise malformed("body", fmt, exc) from None
    except ImportError_ as exc:
        pipeline.store([], [DeadLetter("http", "schema_invalid", str(exc)[:4000], body, params=params)], "http")
        return Answer(422, {"detail": str(exc), "reason": "schema_invalid", "format": fmt})
    valid: list[tuple[Conversation, str, Envelope]] = []
    errors: list[dict[str, Any]] = []
    indexed: list[tuple[int, Conversation]] = []
    invalid: list[Item] = []
    latest = rt.future_bound.latest_allowed()
    for index, conv in enumerate(imported.conversations):
        raw = b""
        try:
            raw = encode_conversation(conv)
            checked, raw = decode_document(raw, rt.settings.max_message_bytes, latest=latest)
        except DecodeError as exc:
            errors.append({"index": index, "reason": exc.reason, "errors": exc.errors})
            invalid.append(Item(index, raw, error=exc))
            continue
        valid.append((checked, raw.decode(), Envelope(raw, "http", key=checked.conversation_id)))
        indexed.append((index, checked))
    result = pipeline.process_documents(valid, grouped_letters(invalid, "http") if invalid else [], "http")
    out = {
        "format": imported.format,
        "format_title": imported.title,
        "accepted": len(valid),
        "stored": len(result.stored),
        "duplicates": result.duplicates,
        "erased": result.erased,
        "rejected": len(errors),
        "errors": errors,
        "warnings": stored_warnings(rt, indexed),
        "conversation_ids": [c.conversation_id for c, _, _ in valid],
    }
    return Answer(422 if errors else 202, out)


class _Unlettered:
    """The pipeline, keeping none of the dead letters handed to it: a re-sent letter refused again stays as
    it was instead of being written once more (a letter the database refuses, ``store_rejected``, is still
    kept: that is a new refusal)."""

    def __init__(self, inner: Pipeline) -> None:
        self.inner = inner
        self.stopping: threading.Event = inner.stopping

    def check(self, conversation: Conversation, document: str | None = None) -> Checked:
        return self.inner.check(conversation, document)

    def process(self, conversations: Sequence[Conversation], source: str) -> BatchResult:
        return self.inner.process(conversations, source)

    def process_raw(self, envelopes: Sequence[Envelope]) -> BatchResult:
        return self.inner.process_raw(envelopes)

    def process_documents(
        self, items: Sequence[tuple[Conversation, str, Envelope | None]], dead: list[DeadLetter], source: str
    ) -> BatchResult:
        return self.inner.process_documents(items, [], source)

    def store(self, checked: list[Checked], dead: list[DeadLetter], source: str) -> BatchResult:
        return self.inner.store(checked, [], source)


def replay(rt: Runtime, raw: bytes, params: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
    """``rt.hooks.replayers["conversations"]``: a dead letter's raw bytes through ``POST /v1/conversations``
    with the query ``params`` (``format=native``: Vigil's schema, as without one), answered as it answers,
    keeping no new dead letter of a refusal; a parameter it does not read or a format it does not know raises
    :class:`BadParameter`."""
    for name in params:
        if name not in PARAMETERS:
            raise BadParameter(name, f"POST /v1/conversations reads {', '.join(PARAMETERS)}; not {name}")
    fmt = params.get("format")
    if fmt is not None and fmt not in (NATIVE, "auto", *FORMATS):
        raise BadParameter("format", f"format must be {NATIVE}, auto, {', '.join(FORMATS)}; not {fmt!r}")
    quiet = replace(rt, pipeline=_Unlettered(rt.pipeline))
    if fmt is None or fmt == NATIVE:
        answer = ingest_body(quiet, raw)
    else:
        answer = ingest_formatted(quiet, raw, fmt, params.get("agent_id"), params.get("agent_version"))
    return answer.status, answer.body


def unavailable(rt: Runtime, exc: Exception) -> JSONResponse:
    """Nothing of the request was stored or acknowledged: the client sends it again later."""
    log.warning("storing a request failed; answered 503: %s", exc)
    # its frames (and its cause's) hold the request's decoded conversations, in a cycle through SQLAlchemy's: freed
    # with the answer rather than at the collector's next run, outside the in-flight budget the body was held to
    without_frames(exc)
    rt.metrics.ingest_errors.labels("store").inc()
    retry = str(max(1, round(rt.settings.store_retry_after_seconds)))
    return JSONResponse(
        {"detail": "storage is busy or unavailable; nothing was stored, send the request again"},
        503,
        headers={"Retry-After": retry},
    )


@router.post(
    "/v1/conversations",
    dependencies=[require("ingest")],
    responses={
        202: {"description": "All items accepted"},
        400: {
            "description": "Empty body, not JSON or broken gzip/deflate (kept as a dead letter), or an unknown format"
        },
        413: {"description": "Body (as inflated) over VIGIL_MAX_REQUEST_BYTES, or more than 1000 items"},
        415: {"description": "A Content-Encoding other than gzip or deflate: send it as gzip, deflate or uncompressed"},
        422: {"description": "Some items invalid; valid ones kept"},
        503: {"description": "Storage busy or unavailable; nothing stored, retry after Retry-After"},
    },
    openapi_extra={
        "requestBody": {
            "description": ENCODED_BODIES,
            "content": {
                "application/json": {
                    "schema": {
                        "oneOf": [
                            {"$ref": "#/components/schemas/Conversation"},
                            {"type": "array", "items": {"$ref": "#/components/schemas/Conversation"}},
                        ]
                    }
                }
            },
        }
    },
)
async def ingest_conversations(
    request: Request,
    format: Annotated[
        str | None,
        Query(
            description="Read the body in another format: auto (detected; the answer says which), openai, "
            "openai-responses, anthropic, openai-agents, langsmith, tau2 or tau-bench. Absent: Vigil's schema."
        ),
    ] = None,
    agent_id: Annotated[str | None, Query(description="With format: the agent id, where the body has none.")] = None,
    agent_version: Annotated[str | None, Query(description="With format: the agent version.")] = None,
) -> JSONResponse:
    rt = runtime_of(request)
    s = rt.settings
    if format is not None and format not in ("auto", *FORMATS):
        detail = f"format must be auto, {', '.join(FORMATS)}; not {format!r}"
        return JSONResponse({"detail": detail, "reason": "schema_invalid"}, 400)
    try:
        async with limited_body(request, s.max_request_bytes, s.max_inflight_bytes) as body:
            await hold_decoded(request, len(body) * DECODED_BYTES_PER_BODY_BYTE)
            if format is None:
                answer = await run_in_threadpool(ingest_body, rt, body)
            else:
                answer = await run_in_threadpool(ingest_formatted, rt, body, format, agent_id, agent_version)
    except BodyTooLarge as exc:
        params = read_params(format, agent_id, agent_version)
        letter = DeadLetter("http", "oversized", str(exc), exc.prefix, size=exc.sent, params=params)
        try:
            await run_in_threadpool(rt.pipeline.store, [], [letter], "http")
        except StoreUnavailable:
            log.warning("keeping a note of an oversized request failed")
        return JSONResponse({"detail": str(exc), "reason": "oversized"}, 413)
    except EncodedBody as exc:
        return JSONResponse({"detail": str(exc), "reason": "unsupported_encoding"}, 415)
    except Undecodable as exc:  # gzip or deflate that cannot be undone: a note of what was sent, as for a large one
        params = read_params(format, agent_id, agent_version)
        letter = DeadLetter("http", reason_of(exc), f"{exc}; {exc.kept}", exc.body, params=params)
        try:
            await run_in_threadpool(rt.pipeline.store, [], [letter], "http")
        except StoreUnavailable:
            log.warning("keeping a note of an undecodable request failed")
        return JSONResponse({"detail": str(exc), "reason": reason_of(exc)}, exc.status)
    except StoreUnavailable as exc:
        return unavailable(rt, exc)
    return JSONResponse(answer.body, status_code=answer.status)
