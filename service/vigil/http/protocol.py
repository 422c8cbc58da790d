"""The HTTP/1.1 connection of ``vigil serve``: uvicorn's own (httptools) with the limits it lacks on how
a client sends its request.

Uvicorn bounds neither the size of a request's head (request line and headers) nor the time a client
takes to send it or its body: its keep-alive timeout is armed only after a response and cancelled by any
byte received. Measured on ``vigil serve`` without a key: 2,000 connections sending a header line every
10 s were all still open after 60 s (each holds a file descriptor until the process has none left), and
one header value of 96 MiB froze the event loop (httptools joins a value's pieces in quadratic time:
74 CPU seconds for 256 MiB; cheap reads went from 3 ms to 1.2 s p50 meanwhile).

Here a connection must send its head within :data:`HEAD_SECONDS` of its first byte (or of opening) and
in at most :data:`HEAD_BYTES` (else 408 or 431, and the connection closes); a body must keep arriving:
no pause over :data:`BODY_IDLE_SECONDS` and on average :data:`BODY_MIN_RATE` bytes a second after
:data:`BODY_GRACE_SECONDS` (Apache's ``mod_reqtimeout`` defaults). Time the server itself is not reading
(flow control: the app has not taken what it was sent) is never counted against the client.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from vigil.http.proxy_auth import PEER_SCOPE_KEY

log = logging.getLogger(__name__)

HEAD_BYTES = 65_536  # request line and headers; a bearer key, a session cookie and a query fit many times
HEAD_SECONDS = 20.0
BODY_IDLE_SECONDS = 30.0
BODY_GRACE_SECONDS = 20.0
BODY_MIN_RATE = 500.0  # bytes a second: far below any real uplink


@dataclass(frozen=True)
class Limits:
    head_bytes: int = HEAD_BYTES
    head_seconds: float = HEAD_SECONDS
    body_idle_seconds: float = BODY_IDLE_SECONDS
    body_grace_seconds: float = BODY_GRACE_SECONDS
    body_min_rate: float = BODY_MIN_RATE


class _TimedFlow(FlowControl):
    """Uvicorn's flow control, also counting how long reading has been paused."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(transport)
        self._loop = loop
        self._paused_at = 0.0
        self._paused_before = 0.0
        self.resumed_at = 0.0

    def pause_reading(self) -> None:
        if not self.read_paused:
            self._paused_at = self._loop.time()
        super().pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.resumed_at = self._loop.time()
            self._paused_before += self.resumed_at - self._paused_at
        super().resume_reading()

    def paused_seconds(self) -> float:
        """Seconds reading has been paused since the connection opened (the current pause included)."""
        now = self._loop.time()
        return self._paused_before + (now - self._paused_at if self.read_paused else 0.0)


class GuardedHttpProtocol(HttpToolsProtocol):
    """Uvicorn's httptools protocol with :class:`Limits` on a request's head and body (see the module)."""

    limits = Limits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._in_head = True
        self._head_bytes = 0
        self._started = 0.0
        self._paused_at_start = 0.0
        self._body_bytes = 0
        self._body_seen = 0.0
        self._timed: _TimedFlow | None = None
        # the client asked for our "100 Continue" and no check has counted from it yet (see _expired)
        self._continue_seen = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = self._timed = _TimedFlow(transport, self.loop)
        self._start_head()  # a connection that never sends a byte is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # the head is fed at most up to its limit: httptools would buffer (and copy) all of it first
        while self._in_head and data and not self.transport.is_closing():
            room = self.limits.head_bytes - self._head_bytes
            if room <= 0:
                self._refuse(431, f"request line and headers over {self.limits.head_bytes} bytes")
                return
            if self._timer is None:
                self._start_head()
            piece, data = data[:room], data[room:]
            self._head_bytes += len(piece)
            super().data_received(piece)
        if data and not self.transport.is_closing():
            super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # the socket's own peer, before uvicorn's proxy-headers middleware replaces the scope's client with
        # X-Forwarded-For: the sign-in proxy's header is trusted by this address only (vigil.http.proxy_auth)
        self.scope[PEER_SCOPE_KEY] = self.client[0] if self.client else None  # type: ignore[literal-required]

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm()
        self._started = self.loop.time()
        self._paused_at_start = self._paused()
        self._body_bytes = 0
        self._body_seen = self._started
        # the 100 may go out before the first check (the app reads within the first period): that check
        # starts the clock too, else it counts from the head and cuts off a client given little time
        self._continue_seen = self.expect_100_continue
        self._arm(self._deadline() - self._started)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        self._body_seen = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head = True
        self._head_bytes = 0
        super().on_message_complete()

    def _start_head(self) -> None:
        self._started = self.loop.time()
        self._paused_at_start = self._paused()
        self._arm(self.limits.head_seconds)

    def _paused(self) -> float:
        return self._timed.paused_seconds() if self._timed is not None else 0.0

    def _deadline(self) -> float:
        lim = self.limits
        paused = self._paused() - self._paused_at_start
        if self._in_head:
            return self._started + paused + lim.head_seconds
        resumed = self._timed.resumed_at if self._timed is not None else 0.0
        idle = max(self._body_seen, resumed) + lim.body_idle_seconds
        rate = self._started + paused + lim.body_grace_seconds + self._body_bytes / lim.body_min_rate
        return min(idle, rate)

    def _arm(self, delay: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(max(delay, 0.01), self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        waiting = not self._in_head and cycle is not None and cycle.waiting_for_100_continue
        # answered without its body read (a 401, say), the client is owed no more time for it
        answered = cycle is not None and cycle.response_started
        if waiting or (self._continue_seen and not self._in_head and not answered):
            # the client waits for our "100 Continue", which goes out once the app reads: its time starts then.
            # The first check after it went out starts the clock (the moment it went out is not known, and
            # counting from an earlier check would cut off a client that had had less than its full time)
            self._continue_seen = waiting
            self._started = self.loop.time()
            self._paused_at_start = self._paused()
            if self._body_bytes == 0:
                self._body_seen = self._started
            self._arm(self.limits.body_grace_seconds if waiting else self._deadline() - self._started)
            return
        if self.flow.read_paused or (self._in_head and cycle is not None and not cycle.response_complete):
            # the server is not reading, or is still answering the previous request
            self._arm(self.limits.head_seconds if self._in_head else self.limits.body_idle_seconds)
            return
        left = self._deadline() - self.loop.time()
        if left > 0:
            self._arm(left)
            return
        what = "request line and headers" if self._in_head else "request body"
        self._refuse(408, f"the {what} did not arrive in time")

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` unless a response has begun, and close the connection."""
        self._disarm()
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "client"
        log.info("closed %s: %s", client, message)
        if self.cycle is None or not self.cycle.response_started:
            phrase = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}[status]
            body = message.encode("ascii")
            self.transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n%s" % (status, phrase, len(body), body)
            )
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app's receive() answers http.disconnect
            self.cycle.message_event.set()
        self.transport.close()
