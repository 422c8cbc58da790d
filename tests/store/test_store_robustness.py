"""Input the database refuses, NUL characters, revisions, time filters, and what the metrics count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select, text

from tests.support.app import ADMIN, INGEST, REVIEWER, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.ingest.pipeline import Envelope
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.store.models import ConversationRow, DeadLetterRow


def sim(n: int, versions: str = "v1:0.0", seed: int = 4) -> list[dict]:
    return list(Simulator(parse_versions(versions), seed).stream(n))


def refuse_agent(rt, agent: str) -> None:  # type: ignore[no-untyped-def]
    """Make the database itself refuse one agent's conversations, as a real constraint would."""
    with rt.engine.begin() as conn:
        if rt.engine.dialect.name == "postgresql":
            conn.execute(text(f"ALTER TABLE conversations ADD CONSTRAINT no_evil CHECK (agent_id <> '{agent}')"))
        else:
            conn.execute(
                text(
                    f"CREATE TRIGGER no_evil BEFORE INSERT ON conversations WHEN NEW.agent_id = '{agent}' "
                    "BEGIN SELECT RAISE(ABORT, 'refused by constraint'); END"
                )
            )


def count(rt, model) -> int:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return s.scalar(select(func.count()).select_from(model)) or 0


def test_http_batch_keeps_good_items_when_the_database_refuses_one(db_url) -> None:
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    refuse_agent(rt, "evil")
    good = sim(4)
    bad = dict(good[0], conversation_id="refused-1", agent_id="evil")
    with make_client(rt) as c:
        r = c.post("/v1/conversations", json=[good[0], good[1], bad, good[2], good[3]], headers=INGEST)
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["stored"] == 4 and body["errors"][0]["index"] == 2
        assert "refused" in body["errors"][0]["errors"][0]["message"]
        dead = c.get("/v1/dead-letters", headers=ADMIN).json()
    assert [d["reason"] for d in dead] == ["store_rejected"]
    assert '"refused-1"' in dead[0]["raw_preview"] and dead[0]["key"] == "refused-1"
    assert count(rt, ConversationRow) == 4


def test_kafka_batch_with_a_refused_message_goes_on(db_url) -> None:
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    refuse_agent(rt, "evil")
    convs = sim(30)
    convs[17]["agent_id"] = "evil"
    envs = [Envelope(orjson.dumps(c), "kafka", "t", 0, i, c["conversation_id"]) for i, c in enumerate(convs)]
    result = rt.pipeline.process_raw(envs)
    assert len(result.stored) == 29
    with rt.sessions() as s:
        dead = s.scalars(select(DeadLetterRow)).all()
    assert [(d.reason, d.topic, d.partition, d.offset) for d in dead] == [("store_rejected", "t", 0, 17)]
    assert b'"evil"' in dead[0].raw
    text_out = rt.metrics.registry.get_sample_value(
        "vigil_dead_letters_total", {"reason": "store_rejected", "source": "kafka"}
    )
    assert text_out == 1.0


def test_escaped_nul_characters_are_stored(db_url) -> None:
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    conv = sim(1)[0]
    conv["messages"][1]["content"] = "before\u0000after"
    raw = orjson.dumps(conv)
    assert b"\\u0000" in raw
    with make_client(rt) as c:
        assert c.post("/v1/conversations", content=raw, headers=INGEST).status_code == 202
        other = dict(conv, conversation_id="nul-kafka")
        rt.pipeline.process_raw([Envelope(orjson.dumps(other), "kafka", "t", 0, 1)])
        for cid in (conv["conversation_id"], "nul-kafka"):
            got = c.get(f"/v1/conversations/{cid}", headers=REVIEWER).json()
            assert got["conversation"]["messages"][1]["content"] == "before\ufffdafter"


def test_out_of_range_revision_and_tokens_are_named(client) -> None:
    conv = sim(1)[0]
    r = client.post("/v1/conversations", json=[dict(conv, revision=2**64)], headers=INGEST)
    assert r.status_code == 422 and r.json()["errors"][0]["errors"][0]["field"] == "revision"
    conv["usage"]["total_tokens"] = 10**20
    r = client.post("/v1/conversations", json=[conv], headers=INGEST)
    assert r.json()["errors"][0]["errors"][0]["field"] == "usage.total_tokens"


def test_oversized_batches_are_dead_lettered(client) -> None:
    conv = sim(1)[0]
    r = client.post("/v1/conversations", content=orjson.dumps([conv] * 1001), headers=INGEST)
    assert r.status_code == 413
    assert client.get("/v1/dead-letters", headers=ADMIN).json()[0]["reason"] == "batch_too_large"


def test_revisions_count_once_and_new_findings_only(client, runtime) -> None:
    conv = [c for c in sim(60, "v1:1.0", seed=8) if c["metadata"]["simulated_defect"] == "pii_leak"][0]
    for rev in (1, 2, 3):
        client.post("/v1/conversations", json=dict(conv, revision=rev), headers=INGEST)
    reg = runtime.metrics.registry
    labels = {"agent": "support-bot", "agent_version": "v1", "source": "http"}
    assert reg.get_sample_value("vigil_conversations_processed_total", labels) == 1.0
    assert reg.get_sample_value("vigil_conversations_updated_total", labels) == 2.0
    finding = {"rule": "pii-in-reply", "severity": "critical", "agent": "support-bot", "agent_version": "v1"}
    assert reg.get_sample_value("vigil_findings_total", finding) == 1.0
    flagged = {"agent": "support-bot", "agent_version": "v1", "severity": "critical"}
    assert reg.get_sample_value("vigil_conversations_flagged_total", flagged) == 1.0


def test_a_redelivered_dead_letter_is_counted_once(runtime) -> None:
    env = Envelope(b"not json", "kafka", "t", 3, 99, "k")
    runtime.pipeline.process_raw([env])
    runtime.pipeline.process_raw([env])
    assert count(runtime, DeadLetterRow) == 1
    value = runtime.metrics.registry.get_sample_value(
        "vigil_dead_letters_total", {"reason": "malformed_json", "source": "kafka"}
    )
    assert value == 1.0


def test_http_ingest_observes_processing_time(client, runtime) -> None:
    client.post("/v1/conversations", json=sim(5), headers=INGEST)
    reg = runtime.metrics.registry
    assert reg.get_sample_value("vigil_processing_seconds_count", {"stage": "rules"}) == 1.0
    assert reg.get_sample_value("vigil_batch_size_conversations_count") == 1.0


@pytest.mark.parametrize("offset_hours", [0, 5, -8])
def test_time_filters_honour_the_offset(client, offset_hours) -> None:
    client.post("/v1/conversations", json=sim(3), headers=INGEST)
    now = datetime.now(UTC)
    zone = UTC if offset_hours == 0 else __import__("datetime").timezone(timedelta(hours=offset_hours))
    before, after = (now - timedelta(minutes=5)).astimezone(zone), (now + timedelta(minutes=5)).astimezone(zone)
    q = lambda **p: client.get("/v1/conversations", params=p, headers=REVIEWER).json()["total"]  # noqa: E731
    assert q(since=before.isoformat()) == 3
    assert q(since=after.isoformat()) == 0
    assert q(until=before.isoformat()) == 0
    listed = client.get("/v1/conversations", headers=REVIEWER).json()["items"][0]["received_at"]
    assert listed.endswith(("Z", "+00:00"))


def test_ids_with_slashes_are_reachable(client) -> None:
    conv = dict(sim(1)[0], conversation_id="tenant/a/42")
    client.post("/v1/conversations", json=conv, headers=INGEST)
    assert client.get("/v1/conversations/tenant%2Fa%2F42", headers=REVIEWER).json()["conversation_id"] == "tenant/a/42"
    assert client.get("/v1/conversations/tenant/a/42", headers=REVIEWER).status_code == 200


def test_a_refused_replayed_conversation_is_kept_under_its_own_source(sqlite_url) -> None:
    from vigil.schema import Conversation

    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    refuse_agent(rt, "evil")
    convs = sim(3)
    convs[1]["agent_id"] = "evil"
    result = rt.pipeline.process([Conversation.model_validate(c) for c in convs], "replay")
    assert len(result.stored) == 2
    with rt.sessions() as s:
        dead = s.scalars(select(DeadLetterRow)).all()
    assert [(d.source, d.reason, d.key) for d in dead] == [("replay", "store_rejected", convs[1]["conversation_id"])]
    assert b'"evil"' in dead[0].raw


def test_dead_letters_count_messages_not_rows(runtime, client) -> None:
    """A consumer batch's bad messages share one row per reason; the counter said 1 for 100 of them (its
    help says messages, and the outcomes path counted messages), so an alert on its rate read low."""
    envs = [Envelope(b"not json", "kafka", "t", 0, n, "k") for n in range(100)]
    envs += [
        Envelope(orjson.dumps({"conversation_id": "x", "messages": []}), "kafka", "t", 0, 100 + n) for n in range(40)
    ]
    runtime.pipeline.process_raw(envs)
    assert count(runtime, DeadLetterRow) == 2
    reg = runtime.metrics.registry
    assert reg.get_sample_value("vigil_dead_letters_total", {"reason": "malformed_json", "source": "kafka"}) == 100
    assert reg.get_sample_value("vigil_dead_letters_total", {"reason": "schema_invalid", "source": "kafka"}) == 40
    runtime.pipeline.process_raw(envs)  # redelivered: counted once
    assert reg.get_sample_value("vigil_dead_letters_total", {"reason": "malformed_json", "source": "kafka"}) == 100
    bad = [{"conversation_id": f"b{n}", "messages": []} for n in range(7)]
    assert client.post("/v1/conversations", json=bad, headers=INGEST).status_code == 422
    assert reg.get_sample_value("vigil_dead_letters_total", {"reason": "schema_invalid", "source": "http"}) == 7
