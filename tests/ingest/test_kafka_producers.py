"""What real producers send, read by the Kafka consumer against a real Kafka-protocol broker and Postgres:
compressed batches of every codec, batches that cannot be read, compression bombs, transactions,
tombstones, headers and schema-registry framing."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import orjson
import pytest
from kafka.record.memory_records import MemoryRecords
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from tests.support.app import make_settings
from tests.support.services import create_topic
from tests.support.waiting import scaled, wait_for
from vigil.app.runtime import build_runtime
from vigil.ingest.kafka import ConsumerWorker, kafka_consumer, kafka_producer
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.store.models import ConversationRow, DeadLetterRow

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]

FAST = {
    "kafka_max_poll_interval_ms": int(scaled(4000)),
    "kafka_session_timeout_ms": int(scaled(3000)),
    "kafka_poll_timeout_ms": 200,
}


def fresh_topic(bootstrap: str, partitions: int = 1) -> str:
    topic = f"conv-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions)
    return topic


def runtime_for(bootstrap: str, db: str, topic: str, registry: CollectorRegistry | None = None, **extra: Any):  # type: ignore[no-untyped-def]
    s = make_settings(
        db,
        kafka_bootstrap_servers=bootstrap,
        kafka_conversations_topic=topic,
        kafka_group_id=f"g-{uuid.uuid4().hex[:8]}",
        **FAST,
        **extra,
    )
    return build_runtime(s, registry=registry or CollectorRegistry())


class Running:
    """A consumer worker on its own thread, as `vigil consume` runs it; ``error`` is what stopped it."""

    def __init__(self, rt, dead_letter_producer: Any = None, topics: list[str] | None = None) -> None:  # type: ignore[no-untyped-def]
        self.rt = rt
        topics = topics or [rt.settings.kafka_conversations_topic]
        consumer = kafka_consumer(rt, topics, client_id=f"t-{uuid.uuid4().hex[:6]}")
        self.worker = ConsumerWorker(rt, consumer, dead_letter_producer=dead_letter_producer)
        self.error: BaseException | None = None
        self.largest = 0  # bytes of the largest message the consumer handed to a topic's handler
        for topic, handler in list(self.worker.handlers.items()):
            self.worker.handlers[topic] = self._measured(handler)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _measured(self, handler):  # type: ignore[no-untyped-def]
        def measured(envelopes):  # type: ignore[no-untyped-def]
            self.largest = max([self.largest, *(len(e.raw) for e in envelopes)])
            return handler(envelopes)

        return measured

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # what a `vigil consume` process would have died of
            self.error = exc

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.thread.join(scaled(30))

    def wait(self, check, what: str, timeout: float = 90) -> Any:  # type: ignore[no-untyped-def]
        """Wait for ``check``; fail at once, with its error, if the worker stopped."""

        def done():  # type: ignore[no-untyped-def]
            if self.error is not None:
                raise AssertionError(f"the consumer stopped: {type(self.error).__name__}: {self.error}")
            return check()

        return wait_for(done, timeout, interval=0.1, what=what)


def conversations(n: int, seed: int) -> list[dict[str, Any]]:
    return list(Simulator(parse_versions("v1:0.0"), seed=seed).stream(n))


def send(producer, topic: str, convs: list[dict[str, Any]], **kw: Any) -> None:  # type: ignore[no-untyped-def]
    for c in convs:
        producer.send(topic, key=c["conversation_id"].encode(), value=orjson.dumps(c), **kw)
    producer.flush(30)


def stored_ids(rt) -> set[str]:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return set(s.scalars(select(ConversationRow.conversation_id)).all())


def count(rt, model=ConversationRow) -> int:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return s.scalar(select(func.count()).select_from(model)) or 0


def letters(rt) -> list[DeadLetterRow]:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return list(s.scalars(select(DeadLetterRow).order_by(DeadLetterRow.offset)).all())


def test_batches_of_every_compression_codec_are_stored(kafka, pg_url) -> None:
    """Producers set compression.type gzip, snappy, lz4 or zstd; the consumer needs each codec's library
    (a dependency of Vigil): without one, the first batch in that codec stopped `vigil consume`."""
    topic = fresh_topic(kafka)
    rt = runtime_for(kafka, pg_url, topic)
    sent: set[str] = set()
    for n, codec in enumerate(["gzip", "snappy", "lz4", "zstd"]):
        convs = conversations(5, seed=100 + n)
        p = kafka_producer(kafka, compression_type=codec, linger_ms=50)
        send(p, topic, convs)
        p.close()
        sent |= {c["conversation_id"] for c in convs}
    with Running(rt) as running:
        running.wait(lambda: stored_ids(rt) == sent, "20 conversations, 5 in each codec")
    assert letters(rt) == []


def test_a_batch_in_a_codec_without_its_library_is_a_dead_letter_and_the_partition_goes_on(
    kafka, pg_url, monkeypatch
) -> None:
    """A consumer installed without a codec's library (or a codec it does not know) met a batch in it:
    `vigil consume` stopped with UnsupportedCodecError, and again after every restart."""
    import kafka.codec as codecs

    topic = fresh_topic(kafka)
    registry = CollectorRegistry()
    rt = runtime_for(kafka, pg_url, topic, registry)
    before, unreadable, after = conversations(3, 1), conversations(4, 2), conversations(3, 3)
    plain = kafka_producer(kafka)
    send(plain, topic, before)
    snappy = kafka_producer(kafka, compression_type="snappy", linger_ms=200)
    send(snappy, topic, unreadable)  # one batch of 4, at offsets 3-6
    snappy.close()
    send(plain, topic, after)
    plain.close()
    monkeypatch.setattr(codecs, "has_snappy", lambda: False)  # as on an install without python-snappy
    with Running(rt) as running:
        running.wait(lambda: len(stored_ids(rt)) == 6, "the 6 readable conversations stored")
        running.wait(lambda: letters(rt), "the unreadable batch's dead letter")
    assert stored_ids(rt) == {c["conversation_id"] for c in before + after}
    [letter] = letters(rt)
    assert (letter.reason, letter.topic, letter.partition, letter.offset, letter.last_offset) == (
        "undecodable_batch",
        topic,
        0,
        3,
        6,
    )
    assert "snappy" in letter.detail and "codec not found" in letter.detail
    batch = MemoryRecords(letter.raw).next_batch()  # kept as fetched: still compressed, whole
    assert (batch.base_offset, batch.compression_type, batch.records_count) == (3, 2, 4)
    counted = registry.get_sample_value("vigil_dead_letters_total", {"reason": "undecodable_batch", "source": "kafka"})
    assert counted == 4


def test_a_batch_whose_payload_does_not_decompress_is_a_dead_letter(kafka, pg_url, monkeypatch) -> None:
    """A producer wrote a gzip batch whose payload is cut short (its checksum covers the damage, so the
    broker and the consumer's check take it): reading it raised out of poll() and stopped the consumer."""
    import kafka.codec as codecs
    import kafka.record.default_records as records

    topic = fresh_topic(kafka)
    rt = runtime_for(kafka, pg_url, topic)
    good = conversations(5, 4)
    plain = kafka_producer(kafka)
    send(plain, topic, good[:2])
    monkeypatch.setattr(records, "gzip_encode", lambda data: codecs.gzip_encode(data)[:-40])
    broken = kafka_producer(kafka, compression_type="gzip")
    broken.send(topic, key=b"cut", value=orjson.dumps(conversations(1, 5)[0]))
    broken.flush(30)
    broken.close()
    monkeypatch.undo()
    send(plain, topic, good[2:])
    plain.close()
    with Running(rt) as running:
        running.wait(lambda: len(stored_ids(rt)) == 5 and letters(rt), "5 conversations and a dead letter")
    [letter] = letters(rt)
    assert (letter.reason, letter.offset, letter.last_offset) == ("undecodable_batch", 2, 2)
    assert "gzip" in letter.detail


def test_a_compression_bomb_is_refused_without_being_inflated(kafka, pg_url) -> None:
    """A zstd batch of a few KB inflating to 64 MiB: kafka-python inflated every batch whole (a 32 KB batch
    of 1 GiB took `vigil consume` from 234 MB to 3.4 GB, and a 1 MB batch can hold some 30 GiB)."""
    topic = fresh_topic(kafka)
    registry = CollectorRegistry()
    rt = runtime_for(kafka, pg_url, topic, registry, kafka_max_inflated_batch_bytes=2 << 20)
    good = conversations(2, 6)
    plain = kafka_producer(kafka)
    send(plain, topic, good[:1])
    bomb = kafka_producer(kafka, compression_type="zstd", max_request_size=128 << 20)
    bomb.send(topic, key=b"bomb", value=b" " * (64 << 20)).get(60)
    bomb.close()
    send(plain, topic, good[1:])
    plain.close()
    with Running(rt) as running:
        running.wait(lambda: len(stored_ids(rt)) == 2 and letters(rt), "2 conversations and a dead letter")
    [letter] = letters(rt)
    assert (letter.reason, letter.offset, letter.last_offset) == ("oversized_batch", 1, 1)
    assert "2097152" in letter.detail and "VIGIL_KAFKA_MAX_INFLATED_BATCH_BYTES" in letter.detail
    batch = MemoryRecords(letter.raw).next_batch()  # what the broker holds: a small zstd batch
    assert (batch.base_offset, batch.compression_type) == (1, 4) and letter.raw_size < 64 << 10
    assert running.largest < 1 << 20  # the 64 MiB message was never handed over
    counted = registry.get_sample_value("vigil_dead_letters_total", {"reason": "oversized_batch", "source": "kafka"})
    assert counted == 1


OVERSIZED = ("vigil_dead_letters_total", {"reason": "oversized", "source": "kafka"})


def test_large_messages_in_many_small_compressed_batches_are_refused_as_they_leave_their_batch(kafka, pg_url) -> None:
    """Each batch inflates within bounds, but each holds a message of 4 MiB: a poll handed every one of them
    over whole (a fetch of 1 MB holds hundreds of such batches: 40 of 60 MiB took a consumer to 23 GB, and
    the kernel killed it), to be refused as oversized only then."""
    topic = fresh_topic(kafka)
    registry = CollectorRegistry()
    rt = runtime_for(kafka, pg_url, topic, registry)  # VIGIL_MAX_MESSAGE_BYTES: 1,000,000
    good = conversations(2, 7)
    plain = kafka_producer(kafka)
    send(plain, topic, good[:1])
    large = kafka_producer(kafka, compression_type="zstd", max_request_size=16 << 20)
    for n in range(8):
        large.send(topic, key=f"large-{n}".encode(), value=b"x" * (4 << 20)).get(60)  # a batch each
    large.close()
    send(plain, topic, good[1:])
    plain.close()
    with Running(rt) as running:
        running.wait(lambda: len(stored_ids(rt)) == 2, "the 2 conversations around them")
        running.wait(lambda: registry.get_sample_value(*OVERSIZED) == 8, "8 messages in dead letters")
    rows = letters(rt)
    assert {d.reason for d in rows} == {"oversized"} and rows[0].offset == 1
    assert max(d.last_offset for d in rows) == 8 and rows[0].key == "large-0"
    assert "4194304 bytes exceeds the limit of 1000000" in rows[0].detail
    assert running.largest <= 1_000_000  # none of them was handed over whole


def test_messages_of_an_open_transaction_are_stored_once_it_commits(kafka, pg_url) -> None:
    """A transactional producer's messages are not the producer's until it commits: read uncommitted (the
    client's default), Vigil stored them while the transaction was open, and would keep them had it been
    aborted. (Aborted transactions: test_kafka_transactions.)"""
    from kafka import KafkaProducer

    topic = fresh_topic(kafka, partitions=2)
    rt = runtime_for(kafka, pg_url, topic)
    in_transaction, beside = conversations(3, 8), conversations(2, 9)
    tx = KafkaProducer(bootstrap_servers=kafka, transactional_id=f"tx-{uuid.uuid4().hex[:8]}")
    plain = kafka_producer(kafka)
    try:
        tx.init_transactions()
        tx.begin_transaction()
        send(tx, topic, in_transaction, partition=0)  # written to the log, not committed
        with Running(rt) as running:
            for c in beside:  # the other partition is read meanwhile, fetch after fetch
                send(plain, topic, [c], partition=1)
                running.wait(lambda c=c: c["conversation_id"] in stored_ids(rt), "a conversation beside it")
            assert stored_ids(rt) == {c["conversation_id"] for c in beside}
            tx.commit_transaction()
            everything = {c["conversation_id"] for c in in_transaction + beside}
            running.wait(lambda: stored_ids(rt) == everything, "the transaction's conversations once committed")
    finally:
        tx.close(timeout=5)
        plain.close(timeout=5)
    assert letters(rt) == []


def test_a_transaction_marker_is_committed_past_and_leaves_no_lag(kafka, pg_url) -> None:
    """A transaction ends with a marker in the log, which no poll returns: the worker committed only after
    the messages it stored, so the group's offset and vigil_consumer_lag_messages stayed one behind each
    partition's last transaction (as many behind as an aborted transaction held, read committed) until the
    next message came."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = fresh_topic(kafka)
    registry = CollectorRegistry()
    rt = runtime_for(kafka, pg_url, topic, registry)
    convs = conversations(3, 10)
    tx = KafkaProducer(bootstrap_servers=kafka, transactional_id=f"tx-{uuid.uuid4().hex[:8]}")
    try:
        tx.init_transactions()
        tx.begin_transaction()
        send(tx, topic, convs)
        tx.commit_transaction()  # offsets 0-2, and its marker at 3
    finally:
        tx.close(timeout=5)
    lag = ("vigil_consumer_lag_messages", {"topic": topic, "partition": "0"})
    with Running(rt) as running:
        running.wait(lambda: len(stored_ids(rt)) == 3, "the transaction's 3 conversations")
        running.wait(lambda: registry.get_sample_value(*lag) == 0, "no lag once the marker is passed")
    reader = KafkaConsumer(bootstrap_servers=kafka, group_id=rt.settings.kafka_group_id)
    try:
        assert reader.committed(TopicPartition(topic, 0)) == 4  # past the marker, not at it
    finally:
        reader.close()


def test_a_message_refused_for_its_size_and_one_for_its_density_are_both_kept(kafka, pg_url) -> None:
    """Messages refused for their size as they leave their batch, kept apart from the pipeline's letters of
    the same reason (`oversized`): their letter spanned offsets 1-3, so the pipeline's letter of offset 2
    (a message of empty arrays, refused for what it would take decoded) counted as recorded and was lost."""
    topic = fresh_topic(kafka)
    registry = CollectorRegistry()
    rt = runtime_for(kafka, pg_url, topic, registry)
    good = conversations(2, 12)
    p = kafka_producer(kafka, compression_type="zstd", max_request_size=16 << 20)
    send(p, topic, good[:1])
    p.send(topic, key=b"large-1", value=b"x" * (2 << 20))
    p.send(topic, key=b"dense", value=b"[" + b"[]," * 40_000 + b"[]]")
    p.send(topic, key=b"large-3", value=b"x" * (2 << 20))
    send(p, topic, good[1:])
    p.close()
    with Running(rt) as running:
        running.wait(lambda: len(stored_ids(rt)) == 2, "the 2 conversations around them")
        running.wait(lambda: registry.get_sample_value(*OVERSIZED) == 3, "3 oversized messages counted")
    rows = letters(rt)
    assert [(d.offset, d.last_offset, d.reason) for d in rows] == [(1, 3, "oversized")]
    assert "3 message(s) at offsets 1-3" in rows[0].detail and "VIGIL_MAX_JSON_EXPANSION" in rows[0].detail


def test_tombstones_headers_and_schema_registry_framing(kafka, pg_url) -> None:
    """What producers with a schema registry, compacted topics or headers send: a tombstone (null value)
    and a key alone are `empty` dead letters; headers change nothing; JSON in the registry's wire format
    (magic byte 0, a 4-byte schema id, the JSON, as JSON Schema serializers write) was a malformed_json
    dead letter, each such conversation lost; an Avro value in that format said only where it failed."""
    topic = fresh_topic(kafka)
    registry = CollectorRegistry()
    rt = runtime_for(kafka, pg_url, topic, registry)
    convs = conversations(4, 11)
    p = kafka_producer(kafka)
    p.send(topic, key=convs[0]["conversation_id"].encode(), value=None)  # 0: a tombstone
    p.send(topic, key=b"only-a-key")  # 1: no value at all
    headers = [("content-type", b"application/json"), ("schema.version", b"3"), ("trace", b"")]
    p.send(topic, key=b"h", value=orjson.dumps(convs[0]), headers=headers)  # 2: headers
    framed = b"\x00" + (42).to_bytes(4, "big")
    p.send(topic, key=b"json", value=framed + orjson.dumps(convs[1]))  # 3: JSON Schema serializer
    p.send(topic, key=b"json-array", value=framed + b" \n" + orjson.dumps(convs[2]))  # 4: with blanks before it
    avro = framed + b"\x02\x0cconv-1\x0eagent-a"  # 5: an Avro record's bytes
    p.send(topic, key=b"avro", value=avro)
    p.send(topic, key=b"plain", value=orjson.dumps(convs[3]))  # 6
    p.flush(30)
    p.close()
    with Running(rt) as running:
        running.wait(lambda: len(stored_ids(rt)) == 4 and len(letters(rt)) == 2, "4 conversations, 2 letters")
    assert stored_ids(rt) == {c["conversation_id"] for c in convs}
    rows = letters(rt)  # the batch's two empty messages share a letter
    assert [(d.offset, d.last_offset, d.reason) for d in rows] == [(0, 1, "empty"), (5, 5, "malformed_json")]
    assert rows[0].key == convs[0]["conversation_id"] and "empty message" in rows[0].detail
    assert "schema id 42" in rows[1].detail and "not JSON" in rows[1].detail and rows[1].raw == avro
    assert registry.get_sample_value("vigil_dead_letters_total", {"reason": "empty", "source": "kafka"}) == 2


def test_the_outcomes_topic_reads_framed_json_and_refuses_what_it_cannot_read(kafka, pg_url) -> None:
    """The outcomes topic is read by the same consumer: a JSON outcome in a schema registry's wire format
    was a malformed_json dead letter, and a message over VIGIL_MAX_MESSAGE_BYTES is refused as it leaves its
    compressed batch, kept by the outcomes handler with its full size."""
    from vigil.app.wiring import wire
    from vigil.store.models import OutcomeRow

    topic = fresh_topic(kafka)
    outcomes = fresh_topic(kafka)
    registry = CollectorRegistry()
    rt = wire(runtime_for(kafka, pg_url, topic, registry, kafka_outcomes_topic=outcomes), {"consume"})
    cid = conversations(1, 13)[0]["conversation_id"]
    framed = b"\x00" + (7).to_bytes(4, "big")
    p = kafka_producer(kafka, compression_type="gzip", max_request_size=16 << 20)
    values = [
        framed + orjson.dumps({"conversation_id": cid, "type": "escalation", "idempotency_key": "framed"}),
        b"[" + b" " * (2 << 20) + b"]",  # 2 MiB: over VIGIL_MAX_MESSAGE_BYTES
        orjson.dumps({"conversation_id": cid, "type": "thumbs_down", "idempotency_key": "plain"}),
    ]
    for value in values:
        p.send(outcomes, key=cid.encode(), value=value).get(30)
    p.close()

    def kept() -> set[str]:
        with rt.sessions() as s:
            return set(s.scalars(select(OutcomeRow.idempotency_key)).all())

    with Running(rt, topics=[outcomes]) as running:
        running.wait(lambda: kept() == {"framed", "plain"} and letters(rt), "2 outcomes and a dead letter")
    [letter] = letters(rt)
    assert (letter.topic, letter.offset, letter.reason, letter.raw_size) == (outcomes, 1, "oversized", (2 << 20) + 2)
    assert running.largest <= 1_000_000
