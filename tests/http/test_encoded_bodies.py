"""A body sent gzip or deflate to /v1/conversations or /v1/outcomes is inflated and stored as if sent as is
(it was refused with 415); one that inflates past VIGIL_MAX_REQUEST_BYTES, or is not valid, is refused and
kept as a dead letter; an encoding Vigil cannot undo is a 415 that names it (it used to be a 400 claiming
the body was "not valid UTF-8"), and leaves nothing."""

from __future__ import annotations

import gzip
import zlib

import orjson
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import ADMIN, make_client, make_settings
from vigil.app.runtime import build_runtime

CONV = {
    "conversation_id": "gz-1",
    "agent_id": "a",
    "agent_version": "v",
    "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
}
OUTCOME = {"conversation_id": "gz-1", "type": "thumbs_down", "idempotency_key": "k1"}
LIMIT = 200_000


@pytest.fixture
def rt(sqlite_url: str):  # type: ignore[no-untyped-def]
    rt = build_runtime(make_settings(sqlite_url, max_request_bytes=LIMIT), registry=CollectorRegistry())
    yield rt
    rt.close()


@pytest.fixture
def client(rt):  # type: ignore[no-untyped-def]
    with make_client(rt) as c:
        yield c


def _letters(client) -> list[dict]:  # type: ignore[no-untyped-def]
    r = client.get("/v1/dead-letters", headers=ADMIN)
    assert r.status_code == 200, r.text
    body = r.json()
    return body["items"] if isinstance(body, dict) else body


def _post(client, path: str, body: bytes, encoding: str | None = None):  # type: ignore[no-untyped-def]
    headers = {**ADMIN, "Content-Type": "application/json"}
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    return client.post(path, content=body, headers=headers)


def _raw_deflate(b: bytes) -> bytes:
    """Deflate data without zlib's header and checksum, as some clients send ``Content-Encoding: deflate``."""
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(b) + c.flush()


def _gzip_members(b: bytes) -> bytes:
    half = len(b) // 2
    return gzip.compress(b[:half]) + gzip.compress(b[half:])


@pytest.mark.parametrize(("path", "doc"), [("/v1/conversations", CONV), ("/v1/outcomes", OUTCOME)])
@pytest.mark.parametrize(
    ("encoding", "pack"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", _raw_deflate),
        ("GZIP", gzip.compress),
        ("x-gzip", _gzip_members),
    ],
)
def test_a_gzip_or_deflate_body_is_stored_as_if_sent_as_is(client, path, doc, encoding, pack) -> None:  # type: ignore[no-untyped-def]
    r = _post(client, path, pack(orjson.dumps(doc)), encoding)
    assert r.status_code == 202, r.text
    assert r.json()["stored"] == 1
    again = _post(client, path, orjson.dumps(doc))  # the same, sent as is: already there
    assert again.status_code == 202 and again.json()["stored"] == 0 and again.json()["duplicates"] == 1


@pytest.mark.parametrize(("path", "doc"), [("/v1/conversations", CONV), ("/v1/outcomes", OUTCOME)])
@pytest.mark.parametrize(("encoding", "pack"), [("br", lambda b: b"\x0b\x02\x80" + b), ("zstd", lambda b: b)])
def test_an_encoding_vigil_cannot_undo_is_a_415_naming_it_and_leaves_nothing(client, path, doc, encoding, pack) -> None:  # type: ignore[no-untyped-def]
    r = _post(client, path, pack(orjson.dumps(doc)), encoding)
    assert r.status_code == 415, r.text
    assert r.json()["reason"] == "unsupported_encoding" and encoding in r.json()["detail"]
    plain = _post(client, path, orjson.dumps(doc))
    assert plain.status_code == 202, plain.text
    assert plain.json()["stored"] == 1 and plain.json()["duplicates"] == 0  # the refused copy left nothing


@pytest.mark.parametrize("path", ["/v1/conversations", "/v1/outcomes"])
def test_a_gzip_bomb_stops_at_the_request_limit_and_is_kept_as_a_dead_letter(rt, client, path) -> None:  # type: ignore[no-untyped-def]
    bomb = gzip.compress(b"[" + b" " * 50_000_000 + b"]")  # 50 MB of spaces in about 50 KB
    assert len(bomb) < LIMIT
    r = _post(client, path, bomb, "gzip")
    assert r.status_code == 413, r.text
    assert r.json()["reason"] == "oversized" and "VIGIL_MAX_REQUEST_BYTES" in r.json()["detail"]
    [letter] = _letters(client)
    assert letter["reason"] == "oversized" and "decompressed" in letter["detail"]


@pytest.mark.parametrize("path", ["/v1/conversations", "/v1/outcomes"])
@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"\x1f\x8b\x08\x00garbage-not-deflate", "not valid gzip"),
        (gzip.compress(orjson.dumps(CONV))[:-12], "truncated"),
        (gzip.compress(orjson.dumps(CONV)) + b"{trailing}", "followed by"),
    ],
)
def test_broken_gzip_is_a_400_kept_as_a_dead_letter(rt, client, path, body, why) -> None:  # type: ignore[no-untyped-def]
    r = _post(client, path, body, "gzip")
    assert r.status_code == 400, r.text
    assert r.json()["reason"] == "invalid_encoding" and why in r.json()["detail"]
    [letter] = _letters(client)
    assert letter["reason"] == "invalid_encoding" and why in letter["detail"]


@pytest.mark.parametrize("path", ["/v1/conversations", "/v1/outcomes"])
@pytest.mark.parametrize(
    ("body", "encoding"),
    [
        (b"", None),
        (b"", "gzip"),
        (b"", "deflate"),
        (gzip.compress(b""), "gzip"),
        (zlib.compress(b""), "deflate"),
        (b" \n", None),
        (gzip.compress(b" \n"), "gzip"),
    ],
    ids=["plain", "gzip-no-bytes", "deflate-no-bytes", "gzip-of-nothing", "deflate-of-nothing", "blank", "gzip-blank"],
)
def test_an_empty_body_is_empty_however_it_was_sent(client, path, body, encoding) -> None:  # type: ignore[no-untyped-def]
    """No bytes sent with ``Content-Encoding: gzip`` or ``deflate`` were a 400 ``invalid_encoding`` ("truncated
    gzip stream") on both routes, and /v1/outcomes answered an empty body without a reason and kept no letter
    of it (a blank one was ``malformed_json``), while /v1/conversations answers ``empty`` and keeps one."""
    r = _post(client, path, body, encoding)
    assert r.status_code == 400, r.text
    assert r.json()["reason"] == "empty" and "empty body" in r.json()["detail"], r.text
    [letter] = _letters(client)
    assert letter["reason"] == "empty", letter


def test_identity_encoding_is_read_as_is(client) -> None:  # type: ignore[no-untyped-def]
    assert _post(client, "/v1/conversations", orjson.dumps(CONV), "identity").status_code == 202


def test_a_gzip_body_that_is_not_json_is_kept_inflated_for_replay(rt, client) -> None:  # type: ignore[no-untyped-def]
    r = _post(client, "/v1/conversations", gzip.compress(b'{"conversation_id": '), "gzip")
    assert r.status_code == 400, r.text
    [letter] = _letters(client)
    assert letter["reason"] == "malformed_json"


class _CountingZlib:
    """``zlib`` as the inflater sees it, counting the compressed bytes it hands zlib (each one is copied)."""

    MAX_WBITS = zlib.MAX_WBITS
    error = zlib.error

    def __init__(self) -> None:
        self.given = 0

    def decompressobj(self, wbits: int) -> object:
        real = zlib.decompressobj(wbits)
        counter = self

        class Counted:
            def decompress(self, data: bytes, max_length: int = 0) -> bytes:
                counter.given += len(data)
                return real.decompress(data, max_length)

            def __getattr__(self, name: str) -> object:
                return getattr(real, name)

        return Counted()


def test_many_gzip_members_take_time_in_proportion_to_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each member was handed everything after it, copied again at its end: 100,000 empty members (2 MB)
    took 10 s, 1.7 million (a 32 MiB body) would take most of an hour. The bytes zlib is handed now grow
    with the body, not with the square of its members."""
    from vigil.http import encoding

    def handed(members: int) -> int:
        counting = _CountingZlib()
        monkeypatch.setattr(encoding, "zlib", counting)
        body = gzip.compress(orjson.dumps(CONV)) + gzip.compress(b"", mtime=0) * members
        assert encoding.inflate(body, "gzip", LIMIT) == orjson.dumps(CONV)
        return counting.given

    small, large = handed(5_000), handed(10_000)
    assert large < 2.5 * small, f"twice the members handed zlib {large / small:.1f} times the bytes"


@pytest.mark.parametrize("path", ["/v1/conversations", "/v1/outcomes", "/v1/traces"])
def test_gzip_bombs_sent_at_once_hold_no_more_than_the_in_flight_budget(sqlite_url: str, path: str) -> None:
    """A body was inflated whole, up to the limit, before its inflated bytes were taken from
    VIGIL_MAX_INFLIGHT_BYTES (and a bomb's never were): 40 bombs of 32 KB sent at once to a live server
    held 1.8 GB, 40 that inflated to just under the limit 2.1 GB, where the budget is 64 MiB. A body's
    inflated bytes are now taken a step at a time before they are made: bombs sent together wait their
    turn, or the youngest is answered 503 (send it again), as bodies still arriving do. OTLP bodies too:
    40 bombs of 15 KB sent at once to /v1/traces held 960 MB."""
    import asyncio
    import tracemalloc

    import httpx

    from tests.support.waiting import scaled
    from vigil.app.server import build_app
    from vigil.app.wiring import wire

    budget, limit, bombs = 4 * 1_048_576, 1_000_000, 32
    settings = make_settings(sqlite_url, max_request_bytes=limit, max_inflight_bytes=budget, otlp_max_body_bytes=limit)
    rt = build_runtime(settings, registry=CollectorRegistry())
    wire(rt, {"api"})
    app = build_app(rt, [])
    bomb = gzip.compress(b"[" + b" " * (3 * limit) + b"]")
    assert len(bomb) < 5_000

    async def main() -> tuple[list[int], int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=scaled(120)) as c:
            assert (await _post_async(c, path, bomb)).status_code == 413  # the first request's own costs aside
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                answers = await asyncio.gather(*(_post_async(c, path, bomb) for _ in range(bombs)))
                peak = tracemalloc.get_traced_memory()[1] - before
            finally:
                tracemalloc.stop()
        return [a.status_code for a in answers], peak

    try:
        codes, peak = asyncio.run(main())
    finally:
        rt.close()
    assert set(codes) <= {413, 503} and 413 in codes, codes  # 503: busy, send it again
    assert app.state.body_budget.free == budget  # everything given back
    assert peak < 3 * budget, f"{bombs} bombs of {len(bomb)} bytes held {peak / 1e6:.1f} MB at once"


def _post_async(c, path: str, body: bytes):  # type: ignore[no-untyped-def]
    headers = {**ADMIN, "Content-Type": "application/json", "Content-Encoding": "gzip"}
    return c.post(path, content=body, headers=headers)


def test_a_body_inflated_in_several_steps_is_stored_whole(sqlite_url: str) -> None:
    """With a small budget a body is inflated in steps of 64 KiB: every conversation of it is stored, and
    every byte taken from the budget is given back."""
    settings = make_settings(sqlite_url, max_request_bytes=LIMIT, max_inflight_bytes=1_048_576)
    rt = build_runtime(settings, registry=CollectorRegistry())
    pad = "step " * 1_000
    batch = [{**CONV, "conversation_id": f"gz-step-{i}", "metadata": {"pad": pad}} for i in range(30)]
    body = orjson.dumps(batch)
    assert 2 * 65_536 < len(body) < LIMIT
    try:
        with make_client(rt) as c:
            r = _post(c, "/v1/conversations", gzip.compress(body), "gzip")
            assert r.status_code == 202, r.text
            assert r.json()["stored"] == 30
            got = c.get("/v1/conversations/gz-step-29", headers=ADMIN)
            assert got.status_code == 200 and got.json()["conversation"]["metadata"]["pad"] == pad
            assert c.app.state.body_budget.free == 1_048_576  # type: ignore[attr-defined]
    finally:
        rt.close()


@pytest.mark.parametrize("path", ["/v1/conversations", "/v1/outcomes"])
def test_a_refused_compressed_body_is_labelled_as_sent_compressed_in_its_dead_letter(rt, client, path) -> None:  # type: ignore[no-untyped-def]
    """The letter of a gzip body that could not be inflated keeps its start as sent, still compressed, and
    said nothing of it: an admin saw binary in its preview and a ``raw_size`` of 65536 for a body of
    150 KB. Its detail now names the encoding, the size sent and what the letter keeps."""
    import os

    body = gzip.compress(os.urandom(150_000))[:-8]  # random bytes do not compress: about 150 KB, cut short
    r = _post(client, path, body, "gzip")
    assert r.status_code == 400 and r.json()["reason"] == "invalid_encoding", r.text
    [letter] = _letters(client)
    assert "truncated gzip stream" in letter["detail"]
    assert f"sent with Content-Encoding gzip ({len(body)} bytes)" in letter["detail"], letter["detail"]
    assert "still compressed" in letter["detail"]


def test_the_api_document_says_both_endpoints_take_gzip_and_deflate(client) -> None:  # type: ignore[no-untyped-def]
    """The OpenAPI document said nothing of compressed bodies for /v1/outcomes (nor its 400, 413 and 415
    answers), and for /v1/conversations only in the descriptions of its errors."""
    spec = client.get("/openapi.json").json()
    for path in ("/v1/conversations", "/v1/outcomes"):
        op = spec["paths"][path]["post"]
        said = op["requestBody"].get("description", "")
        assert "Content-Encoding" in said and "gzip" in said and "deflate" in said, (path, said)
        assert {"400", "413", "415", "503"} <= set(op["responses"]), (path, sorted(op["responses"]))
