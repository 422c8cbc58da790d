"""A compressed body sent to an endpoint that reads JSON as is gets a 415 that says so (it used to be a
400 claiming the body was "not valid UTF-8"), is not stored, and the same body uncompressed is taken."""

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


@pytest.fixture
def client(sqlite_url: str):  # type: ignore[no-untyped-def]
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    with make_client(rt) as c:
        yield c
    rt.close()


@pytest.mark.parametrize(("path", "doc"), [("/v1/conversations", CONV), ("/v1/outcomes", OUTCOME)])
@pytest.mark.parametrize(
    ("encoding", "pack"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("br", lambda b: b"\x0b\x02\x80" + b),
        ("GZIP", gzip.compress),
    ],
)
def test_a_compressed_body_is_a_415_naming_its_encoding_and_leaves_nothing(client, path, doc, encoding, pack) -> None:  # type: ignore[no-untyped-def]
    body = pack(orjson.dumps(doc))
    headers = {**ADMIN, "Content-Type": "application/json", "Content-Encoding": encoding}
    r = client.post(path, content=body, headers=headers)
    assert r.status_code == 415, r.text
    assert r.json()["reason"] == "unsupported_encoding" and encoding.lower() in r.json()["detail"]
    plain = client.post(path, content=orjson.dumps(doc), headers={**ADMIN, "Content-Type": "application/json"})
    assert plain.status_code == 202, plain.text
    assert plain.json()["stored"] == 1 and plain.json()["duplicates"] == 0  # the refused copy left nothing


def test_identity_encoding_is_read_as_is(client) -> None:  # type: ignore[no-untyped-def]
    headers = {**ADMIN, "Content-Type": "application/json", "Content-Encoding": "identity"}
    assert client.post("/v1/conversations", content=orjson.dumps(CONV), headers=headers).status_code == 202
