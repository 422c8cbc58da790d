"""``POST /v1/dead-letters/{id}/replay``: a dead letter's raw bytes fed back through the intake its source uses.

Which intake: a Kafka letter's topic names it (the outcomes topic, else conversations); an OTLP letter dated
ahead holds the conversation it assembled; ``replay`` letters (``vigil import``) hold conversations, or a
file or line as read with the format it was read in (``query``); an HTTP
letter holds the body (or invalid items) of ``POST /v1/conversations`` or ``POST /v1/outcomes``, told apart
by the query parameters it records (only the conversations intake reads any), its reason and what its items
hold. The body of a ``POST /v1/conversations?format=...`` goes back with the parameters it was sent with
(``query``); ``?format=`` of the replay overrides the recorded format. What cannot go back is refused with
409: a letter that kept only the first bytes of what was refused, OTLP request bodies, a Kafka row holding
several messages, recorded parameters its intake cannot read.

Taken, the letter is marked ``replayed_at`` (kept, not deleted: on-call sees what was re-sent, and retention
removes it as any other). Refused again, it is left as it was, no new letter is written, and the answer is
the intake's refusal. Replaying twice stores nothing twice: conversations are upserted by id and revision,
outcomes by their idempotency key.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

import orjson
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from sqlalchemy import update
from starlette.concurrency import run_in_threadpool

from vigil.http import runtime_of
from vigil.http.auth import require
from vigil.http.params import MAX_ID
from vigil.runtime import BadParameter, Runtime
from vigil.store.db import aware, write_clock
from vigil.store.models import DeadLetterRow

router = APIRouter(tags=["conversations"])

CONVERSATIONS, OUTCOMES = "conversations", "outcomes"
# reasons only POST /v1/outcomes (and the outcomes topic) give
_OUTCOME_REASONS = frozenset({"unknown_outcome_type", "idempotency_conflict"})


class NoWayBack(Exception):
    """This letter cannot be fed back through any intake (answered 409)."""


def intake_of(letter: DeadLetterRow, outcomes_topic: str) -> str:
    """The intake a letter's raw bytes go back through, or :class:`NoWayBack` saying why none."""
    if letter.raw_size > len(letter.raw):
        raise NoWayBack(
            f"only the first {len(letter.raw)} of {letter.raw_size} bytes were kept (VIGIL_DEAD_LETTER_RAW_BYTES): "
            "send the original again from its producer"
        )
    if letter.source == "kafka":
        if letter.last_offset is not None and letter.last_offset != letter.offset:
            raise NoWayBack(
                f"the letter holds the messages of offsets {letter.offset}-{letter.last_offset} one per line: "
                "re-read them from the topic"
            )
        return OUTCOMES if letter.topic == outcomes_topic else CONVERSATIONS
    if letter.source == "otlp":
        if letter.reason != "occurred_in_future":
            raise NoWayBack("an OTLP request body cannot be re-sent from here: have the exporter send it again")
        return CONVERSATIONS  # the conversation its spans assembled, as Vigil's schema
    if letter.source == "replay":
        return CONVERSATIONS
    if letter.source in ("http", "demo"):  # demo traffic letters both its conversations and its outcomes
        if letter.query:  # the body of a ?format= request (OpenAI Agents spans have a type and no messages)
            return CONVERSATIONS
        return OUTCOMES if letter.reason in _OUTCOME_REASONS or _holds_outcomes(letter.raw) else CONVERSATIONS
    raise NoWayBack(f"no intake reads letters of source {letter.source!r}")


def _holds_outcomes(raw: bytes) -> bool:
    """Whether a body reads as outcomes: objects with a ``type`` and none of a conversation's ``messages``."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    items = data if isinstance(data, list) else [data]
    objects = [i for i in items if isinstance(i, dict)]
    return bool(objects) and all("type" in i and "messages" not in i for i in objects)


def refusal_text(answer: dict[str, Any]) -> str:
    """An intake's refusal in words, as a letter's own detail reads: each refused item's reason and each field's
    error (``item 0 schema_invalid: agent_id: ...; messages: ...``), or the body's (``malformed_json: ...``)."""
    refusal = answer.get("refusal")
    if not isinstance(refusal, dict):
        return str(answer.get("detail", ""))
    items = []
    for item in refusal.get("errors") or []:
        if not isinstance(item, dict):
            continue
        fields = "; ".join(
            f"{e.get('field')}: {e.get('message')}" if e.get("field") else str(e.get("message"))
            for e in item.get("errors") or []
            if isinstance(e, dict)
        )
        said = f"item {item.get('index')} {item.get('reason')}" + (f": {fields}" if fields else "")
        items.append(said + (f" ({item['hint']})" if item.get("hint") else ""))
    if items:
        why = " | ".join(items)
    elif refusal.get("reason") or refusal.get("detail"):
        why = ": ".join(str(refusal[k]) for k in ("reason", "detail") if refusal.get(k))
    else:
        why = orjson.dumps(refusal).decode()
    return f"The {answer.get('intake', 'its')} intake refused it again: {why}"


def recorded_params(query: str | None) -> dict[str, str]:
    """The query parameters a letter records (``query``), or :class:`NoWayBack` when they cannot be read back:
    each named once, as ``name=value`` (the intake checks the names and values)."""
    if not query:
        return {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True, max_num_fields=8)
    except ValueError as exc:
        raise NoWayBack(f"its recorded query {query[:200]!r} cannot be read ({exc})") from None
    params = dict(pairs)
    if len(params) < len(pairs):
        raise NoWayBack(f"its recorded query {query[:200]!r} names a parameter twice (format, say)")
    return params


def replay_letter(rt: Runtime, letter_id: int, fmt: str | None, intake: str | None) -> tuple[int, dict[str, Any]]:
    """Re-send one letter (runs in a worker thread): (status, answer). Read with the query parameters it
    records when it goes back through the intake it came in by, ``fmt`` over its format."""
    with rt.sessions() as s:
        letter = s.get(DeadLetterRow, letter_id)
        if letter is None:
            return 404, {"detail": f"no dead letter {letter_id}"}
        s.expunge(letter)
    where = {"id": letter.id, "source": letter.source, "reason": letter.reason}
    try:
        found = intake_of(letter, rt.settings.kafka_outcomes_topic)
        chosen = intake or found
        # another intake's parameters mean nothing to this one
        recorded = recorded_params(letter.query) if chosen == found else {}
    except NoWayBack as exc:
        return 409, {**where, "detail": str(exc), "reason": "not_replayable"}
    replayer = rt.hooks.replayers.get(chosen)
    if replayer is None:
        return 409, {**where, "detail": f"the {chosen} intake is not wired in this process", "reason": "not_replayable"}
    given = {} if fmt is None else {"format": fmt}
    try:
        status, answer = replayer(letter.raw, {**recorded, **given})
    except BadParameter as exc:
        if exc.name in given:
            bad = {"detail": f"{exc.name}: {exc}", "reason": "bad_parameter", "parameter": exc.name}
            return 422, {**where, "intake": chosen, **bad}
        why = f"its recorded query parameter {exc.name} cannot be used: {exc}"
        return 409, {**where, "intake": chosen, "detail": why, "reason": "not_replayable"}
    if status >= 300:  # refused again: the letter stays as it was
        return 422, {**where, "intake": chosen, "detail": "the intake refused it again", "refusal": answer}
    with rt.sessions.begin() as s:
        now = write_clock(s)
        s.execute(update(DeadLetterRow).where(DeadLetterRow.id == letter.id).values(replayed_at=now))
    return 200, {**where, "intake": chosen, "replayed_at": aware(now).isoformat(), "result": answer}


@router.post(
    "/v1/dead-letters/{letter_id}/replay",
    dependencies=[require("admin")],
    responses={
        200: {"description": "Taken by its intake; the letter is marked replayed_at"},
        404: {"description": "No such dead letter"},
        409: {
            "description": "Cannot be re-sent: raw truncated, an OTLP body, several Kafka messages in one row, "
            "recorded query parameters its intake cannot read"
        },
        422: {
            "description": "Its intake refused it again (the refusal is in the answer; the letter is kept), or a "
            "?format= it does not read (reason bad_parameter, naming it)"
        },
    },
)
async def replay_dead_letter(
    request: Request,
    letter_id: int = PathParam(ge=1, le=MAX_ID),
    format: str | None = Query(
        None,
        max_length=64,
        description="Read the raw bytes in another format (as POST /v1/conversations?format=), over the one "
        "the letter's request named; native: Vigil's own schema, the letter's recorded parameters left out.",
    ),
    intake: str | None = Query(None, description="conversations or outcomes: overrides the intake found."),
) -> JSONResponse:
    if intake is not None and intake not in (CONVERSATIONS, OUTCOMES):
        raise HTTPException(422, f"intake must be {CONVERSATIONS} or {OUTCOMES}, not {intake!r}")
    status, answer = await run_in_threadpool(replay_letter, runtime_of(request), letter_id, format, intake)
    return JSONResponse(answer, status_code=status)
