"""Decode stage: raw bytes to a validated :class:`Conversation`, or a per-item :class:`DecodeError`.

One decoder for every way in (HTTP, Kafka, OTLP, replay, simulate), with the same rules:

* JSON is strict (orjson's grammar): ``NaN``, ``Infinity`` and numbers too large for a double are
  refused (``non_finite_number``), as is a lone UTF-16 surrogate such as ``"\\ud800"``
  (``invalid_unicode``). In a batch only the item holding one is refused, never the whole batch.
* An escaped NUL (``\\u0000``) becomes U+FFFD: Postgres text cannot hold NUL.
* A conversation larger than ``VIGIL_MAX_MESSAGE_BYTES`` is refused (``oversized``), and so is one message
  that would decode to more than ``VIGIL_MAX_JSON_EXPANSION`` times its size.
* Otherwise the document must validate against the schema (``schema_invalid``).
* No time in it (``started_at``, ``ended_at``, ``updated_at``, a message's ``timestamp``, an inline outcome's
  ``occurred_at``) may lie more than ``FUTURE_ALLOWANCE`` (5 minutes) ahead of the database's clock (the
  runtime's ``FutureBound``), read once a batch and passed as ``latest`` (``occurred_in_future``): as
  ``POST /v1/outcomes`` refuses an outcome.
* Integers keep their exact value, also beyond 64 bits (rules see ``2**70 + 1``, not the nearest double).

Whatever passes can be stored and read back by every reader (the stored document is strict JSON).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from vigil.errors import VigilError
from vigil.schema import (
    INCOMING,
    UNSTORABLE,
    Conversation,
    LatestAllowed,
    conversation_in_future,
    item_raw,
    lenient_loads,
    loads_exact,
    too_dense,
    unstorable,
)

# Every reason a message or an item can be refused with; metric labels never take other values.
REASONS = (
    "empty",
    "oversized",
    "batch_too_large",
    "malformed_json",
    "non_finite_number",
    "invalid_unicode",
    "schema_invalid",
    "occurred_in_future",
)


class DecodeError(VigilError):
    """A message that cannot become a conversation. ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str, errors: list[dict[str, str]] | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.errors = errors if errors is not None else [{"field": "(root)", "message": detail}]


def describe_validation_error(exc: ValidationError, limit: int = 5) -> str:
    parts = []
    for err in exc.errors()[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - limit
    if more > 0:
        parts.append(f"... and {more} more")
    return "; ".join(parts)


def field_errors(exc: ValidationError, limit: int = 20) -> list[dict[str, str]]:
    return [
        {"field": ".".join(str(p) for p in e["loc"]) or "(root)", "message": e["msg"]} for e in exc.errors()[:limit]
    ]


# A JSON-escaped NUL (not one preceded by an escaping backslash). Postgres text cannot hold NUL, so it
# becomes U+FFFD rather than making the whole conversation unstorable.
_ESCAPED_NUL = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")


def strip_nul(raw: bytes) -> bytes:
    return _ESCAPED_NUL.sub(rb"\1\\ufffd", raw) if b"\\u0000" in raw else raw


def _refusal(obj: Any) -> DecodeError | None:
    found = unstorable(obj)
    if found is None:
        return None
    reason, where = found
    message = UNSTORABLE[reason]
    return DecodeError(reason, f"{where}: {message}", [{"field": where, "message": message}])


def _parse(raw: bytes) -> Any:
    """Strict JSON; a refusal names its reason (and the field, when the lenient parser can find it)."""
    try:
        return loads_exact(raw)
    except orjson.JSONDecodeError as exc:
        strict_error = str(exc)
    try:
        refusal = _refusal(lenient_loads(raw))
    except (ValueError, RecursionError):
        refusal = None
    if refusal is not None:
        raise refusal from None
    raise DecodeError("malformed_json", strict_error) from None


def validate(obj: Any, latest: LatestAllowed | None = None) -> Conversation:
    """The schema check of one item, given as what the strict parser made of its bytes, and (``latest``
    given) the check that none of its times is later than that (:class:`vigil.schema.FutureBound`).

    The strict parse has to build the objects anyway; validating them is 30% cheaper on a 31 kB
    conversation than having pydantic parse the same bytes a second time (the strings, the tool
    schemas and the metadata are then built twice).
    """
    try:
        conversation = Conversation.model_validate(obj, context=INCOMING)
    except ValidationError as exc:
        raise DecodeError("schema_invalid", describe_validation_error(exc), field_errors(exc)) from None
    if latest is not None:
        check_times(conversation, latest, obj)
    return conversation


def check_times(conversation: Conversation, latest: LatestAllowed, document: Any = None) -> None:
    """Raise ``occurred_in_future`` naming the times of ``conversation`` later than ``latest`` (the first 20)."""
    errors, found = conversation_in_future(conversation, latest, document)
    if found:
        detail = "; ".join(e["message"] for e in errors[:5])
        more = found - 5
        raise DecodeError("occurred_in_future", detail + (f"; ... and {more} more" if more > 0 else ""), errors)


def _sized(raw: bytes, max_bytes: int) -> bytes:
    if len(raw) > max_bytes:
        detail = f"{len(raw)} bytes exceeds the limit of {max_bytes}"
        raise DecodeError("oversized", detail)
    return strip_nul(raw)


def decode_document(
    raw: bytes | str, max_bytes: int, max_expansion: float = 0.0, latest: LatestAllowed | None = None
) -> tuple[Conversation, bytes]:
    """Validate one JSON conversation; returns it with the bytes to store. Raises DecodeError. ``latest``: the
    latest time it may carry (:class:`vigil.schema.FutureBound`, read once a batch); None checks none.

    ``max_expansion`` (``VIGIL_MAX_JSON_EXPANSION``) refuses a message that would decode to more than that
    many times its size (``oversized``), as the API refuses such a body: a consumer holds a whole batch of
    decoded messages, and one of 1 MB of empty arrays held 20 MB decoded (a batch of 500 of them 10 GB)."""
    if isinstance(raw, str):
        try:
            raw = raw.encode()
        except UnicodeEncodeError:
            raise DecodeError("invalid_unicode", UNSTORABLE["invalid_unicode"]) from None
    if not raw or raw.isspace():  # a Kafka tombstone (null value) or a blank message: nothing to parse
        raise DecodeError("empty", "empty message; a conversation is a JSON object")
    raw = _sized(raw, max_bytes)
    why = too_dense(raw, max_expansion, what="message", advice="send fewer values per conversation")
    if why is not None:
        raise DecodeError("oversized", why)
    return validate(_parse(raw), latest), raw


def decode_conversation(raw: bytes | str, max_bytes: int) -> Conversation:
    """Validate one JSON conversation; raises DecodeError with a bounded ``reason``."""
    return decode_document(raw, max_bytes)[0]


def encode_conversation(conversation: Conversation) -> bytes:
    """A conversation built in code (replay, OTLP, simulate) as the JSON the decoder then checks.

    Non-finite floats are written as ``NaN``/``Infinity`` so the decoder refuses them by name rather
    than silently storing null; a lone surrogate cannot be encoded at all (``invalid_unicode``).
    """
    try:
        return conversation.model_dump_json(exclude_none=True).encode()
    except PydanticSerializationError as exc:
        if "surrogates not allowed" in str(exc):
            raise DecodeError("invalid_unicode", UNSTORABLE["invalid_unicode"]) from None
        raise DecodeError("schema_invalid", str(exc)) from None


@dataclass(slots=True)
class Item:
    """One item of a batch: its conversation and stored bytes, or why it was refused (and its raw bytes)."""

    index: int
    raw: bytes
    conversation: Conversation | None = None
    error: DecodeError | None = None


@dataclass(slots=True)
class Batch:
    """A decoded request body: one object or an array of them."""

    single: bool
    items: list[Item] = field(default_factory=list)

    def valid(self) -> Iterator[Item]:
        return (i for i in self.items if i.conversation is not None)

    def invalid(self) -> Iterator[Item]:
        return (i for i in self.items if i.error is not None)


def decode_batch(body: bytes, max_bytes: int, max_items: int, latest: LatestAllowed | None = None) -> Batch:
    """Split a request body into items and decode each with the rules above (``latest`` as for
    :func:`decode_document`).

    Raises DecodeError only when the body as a whole is unreadable (``empty``, ``malformed_json``,
    ``batch_too_large``); everything else is per item.
    """
    if not body.strip():
        raise DecodeError("empty", "empty body; send a conversation object or an array of them")
    try:
        payload = loads_exact(body)
        lenient = False
    except orjson.JSONDecodeError as exc:
        try:
            payload = lenient_loads(body)
        except (ValueError, RecursionError):
            raise DecodeError("malformed_json", f"body is not JSON: {exc}") from None
        lenient = True
    single = not isinstance(payload, list)
    objects: list[Any] = [payload] if single else payload
    if len(objects) > max_items:
        raise DecodeError("batch_too_large", f"batch of {len(objects)} exceeds {max_items} items; split it")
    batch = Batch(single)
    for index, obj in enumerate(objects):
        refusal = _refusal(obj) if lenient else None
        # a single object keeps the exact bytes received; batch items are re-encoded one by one
        raw = body if single and not lenient else item_raw(obj)
        if refusal is not None:
            batch.items.append(Item(index, raw, error=refusal))
            continue
        try:
            stored = _sized(raw, max_bytes)
            # what the parser made of the body, unless the stored bytes differ (an escaped NUL replaced)
            raw, parsed = stored, (obj if stored is raw else loads_exact(stored))
            batch.items.append(Item(index, raw, validate(parsed, latest)))
        except DecodeError as exc:
            batch.items.append(Item(index, raw, error=exc))
    return batch
