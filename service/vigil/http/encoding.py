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
FIRST_PIECE = 64  # compressed bytes a gzip member's (or deflate stream's) inflater is given first
LAST_PIECE = 1_048_576  # the most it is given at once: the piece doubles up to this while the member goes on


class Undecodable(VigilError):
    """A body whose ``Content-Encoding`` cannot be undone: unknown (415), not valid or cut short (400), or
    inflating past the limit (413). ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
        self.body = b""  # the start of the body as sent, for a dead letter (set by the reader)
        self.sent = 0  # the size of the body as sent (set by the reader)
        self.encoding = ""  # its Content-Encoding (set by the reader)

    @property
    def kept(self) -> str:
        """What a dead letter of the body keeps, for its detail: the letter's bytes are still compressed."""
        return (
            f"sent with Content-Encoding {self.encoding[:40]} ({self.sent} bytes): the letter keeps the start of "
            "the body as sent, still compressed"
        )


def encoding_of(value: str | None) -> str | None:
    """The body's encoding, lowercased; ``None`` for a body sent as is (absent or ``identity``)."""
    enc = (value or "").strip().lower()
    return None if enc in ("", "identity") else enc


def inflate(
    body: bytes | memoryview, encoding: str | None, limit: int, setting: str = "VIGIL_MAX_REQUEST_BYTES"
) -> bytes | memoryview:
    """``body`` as sent before ``encoding`` (a ``Content-Encoding`` value) was applied, at most ``limit``
    bytes (the setting named ``setting``, for the 413's message)."""
    if encoding_of(encoding) is None:
        if len(body) > limit:
            raise Undecodable(f"request body of {len(body)} bytes exceeds {limit} bytes ({setting})", 413)
        return body
    inflater = Inflater(body, encoding, limit, setting)
    try:
        return inflater.read(limit + 1)
    finally:
        inflater.close()


class Inflater:
    """A gzip or deflate body inflated a step at a time (:meth:`read`), never to more than ``limit``
    bytes in all: each step's output can be paid for before it is made.

    gzip may hold several members one after the other (RFC 1952, as ``cat a.gz b.gz`` makes): each is
    read, under one bound for all; gzip's zero padding may follow the last. zlib is given the body in
    pieces, the first of :data:`FIRST_PIECE` bytes for each member, doubling while the member goes on:
    at a member's end zlib copies whatever it was given past it, and given the whole rest of the body
    each time, 100,000 empty members (2 MB) took 10 s, growing with the square of their number."""

    def __init__(
        self, body: bytes | memoryview, encoding: str | None, limit: int, setting: str = "VIGIL_MAX_REQUEST_BYTES"
    ) -> None:
        enc = encoding_of(encoding)
        if enc in ("gzip", "x-gzip"):
            self._wbits, self._name, self._members = 16 + zlib.MAX_WBITS, "gzip", True
        elif enc == "deflate":
            # RFC 9110's deflate is a zlib stream; some clients send the bare deflate data without its header
            self._wbits, self._name, self._members = (
                zlib.MAX_WBITS if _zlib_header(bytes(body[:2])) else -zlib.MAX_WBITS,
                "deflate",
                False,
            )
        else:
            raise Undecodable(f"Content-Encoding {encoding!r} is not supported (gzip, deflate or none)", 415)
        self._view = memoryview(body)
        self._limit = limit
        self._setting = setting
        self._pos = 0  # the body's bytes before this were given to zlib (those still in ``_tail`` aside)
        self._tail = b""  # what zlib was given but has not read yet: its output filled the step
        self._piece = FIRST_PIECE
        self._decomp = zlib.decompressobj(self._wbits)
        self.size = 0  # inflated bytes so far
        # no bytes at all is an empty body whatever its header says (a client that compresses only bodies it
        # has still names the encoding), answered as one sent as is, not as a truncated stream
        self.done = not len(self._view)

    def read(self, most: int) -> bytes:
        """Up to ``most`` more inflated bytes, fewer only at the end (then :attr:`done`)."""
        parts: list[bytes] = []
        want = most
        while want > 0 and not self.done:
            out = self._step(want)
            if out:
                parts.append(out)
                want -= len(out)
                self.size += len(out)
                if self.size > self._limit:
                    raise Undecodable(f"decompressed body exceeds {self._limit} bytes ({self._setting})", 413)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        self._view.release()

    def _step(self, want: int) -> bytes:
        decomp = self._decomp
        if self._tail:
            data: bytes | memoryview = self._tail
        elif self._pos < len(self._view):
            data = self._view[self._pos : self._pos + self._piece]
            self._pos += len(data)
            self._piece = min(2 * self._piece, LAST_PIECE)
        else:
            data = b""  # all given: what zlib still holds, if anything
        try:
            out = decomp.decompress(data, want)
        except zlib.error as exc:
            raise Undecodable(f"body is not valid {self._name}: {exc}") from exc
        self._tail = decomp.unconsumed_tail
        if decomp.eof:
            self._pos -= len(decomp.unused_data)  # given past the member's end: read again, as what follows it
            self._tail = b""
            self._next()
        elif not out and not data:
            raise Undecodable(
                f"truncated {self._name} stream: the body ends before the end of the compressed data "
                f"(after {self.size} decompressed bytes)"
            )
        return out

    def _next(self) -> None:
        """After a member's end: the next member, the end (or gzip's zero padding), or bytes refused."""
        rest = self._view[self._pos :]
        if not rest or (self._members and rest[:2] == GZIP_MAGIC):
            if rest:
                self._decomp = zlib.decompressobj(self._wbits)
                self._piece = FIRST_PIECE
            else:
                self.done = True
            return
        if self._members and not bytes(rest).strip(b"\0"):
            self.done = True
            return
        raise Undecodable(f"{self._name} stream is followed by {len(rest)} bytes that are not {self._name}")


def _zlib_header(head: bytes) -> bool:
    """``head`` starts a zlib stream (RFC 1950: method 8, a header check that divides by 31)."""
    return len(head) == 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0


def reason_of(exc: Undecodable) -> str:
    """The ``reason`` an answer gives for ``exc``."""
    return {413: "oversized", 415: "unsupported_encoding"}.get(exc.status, "invalid_encoding")
