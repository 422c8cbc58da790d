"""HEAD is answered wherever GET is (uptime checkers and load balancers probe with it): the GET's status
and headers, no body, and the same key or session check."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

from tests.support.app import REVIEWER, served


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/ui/login", "/ui/static/vigil.css"])
def test_head_answers_as_get_without_a_body(client, path: str) -> None:  # type: ignore[no-untyped-def]
    got = client.get(path)
    head = client.head(path)
    assert head.status_code == got.status_code == 200, head.text
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    assert head.headers["content-length"] == str(len(got.content))


def test_head_on_the_api_checks_the_key_as_get_does(client) -> None:  # type: ignore[no-untyped-def]
    refused = client.head("/v1/conversations")
    assert refused.status_code == 401
    assert refused.content == b""
    assert refused.headers["www-authenticate"] == client.get("/v1/conversations").headers["www-authenticate"]
    r = client.head("/v1/conversations", headers=REVIEWER)
    assert r.status_code == 200
    assert r.content == b""
    assert r.headers["content-type"] == "application/json"


def test_head_keeps_the_gets_errors(client) -> None:  # type: ignore[no-untyped-def]
    assert client.head("/v1/conversations/nope", headers=REVIEWER).status_code == 404
    assert client.head("/no/such/path").status_code == 404
    assert client.head("/healthz?x=%00").status_code == 400


def test_head_through_the_server_sends_headers_and_no_body(runtime) -> None:  # type: ignore[no-untyped-def]
    with served(runtime) as base:
        conn = http.client.HTTPConnection(urlsplit(base).netloc, timeout=10)
        try:
            for path in ("/healthz", "/readyz", "/ui/login"):
                conn.request("HEAD", path)
                r = conn.getresponse()
                assert r.status == 200, path
                assert int(r.getheader("content-length") or 0) > 0
                assert r.read() == b""
            # the connection is still in step: a GET on it reads its whole answer
            conn.request("GET", "/healthz")
            r = conn.getresponse()
            assert r.status == 200
            assert json.loads(r.read())["status"] == "ok"
        finally:
            conn.close()
