"""Clients that send their request slowly, or a head too large, are cut off (uvicorn alone kept them: a
connection sending a header line every 10 s stayed open for good, and a 96 MiB header value froze the
event loop for seconds), while clients the server itself keeps waiting are not."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn

from tests.support.services import free_port, wait_port
from tests.support.waiting import scaled, wait_for
from vigil.http.protocol import GuardedHttpProtocol, Limits

# a second each, times VIGIL_TEST_TIME_SCALE: on a machine whose every core is busy (CI) a client the test
# drives may itself be late by more than a second, and the tests that must not be cut off would be
SHORT = Limits(
    head_bytes=16_384,
    head_seconds=scaled(1.0),
    body_idle_seconds=scaled(1.0),
    body_grace_seconds=scaled(1.0),
    body_min_rate=1000,
)


class ShortProtocol(GuardedHttpProtocol):
    limits = SHORT


async def echo_size(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers the size of the body; ``/slow`` first keeps the client waiting three idle periods."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(3 * SHORT.body_idle_seconds)
    elif scope["path"] == "/between":  # reads between two of the server's checks on the waiting client
        await asyncio.sleep(1.5 * SHORT.body_idle_seconds)
    elif scope["path"] == "/early":  # reads before the server's first check on the waiting client
        await asyncio.sleep(0.6 * SHORT.body_idle_seconds)
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = str(size).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@contextmanager
def served() -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(echo_size, host="127.0.0.1", port=port, http=ShortProtocol, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert wait_port(port), "uvicorn did not start"
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def read_until_closed(sock: socket.socket, keep_sending: bytes = b"") -> bytes:
    """What the server sends until it closes the connection; ``keep_sending`` goes out between reads."""
    sock.settimeout(0.2)
    got = b""
    deadline = time.monotonic() + scaled(20)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            if keep_sending:
                try:
                    sock.sendall(keep_sending)
                except OSError:
                    return got
            continue
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk
    raise AssertionError(f"the connection is still open after {scaled(20):.0f} s; received {got[:200]!r}")


@pytest.fixture
def port() -> Iterator[int]:
    with served() as p:
        yield p


def test_a_connection_that_sends_nothing_is_closed(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        assert read_until_closed(s).startswith(b"HTTP/1.1 408 ")


def test_headers_trickled_forever_are_cut_off(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        assert read_until_closed(s, keep_sending=b"X-A: b\r\n").startswith(b"HTTP/1.1 408 ")


def test_a_head_over_the_limit_is_431_before_it_is_buffered(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (SHORT.head_bytes + 1))
        assert read_until_closed(s, keep_sending=b"a" * 65536).startswith(b"HTTP/1.1 431 ")


def test_a_body_trickled_forever_is_cut_off(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        assert read_until_closed(s, keep_sending=b"x").startswith(b"HTTP/1.1 408 ")


def test_ordinary_requests_pipelined_with_large_headers_and_bodies_pass(port: int) -> None:
    cookie = b"Cookie: " + b"c" * (SHORT.head_bytes // 2) + b"\r\n"
    body = b"b" * 300_000
    one = b"POST / HTTP/1.1\r\nHost: x\r\n" + cookie + b"Content-Length: %d\r\n\r\n" % len(body) + body
    last = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(one * 3 + last)
        got = read_until_closed(s)
    assert got.count(b"HTTP/1.1 200 ") == 4 and got.count(b"\r\n\r\n300000") == 3, got[:300]


def test_a_client_the_server_keeps_waiting_is_not_cut_off(port: int) -> None:
    # the app reads nothing for 3 idle periods: the server stops reading once it holds 64 KiB, and the
    # client, blocked meanwhile, is not the one late
    body = b"b" * 1_000_000
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"POST /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body))
        sender = threading.Thread(target=s.sendall, args=(body,), daemon=True)
        sender.start()
        got = read_until_closed(s)
        wait_for(lambda: not sender.is_alive(), timeout=10, what="the body sent")
    assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"1000000"), got[:300]


def test_serve_runs_uvicorn_with_the_guarded_protocol(monkeypatch: pytest.MonkeyPatch, sqlite_url: str) -> None:
    from typer.testing import CliRunner

    from vigil.app.cli import app

    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda application, **kwargs: seen.update(kwargs))
    monkeypatch.setenv("VIGIL_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("VIGIL_METRICS_PORT", "0")
    monkeypatch.setenv("VIGIL_OTLP_GRPC_PORT", "0")
    result = CliRunner().invoke(app, ["serve", "--no-workers", "--port", str(free_port())])
    assert result.exit_code == 0, result.output
    assert seen["http"] is GuardedHttpProtocol


def test_a_client_waiting_for_100_continue_is_not_cut_off(port: int) -> None:
    # /slow reads its body only after 3 idle periods: until then the client waits for "100 Continue"
    body = b"b" * 5000
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b"POST /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        s.settimeout(scaled(20))
        assert s.recv(64).startswith(b"HTTP/1.1 100 ")
        s.sendall(body)
        got = read_until_closed(s)
    assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"5000"), got[:300]


def given_continue(s: socket.socket, path: bytes, length: int) -> None:
    """Send a head asking ``path`` for "100 Continue", and wait for it."""
    s.sendall(
        b"POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nExpect: 100-continue\r\n"
        b"Content-Length: %d\r\n\r\n" % (path, length)
    )
    s.settimeout(scaled(20))
    assert s.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"


@pytest.mark.parametrize("path", [b"/between", b"/early"])
def test_a_client_given_100_continue_has_its_full_time_from_it(port: int, path: bytes) -> None:
    # /between: the server last looked at the waiting client one idle period in, and the app reads half a
    # period later; /early: the app reads before the server's first look. Either way "100 Continue" goes out
    # and the client takes a moment before its body. Its time starts at the 100 (the server once counted
    # from its last look, or from the head, and cut the client off at its next look, soon after the 100)
    body = b"b" * 5000
    with socket.create_connection(("127.0.0.1", port)) as s:
        given_continue(s, path, len(body))
        time.sleep(0.7 * SHORT.body_idle_seconds)  # the client's own pause, inside its idle period
        s.sendall(body)
        got = read_until_closed(s)
    assert got.startswith(b"HTTP/1.1 200 ") and got.endswith(b"5000"), got[:300]


def test_a_client_given_100_continue_that_sends_nothing_is_still_cut_off(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        given_continue(s, b"/between", 5000)
        got = read_until_closed(s)
    assert got.startswith(b"HTTP/1.1 408 ") and got.endswith(b"the request body did not arrive in time"), got
