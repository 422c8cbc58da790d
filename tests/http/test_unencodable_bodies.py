"""JSON bodies Python's reader accepts but nothing can store or echo get a clear 4xx, never a 500: a lone
UTF-16 surrogate in a text field, and a number past a double's range (or NaN) where a field is checked.
Nothing of a refused request is saved, and the same request with clean text then succeeds."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from tests.support.app import ADMIN, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.calibration.models import CalibrationRunRow

CONV = {
    "conversation_id": "c1",
    "agent_id": "a",
    "agent_version": "v",
    "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
}
JSON = {**ADMIN, "Content-Type": "application/json"}


@pytest.fixture
def client(db_url):  # type: ignore[no-untyped-def]
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    with make_client(rt) as c:
        assert c.post("/v1/conversations", json=CONV, headers=ADMIN).status_code == 202
        assert c.post("/v1/review/items", json={"conversation_id": "c1"}, headers=ADMIN).status_code == 201
        c.runtime = rt
        yield c
    rt.close()


@pytest.mark.parametrize(
    "body",
    [
        b'{"body": "a \\ud800 b"}',  # escaped, as a JSON encoder writes it
        '{"body": "a \ud800 b"}'.encode("utf-8", "surrogatepass"),  # the raw bytes of one
        b'{"body": "\\udfff"}',
    ],
)
def test_a_lone_surrogate_in_a_comment_is_a_422_naming_the_field_and_nothing_is_saved(client, body: bytes) -> None:  # type: ignore[no-untyped-def]
    r = client.post("/v1/review/items/c1/comments", content=body, headers=JSON)
    assert r.status_code == 422, r.text
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "body"] and error["type"] == "string_unicode"
    assert client.get("/v1/review/items/c1/comments", headers=ADMIN).json() == []
    assert client.post("/v1/review/items/c1/comments", json={"body": "a b"}, headers=ADMIN).status_code == 201


def test_a_lone_surrogate_in_label_notes_is_a_422_then_the_clean_label_is_kept(client) -> None:  # type: ignore[no-untyped-def]
    bad = b'{"label": "not_a_failure", "notes": "fine \\ud83d"}'
    r = client.post("/v1/review/items/c1/labels", content=bad, headers=JSON)
    assert r.status_code == 422, r.text
    assert client.get("/v1/review/labels", headers=ADMIN).json() == []
    good = {"label": "not_a_failure", "notes": "fine \U0001f600"}  # a surrogate pair is a character
    r = client.post("/v1/review/items/c1/labels", json=good, headers=ADMIN)
    assert r.status_code == 201, r.text
    assert r.json()["notes"] == "fine \U0001f600"


def test_a_lone_surrogate_the_schema_lets_through_is_a_400_where_it_would_be_stored(client) -> None:  # type: ignore[no-untyped-def]
    """Labelled-set items are free-form objects: the surrogate reaches the database driver, which refuses it."""
    body = b'{"labels": [{"conversation_id": "\\ud800", "label": "fail"}], "save": true}'
    r = client.post("/v1/judges/support-generic/calibration", content=body, headers=JSON)
    assert r.status_code == 400, r.text
    assert r.json()["reason"] == "invalid_unicode" and "surrogate" in r.json()["detail"]
    with client.runtime.sessions() as s:
        assert s.scalar(select(func.count()).select_from(CalibrationRunRow)) == 0
    clean = b'{"labels": [{"conversation_id": "c1", "label": "fail"}], "save": true}'
    assert client.post("/v1/judges/support-generic/calibration", content=clean, headers=JSON).status_code == 200
    with client.runtime.sessions() as s:
        assert s.scalar(select(func.count()).select_from(CalibrationRunRow)) >= 1


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/review/items/c1/comments", b'{"body": "x", "message_index": 1e400}'),
        ("/v1/review/items/c1/comments", b'{"body": "x", "message_index": -1e400}'),
        ("/v1/review/items/c1/comments", b'{"body": "x", "message_index": NaN}'),
        ("/v1/review/items/c1/labels", b'{"label": Infinity}'),
        ("/v1/review/items/c1/labels", b'{"label": "unsure", "notes": ["\\ud800"]}'),
        ("/v1/review/bulk", b'{"action": "skip", "conversation_ids": [1e999]}'),
    ],
)
def test_a_refused_field_whose_input_json_cannot_write_is_a_422_naming_it(client, path: str, body: bytes) -> None:  # type: ignore[no-untyped-def]
    r = client.post(path, content=body, headers=JSON)
    assert r.status_code == 422, r.text
    errors = r.json()["detail"]
    assert isinstance(errors, list) and errors and all("loc" in e and "msg" in e for e in errors)
    assert r.text.isascii() or "\\ud800" in r.text


def test_a_huge_or_deep_wrong_field_gets_a_small_422_not_its_input_echoed_back(client) -> None:  # type: ignore[no-untyped-def]
    # a 5 MB field where none belongs: FastAPI's 422 echoed it whole, twice (10 MB back for 5 MB sent)
    r = client.post("/v1/review/items/c1/comments", json={"text": "a" * 5_000_000}, headers=ADMIN)
    assert r.status_code == 422 and len(r.content) < 5_000, len(r.content)
    errors = r.json()["detail"]
    assert {tuple(e["loc"]) for e in errors} == {("body", "body"), ("body", "text")}
    extra = next(e for e in errors if e["loc"] == ["body", "text"])
    assert extra["input"].startswith("a" * 200) and extra["input"].endswith("… (5000000 characters)")
    # a field nested 900 deep (Python's JSON reader takes it): the echo overflowed the stack, a 500
    deep = b'{"body": ' + b"[" * 900 + b"]" * 900 + b"}"
    r = client.post("/v1/review/items/c1/comments", content=deep, headers=JSON)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "body"] and len(r.content) < 2_000
    # many keys, many items: cut, each cut saying how much it left out
    wide = {"body": "ok", **{f"k{i}": list(range(1000)) for i in range(100)}}
    r = client.post("/v1/review/items/c1/comments", json=wide, headers=ADMIN)
    assert r.status_code == 422 and len(r.content) < 50_000, len(r.content)
    first = r.json()["detail"][0]
    assert first["input"][-1] == "… 980 more items"
    assert client.get("/v1/review/items/c1/comments", headers=ADMIN).json() == []


def test_an_echoed_byte_string_says_its_whole_size() -> None:
    from vigil.http.unencodable import echoed

    assert echoed(b"x" * 5000) == "x" * 200 + "… (5000 bytes)"
    assert echoed(b"short") == "short"
