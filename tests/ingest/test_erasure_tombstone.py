"""The tombstone of an erased conversation: ingest drops it when it is sent again (an HTTP client's retry, a Kafka
redelivery, an import run twice), neither storing it nor keeping it as a dead letter, and counts it in
``vigil_erased_dropped_total``; erased without a tombstone it may come again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from tests.http.test_erasure import conversation, holding
from tests.support.app import ADMIN, INGEST, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.runtime import Envelope, Runtime
from vigil.store.models import ConversationRow, DeadLetterRow


@pytest.fixture
def rt_client(db_url: str) -> Iterator[tuple[Runtime, Any]]:
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    with make_client(rt) as c:
        yield rt, c
    rt.close()


def test_an_erased_conversation_sent_again_over_http_is_dropped(rt_client) -> None:
    rt, c = rt_client
    assert c.post("/v1/conversations", json=[conversation("c-1")], headers=INGEST).status_code == 202
    assert c.delete("/v1/conversations/c-1", headers=ADMIN).status_code == 200
    again = c.post("/v1/conversations", json=[conversation("c-1"), conversation("c-3")], headers=INGEST).json()
    assert (again["stored"], again["erased"]) == (1, 1), again
    assert holding(rt, "c-1") == {}
    metric = rt.metrics.registry.get_sample_value("vigil_erased_dropped_total", {"source": "http"})
    assert metric == 1.0


def test_a_redelivered_kafka_batch_drops_erased_ids_without_dead_letters(rt_client) -> None:
    rt, c = rt_client
    convs = [conversation(f"k-{i}") for i in range(4)]
    envelopes = [Envelope(orjson.dumps(conv), "kafka", "conversations", 0, i) for i, conv in enumerate(convs)]
    assert len(rt.pipeline.process_raw(envelopes).stored) == 4
    ids = ["k-1", "k-2"]
    r = c.post("/v1/conversations/erase", json={"conversation_ids": [*ids, "k-404"]}, headers=ADMIN)
    assert [x["status"] for x in r.json()["results"]] == ["erased", "erased", "not_found"]
    result = rt.pipeline.process_raw(envelopes)  # the consumer read the batch again
    assert (len(result.stored), result.duplicates, result.erased, result.dead_letters) == (0, 2, 2, [])
    with rt.sessions() as s:
        assert sorted(s.scalars(select(ConversationRow.conversation_id))) == ["k-0", "k-3"]
        assert s.scalar(select(func.count()).select_from(DeadLetterRow)) == 0
    metric = rt.metrics.registry.get_sample_value("vigil_erased_dropped_total", {"source": "kafka"})
    assert metric == 2.0


def test_without_a_tombstone_the_conversation_may_come_again(rt_client) -> None:
    rt, c = rt_client
    assert c.post("/v1/conversations", json=[conversation("c-1")], headers=INGEST).status_code == 202
    r = c.delete("/v1/conversations/c-1", params={"tombstone": "false"}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["tombstone"] is False
    again = c.post("/v1/conversations", json=[conversation("c-1")], headers=INGEST).json()
    assert (again["stored"], again["erased"]) == (1, 0)


@pytest.mark.kafka
@pytest.mark.postgres
def test_an_erased_conversation_produced_again_to_kafka_is_dropped_by_the_consumer(kafka, pg_url) -> None:
    from tests.ingest.test_kafka_consumer import produce, start_worker, topic_settings
    from tests.support.services import create_topic
    from tests.support.waiting import wait_for
    from vigil.store.erasure import erase_each

    topic, group = f"conv-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka, topic, 1)
    rt = build_runtime(topic_settings(kafka, pg_url, topic, group), registry=CollectorRegistry())
    worker, thread, _ = start_worker(rt)

    def stored() -> set[str]:
        with rt.sessions() as s:
            return set(s.scalars(select(ConversationRow.conversation_id)))

    try:
        produce(kafka, topic, [conversation("k-1"), conversation("k-2")])
        wait_for(lambda: stored() == {"k-1", "k-2"}, 60, what="both conversations stored")
        assert erase_each(rt.sessions, ["k-1"], [], "test")[0]["status"] == "erased"
        produce(kafka, topic, [conversation("k-1"), conversation("k-3")])  # the producer sent it again
        wait_for(lambda: "k-3" in stored(), 60, what="the conversation after the erased one stored")
        assert stored() == {"k-2", "k-3"}
        assert rt.metrics.registry.get_sample_value("vigil_erased_dropped_total", {"source": "kafka"}) == 1.0
        with rt.sessions() as s:
            assert s.scalar(select(func.count()).select_from(DeadLetterRow)) == 0
    finally:
        worker.stop()
        thread.join(15)
        rt.close()


def test_until_a_tombstone_exists_a_batch_does_not_look_its_ids_up_and_another_replica_still_drops(
    db_url: str,
) -> None:
    """With no erasure yet (the usual case) a batch asks only whether any tombstone exists, not for its 1,000
    ids' hashes; a replica that learnt "none" still drops a conversation another replica erased since."""
    from sqlalchemy import event

    first = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    second = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    lookups: list[str] = []

    def record(_conn, _cursor, statement, _parameters, _context, _many):  # type: ignore[no-untyped-def]
        if "erased_conversations" in statement:
            lookups.append(statement)

    try:
        with make_client(first) as a, make_client(second) as b:
            event.listen(second.engine, "before_cursor_execute", record)
            assert b.post("/v1/conversations", json=[conversation("r-1")], headers=INGEST).status_code == 202
            assert lookups and all("conversation_hash IN" not in s and "ANY" not in s for s in lookups), lookups
            assert a.delete("/v1/conversations/r-1", headers=ADMIN).status_code == 200  # the other replica
            again = b.post("/v1/conversations", json=[conversation("r-1")], headers=INGEST).json()
            assert (again["stored"], again["erased"]) == (0, 1), again
    finally:
        first.close()
        second.close()
