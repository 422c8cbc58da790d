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


def _gzip_members(b: bytes) -> bytes:
    half = len(b) // 2
    return gzip.compress(b[:half]) + gzip.compress(b[half:])


@pytest.mark.parametrize(("path", "doc"), [("/v1/conversations", CONV), ("/v1/outcomes", OUTCOME)])
@pytest.mark.parametrize(
    ("encoding", "pack"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("GZIP", gzip.compress), ("x-gzip", _gzip_members)],
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
