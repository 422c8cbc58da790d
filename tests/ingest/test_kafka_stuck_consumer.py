"""What a consumer shows and sends when a batch cannot be stored, and the outcomes topic's dead letters."""

from __future__ import annotations

import logging
import threading
import uuid

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text

from tests.ingest.test_kafka_consumer import topic_settings
from tests.support.services import create_topic
from tests.support.waiting import wait_for
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.kafka import ConsumerWorker, kafka_consumer, kafka_producer

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]


def lag(registry: CollectorRegistry, topic: str) -> float | None:
    return registry.get_sample_value("vigil_consumer_lag_messages", {"topic": topic, "partition": "0"})


def test_lag_counts_what_is_not_committed_while_a_batch_keeps_failing(kafka, pg_url) -> None:
    topic, group = f"conv-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 1)
    registry = CollectorRegistry()
    rt = build_runtime(topic_settings(kafka, pg_url, topic, group, kafka_batch_size=50), registry=registry)
    p = kafka_producer(kafka)
    for i in range(30):
        p.send(topic, key=f"k{i}".encode(), value=b"{}")
    p.flush(30)
    failing = threading.Event()
    failing.set()
    handled: list[int] = []

    def handler(envelopes) -> None:  # type: ignore[no-untyped-def]
        handled.append(len(envelopes))
        if failing.is_set():
            raise RuntimeError("database away")

    worker = ConsumerWorker(rt, kafka_consumer(rt, [topic]), {topic: handler})
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        # polled and not stored: every message is still to be done, however far the fetch position moved
        wait_for(lambda: len(handled) >= 3, 60, what="the batch retried")
        assert lag(registry, topic) == 30
        failing.clear()
        wait_for(lambda: lag(registry, topic) == 0, 60, what="lag to fall once the batches are stored")
    finally:
        worker.stop()
        thread.join(15)
        p.close()
        rt.close()


def test_a_batch_failing_again_and_again_is_logged_without_its_statements_parameters(kafka, pg_url, caplog) -> None:
    topic, group = f"conv-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 1)
    rt = build_runtime(topic_settings(kafka, pg_url, topic, group), registry=CollectorRegistry())
    p = kafka_producer(kafka)
    p.send(topic, key=b"k", value=b"{}")
    p.flush(30)
    p.close()
    calls: list[int] = []
    secret = "-".join(("s3cret", "value"))  # not spelled out here: the logged traceback quotes this file

    def handler(envelopes) -> None:  # type: ignore[no-untyped-def]
        calls.append(len(envelopes))
        if len(calls) <= 3:  # a statement the database refuses, with what a client sent in its parameters
            with rt.sessions() as s:
                s.execute(text("SELECT CAST(:p AS text), 1 / 0"), {"p": secret})

    worker = ConsumerWorker(rt, kafka_consumer(rt, [topic]), {topic: handler})
    with caplog.at_level(logging.INFO, logger="vigil"):
        worker.run(max_idle_polls=5)
    assert calls[:4] == [1, 1, 1, 1]  # (then redelivered if the retries outlasted the poll interval)
    failures = [r for r in caplog.records if "storing a batch" in r.getMessage()]
    assert len(failures) == 3 and "division by zero" in failures[2].getMessage()
    assert [bool(r.exc_info) for r in failures] == [True, False, False]  # the traceback once
    assert secret not in caplog.text
    rt.close()


def test_bad_outcome_messages_are_produced_to_the_dead_letter_topic_too(kafka, pg_url) -> None:
    from kafka import KafkaConsumer

    topic, dlq = f"outcomes-{uuid.uuid4().hex[:8]}", f"dlq-{uuid.uuid4().hex[:8]}"
    for name in (topic, topic + "-conv", dlq):
        create_topic(kafka, name, 1)
    s = topic_settings(kafka, pg_url, topic + "-conv", topic, kafka_outcomes_topic=topic, kafka_dead_letter_topic=dlq)
    rt = wire(build_runtime(s, registry=CollectorRegistry()), {"consume"})
    p = kafka_producer(kafka)
    p.send(topic, key=b"m", value=b'{"conversation_id": ')
    p.send(topic, key=b"u", value=orjson.dumps({"conversation_id": "c1", "type": "chargeback"}))
    p.send(topic, key=b"s", value=orjson.dumps({"conversation_id": "c1", "type": "escalation", "value": "high"}))
    p.send(topic, key=b"ok", value=orjson.dumps({"conversation_id": "c1", "type": "escalation"}))
    p.flush(30)
    p.close()
    handlers = ConsumerWorker(rt, None).handlers
    worker = ConsumerWorker(rt, kafka_consumer(rt, list(handlers)), handlers, kafka_producer(kafka))
    worker.run(max_idle_polls=10)
    reader = KafkaConsumer(dlq, bootstrap_servers=kafka, auto_offset_reset="earliest", consumer_timeout_ms=8000)
    got = [(dict(m.headers)["vigil-reason"], dict(m.headers)["vigil-source-offset"], m.key) for m in reader]
    reader.close()
    assert got == [
        (b"malformed_json", b"0", b"m"),
        (b"unknown_outcome_type", b"1", b"u"),
        (b"schema_invalid", b"2", b"s"),
    ]
    rt.close()


def test_lag_after_a_commit_that_failed_counts_what_the_next_commit_wrote(tmp_path) -> None:
    """A commit that timed out dropped its batch's offsets: the next commit wrote every assigned partition's
    position, those included, but the lag of the first batch's partition stayed at its size (10) until the
    partition got new messages. A consumer of the worker's own interface, with a commit that fails once."""
    from collections import namedtuple
    from typing import Any

    from kafka.errors import KafkaTimeoutError

    from tests.support.app import make_settings
    from vigil.app.runtime import build_runtime
    from vigil.ingest.kafka import ConsumerWorker

    tp, msg = namedtuple("tp", "topic partition"), namedtuple("msg", "offset key value")
    p0, p1 = tp("t", 0), tp("t", 1)

    class Consumer:
        def __init__(self) -> None:
            first = {p0: [msg(o, b"k", b"{}") for o in range(10)]}
            self.polls: list[dict[Any, Any]] = [first, {p1: [msg(o, b"k", b"{}") for o in range(5)]}, {}, {}]
            self.commits, self.committed, self.pos = 0, {}, {p0: 0, p1: 0}

        def poll(self, timeout_ms: int, max_records: int) -> dict[Any, Any]:
            batch = self.polls.pop(0) if self.polls else {}
            for part, msgs in batch.items():
                self.pos[part] = msgs[-1].offset + 1
            return batch

        def assignment(self) -> set[Any]:
            return {p0, p1}

        def highwater(self, part: Any) -> int:
            return {p0: 10, p1: 5}[part]

        def position(self, part: Any, timeout_ms: int | None = None) -> int:
            return self.pos[part]

        def end_offsets(self, parts: Any, timeout_ms: int | None = None) -> dict[Any, int]:
            return {p0: 10, p1: 5}

        def commit(self) -> None:
            self.commits += 1
            if self.commits == 1:
                raise KafkaTimeoutError("coordinator not available")
            self.committed = dict(self.pos)  # every assigned partition's position, as kafka-python commits

        def close(self, autocommit: bool = False) -> None:
            pass

    registry = CollectorRegistry()
    rt = build_runtime(make_settings(f"sqlite:///{tmp_path / 'v.db'}"), registry=registry)
    consumer = Consumer()
    ConsumerWorker(rt, consumer, {"t": lambda envs: None}).run(max_idle_polls=2)
    assert consumer.committed == {p0: 10, p1: 5}
    for part in ("0", "1"):
        lag = registry.get_sample_value("vigil_consumer_lag_messages", {"topic": "t", "partition": part})
        assert lag == 0, (part, lag)
    rt.close()
