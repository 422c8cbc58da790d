"""Decode stage: raw bytes to a validated :class:`Conversation`, or a :class:`DecodeError`."""

from __future__ import annotations

import re

from pydantic import ValidationError

from vigil.errors import VigilError
from vigil.schema import Conversation


class DecodeError(VigilError):
    """A message that cannot become a conversation. ``reason`` is a bounded label value."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def describe_validation_error(exc: ValidationError, limit: int = 5) -> str:
    parts = []
    for err in exc.errors()[:limit]:
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - limit
    if more > 0:
        parts.append(f"... and {more} more")
    return "; ".join(parts)


# A JSON-escaped NUL (not one preceded by an escaping backslash). Postgres text cannot hold NUL, so it
# becomes U+FFFD rather than making the whole conversation unstorable.
_ESCAPED_NUL = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")


def strip_nul(raw: bytes) -> bytes:
    return _ESCAPED_NUL.sub(rb"\1\\ufffd", raw) if b"\\u0000" in raw else raw


def decode_conversation(raw: bytes | str, max_bytes: int) -> Conversation:
    """Validate one JSON conversation; raises DecodeError with a bounded ``reason``."""
    size = len(raw)
    if size > max_bytes:
        raise DecodeError("oversized", f"{size} bytes exceeds the limit of {max_bytes}")
    if isinstance(raw, str):
        raw = raw.encode()
    raw = strip_nul(raw)
    try:
        return Conversation.model_validate_json(raw)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise DecodeError("malformed_json", describe_validation_error(exc)) from None
        raise DecodeError("schema_invalid", describe_validation_error(exc)) from None
