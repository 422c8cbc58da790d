"""Request bodies read under a size limit, and a budget on the bytes every request holds at once.

A body is refused with 413 as soon as it is known to be too large (a ``Content-Length`` over the limit
before anything is read, or a chunked body the moment it crosses the limit), so nothing larger than
``VIGIL_MAX_REQUEST_BYTES`` is ever buffered. Every POST that takes a body also takes its size from a
shared byte budget (``VIGIL_MAX_INFLIGHT_BYTES``) before reading and gives it back once answered, so
concurrent large batches wait their turn instead of multiplying memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Request

from vigil.errors import VigilError

PREFIX_BYTES = 65_536  # of a body refused while reading, kept for its dead letter


class BodyTooLarge(VigilError):
    """A request body over the limit; ``prefix`` holds what was read of it (for a dead letter), ``read``
    whether any of it was (not when its ``Content-Length`` alone was over the limit), and ``kept`` says
    which, for a dead letter's detail. ``setting`` names the limit that applied."""

    def __init__(
        self,
        size: int | None,
        limit: int,
        prefix: bytes = b"",
        *,
        setting: str = "VIGIL_MAX_REQUEST_BYTES",
        read: bool = True,
    ) -> None:
        told = f"{size} bytes" if size is not None else "more bytes"
        super().__init__(f"request body of {told} exceeds the limit of {limit} bytes ({setting})")
        self.prefix = prefix
        self.size = size
        self.limit = limit
        self.setting = setting
        self.read = read

    @property
    def kept(self) -> str:
        if not self.read:
            return f"refused on its Content-Length of {self.size} bytes before any of it was read: no bytes kept"
        return f"refused while reading, once past {self.limit} bytes: the letter keeps the start of the body"


class EncodedBody(VigilError):
    """A body sent with a ``Content-Encoding`` (gzip, deflate, ...) to an endpoint that reads it as is."""

    def __init__(self, encoding: str) -> None:
        super().__init__(
            f"Content-Encoding {encoding[:40]!r} is not accepted here: send the body uncompressed "
            "(only the OTLP endpoints /v1/traces and /v1/logs take gzip)"
        )


def refused_encoding(request: Request) -> str | None:
    encoding = request.headers.get("content-encoding", "").strip().lower()
    return encoding if encoding not in ("", "identity") else None


class ByteBudget:
    """An asyncio semaphore counted in bytes. A single request never waits for more than the whole budget."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free = capacity
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        size = min(size, self.capacity)
        async with self._changed:
            await self._changed.wait_for(lambda: self.free >= size)
            self.free -= size
        try:
            yield
        finally:
            async with self._changed:
                self.free += size
                self._changed.notify_all()


def _budget(request: Request, capacity: int) -> ByteBudget:
    state = request.app.state
    budget = getattr(state, "body_budget", None)
    if budget is None:
        budget = state.body_budget = ByteBudget(capacity)
    return budget  # type: ignore[no-any-return]


def _declared(request: Request) -> int | None:
    value = request.headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else None


@asynccontextmanager
async def limited_body(
    request: Request, limit: int, inflight: int, *, encoded: bool = False, setting: str = "VIGIL_MAX_REQUEST_BYTES"
) -> AsyncIterator[bytes]:
    """The request body, read only up to ``limit`` bytes (the setting named ``setting``, for the 413's message);
    holds its size from the shared budget meanwhile.

    Unless the caller inflates bodies itself (``encoded``: OTLP, which bounds what it inflates), a
    compressed body is refused (:class:`EncodedBody`) before anything is read: decoding it as JSON
    would answer a misleading "not valid UTF-8"."""
    encoding = None if encoded else refused_encoding(request)
    if encoding is not None:
        raise EncodedBody(encoding)
    declared = _declared(request)
    if declared is not None and declared > limit:
        raise BodyTooLarge(declared, limit, setting=setting, read=False)
    async with _budget(request, inflight).hold(declared if declared is not None else limit):
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:  # the letter keeps the start of the body, the chunk that crossed the limit included
                prefix = b"".join(chunks)[:PREFIX_BYTES]
                raise BodyTooLarge(declared, limit, prefix + chunk[: PREFIX_BYTES - len(prefix)], setting=setting)
            chunks.append(chunk)
        yield b"".join(chunks)
