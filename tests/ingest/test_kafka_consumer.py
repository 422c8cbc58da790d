"""The Kafka source against a real Kafka-protocol broker and Postgres: at-least-once, nothing lost or doubled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from tests.support.app import make_settings
from tests.support.services import create_topic, free_port, scrape
from tests.support.waiting import scaled, wait_for
from vigil.app.runtime import build_runtime
from vigil.ingest.kafka import ConsumerWorker, kafka_consumer, kafka_producer
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.rules import RuleEngine
from vigil.schema import Conversation
from vigil.settings import PROJECT_ROOT
from vigil.store.models import ConversationRow, DeadLetterRow, FindingRow

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]

# short group timeouts so a dead consumer's partitions move quickly; stretched on a busy machine, where a
# batch can take longer than an idle machine's poll interval
FAST = {
    "kafka_max_poll_interval_ms": int(scaled(4000)),
    "kafka_session_timeout_ms": int(scaled(3000)),
    "kafka_poll_timeout_ms": 200,
}


def topic_settings(bootstrap: str, db: str, topic: str, group: str, **extra: object):  # type: ignore[no-untyped-def]
    return make_settings(
        db,
        kafka_bootstrap_servers=bootstrap,
        kafka_conversations_topic=topic,
        kafka_group_id=group,
        **FAST,
        **extra,
    )


def produce(bootstrap: str, topic: str, convs: list[dict]) -> None:
    p = kafka_producer(bootstrap)
    for c in convs:
        p.send(topic, key=c["conversation_id"].encode(), value=orjson.dumps(c))
    p.flush(30)
    p.close()


def count(rt, model=ConversationRow) -> int:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return s.scalar(select(func.count()).select_from(model)) or 0


def expected_findings(convs: list[dict]) -> int:
    engine = RuleEngine.from_paths([PROJECT_ROOT / "rules" / "default.yaml"])
    return sum(len(engine.evaluate(Conversation.model_validate(c))) for c in convs)


def start_worker(rt):  # type: ignore[no-untyped-def]
    consumer = kafka_consumer(rt, [rt.settings.kafka_conversations_topic], client_id=f"t-{uuid.uuid4().hex[:6]}")
    worker = ConsumerWorker(rt, consumer)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return worker, thread, consumer


def test_two_consumers_in_one_group_split_the_partitions(kafka, pg_url) -> None:
    topic, group = f"conv-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 4)
    s = topic_settings(kafka, pg_url, topic, group)
    rt1 = build_runtime(s, registry=CollectorRegistry())
    rt2 = build_runtime(s, registry=CollectorRegistry(), migrate=False)
    w1, t1, c1 = start_worker(rt1)
    w2, t2, c2 = start_worker(rt2)
    try:
        assert wait_for(
            lambda: len(c1.assignment()) + len(c2.assignment()) == 4 and c1.assignment() and c2.assignment(),
            60,
        ), "group never balanced over both consumers"
        stream = list(Simulator(parse_versions("v1:0.3"), seed=11).stream(800))
        convs: list[dict] = []
        # in rounds until both have stored a batch: on a busy machine a consumer that missed its heartbeats
        # leaves the group for a rebalance, and the other may take a whole round meanwhile
        for start in range(0, len(stream), 200):
            convs += stream[start : start + 200]
            produce(kafka, topic, stream[start : start + 200])
            wait_for(lambda n=len(convs): count(rt1) == n, 60, what=f"{len(convs)} stored conversations")
            if w1.stored_batches and w2.stored_batches:
                break
        assert w1.stored_batches > 0 and w2.stored_batches > 0, (w1.stored_batches, w2.stored_batches)
        assert wait_for(
            lambda: len(c1.assignment()) + len(c2.assignment()) == 4 and c1.assignment() and c2.assignment(),
            60,
        ), "group not balanced over both consumers at the end"
        a1, a2 = {tp.partition for tp in c1.assignment()}, {tp.partition for tp in c2.assignment()}
        assert a1.isdisjoint(a2) and a1 | a2 == {0, 1, 2, 3}
        assert count(rt1, FindingRow) == expected_findings(convs)
    finally:
        w1.stop()
        w2.stop()
        t1.join(15)
        t2.join(15)


def test_poison_messages_become_dead_letters_and_the_stream_goes_on(kafka, pg_url) -> None:
    topic, group = f"conv-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    dlq = f"dlq-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 1)
    create_topic(kafka, dlq, 1)
    s = topic_settings(kafka, pg_url, topic, group, max_message_bytes=8192, kafka_dead_letter_topic=dlq)
    rt = build_runtime(s, registry=CollectorRegistry())
    good = list(Simulator(parse_versions("v1:0.0"), seed=5).stream(20))
    huge = dict(good[0], conversation_id="huge", messages=[{"role": "user", "content": "x" * 20000}])
    p = kafka_producer(kafka)
    for c in good[:10]:
        p.send(topic, key=c["conversation_id"].encode(), value=orjson.dumps(c))
    p.send(topic, key=b"junk", value=b"\x00\xffnot json at all")
    p.send(topic, key=b"invalid", value=orjson.dumps({"conversation_id": "x", "messages": []}))
    p.send(topic, key=b"huge", value=orjson.dumps(huge))
    for c in good[10:]:
        p.send(topic, key=c["conversation_id"].encode(), value=orjson.dumps(c))
    p.flush(30)
    consumer = kafka_consumer(rt, [topic])
    worker = ConsumerWorker(rt, consumer, dead_letter_producer=kafka_producer(kafka))
    worker.run(max_idle_polls=15)
    assert count(rt) == 20
    with rt.sessions() as sess:
        dead = sess.scalars(select(DeadLetterRow).order_by(DeadLetterRow.offset)).all()
    assert [(d.reason, d.topic, d.partition, d.offset) for d in dead] == [
        ("malformed_json", topic, 0, 10),
        ("schema_invalid", topic, 0, 11),
        ("oversized", topic, 0, 12),
    ]
    assert dead[0].raw.startswith(b"\x00\xffnot json") and dead[1].key == "invalid"
    assert "agent_id" in dead[1].detail and dead[2].raw_size > 20000
    from kafka import KafkaConsumer

    reader = KafkaConsumer(dlq, bootstrap_servers=kafka, auto_offset_reset="earliest", consumer_timeout_ms=8000)
    got = [(dict(m.headers)["vigil-reason"], m.value[:5]) for m in reader]
    reader.close()
    assert [g[0] for g in got] == [b"malformed_json", b"schema_invalid", b"oversized"]


def test_restart_resumes_from_committed_offsets(kafka, pg_url) -> None:
    topic, group = f"conv-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 2)
    s = topic_settings(kafka, pg_url, topic, group)
    convs = list(Simulator(parse_versions("v1:0.1"), seed=9).stream(300))
    produce(kafka, topic, convs[:150])
    seen: Counter[str] = Counter()

    def run_once() -> None:
        rt = build_runtime(s, registry=CollectorRegistry())
        worker = ConsumerWorker(rt, kafka_consumer(rt, [topic]))
        inner = worker.handlers[topic]

        def counting(envs):  # type: ignore[no-untyped-def]
            seen.update(e.key for e in envs)
            return inner(envs)

        worker.handlers[topic] = counting
        worker.run(max_idle_polls=12)
        rt.close()

    run_once()
    assert sum(seen.values()) == 150
    produce(kafka, topic, convs[150:])
    run_once()
    assert sum(seen.values()) == 300 and max(seen.values()) == 1, "a committed message was consumed again"
    rt = build_runtime(s, registry=CollectorRegistry(), migrate=False)
    assert count(rt) == 300


def test_killing_a_consumer_mid_stream_loses_and_doubles_nothing(kafka, pg_url, tmp_path) -> None:
    topic, group = f"conv-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 4)
    s = topic_settings(kafka, pg_url, topic, group, kafka_batch_size=50)
    rt = build_runtime(s, registry=CollectorRegistry())
    env = dict(
        os.environ,
        VIGIL_DATABASE_URL=pg_url,
        VIGIL_KAFKA_BOOTSTRAP_SERVERS=kafka,
        VIGIL_KAFKA_CONVERSATIONS_TOPIC=topic,
        VIGIL_KAFKA_GROUP_ID=group,
        VIGIL_KAFKA_MAX_POLL_INTERVAL_MS=str(FAST["kafka_max_poll_interval_ms"]),
        VIGIL_KAFKA_SESSION_TIMEOUT_MS=str(FAST["kafka_session_timeout_ms"]),
        VIGIL_KAFKA_BATCH_SIZE="50",
        VIGIL_API_KEYS="a:admin:k",
        VIGIL_LOG_LEVEL="WARNING",
        VIGIL_RULE_PACKS=str(PROJECT_ROOT / "rules" / "default.yaml"),
    )
    cmd = [sys.executable, "-m", "vigil.app.cli", "consume"]
    logs = [open(tmp_path / f"c{i}.log", "wb") for i in range(2)]  # noqa: SIM115  (closed in finally)
    ports = [free_port() for _ in range(2)]
    procs = [
        subprocess.Popen(
            cmd,
            env={**env, "VIGIL_METRICS_PORT": str(ports[i])},
            stdout=logs[i],
            stderr=subprocess.STDOUT,
            cwd=PROJECT_ROOT,
        )
        for i in range(2)
    ]

    def assigned(i: int) -> float:
        assert procs[i].poll() is None, f"consumer {i} exited: {(tmp_path / f'c{i}.log').read_text()[-2000:]}"
        return scrape(ports[i], "vigil_consumer_assigned_partitions") or 0

    try:
        # start-up (imports, migrations) and the group join take as long as they take on this machine:
        # the kill waits until both consumers hold partitions, then until the victim has stored
        wait_for(lambda: assigned(0) and assigned(1), 120, 0.2, "both consumers to join the group")
        convs = list(Simulator(parse_versions("v1:0.2,v2:0.4"), seed=21).stream(3000))
        produce(kafka, topic, convs[:1500])
        victim = "vigil_conversations_processed_total"
        wait_for(lambda: scrape(ports[0], victim), 60, 0.2, "the first consumer to store")
        wait_for(lambda: count(rt) >= 200, 60, 0.2, "200 stored conversations")
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(scaled(10))
        produce(kafka, topic, convs[1500:])
        wait_for(lambda: count(rt) >= 3000, 120, 0.2, "all 3,000 conversations")
        assert count(rt) == 3000
        with rt.sessions() as sess:
            ids = set(sess.scalars(select(ConversationRow.conversation_id)).all())
        assert ids == {c["conversation_id"] for c in convs}
        assert count(rt, FindingRow) == expected_findings(convs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
        for f in logs:
            f.close()


def add_partitions(bootstrap: str, topic: str, total: int) -> None:
    """Grow ``topic`` to ``total`` partitions. Tansu does not implement CreatePartitions (kafka-python raises
    IncompatibleBrokerVersion), so there the topic is deleted and made again with ``total`` partitions: to
    a running member, both show as the topic's partition set growing between two metadata refreshes."""
    from kafka.admin import KafkaAdminClient, NewPartitions
    from kafka.errors import IncompatibleBrokerVersion

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    try:
        admin.create_partitions({topic: NewPartitions(total)})
    except IncompatibleBrokerVersion:
        admin.delete_topics([topic])
        wait_for(lambda: topic not in admin.list_topics(), 30, what=f"{topic} deleted")
        create_topic(bootstrap, topic, total)
    finally:
        admin.close()


def test_running_consumers_see_partitions_added_to_the_topic_within_the_metadata_age(kafka, pg_url) -> None:
    """The client refreshed topic metadata every 5 minutes (its own default), and the group's leader only
    rebalances once its metadata shows the new partitions: they went unassigned, and their messages unread,
    for up to 5 minutes. ``VIGIL_KAFKA_METADATA_MAX_AGE_MS`` (here 2 s) bounds that.

    What is checked is the running consumers' view of the topic, not the rebalance that follows: Tansu
    answers the leader's SyncGroup after such a rejoin with the previous assignment (the generation stays
    0), so against it the new partitions stay unassigned however soon they are seen."""
    topic, group = f"conv-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 2)
    s = topic_settings(kafka, pg_url, topic, group, kafka_metadata_max_age_ms=2000)
    rt1 = build_runtime(s, registry=CollectorRegistry())
    rt2 = build_runtime(s, registry=CollectorRegistry(), migrate=False)
    w1, t1, c1 = start_worker(rt1)
    w2, t2, c2 = start_worker(rt2)
    try:
        wait_for(lambda: c1.assignment() and c2.assignment(), 60, what="both consumers assigned")
        add_partitions(kafka, topic, 4)
        # well inside the client's default 5 minutes, however busy the machine
        wait_for(
            lambda: c1.partitions_for_topic(topic) == c2.partitions_for_topic(topic) == {0, 1, 2, 3},
            60,
            what="both consumers seeing 4 partitions",
        )
    finally:
        w1.stop()
        w2.stop()
        t1.join(15)
        t2.join(15)
        rt1.close()
        rt2.close()
