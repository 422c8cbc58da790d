"""Request bodies sent compressed (``Content-Encoding: gzip`` or ``deflate``), inflated under a bound.

A compressed body is inflated whole but never to more than the limit that applies to the body as read
(a bomb stops there: 413); a stream cut short, or followed by anything but another gzip member, is
refused (400): reading only what inflates would store part of a request and acknowledge all of it.
"""

from __future__ import annotations

import zlib

from vigil.errors import VigilError

INFLATABLE = ("gzip", "x-gzip", "deflate")
GZIP_MAGIC = b"\x1f\x8b"


class Undecodable(VigilError):
    """A body whose ``Content-Encoding`` cannot be undone: unknown (415), not valid or cut short (400), or
    inflating past the limit (413). ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
        self.body = b""  # the start of the body as sent, for a dead letter (set by the reader)


def encoding_of(value: str | None) -> str | None:
    """The body's encoding, lowercased; ``None`` for a body sent as is (absent or ``identity``)."""
    enc = (value or "").strip().lower()
    return None if enc in ("", "identity") else enc


def inflate(
    body: bytes | memoryview, encoding: str | None, limit: int, setting: str = "VIGIL_MAX_REQUEST_BYTES"
) -> bytes | memoryview:
    """``body`` as sent before ``encoding`` (a ``Content-Encoding`` value) was applied, at most ``limit``
    bytes (the setting named ``setting``, for the 413's message)."""
    enc = encoding_of(encoding)
    if enc is None:
        data = body
    elif enc in ("gzip", "x-gzip"):
        data = _inflate(body, limit, 16 + zlib.MAX_WBITS, "gzip", members=True, setting=setting)
    elif enc == "deflate":
        data = _inflate(body, limit, zlib.MAX_WBITS, "deflate", members=False, setting=setting)
    else:
        raise Undecodable(f"Content-Encoding {encoding!r} is not supported (gzip, deflate or none)", 415)
    if len(data) > limit:
        raise Undecodable(f"request body of {len(data)} bytes exceeds {limit} bytes ({setting})", 413)
    return data


def _inflate(
    body: bytes | memoryview, limit: int, wbits: int, name: str, *, members: bool, setting: str
) -> bytes | memoryview:
    """A compressed body inflated whole, never to more than ``limit`` bytes.

    gzip may hold several members one after the other (RFC 1952, as ``cat a.gz b.gz`` makes): each is
    read, under one bound for all."""
    parts: list[bytes] = []
    size = 0
    rest = body
    while True:
        decomp = zlib.decompressobj(wbits)
        try:
            out = decomp.decompress(rest, limit - size + 1)
        except zlib.error as exc:
            raise Undecodable(f"body is not valid {name}: {exc}") from exc
        size += len(out)
        if size > limit:
            raise Undecodable(f"decompressed body exceeds {limit} bytes ({setting})", 413)
        parts.append(out)
        if not decomp.eof:
            raise Undecodable(
                f"truncated {name} stream: the body ends before the end of the compressed data "
                f"(after {size} decompressed bytes)"
            )
        rest = decomp.unused_data
        if not rest or (members and not rest.strip(b"\0")):
            break
        if not (members and rest.startswith(GZIP_MAGIC)):
            raise Undecodable(f"{name} stream is followed by {len(rest)} bytes that are not {name}")
    return parts[0] if len(parts) == 1 else b"".join(parts)


def reason_of(exc: Undecodable) -> str:
    """The ``reason`` an answer gives for ``exc``."""
    return {413: "oversized", 415: "unsupported_encoding"}.get(exc.status, "invalid_encoding")
