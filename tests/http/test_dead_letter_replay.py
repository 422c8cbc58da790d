"""``POST /v1/dead-letters/{id}/replay``: a refused item fed back through its own intake once the cause is gone
(a clock moved past its time), marked ``replayed_at``; refused again it stays as it was and no new letter is
written; what cannot go back (kept truncated, an OTLP body) is refused with 409; admins only."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from tests.support.app import ADMIN, INGEST, REVIEWER, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.outcomes.ingest import OutcomeStore
from vigil.runtime import Runtime
from vigil.schema import FUTURE_ALLOWANCE, LatestAllowed
from vigil.store.models import ConversationRow, DeadLetterRow, OutcomeRow

PAST = datetime.now(UTC) - timedelta(days=1)


@dataclass
class Later:
    """A clock three hours ahead: what was dated two hours ahead has happened."""

    def latest_allowed(self) -> LatestAllowed:
        return LatestAllowed(self.now() + FUTURE_ALLOWANCE)

    def now(self) -> datetime:
        return datetime.now(UTC) + timedelta(hours=3)


def ahead(hours: float = 2.0) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).isoformat()


@pytest.fixture
def rt_client(db_url: str) -> Iterator[tuple[Runtime, Any]]:
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    with make_client(rt) as c:
        yield rt, c
    rt.close()


def letters(rt: Runtime) -> list[DeadLetterRow]:
    with rt.sessions() as s:
        rows = list(s.scalars(select(DeadLetterRow).order_by(DeadLetterRow.id)))
        s.expunge_all()
        return rows


def count(rt: Runtime, table: Any) -> int:
    with rt.sessions() as s:
        return s.scalar(select(func.count()).select_from(table)) or 0


def test_a_future_dated_conversation_is_stored_once_the_clock_has_passed_it(rt_client) -> None:
    rt, c = rt_client
    conv = dict(next(Simulator(parse_versions("v1:0.0"), 1).stream(1, start=PAST)), ended_at=ahead())
    assert c.post("/v1/conversations", json=conv, headers=INGEST).status_code == 422
    [letter] = letters(rt)
    assert letter.reason == "occurred_in_future" and letter.replayed_at is None

    again = c.post(f"/v1/dead-letters/{letter.id}/replay", headers=ADMIN)
    assert again.status_code == 422, again.text
    assert again.json()["refusal"]["errors"][0]["reason"] == "occurred_in_future"
    [kept] = letters(rt)  # left as it was, and no second letter of the same refusal
    assert kept.id == letter.id and kept.replayed_at is None
    assert count(rt, ConversationRow) == 0

    rt.future_bound = Later()
    r = c.post(f"/v1/dead-letters/{letter.id}/replay", headers=ADMIN)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["intake"], body["result"]["stored"]) == ("conversations", 1)
    assert count(rt, ConversationRow) == 1
    [done] = letters(rt)
    assert done.replayed_at is not None
    listed = c.get("/v1/dead-letters", headers=ADMIN).json()
    assert listed[0]["replayed_at"] is not None

    twice = c.post(f"/v1/dead-letters/{letter.id}/replay", headers=ADMIN)  # stores nothing twice
    assert twice.status_code == 200, twice.text
    assert (twice.json()["result"]["stored"], twice.json()["result"]["duplicates"]) == (0, 1)
    assert count(rt, ConversationRow) == 1 and len(letters(rt)) == 1


def test_an_outcome_letter_goes_back_through_the_outcomes_intake(rt_client) -> None:
    rt, c = rt_client
    outcome = {"conversation_id": "c-1", "type": "escalation", "occurred_at": ahead(), "idempotency_key": "k-1"}
    assert c.post("/v1/outcomes", json=outcome, headers=INGEST).status_code == 422
    [letter] = letters(rt)
    assert (letter.source, letter.reason) == ("http", "occurred_in_future")

    rt.get(OutcomeStore).bound = Later()
    r = c.post(f"/v1/dead-letters/{letter.id}/replay", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert (r.json()["intake"], r.json()["result"]["stored"]) == ("outcomes", 1)
    twice = c.post(f"/v1/dead-letters/{letter.id}/replay", headers=ADMIN)
    assert twice.status_code == 200 and twice.json()["result"]["duplicates"] == 1
    assert count(rt, OutcomeRow) == 1 and len(letters(rt)) == 1


def test_what_cannot_go_back_is_refused_with_409(rt_client) -> None:
    rt, c = rt_client
    raw = orjson.dumps({"conversation_id": "x", "messages": []})
    with rt.sessions.begin() as s:
        truncated = DeadLetterRow(source="http", reason="oversized", detail="d", raw=raw[:10], raw_size=len(raw))
        otlp = DeadLetterRow(source="otlp", reason="malformed_otlp", detail="d", raw=b"\x0a\x01", raw_size=2)
        s.add_all([truncated, otlp])
        s.flush()
        ids = truncated.id, otlp.id
    for letter_id, says in zip(ids, ("first 10 of", "OTLP request body"), strict=True):
        r = c.post(f"/v1/dead-letters/{letter_id}/replay", headers=ADMIN)
        assert r.status_code == 409, r.text
        assert says in r.json()["detail"] and r.json()["reason"] == "not_replayable"
    assert all(d.replayed_at is None for d in letters(rt))
    assert c.post("/v1/dead-letters/999999/replay", headers=ADMIN).status_code == 404


def test_only_an_admin_replays(rt_client) -> None:
    rt, c = rt_client
    assert c.post("/v1/conversations", content=b"{not json", headers=INGEST).status_code == 400
    [letter] = letters(rt)
    for who in (REVIEWER, INGEST):
        assert c.post(f"/v1/dead-letters/{letter.id}/replay", headers=who).status_code == 403
    r = c.post(f"/v1/dead-letters/{letter.id}/replay", headers=ADMIN)
    assert r.status_code == 422 and r.json()["refusal"]["reason"] == "malformed_json"
    assert len(letters(rt)) == 1


def test_the_replayed_at_migration_matches_the_model_and_downgrades(db_url: str) -> None:
    from alembic import command
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import inspect

    from vigil.app.wiring import metadata
    from vigil.store import db

    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), metadata())
        assert [d for d in diffs if "dead_letters" in repr(d)] == []
        cfg = db.alembic_config(engine.url.render_as_string(hide_password=False))
        command.downgrade(cfg, "0021_detector_feeds")
        assert "replayed_at" not in {c["name"] for c in inspect(engine).get_columns("dead_letters")}
        command.upgrade(cfg, "head")
        assert "replayed_at" in {c["name"] for c in inspect(engine).get_columns("dead_letters")}
    finally:
        engine.dispose()


def test_each_source_finds_its_intake() -> None:
    from vigil.http.dead_letters import NoWayBack, intake_of

    def row(source: str, reason: str = "schema_invalid", raw: bytes = b"{}", **where: Any) -> DeadLetterRow:
        return DeadLetterRow(source=source, reason=reason, detail="", raw=raw, raw_size=len(raw), **where)

    outcome = orjson.dumps([{"conversation_id": "c", "type": "escalation"}])
    assert intake_of(row("kafka", topic="outcomes", offset=3, last_offset=3), "outcomes") == "outcomes"
    assert intake_of(row("kafka", topic="conversations", offset=3, last_offset=3), "outcomes") == "conversations"
    assert intake_of(row("otlp", "occurred_in_future"), "outcomes") == "conversations"
    assert intake_of(row("replay"), "outcomes") == "conversations"
    assert intake_of(row("http", raw=outcome), "outcomes") == "outcomes"
    assert intake_of(row("http", "unknown_outcome_type", raw=b"x"), "outcomes") == "outcomes"
    assert intake_of(row("http", raw=orjson.dumps({"conversation_id": "c", "messages": []})), "o") == "conversations"
    # the demo feeds conversations through the pipeline and outcomes through their store, both as "demo"
    assert intake_of(row("demo", raw=orjson.dumps({"conversation_id": "c", "messages": []})), "o") == "conversations"
    assert intake_of(row("demo", raw=outcome), "outcomes") == "outcomes"
    with pytest.raises(NoWayBack, match="offsets 3-7"):
        intake_of(row("kafka", topic="conversations", offset=3, last_offset=7), "outcomes")


def test_kafka_letters_go_back_through_the_intake_of_their_topic(rt_client) -> None:
    """A message the database refused once (``store_rejected``), on either topic: its topic names its intake."""
    rt, c = rt_client
    conv = next(Simulator(parse_versions("v1:0.0"), 2).stream(1, start=PAST))
    outcome = {"conversation_id": conv["conversation_id"], "type": "escalation", "idempotency_key": "k-9"}
    with rt.sessions.begin() as s:
        rows = [
            DeadLetterRow(
                source="kafka", topic=topic, partition=0, offset=7, last_offset=7, reason="store_rejected",
                detail="d", raw=orjson.dumps(doc), raw_size=len(orjson.dumps(doc)),
            )
            for topic, doc in (("conversations", conv), (rt.settings.kafka_outcomes_topic, outcome))
        ]  # fmt: skip
        s.add_all(rows)
        s.flush()
        ids = [r.id for r in rows]
    answers = [c.post(f"/v1/dead-letters/{i}/replay", headers=ADMIN) for i in ids]
    assert [(a.status_code, a.json()["intake"]) for a in answers] == [(200, "conversations"), (200, "outcomes")]
    assert count(rt, ConversationRow) == 1 and count(rt, OutcomeRow) == 1


def test_a_body_refused_as_over_the_size_limit_is_not_replayed_from_what_was_kept(sqlite_url: str) -> None:
    """Only the first bytes of an oversized body are kept: re-sending those is no replay (409), never a
    truncated body answered as refused again, or taken in part and marked re-sent."""
    rt = build_runtime(make_settings(sqlite_url, max_request_bytes=1024), registry=CollectorRegistry())
    try:
        with make_client(rt) as c:
            body = orjson.dumps([{"conversation_id": f"c-{i}", "messages": []} for i in range(100)])
            assert c.post("/v1/conversations", content=body, headers=INGEST).status_code == 413
            assert c.post("/v1/outcomes", content=body, headers=INGEST).status_code == 413
            kept = letters(rt)
            assert [d.reason for d in kept] == ["oversized", "oversized"]
            assert all(d.raw_size > len(d.raw) for d in kept)
            answers = [c.post(f"/v1/dead-letters/{d.id}/replay", headers=ADMIN) for d in kept]
            assert [a.status_code for a in answers] == [409, 409], [a.json() for a in answers]
    finally:
        rt.close()


def anthropic_body(chars: int = 70_000) -> bytes:
    """An Anthropic Messages record without an id or agent: read natively it is no conversation."""
    text = "x" * chars
    return orjson.dumps(
        {
            "system": "You help.",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": text}]},
                {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            ],
        }
    )


FORMATTED = "/v1/conversations?format=anthropic&agent_id=support-bot&agent_version=v2&unread=1"


def test_a_formatted_request_is_replayed_with_the_query_parameters_it_was_sent_with(db_url: str) -> None:
    """Refused as too dense under a low ``VIGIL_MAX_JSON_EXPANSION``, the body is re-sent once the setting is
    raised: read as the format and for the agent its request named, not as Vigil's schema (refused) nor as an
    agent called ``body``."""
    keep = {"dead_letter_raw_bytes": 200_000, "dead_letter_batch_raw_bytes": 200_000}
    low = build_runtime(make_settings(db_url, max_json_expansion=0.001, **keep), registry=CollectorRegistry())
    try:
        with make_client(low) as c:
            assert c.post(FORMATTED, content=anthropic_body(), headers=INGEST).status_code == 413
            listed = c.get("/v1/dead-letters", headers=ADMIN).json()
    finally:
        low.close()
    [letter] = listed
    assert letter["reason"] == "oversized"
    # what the intake reads of the query, and nothing else of it
    assert letter["query"] == "format=anthropic&agent_id=support-bot&agent_version=v2"

    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    try:
        with make_client(rt) as c:
            r = c.post(f"/v1/dead-letters/{letter['id']}/replay", headers=ADMIN)
            assert r.status_code == 200, r.text
            assert (r.json()["result"]["format"], r.json()["result"]["stored"]) == ("anthropic", 1)
            with rt.sessions() as s:
                stored = s.execute(select(ConversationRow.agent_id, ConversationRow.agent_version)).all()
            assert [tuple(row) for row in stored] == [("support-bot", "v2")]
            # ?format= on the replay still decides the format; the agent named by the request stays
            again = c.post(f"/v1/dead-letters/{letter['id']}/replay?format=auto", headers=ADMIN)
            assert again.status_code == 200 and again.json()["result"]["duplicates"] == 1, again.text
            # native: Vigil's own schema, the recorded parameters left out (a producer that named a wrong format)
            native = c.post(f"/v1/dead-letters/{letter['id']}/replay?format=native", headers=ADMIN)
            assert native.status_code == 422 and native.json()["refusal"]["rejected"] == 1, native.text
    finally:
        rt.close()


def test_a_request_refused_whole_keeps_its_parameters_and_its_items_keep_none(sqlite_url: str) -> None:
    """A body the format's reader refuses is kept as sent, with the query; an item refused after conversion
    is kept in Vigil's schema, read back without any."""
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    try:
        with make_client(rt) as c:
            assert c.post(FORMATTED, content=b'{"nothing": 1}', headers=INGEST).status_code == 422
            dated = orjson.dumps(
                {
                    "conversation_id": "c-ahead",
                    "agent_id": "a",
                    "ended_at": ahead(),
                    "messages": [{"role": "user", "content": "hi"}],
                }
            )
            assert c.post("/v1/conversations?format=openai", content=dated, headers=INGEST).status_code == 422
            listed = c.get("/v1/dead-letters", headers=ADMIN).json()
        assert [(d["reason"], d["query"]) for d in listed] == [
            ("occurred_in_future", None),
            ("schema_invalid", "format=anthropic&agent_id=support-bot&agent_version=v2"),
        ]
    finally:
        rt.close()


def test_recorded_parameters_are_bounded_and_checked_before_replay(rt_client) -> None:
    rt, c = rt_client
    long_id = "a" * 10_000  # no agent id is this long: the schema takes 256 characters at most
    assert (
        c.post(f"/v1/conversations?format=anthropic&agent_id={long_id}", content=b"[", headers=INGEST).status_code
        == 400
    )
    [kept] = letters(rt)
    assert kept.query is not None and len(kept.query) < 400 and kept.query.startswith("format=anthropic&agent_id=aaa")
    # a value cut is still longer than any the intake takes: refused again, never read as another agent
    r = c.post(f"/v1/dead-letters/{kept.id}/replay", headers=ADMIN)
    assert r.status_code == 422 and r.json()["refusal"]["reason"] == "malformed_json", r.text

    raw = anthropic_body(100)
    with rt.sessions.begin() as s:
        rows = [
            DeadLetterRow(source="http", reason="schema_invalid", detail="d", raw=raw, raw_size=len(raw), query=q)
            for q in ("format=hologram", "format=openai&format=anthropic", "format=openai&colour=blue", "agent_id")
        ]
        s.add_all(rows)
        s.flush()
        ids = [row.id for row in rows]
    for letter_id, says in zip(ids, ("format", "format", "colour", "query"), strict=True):
        r = c.post(f"/v1/dead-letters/{letter_id}/replay", headers=ADMIN)
        assert r.status_code == 409, r.text
        assert r.json()["reason"] == "not_replayable" and says in r.json()["detail"], r.text
    # an explicit ?format= replaces a recorded one it could not use
    r = c.post(f"/v1/dead-letters/{ids[0]}/replay?format=anthropic", headers=ADMIN)
    assert r.status_code == 200, r.text
    bad = c.post(f"/v1/dead-letters/{ids[0]}/replay?format=hologram", headers=ADMIN)
    assert bad.status_code == 422 and bad.json()["parameter"] == "format", bad.text


def test_a_letter_of_a_formatted_request_goes_back_to_conversations_whatever_it_holds() -> None:
    """OpenAI Agents spans carry a ``type`` and no ``messages``, as outcomes do: the query says which intake."""
    from vigil.http.dead_letters import intake_of

    spans = orjson.dumps([{"object": "trace.span", "type": "agent"}])
    row = DeadLetterRow(source="http", reason="schema_invalid", detail="", raw=spans, raw_size=len(spans))
    assert intake_of(row, "outcomes") == "outcomes"
    row.query = "format=openai-agents"
    assert intake_of(row, "outcomes") == "conversations"


def test_the_query_migration_matches_the_model_and_downgrades(db_url: str) -> None:
    from alembic import command
    from sqlalchemy import inspect

    from vigil.store import db

    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        cfg = db.alembic_config(engine.url.render_as_string(hide_password=False))
        command.downgrade(cfg, "0022_dead_letter_replayed")
        assert "query" not in {c["name"] for c in inspect(engine).get_columns("dead_letters")}
        command.upgrade(cfg, "head")
        assert "query" in {c["name"] for c in inspect(engine).get_columns("dead_letters")}
    finally:
        engine.dispose()


def test_a_format_given_for_an_outcome_letter_is_refused_naming_it(rt_client) -> None:
    """POST /v1/outcomes reads no format: asked for one, a replay says so instead of re-sending the letter
    as if the format had been read."""
    rt, c = rt_client
    outcome = {"conversation_id": "c-1", "type": "escalation", "occurred_at": ahead(), "idempotency_key": "k-2"}
    assert c.post("/v1/outcomes", json=outcome, headers=INGEST).status_code == 422
    [letter] = letters(rt)
    rt.get(OutcomeStore).bound = Later()
    for ask in ("?format=openai", "?format=openai&intake=outcomes"):
        r = c.post(f"/v1/dead-letters/{letter.id}/replay{ask}", headers=ADMIN)
        assert r.status_code == 422, r.text
        body = r.json()
        assert (body["reason"], body["parameter"], body["intake"]) == ("bad_parameter", "format", "outcomes")
        assert "POST /v1/outcomes reads no query parameters" in body["detail"]
    assert count(rt, OutcomeRow) == 0 and letters(rt)[0].replayed_at is None
    r = c.post(f"/v1/dead-letters/{letter.id}/replay", headers=ADMIN)
    assert r.status_code == 200 and r.json()["result"]["stored"] == 1, r.text
