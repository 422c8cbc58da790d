"""Hostile but valid input at the edges of the schema: times at the ends of Python's calendar, ids that
cannot be addressed, revisions of the wrong JSON type. Each is one item's clear error (or stored), never
a 500, a lost batch or a conversation that cannot be looked up."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError
from sqlalchemy import select

from tests.support.app import INGEST, REVIEWER, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.ingest.decode import decode_batch, decode_conversation
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.schema import INCOMING, Conversation
from vigil.store.models import OutcomeLinkRow, OutcomeRow
from vigil.store.signals import attributed

OUT_OF_RANGE = ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"]
UTC_RANGE_MESSAGE = "in UTC this time falls outside the years 1 to 9999"


def conv(cid: str | None = None, **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "conversation_id": cid or f"hostile-{uuid.uuid4().hex[:8]}",
        "agent_id": "a",
        "agent_version": "v1",
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    }
    doc.update(fields)
    return doc


@pytest.fixture
def rt_client(sqlite_url):  # type: ignore[no-untyped-def]
    rt = build_runtime(make_settings(sqlite_url, outcome_attribution_window_hours=24), registry=CollectorRegistry())
    with make_client(rt) as c:
        yield rt, c
    rt.close()


@pytest.fixture
def db_client(db_url):  # type: ignore[no-untyped-def]
    # the default week: ended_at 9999-12-30 plus the window is past datetime.max
    rt = build_runtime(make_settings(db_url, outcome_attribution_window_hours=168), registry=CollectorRegistry())
    with make_client(rt) as c:
        yield rt, c
    rt.close()


def schema_errors(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ValidationError) as err:
        Conversation.model_validate(doc, context=INCOMING)
    return {".".join(str(p) for p in e["loc"]): e["msg"] for e in err.value.errors()}


@pytest.mark.parametrize("when", OUT_OF_RANGE)
def test_outcome_time_leaving_the_calendar_in_utc_is_that_items_422(rt_client, when: str) -> None:
    """An occurred_at whose offset moves it past year 1 or 9999 in UTC is a 422 naming the field for that
    item only; the valid item of the same batch is stored (it was a 500 losing the whole batch)."""
    rt, c = rt_client
    good = {"conversation_id": "x", "type": "csat", "value": 2, "idempotency_key": f"ok-{when}"}
    bad = {"conversation_id": "x", "type": "csat", "value": 1, "occurred_at": when}
    r = c.post("/v1/outcomes", json=[good, bad], headers=INGEST)
    assert r.status_code == 422, r.text
    body = r.json()
    assert (body["stored"], body["rejected"]) == (1, 1)
    [error] = body["errors"]
    assert error["index"] == 1 and error["reason"] == "schema_invalid"
    assert error["errors"][0]["field"] == "occurred_at"
    assert UTC_RANGE_MESSAGE in error["errors"][0]["message"]
    with rt.sessions() as s:
        assert [o.idempotency_key for o in s.scalars(select(OutcomeRow))] == [f"ok-{when}"]


@pytest.mark.parametrize("when", OUT_OF_RANGE)
def test_conversation_times_leaving_the_calendar_in_utc_are_refused_by_field(when: str) -> None:
    """Every time in a conversation (started/ended/updated_at, message timestamps, inline outcomes) is
    refused with the field named when it cannot be expressed in UTC; a normal offset still reads as sent."""
    cases = {
        "started_at": conv(started_at=when),
        "ended_at": conv(ended_at=when),
        "updated_at": conv(updated_at=when),
        "messages.0.timestamp": conv(messages=[{"role": "user", "content": "x", "timestamp": when}]),
        "outcomes.0.occurred_at": conv(outcomes=[{"type": "csat", "value": 1, "occurred_at": when}]),
    }
    for field, doc in cases.items():
        errors = schema_errors(doc)
        assert UTC_RANGE_MESSAGE in errors[field], (field, errors)
    kept = Conversation.model_validate(conv(started_at="2024-05-01T10:00:00+02:00"))
    assert kept.started_at is not None and kept.started_at.utcoffset() is not None
    assert kept.started_at.astimezone(UTC) == datetime(2024, 5, 1, 8, tzinfo=UTC)


def test_conversation_time_leaving_the_calendar_is_a_422_over_http(rt_client) -> None:
    """Over HTTP the refusal is the item's schema_invalid error, not a store failure."""
    _rt, c = rt_client
    r = c.post("/v1/conversations", json=conv(started_at=OUT_OF_RANGE[0], outcomes=[{"type": "csat"}]), headers=INGEST)
    assert r.status_code == 422, r.text
    [error] = r.json()["errors"]
    assert error["reason"] == "schema_invalid"
    assert error["errors"][0]["field"] == "started_at" and UTC_RANGE_MESSAGE in error["errors"][0]["message"]


def test_conversation_at_the_start_of_time_with_an_inline_outcome_is_stored(db_client) -> None:
    """A valid conversation starting on 0001-01-01 with an inline outcome is stored and its outcome joined:
    the attribution window stops at the start of time instead of overflowing (it was refused as
    store_rejected). One ending days before the end of year 9999 is refused as dated ahead of now, an item's
    error, never a store failure (the window at the end of time is held by the test below)."""
    rt, c = db_client
    doc = conv(started_at="0001-01-01T00:00:00Z", outcomes=[{"type": "csat", "value": 1}])
    r = c.post("/v1/conversations", json=doc, headers=INGEST)
    assert r.status_code == 202, r.text
    cid = doc["conversation_id"]
    assert c.get(f"/v1/conversations/{cid}", headers=REVIEWER).status_code == 200
    with rt.sessions() as s:
        [link] = s.scalars(select(OutcomeLinkRow).where(OutcomeLinkRow.conversation_id == cid)).all()
    assert not link.attributed  # the inline outcome happened on arrival, far past 0001-01-02
    late = conv(ended_at="9999-12-30T00:00:00Z", outcomes=[{"type": "csat", "value": 1}])
    late["conversation_id"] = "ends-in-9999"
    r = c.post("/v1/conversations", json=late, headers=INGEST)
    assert r.status_code == 422, r.text
    assert [(e["reason"], e["errors"][0]["field"]) for e in r.json()["errors"]] == [("occurred_in_future", "ended_at")]


def test_attribution_window_is_clamped_to_the_representable_times() -> None:
    """attributed() holds the window at datetime.min/max (UTC) for times near either end and for windows
    too long for a timedelta, rather than raising OverflowError."""
    end = datetime(9999, 12, 30, tzinfo=UTC)
    start = datetime(1, 1, 1, tzinfo=UTC)
    late = SimpleNamespace(conversation_id="c", started_at=None, ended_at=end, received_at=end)
    early = SimpleNamespace(conversation_id="c", started_at=start, ended_at=start, received_at=start)
    at = SimpleNamespace
    assert attributed(at(occurred_at=datetime.max.replace(tzinfo=UTC)), late, 24 * 7)  # type: ignore[arg-type]
    assert attributed(at(occurred_at=start), early, 1)  # type: ignore[arg-type]
    assert attributed(at(occurred_at=datetime(2024, 1, 1, tzinfo=UTC)), early, 1e12)  # type: ignore[arg-type]
    assert not attributed(at(occurred_at=datetime(2024, 1, 1, tzinfo=UTC)), early, 24)  # type: ignore[arg-type]


@pytest.mark.parametrize("cid", ["line\nbreak", "tab\there", "nul\x00", "del\x7f", "esc\x1b[31m", " ", " \t "])
def test_conversation_ids_that_cannot_be_addressed_are_refused(cid: str) -> None:
    """An id holding a control character (C0 or DEL) or only whitespace is refused with a message saying
    why: a newline in an id was accepted but no per-conversation route could find it again."""
    errors = schema_errors(conv(cid))
    expected = "must not contain control characters" if cid.strip() else "must not be empty or only whitespace"
    assert expected in errors["conversation_id"]


@pytest.mark.parametrize("cid", [".", ".."])
def test_dot_segment_ids_are_refused(cid: str) -> None:
    """``/ui/review/..`` is the console's home page to a browser (it resolves the dot segment, encoded or
    not): such a conversation could be listed in the queue but never opened."""
    assert "must not be '.' or '..'" in schema_errors(conv(cid))["conversation_id"]
    for ok in ("...", "./a", "a/..", ". "):  # only the whole id is a dot segment
        assert Conversation.model_validate(conv(ok), context=INCOMING).conversation_id == ok


def test_newline_id_is_a_422_for_conversations_and_outcomes(rt_client) -> None:
    """Over HTTP the conversation is refused (422, field conversation_id), and so is an outcome for such an
    id, which could never join a conversation."""
    _rt, c = rt_client
    r = c.post("/v1/conversations", json=conv("line\nbreak"), headers=INGEST)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["errors"][0]["field"] == "conversation_id"
    r = c.post("/v1/outcomes", json={"conversation_id": "line\nbreak", "type": "csat"}, headers=INGEST)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["errors"][0]["field"] == "conversation_id"


def test_ordinary_ids_still_pass() -> None:
    """Ids with spaces, unicode, slashes and the simulator's ids are accepted unchanged."""
    for cid in ["a b", "ünï/cødé:1", "x" * 256, "tau2:airline:run-1:task 3"]:
        assert Conversation.model_validate(conv(cid)).conversation_id == cid
    for doc in Simulator(parse_versions("v1:0.1"), 3).stream(20):
        Conversation.model_validate(doc, context=INCOMING)


@pytest.mark.parametrize("revision", ['"3"', "true", "false", '"  7 "', "3.0", "[3]"])
def test_revision_must_be_a_json_integer(revision: str) -> None:
    """revision is a strict integer: a string, a boolean or a float is refused, not coerced (true was
    stored as revision 1 and kept as true in the document)."""
    raw = orjson.dumps(conv("c")).replace(
        b'"conversation_id"', b'"revision":' + revision.encode() + b',"conversation_id"'
    )
    [item] = decode_batch(raw, 1 << 20, 10).items
    assert item.error is not None and item.error.reason == "schema_invalid"
    assert item.error.errors[0]["field"] == "revision"


def test_revision_as_a_json_integer_is_accepted() -> None:
    """JSON integers (through the strict decoder and from Python) keep working, up to the BIGINT bound."""
    for n in (0, 3, 2**63 - 1):
        assert decode_conversation(orjson.dumps(conv("c", revision=n)), 1 << 20).revision == n
    assert Conversation.model_validate(conv("c", revision=7)).revision == 7
    assert "revision" in schema_errors(conv("c", revision=2**63))


def test_revision_of_a_string_is_a_422_over_http(rt_client) -> None:
    """Over HTTP a quoted revision is the item's 422, and nothing is stored."""
    _rt, c = rt_client
    body = orjson.dumps(conv("rev-str")).replace(b'"conversation_id"', b'"revision":"3","conversation_id"')
    r = c.post("/v1/conversations", content=body, headers={**INGEST, "content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["errors"][0]["field"] == "revision"
    assert c.get("/v1/conversations/rev-str", headers=REVIEWER).status_code == 404


def outcome(key: str) -> dict[str, Any]:
    return {"conversation_id": "x", "type": "csat", "value": 1, "idempotency_key": key}


def dead_letters(rt: Any) -> list[tuple[str, str, bytes]]:
    from vigil.store.models import DeadLetterRow

    with rt.sessions() as s:
        return [(d.source, d.reason, d.raw) for d in s.scalars(select(DeadLetterRow).order_by(DeadLetterRow.id))]


@pytest.mark.parametrize(
    ("bad", "reason", "field"),
    [
        (b'{"conversation_id": "x", "type": "csat", "value": NaN}', "non_finite_number", "value"),
        (b'{"conversation_id": "x", "type": "csat", "value": -Infinity}', "non_finite_number", "value"),
        (b'{"conversation_id": "x", "type": "csat", "value": 1e999}', "non_finite_number", "value"),
        (b'{"conversation_id": "x\\ud800", "type": "csat", "value": 1}', "invalid_unicode", "conversation_id"),
    ],
)
def test_a_value_strict_json_cannot_hold_refuses_only_its_outcome(
    rt_client, bad: bytes, reason: str, field: str
) -> None:
    """A NaN (or a lone surrogate) in one outcome of a batch was a 400 for the whole body: the valid outcomes
    beside it were lost with it. Now it is that item's 422, kept as a dead letter, and the others are stored,
    as for conversations."""
    rt, c = rt_client
    good = b'{"conversation_id": "x", "type": "csat", "value": 4, "idempotency_key": "kept"}'
    body = b"[" + good + b"," + bad + b"]"
    r = c.post("/v1/outcomes", content=body, headers={**INGEST, "content-type": "application/json"})
    assert r.status_code == 422, r.text
    out = r.json()
    assert (out["stored"], out["rejected"]) == (1, 1)
    [error] = out["errors"]
    assert (error["index"], error["reason"], error["errors"][0]["field"]) == (1, reason, field)
    with rt.sessions() as s:
        assert [o.idempotency_key for o in s.scalars(select(OutcomeRow))] == ["kept"]
    [(source, why, raw)] = dead_letters(rt)
    assert (source, why) == ("http", reason)
    assert b'"csat"' in raw and b"kept" not in raw  # the refused item, not the stored one


def test_an_outcomes_body_that_is_not_json_is_a_400_kept_whole(rt_client) -> None:
    rt, c = rt_client
    body = b'[{"conversation_id": "x", "type": "csat", "value": 1},'
    r = c.post("/v1/outcomes", content=body, headers={**INGEST, "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["reason"] == "malformed_json", r.text
    assert dead_letters(rt) == [("http", "malformed_json", body)]


def test_an_outcome_batch_over_the_item_limit_is_kept_as_a_dead_letter(rt_client) -> None:
    from vigil.outcomes.api import MAX_BATCH

    rt, c = rt_client
    items = [
        {"conversation_id": "x", "type": "csat", "value": 1, "idempotency_key": f"k{i}"} for i in range(MAX_BATCH + 1)
    ]
    body = orjson.dumps(items)
    r = c.post("/v1/outcomes", content=body, headers={**INGEST, "content-type": "application/json"})
    assert r.status_code == 413 and r.json()["reason"] == "batch_too_large", r.text
    assert "split it" in r.json()["detail"]
    [(source, reason, raw)] = dead_letters(rt)
    assert (source, reason) == ("http", "batch_too_large") and raw.startswith(body[:1000])
    with rt.sessions() as s:
        assert s.scalars(select(OutcomeRow)).first() is None


def test_an_outcomes_body_over_the_size_limit_leaves_a_note(sqlite_url) -> None:
    rt = build_runtime(make_settings(sqlite_url, max_request_bytes=4096), registry=CollectorRegistry())
    with make_client(rt) as c:
        body = orjson.dumps(
            [{"conversation_id": "x", "type": "csat", "value": 1, "idempotency_key": f"k{i}"} for i in range(200)]
        )
        r = c.post("/v1/outcomes", content=body, headers={**INGEST, "content-type": "application/json"})
        assert r.status_code == 413 and r.json()["reason"] == "oversized", r.text
        # refused on its Content-Length before a byte is read: the note says what came, not the body
        [(source, reason, raw)] = dead_letters(rt)
        assert (source, reason) == ("http", "oversized") and body.startswith(raw)
        from vigil.store.models import DeadLetterRow

        with rt.sessions() as s:
            [detail] = s.scalars(select(DeadLetterRow.detail))
        assert "VIGIL_MAX_REQUEST_BYTES" in detail and str(len(body)) in detail
    rt.close()


def test_kafka_outcome_message_with_a_nan_keeps_its_other_outcomes(rt_client) -> None:
    from vigil.outcomes.ingest import OutcomeStore
    from vigil.runtime import Envelope

    rt, _ = rt_client
    store = rt.get(OutcomeStore)
    good = b'{"conversation_id": "x", "type": "csat", "value": 3, "idempotency_key": "from-kafka"}'
    raw = b"[" + good + b', {"conversation_id": "x", "type": "csat", "value": NaN}]'
    broken = b'{"conversation_id": "x", "type"'
    result = store.handle_envelopes(
        [Envelope(raw, "kafka", "outcomes", 0, 7), Envelope(broken, "kafka", "outcomes", 0, 8)]
    )
    assert (result.received, result.stored) == (2, 1)
    assert [(e.index, e.reason) for e in result.errors] == [(1, "non_finite_number")]
    with rt.sessions() as s:
        assert [o.idempotency_key for o in s.scalars(select(OutcomeRow))] == ["from-kafka"]
    assert sorted((r, b) for _, r, b in dead_letters(rt)) == [("malformed_json", broken), ("non_finite_number", raw)]


@pytest.mark.parametrize(("key", "why"), [("k\x00nul", "control characters"), ("k" * 513, "at most 512")])
def test_an_inline_outcome_key_the_outcomes_api_refuses_is_refused_inline_too(key: str, why: str) -> None:
    """A NUL (Postgres cannot store it) or a key longer than its column made the whole conversation a
    ``store_rejected`` dead letter on Postgres; it is now the item's error, naming the field."""
    doc = conv("c-inline")
    doc["outcomes"] = [{"type": "escalation", "idempotency_key": key}]
    errors = schema_errors(doc)
    assert why in errors["outcomes.0.idempotency_key"]
    # documents stored before the rule are read back as they are
    assert Conversation.model_validate(doc).outcomes[0].idempotency_key == key


def test_a_kafka_outcome_message_that_would_decode_to_many_times_its_size_is_an_oversized_dead_letter(
    rt_client,
) -> None:
    """The outcomes topic had not the API's bound on JSON density: a message of 1 MB of empty objects took
    27 s and 300 MB to read, and its dead letter's detail listed all 330,000 items' errors (22 MB). A batch
    of such messages outlasts the poll interval, so the group moved it on and it was read again."""
    from vigil.outcomes.ingest import OutcomeStore
    from vigil.runtime import Envelope

    rt, _ = rt_client
    store = rt.get(OutcomeStore)
    flood = b"[" + b",".join([b"{}"] * 330_000) + b"]"
    invalid = orjson.dumps([{"conversation_id": "x"}] * 50)
    good = b'{"conversation_id": "x", "type": "csat", "value": 3, "idempotency_key": "after"}'
    result = store.handle_envelopes(
        [Envelope(raw, "kafka", "outcomes", 0, n) for n, raw in enumerate((flood, invalid, good))]
    )
    assert result.stored == 1
    with rt.sessions() as s:
        assert [o.idempotency_key for o in s.scalars(select(OutcomeRow))] == ["after"]
    letters = {d.offset: d for d in result.dead_letters}
    assert letters[0].reason == "oversized" and "VIGIL_MAX_JSON_EXPANSION=8" in letters[0].detail
    assert letters[1].reason == "schema_invalid" and letters[1].detail.endswith("; ... and 30 more items")
    assert letters[1].detail.count("item ") == 20
