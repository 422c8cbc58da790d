"""Odd URLs get clear 4xx answers, never a 500: a NUL in a path or query parameter (PostgreSQL cannot
hold one) and integers past any list's length or a 64-bit id, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl

import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import ADMIN, REVIEWER, make_client, make_settings
from vigil.app.runtime import build_runtime


@pytest.fixture
def client(db_url):  # type: ignore[no-untyped-def]
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    with make_client(rt) as c:
        yield c
    rt.close()


NUL_URLS = [
    "/v1/conversations/abc%00def",
    "/v1/conversations?agent_id=a%00b",
    "/v1/conversations?agent_version=%00",
    "/v1/dead-letters?reason=x%00",
    "/v1/review/queue?agent=%00",
]


@pytest.mark.parametrize("url", NUL_URLS)
def test_a_nul_in_the_url_is_a_400_and_never_reaches_the_log(client, url: str, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)
    r = client.get(url, headers=ADMIN)
    assert r.status_code == 400, r.text
    assert "NUL" in r.json()["detail"]
    assert not any("\x00" in rec.getMessage() for rec in caplog.records)


@pytest.mark.parametrize(
    "url",
    [
        f"/v1/conversations?offset={2**70}",
        f"/v1/conversations?offset={2**63}",
        f"/v1/verdicts?offset={2**70}",
        f"/v1/review/queue?offset={2**70}",
        f"/v1/review/labels?offset={2**70}",
        "/v1/conversations?offset=-1",
        f"/v1/conversations?limit={2**70}",
    ],
)
def test_out_of_range_integers_are_422(client, url: str) -> None:  # type: ignore[no-untyped-def]
    r = client.get(url, headers=ADMIN)
    assert r.status_code == 422, r.text


def test_out_of_range_export_watermark_and_run_id_are_422(client) -> None:  # type: ignore[no-untyped-def]
    assert client.post(f"/v1/exports?since={2**70}", headers=ADMIN).status_code == 422
    assert client.post(f"/v1/exports/{2**70}/ack", headers=ADMIN).status_code == 422


def test_the_largest_allowed_offset_is_an_empty_page_and_one_more_says_use_the_cursor(client) -> None:  # type: ignore[no-untyped-def]
    from vigil.settings import Settings

    largest = Settings().list_max_offset
    r = client.get(f"/v1/conversations?offset={largest}", headers=REVIEWER)
    assert r.status_code == 200 and r.json()["items"] == []
    r = client.get(f"/v1/conversations?offset={largest + 1}", headers=REVIEWER)
    assert r.status_code == 422 and "cursor" in r.text


def test_a_nul_in_a_review_label_is_refused_and_the_label_can_be_sent_again(client) -> None:  # type: ignore[no-untyped-def]
    conv = {
        "conversation_id": "c1",
        "agent_id": "a",
        "agent_version": "v",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    }
    assert client.post("/v1/conversations", json=conv, headers=ADMIN).status_code == 202
    label = {"label": "not_a_failure", "notes": "fine\x00"}
    r = client.post("/v1/review/items/c1/labels", json=label, headers=ADMIN)
    # refused on every database (SQLite stored it, raw, into the review page; PostgreSQL cannot)
    assert r.status_code == 422 and "NUL" in r.json()["detail"], r.text
    comment = client.post("/v1/review/items/c1/comments", json={"body": "a\x00b"}, headers=ADMIN)
    assert comment.status_code == 422 and "NUL" in comment.json()["detail"], comment.text
    assert client.get("/v1/review/labels", headers=ADMIN).json() == []
    label["notes"] = "fine"
    assert client.post("/v1/review/items/c1/labels", json=label, headers=ADMIN).status_code == 201


EDGE_TIMES = ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"]
TIMED = [
    "/v1/conversations",
    "/v1/compare?agent=a&baseline=v1&candidate=v2",
    "/v1/compare/conversations?agent=a&version=v1&signal=tool_error",
    "/v1/quality?agent=a&version=v1",
    "/v1/quality/series?agent=a&version=v1",
]


@pytest.mark.parametrize("when", EDGE_TIMES)
@pytest.mark.parametrize("param", ["since", "until"])
@pytest.mark.parametrize("url", TIMED)
def test_a_time_whose_utc_instant_leaves_the_calendar_is_422(client, url: str, param: str, when: str) -> None:  # type: ignore[no-untyped-def]
    """Converting such a time to UTC raised OverflowError: a 500 on every read that takes since/until."""
    path, _, query = url.partition("?")
    r = client.get(path, params={**dict(parse_qsl(query)), param: when}, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert "years 1 to 9999" in r.text


@pytest.mark.parametrize("url", TIMED[1:])
def test_an_empty_required_parameter_is_a_422_saying_it_is_empty(client, url: str) -> None:  # type: ignore[no-untyped-def]
    """``agent=`` was looked up as the agent named '': a 404 ("agent '' has no finished conversations")
    that read as if the data were missing, or an empty answer."""
    path, _, query = url.partition("?")
    given = dict(parse_qsl(query))
    for name in given:
        if name == "agent" and path == "/v1/compare":
            continue  # optional there: the versions name it when one agent has both
        for empty in ("", "  "):
            r = client.get(path, params={**given, name: empty}, headers=ADMIN)
            assert r.status_code == 422, (name, r.text)
            [error] = r.json()["detail"]
            assert error["loc"] == ["query", name]
            assert error["msg"] == "the parameter is empty: it needs a value"


def test_the_calendar_edges_themselves_are_readable(client) -> None:  # type: ignore[no-untyped-def]
    params = {"since": "0001-01-01T00:00:00Z", "until": "9999-12-31T23:59:59Z"}
    r = client.get("/v1/conversations", params=params, headers=ADMIN)
    assert r.status_code == 200 and r.json()["items"] == []


def _cursor(values: object) -> str:
    import base64

    import orjson

    return base64.urlsafe_b64encode(orjson.dumps(values)).decode().rstrip("=")


@pytest.mark.parametrize(
    "url",
    [
        # a cursor decodes to values of the right count but the wrong kind, or out of a column's range
        "/v1/review/queue?cursor=" + _cursor([{"a": 1}, "2024-01-01T00:00:00", 1]),
        "/v1/review/queue?cursor=" + _cursor([1.0, "2024-01-01T00:00:00", "abc"]),
        "/v1/review/queue?cursor=" + _cursor([1.0, "2024-01-01T00:00:00", 2**64 - 1]),
        "/v1/review/queue?cursor=" + _cursor([True, "2024-01-01T00:00:00", 1]),
        "/v1/review/queue?cursor=" + _cursor([1.0, "2024-01-01T00:00:00", None]),
        "/v1/review/queue?cursor=" + _cursor([1.0, "0001-01-01T00:00:00+05:00", 1]),
        "/v1/review/queue?status=done&cursor=" + _cursor(["2024-01-01T00:00:00", "abc"]),
        "/v1/review/queue?status=done&cursor=" + _cursor([["2024"], 1]),
        "/v1/conversations?cursor=" + _cursor(["9999-12-31T23:59:59-05:00", "x"]),
        "/v1/conversations?cursor=" + _cursor(["2024-01-01T00:00:00", {"id": 1}]),
    ],
)
def test_a_crafted_cursor_is_a_422_not_a_500(client, url: str) -> None:  # type: ignore[no-untyped-def]
    r = client.get(url, headers=REVIEWER)
    assert r.status_code == 422, r.text
    assert "cursor" in r.text
