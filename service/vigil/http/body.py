"""Request bodies read under a size limit, and a budget on the bytes every request holds at once.

A body is refused with 413 as soon as it is known to be too large (a ``Content-Length`` over the limit
before anything is read, or a chunked body the moment it crosses the limit), so nothing larger than
``VIGIL_MAX_REQUEST_BYTES`` is ever buffered. Every POST that takes a body also takes its size from a
shared byte budget (``VIGIL_MAX_INFLIGHT_BYTES``) as it arrives and gives it back once answered, so
concurrent large batches wait their turn instead of multiplying memory. An endpoint that decodes its
body into objects holds what they take too (:func:`hold_decoded`) while it decodes, checks and stores.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool

from vigil.errors import VigilError
from vigil.http.encoding import INFLATABLE, Inflater, Undecodable

PREFIX_BYTES = 65_536  # of a body refused while reading, kept for its dead letter
POOL_BUFFERS = 4  # body buffers a process keeps for reuse (see BufferPool)
POOL_BUFFER_BYTES = 16_777_216  # a buffer grown past this is not kept (OTLP bodies are at most 16 MB by default)
OWN_LIMIT = "vigil.body_reader"  # scope key: the endpoint reads its body itself, under its own limit
LEASE = "vigil.body_lease"  # scope key: what a body holds of the budget (see inflate_held, hold_decoded)
ENCODED_BODIES = (
    "JSON, sent as is or with Content-Encoding gzip (several members too), x-gzip or deflate: inflated to at "
    "most VIGIL_MAX_REQUEST_BYTES (413 past it), its inflated bytes held from VIGIL_MAX_INFLIGHT_BYTES; "
    "another encoding is a 415"
)  # the request body's description in the API document, for the endpoints that read theirs with limited_body


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
    def sent(self) -> int:
        """The body's size as far as known, for its dead letter's ``raw_size``: its ``Content-Length``, else
        more than the limit; never ``len(prefix)``, which would read as the whole body (and be replayed as it)."""
        return max(self.size if self.size is not None else self.limit + 1, len(self.prefix) + 1)

    @property
    def kept(self) -> str:
        if not self.read:
            return f"refused on its Content-Length of {self.size} bytes before any of it was read: no bytes kept"
        return f"refused while reading, once past {self.limit} bytes: the letter keeps the start of the body"


class EncodedBody(VigilError):
    """A body sent with a ``Content-Encoding`` the endpoint cannot undo (brotli, zstd, ...)."""

    def __init__(self, encoding: str) -> None:
        super().__init__(
            f"Content-Encoding {encoding[:40]!r} is not accepted here: send the body as gzip, deflate or uncompressed"
        )


def refused_encoding(request: Request) -> str | None:
    encoding = request.headers.get("content-encoding", "").strip().lower()
    return encoding if encoding not in ("", "identity") else None


class IngestBusy(VigilError):
    """Bodies still arriving hold the whole byte budget and each waits for more of it: no one of them can
    finish. The youngest is refused (503, retry later) so the others can; nothing of it was stored."""

    def __init__(self, capacity: int) -> None:
        super().__init__(
            f"request bodies still arriving hold all {capacity} bytes of VIGIL_MAX_INFLIGHT_BYTES and each "
            "needs more: this one was refused so the others can finish; nothing of it was stored, send it again"
        )


class Lease:
    """What one request body holds of a :class:`ByteBudget`: it grows as the body arrives."""

    __slots__ = ("budget", "ceiling", "decoding", "held", "order", "waiting")

    def __init__(self, budget: ByteBudget, ceiling: int, order: int) -> None:
        self.budget = budget
        self.ceiling = ceiling  # the most it will need: the declared length, or else the size limit
        self.held = 0
        self.order = order
        self.waiting = False
        self.decoding = False  # read whole, and holding what its decoded objects take

    async def cover(self, size: int) -> None:
        """Hold at least ``size`` bytes (what has arrived so far), a step ahead where the budget allows."""
        if size > self.held:
            await self.budget._take(self, size)

    async def decode(self, size: int) -> None:
        """Hold ``size`` bytes in all (at most the whole budget) while the body is decoded: waits while
        other bodies being decoded hold what it needs, never for bodies still arriving (a stalled body
        holding a little of the budget must not stop every decode), so it may take more than is free."""
        await self.budget._take_decoded(self, max(self.held, min(size, self.budget.capacity)))

    async def keep(self, size: int) -> None:
        """Hold only ``size`` bytes from now on, giving back the rest (a compressed body, once inflated)."""
        if size < self.held:
            budget = self.budget
            async with budget._changed:
                budget.free += self.held - size
                self.held = size
                budget._changed.notify_all()


class ByteBudget:
    """An asyncio semaphore counted in bytes, taken as each body arrives.

    A body holds what it has received, a step ahead, not the length it declared: a client declaring 32
    MiB and sending a byte a second held half the default budget for hours, and two stalled all ingest.
    When every body holding bytes waits for more (together they declared more than the budget) none
    could finish; the youngest is then refused with :class:`IngestBusy`. A body that is alone may grow
    past the budget (it never waits for more than the whole of it). A body read whole and being decoded
    (:meth:`Lease.decode`) holds what its objects take as well, at most the whole budget; it waits only
    for other decoding bodies, so at most one takes more than is free at any moment."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free = capacity
        self.step = max(65_536, min(1_048_576, capacity // 16))
        self._leases: set[Lease] = set()
        self._order = 0
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def lease(self, ceiling: int) -> AsyncIterator[Lease]:
        self._order += 1
        lease = Lease(self, ceiling, self._order)
        self._leases.add(lease)
        try:
            yield lease
        finally:
            self._leases.discard(lease)
            if lease.held:
                async with self._changed:
                    self.free += lease.held
                    lease.held = 0
                    self._changed.notify_all()

    def _alone(self, lease: Lease) -> bool:
        return not any(other.held for other in self._leases if other is not lease)

    def _others_decoding(self, lease: Lease) -> bool:
        return any(other.decoding and other.held for other in self._leases if other is not lease)

    def _stuck(self, lease: Lease) -> bool:
        """Every body holding bytes waits for more, and ``lease`` is the youngest of them."""
        holders = [other for other in self._leases if other.held]
        return (
            lease.held > 0
            and all(other.waiting for other in holders)
            and max(other.order for other in holders) == lease.order
        )

    async def _take(self, lease: Lease, size: int) -> None:
        need = size - lease.held
        ahead = min(size + self.step, max(size, lease.ceiling)) - lease.held
        async with self._changed:
            if self.free < need and not self._alone(lease):
                lease.waiting = True
                self._changed.notify_all()  # the others see whether everyone is waiting now
                try:
                    await self._changed.wait_for(lambda: self.free >= need or self._alone(lease) or self._stuck(lease))
                finally:
                    lease.waiting = False
                if self.free < need and not self._alone(lease):
                    raise IngestBusy(self.capacity)
            got = max(need, min(ahead, self.free))
            self.free -= got
            lease.held += got

    async def _take_decoded(self, lease: Lease, size: int) -> None:
        need = size - lease.held
        async with self._changed:
            # not marked waiting: those decoding finish without waiting on anyone, so this wait ends and
            # bodies still arriving are not stuck behind it
            await self._changed.wait_for(lambda: self.free >= need or not self._others_decoding(lease))
            lease.decoding = True
            self.free -= need
            lease.held += need


class _Reader:
    own = False


class LimitBodies:
    """ASGI middleware: the body of a request to any endpoint but those reading theirs with
    :func:`limited_body` or :func:`pooled_body` (ingest, which keeps a dead letter of what it refuses) is
    refused with 413 past ``limit`` bytes, as it is read. FastAPI reads and decodes a JSON or form body
    whole before any dependency runs, the API key check included: a 200 MiB comment sent without a key
    took 750 MB of memory before its 401."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        reader = scope[OWN_LIMIT] = _Reader()
        declared = _content_length(scope)
        received = 0

        async def bounded() -> dict[str, Any]:
            nonlocal received
            message: dict[str, Any] = await receive()
            if reader.own or message["type"] != "http.request":
                return message
            received += len(message.get("body", b""))
            if max(received, declared or 0) > self.limit:
                told = f"{declared} bytes" if declared is not None else "more bytes"
                raise HTTPException(
                    413, f"request body of {told} exceeds the limit of {self.limit} bytes (VIGIL_MAX_REQUEST_BYTES)"
                )
            return message

        await self.app(scope, bounded, send)


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _own_limit(request: Request) -> None:
    reader = request.scope.get(OWN_LIMIT)
    if reader is not None:
        reader.own = True


def _budget(request: Request, capacity: int) -> ByteBudget:
    state = request.app.state
    budget = getattr(state, "body_budget", None)
    if budget is None:
        budget = state.body_budget = ByteBudget(capacity)
    return budget  # type: ignore[no-any-return]


def _declared(request: Request) -> int | None:
    value = request.headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else None


def _checked(request: Request, limit: int, encoded: bool, setting: str) -> int | None:
    """The body's declared length, after refusing before reading what its headers already rule out: a
    compressed body neither the caller nor :func:`limited_body` inflates, a declared length over ``limit``."""
    encoding = None if encoded else refused_encoding(request)
    if encoding is not None and encoding not in INFLATABLE:
        raise EncodedBody(encoding)
    declared = _declared(request)
    if declared is not None and declared > limit:
        raise BodyTooLarge(declared, limit, setting=setting, read=False)
    return declared


class BufferPool:
    """Buffers that large request bodies are read into, kept and reused from one request to the next.

    Joining a 10 MB body's chunks into one fresh ``bytes`` faults in and zero-fills its pages every
    time (the protobuf runtime hands freed heap back to the kernel every 10,000 frees, so the memory is
    rarely still mapped): measured, half the kernel's page zeroing on the OTLP path. A kept buffer's
    pages stay mapped. At most ``keep`` buffers of at most ``max_bytes`` each are kept (the largest
    resident cost is ``keep * max_bytes``, reached only after that many bodies of that size arrived at
    once); a buffer still referenced when its request ends (a view of it kept somewhere) is dropped,
    never reused, so no later body can overwrite what something still reads."""

    def __init__(self, keep: int = POOL_BUFFERS, max_bytes: int = POOL_BUFFER_BYTES) -> None:
        self.keep = keep
        self.max_bytes = max_bytes
        self._free: list[bytearray] = []
        self._lock = threading.Lock()  # test clients run apps on loops in other threads

    def take(self) -> bytearray:
        with self._lock:
            return self._free.pop() if self._free else bytearray()

    def give(self, buf: bytearray) -> None:
        if len(buf) > self.max_bytes:
            return
        try:  # resizing fails while any view of the buffer is alive: then it is not safe to reuse
            buf.append(0)
            del buf[-1]
        except BufferError:
            return
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buf)

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return sum(len(b) for b in self._free)


POOL = BufferPool()


@asynccontextmanager
async def limited_body(
    request: Request,
    limit: int,
    inflight: int,
    *,
    encoded: bool = False,
    setting: str = "VIGIL_MAX_REQUEST_BYTES",
) -> AsyncIterator[bytes]:
    """The request body, read only up to ``limit`` bytes (the setting named ``setting``, for the 413's message);
    holds what has arrived of it from the shared budget meanwhile (:class:`IngestBusy` if the bodies
    arriving at once could none of them finish).

    Unless the caller inflates bodies itself (``encoded``: OTLP, which bounds what it inflates), a body
    sent as gzip or deflate is inflated here (off the event loop), to at most ``limit`` bytes, and the
    inflated bytes are held from the budget too; one that cannot be undone is :class:`Undecodable` (its
    ``status`` says why). Another encoding is refused (:class:`EncodedBody`) before anything is read:
    decoding it as JSON would answer a misleading "not valid UTF-8"."""
    _own_limit(request)
    declared = _checked(request, limit, encoded, setting)
    encoding = None if encoded else refused_encoding(request)
    async with _budget(request, inflight).lease(declared if declared is not None else limit) as lease:
        request.scope[LEASE] = lease
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:  # the letter keeps the start of the body, the chunk that crossed the limit included
                prefix = b"".join(chunks)[:PREFIX_BYTES]
                raise BodyTooLarge(declared, limit, prefix + chunk[: PREFIX_BYTES - len(prefix)], setting=setting)
            chunks.append(chunk)
            await lease.cover(size)
        body = b"".join(chunks)
        if encoding is None:
            yield body
            return
        del chunks
        data = await _inflated(lease, body, encoding, limit, setting)
        del body
        await lease.keep(len(data))
        yield data


async def hold_decoded(request: Request, size: int) -> None:
    """For an endpoint that decodes the body it read with :func:`limited_body` or :func:`pooled_body` into
    objects: hold ``size`` bytes of the budget in all, the body's own included (at most the whole budget),
    until it is answered. Waits while other bodies being decoded hold what it needs; a body decoded alone
    always goes ahead."""
    lease: Lease = request.scope[LEASE]
    await lease.decode(size)


async def inflate_held(request: Request, body: memoryview, encoding: str, limit: int, setting: str) -> bytes:
    """For an endpoint that inflates the body it read with :func:`pooled_body` itself (``encoded``: OTLP):
    ``body`` inflated as :func:`limited_body` inflates, its inflated bytes held from the same lease as the
    compressed body, which the caller still holds."""
    lease: Lease = request.scope[LEASE]
    data = await _inflated(lease, body, encoding, limit, setting)
    await lease.keep(len(body) + len(data))
    return data


async def _inflated(lease: Lease, body: bytes | memoryview, encoding: str, limit: int, setting: str) -> bytes:
    """``body`` inflated off the event loop a step at a time, never past ``limit`` bytes, each step's
    bytes taken from the budget before they are made (waiting, or :class:`IngestBusy`, as a body still
    arriving does): inflated whole before they were counted, 40 bombs of 32 KB each sent at once held
    2.1 GB where ``VIGIL_MAX_INFLIGHT_BYTES`` is 64 MiB. (Joining the steps' parts copies them for a
    moment, as joining a body's chunks does, uncounted.) An :class:`Undecodable` body's error keeps its
    start, for a dead letter."""
    inflater = Inflater(body, encoding, limit, setting)
    parts: list[bytes] = []
    total = 0
    try:
        while not inflater.done:
            want = min(lease.budget.step, limit - total + 1)
            await lease.cover(len(body) + total + want)
            part = await run_in_threadpool(inflater.read, want)
            parts.append(part)
            total += len(part)
    except Undecodable as exc:
        parts.clear()  # not kept alive by the error's frames while its dead letter is stored
        exc.body, exc.sent, exc.encoding = bytes(body[:PREFIX_BYTES]), len(body), encoding
        raise
    finally:
        inflater.close()
    if len(parts) <= 1:
        return parts[0] if parts else b""
    data = b"".join(parts)
    parts.clear()
    return data


@asynccontextmanager
async def pooled_body(
    request: Request, limit: int, inflight: int, *, encoded: bool = False, setting: str = "VIGIL_MAX_REQUEST_BYTES"
) -> AsyncIterator[memoryview]:
    """As :func:`limited_body`, but the body is a read-only ``memoryview`` of a buffer from :data:`POOL`,
    valid only inside the ``async with``: the caller copies (``bytes(body)``) anything it keeps beyond
    it, and hands the view only to readers that copy what they take (protobuf's and orjson's parsers
    do)."""
    _own_limit(request)
    declared = _checked(request, limit, encoded, setting)
    async with _budget(request, inflight).lease(declared if declared is not None else limit) as lease:
        request.scope[LEASE] = lease
        buf = POOL.take()
        try:
            size = 0
            async for chunk in request.stream():
                end = size + len(chunk)
                if end > limit:
                    prefix = bytes(buf[: min(size, PREFIX_BYTES)])
                    raise BodyTooLarge(declared, limit, prefix + chunk[: PREFIX_BYTES - len(prefix)], setting=setting)
                buf[size:end] = chunk  # past the buffer's end this grows it
                size = end
                await lease.cover(size)
            with memoryview(buf) as whole:
                view = whole[:size].toreadonly()
            try:
                yield view
            finally:
                view.release()
        finally:
            POOL.give(buf)
