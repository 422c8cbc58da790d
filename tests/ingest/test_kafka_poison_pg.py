"""Messages that stopped a consumer for good on Postgres: each must become a dead letter, and the messages
after it must be stored and their offsets committed.

The consumer retries a batch that fails without end (right for an outage, since nothing may be skipped),
so any message the database refuses every time used to hold up every partition that consumer reads.
"""

from __future__ import annotations

import threading
import uuid

import orjson
import pytest
from kafka import KafkaConsumer
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.ingest.test_kafka_consumer import FAST, count
from tests.support.app import make_settings
from tests.support.services import create_topic
from tests.support.waiting import wait_for
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.kafka import DLQ_VALUE_BYTES, ConsumerWorker, kafka_consumer, kafka_producer
from vigil.ingest.pipeline import Pipeline
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.schema import Conversation
from vigil.store.models import DeadLetterRow, OutcomeRow
from vigil.store.writes import DeadLetter

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def _letters(rt) -> list[DeadLetterRow]:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return list(s.scalars(select(DeadLetterRow).order_by(DeadLetterRow.offset)))


def test_a_nul_key_and_a_letter_too_big_for_the_dead_letter_topic_hold_up_nothing(kafka, pg_url) -> None:
    topic, dlq, group = (f"{p}-{uuid.uuid4().hex[:8]}" for p in ("conv", "dlq", "g"))
    create_topic(kafka, topic, 1)
    create_topic(kafka, dlq, 1)
    s = make_settings(
        pg_url,
        kafka_bootstrap_servers=kafka,
        kafka_conversations_topic=topic,
        kafka_group_id=group,
        kafka_dead_letter_topic=dlq,
        **FAST,
    )
    registry = CollectorRegistry()
    rt = build_runtime(s, registry=registry)
    good = list(Simulator(parse_versions("v1:0.0"), seed=8).stream(2))
    big = b"not json " + b"x" * (9 * 1024 * 1024)  # over the producer's 8 MiB request limit
    p = kafka_producer(kafka, max_request_size=16 * 1024 * 1024)
    p.send(topic, key=good[0]["conversation_id"].encode(), value=orjson.dumps(good[0]))
    p.send(topic, key=b"a\x00b", value=b"this is not json")
    p.send(topic, key=b"big", value=big)
    p.send(topic, key=good[1]["conversation_id"].encode(), value=orjson.dumps(good[1]))
    p.flush(60)
    p.close()
    worker = ConsumerWorker(rt, kafka_consumer(rt, [topic]), dead_letter_producer=kafka_producer(kafka))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: count(rt) == 2 and len(_letters(rt)) == 2, 90), (
            f"{count(rt)} of 2 conversations and {len(_letters(rt))} of 2 dead letters stored"
        )
        # and committed: the group's next consumer starts after the last message
        wait_for(lambda: worker.stored_batches > 0 and _committed(rt, topic) == 4, 60, what="offset 4 committed")
    finally:
        worker.stop()
        thread.join(30)
    nul, oversized = _letters(rt)
    assert (nul.reason, nul.key, nul.offset) == ("malformed_json", "a\ufffdb", 1)
    assert oversized.key == "big" and oversized.raw_size == len(big)
    assert _sample(registry, "vigil_ingest_errors_total", stage="store") == 0  # stored once, never retried
    reader = KafkaConsumer(dlq, bootstrap_servers=kafka, auto_offset_reset="earliest", consumer_timeout_ms=8000)
    got = {m.key: (dict(m.headers), len(m.value)) for m in reader}
    reader.close()
    headers, size = got[b"big"]
    assert size == DLQ_VALUE_BYTES and headers["vigil-truncated"] == b"true"
    assert headers["vigil-raw-size"] == str(len(big)).encode()
    assert b"a\x00b" in got  # the key as it came


def _committed(rt, topic: str) -> int | None:  # type: ignore[no-untyped-def]
    from kafka import TopicPartition

    c = KafkaConsumer(bootstrap_servers=rt.settings.kafka_bootstrap_servers, group_id=rt.settings.kafka_group_id)
    try:
        return c.committed(TopicPartition(topic, 0))
    finally:
        c.close()


def test_an_outcome_with_a_nul_key_is_refused_and_the_topic_goes_on(kafka, pg_url) -> None:
    topic = f"outcomes-{uuid.uuid4().hex[:8]}"
    s = make_settings(
        pg_url,
        kafka_bootstrap_servers=kafka,
        kafka_outcomes_topic=topic,
        kafka_conversations_topic=topic + "-conv",
        kafka_group_id=topic,
        **FAST,
    )
    rt = wire(build_runtime(s, registry=CollectorRegistry()), {"consume"})
    create_topic(kafka, topic, 1)
    create_topic(kafka, topic + "-conv", 1)
    [conv] = list(Simulator(parse_versions("v1:0.0"), seed=9).stream(1))
    rt.pipeline.process([Conversation.model_validate(conv)], "test")
    cid = conv["conversation_id"]
    p = kafka_producer(kafka)
    p.send(topic, value=orjson.dumps({"conversation_id": cid, "type": "thumbs_down", "idempotency_key": "k\x00nul"}))
    p.send(topic, value=orjson.dumps({"conversation_id": cid, "type": "escalation", "idempotency_key": "fine"}))
    p.flush(30)
    p.close()
    handlers = ConsumerWorker(rt, None).handlers
    worker = ConsumerWorker(rt, kafka_consumer(rt, list(handlers)), handlers)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()

    def stored() -> list[str]:
        with rt.sessions() as sess:
            return list(sess.scalars(select(OutcomeRow.idempotency_key)))

    try:
        assert wait_for(lambda: stored() == ["fine"] and len(_letters(rt)) == 1, 60), (stored(), _letters(rt))
    finally:
        worker.stop()
        thread.join(30)
    [letter] = _letters(rt)
    assert letter.reason == "schema_invalid" and "control characters" in letter.detail
    rt.close()


def test_dead_letters_the_database_refuses_are_kept_without_what_names_them(
    pg_url, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should anything still reach Postgres that it cannot store in a dead letter's key or detail, the
    letter is kept without them instead of failing (and so retrying) its batch for ever."""
    rt = build_runtime(make_settings(pg_url), registry=CollectorRegistry())
    monkeypatch.setattr("vigil.store.writes.storable_text", lambda text: text)  # as before the fix
    pipeline: Pipeline = rt.pipeline
    letter = DeadLetter("kafka", "malformed_json", "bad \x00 detail", b"raw \x00 bytes", "t", 0, 7, "k\x00")
    result = pipeline.store([], [letter], "kafka")
    assert result.new_dead_letters == [("malformed_json", "kafka")]
    [row] = _letters(rt)
    assert row.key is None and row.detail == "'bad \\x00 detail'" and row.raw == b"raw \x00 bytes"
    rt.close()


def test_an_outcomes_batch_the_database_refuses_is_split_to_the_message_at_fault(
    pg_url, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever an outcome may hold that Postgres refuses, the batch is split until the message at fault
    is found: it becomes a ``store_rejected`` dead letter and the messages beside it are stored."""
    from vigil.outcomes.ingest import OutcomeStore
    from vigil.runtime import Envelope

    rt = build_runtime(make_settings(pg_url), registry=CollectorRegistry())
    store = OutcomeStore(rt.settings, rt.sessions, rt.metrics, [])
    messages = [
        {"conversation_id": "c1", "type": "escalation", "idempotency_key": "one"},
        {"conversation_id": "c1", "type": "escalation", "idempotency_key": "two"},
        {"conversation_id": "c1", "type": "escalation", "idempotency_key": "three"},
    ]
    envelopes = [Envelope(orjson.dumps(m), "kafka", "outcomes", 0, n) for n, m in enumerate(messages)]
    real_store = store.store

    def refusing(session, outcomes, source):  # type: ignore[no-untyped-def]
        if any(o.idempotency_key == "two" for o in outcomes):  # as Postgres refuses a NUL
            from sqlalchemy.exc import DataError

            raise DataError("INSERT", {}, ValueError("PostgreSQL text fields cannot contain NUL (0x00) bytes"))
        return real_store(session, outcomes, source)

    monkeypatch.setattr(store, "store", refusing)
    result = store.handle_envelopes(envelopes)
    assert result.stored == 2 and [e.reason for e in result.errors] == ["store_rejected"]
    with rt.sessions() as s:
        assert sorted(s.scalars(select(OutcomeRow.idempotency_key))) == ["one", "three"]
    [letter] = _letters(rt)
    assert (letter.reason, letter.offset) == ("store_rejected", 1) and "cannot contain NUL" in letter.detail
    rt.close()


def test_a_message_that_would_decode_to_many_times_its_size_is_a_dead_letter(kafka, pg_url) -> None:
    """A conversation of 1 MB of empty arrays (within VIGIL_MAX_MESSAGE_BYTES) was decoded and stored: it
    held 20 MB once decoded, and a batch of 500 of them would hold 10 GB. The API refuses such a body by
    VIGIL_MAX_JSON_EXPANSION; the conversations topic now does too, and the messages after it go on."""
    from kafka import TopicPartition

    topic, group = f"conv-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 1)
    s = make_settings(
        pg_url, kafka_bootstrap_servers=kafka, kafka_conversations_topic=topic, kafka_group_id=group, **FAST
    )
    rt = build_runtime(s, registry=CollectorRegistry())
    good = list(Simulator(parse_versions("v1:0.0"), seed=8).stream(4))
    dense = dict(good[0], conversation_id="dense", metadata={"x": [[]] * 300_000})
    p = kafka_producer(kafka)
    for value in (good[0], good[1], dense, good[2], good[3]):
        p.send(topic, key=value["conversation_id"].encode(), value=orjson.dumps(value))
    p.flush(30)
    p.close()
    worker = ConsumerWorker(rt, kafka_consumer(rt, [topic]))
    worker.run(max_idle_polls=10)
    assert count(rt) == 4
    [letter] = _letters(rt)
    assert (letter.reason, letter.offset, letter.key) == ("oversized", 2, "dense")
    assert "VIGIL_MAX_JSON_EXPANSION=8" in letter.detail and letter.detail.startswith("message of ")
    reader = KafkaConsumer(bootstrap_servers=kafka, group_id=group)
    assert reader.committed(TopicPartition(topic, 0)) == 5  # past the letter and the messages after it
    reader.close()
    rt.close()
