"""A bad Kafka message is one dead letter however often, and in whatever batches, its topic is read again."""

from __future__ import annotations

import orjson
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import make_settings
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.pipeline import Envelope
from vigil.outcomes.ingest import OutcomeStore
from vigil.store.models import DeadLetterRow

GOOD = {"conversation_id": "c", "agent_id": "a", "agent_version": "v", "messages": [{"role": "user", "content": "x"}]}


def conversation_message(offset: int) -> bytes:
    if offset % 3 == 2:
        return b"{not json " + str(offset).encode()
    if offset % 7 == 3:
        return orjson.dumps({"conversation_id": f"x{offset}", "messages": []})
    return orjson.dumps({**GOOD, "conversation_id": f"c{offset}"})


def outcome_message(offset: int) -> bytes:
    if offset % 3 == 2:
        return b'{"conversation_id": '
    return orjson.dumps({"conversation_id": "c", "type": "escalation", "idempotency_key": f"k{offset}"})


def batches(topic: str, make, size: int, start: int = 0, end: int = 60) -> list[list[Envelope]]:  # type: ignore[no-untyped-def]
    envs = [Envelope(make(o), "kafka", topic, 0, o, f"k{o}") for o in range(start, end)]
    return [envs[i : i + size] for i in range(0, len(envs), size)]


def letters(rt) -> list[tuple[str, int | None, str]]:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        rows = s.scalars(select(DeadLetterRow).order_by(DeadLetterRow.topic, DeadLetterRow.offset)).all()
        return [(r.topic, r.offset, r.reason) for r in rows]


def counted(registry: CollectorRegistry) -> float:
    return sum(
        registry.get_sample_value("vigil_dead_letters_total", {"reason": reason, "source": "kafka"}) or 0
        for reason in ("malformed_json", "schema_invalid")
    )


def test_reading_a_topic_again_in_other_batches_records_and_counts_no_dead_letter_twice(db_url: str) -> None:
    registry = CollectorRegistry()
    rt = wire(build_runtime(make_settings(db_url), registry=registry), {"consume"})
    outcomes = rt.get(OutcomeStore)
    for batch in batches("conversations", conversation_message, 25):
        rt.pipeline.process_raw(batch)
    for batch in batches("outcomes", outcome_message, 25):
        outcomes.handle_envelopes(batch)
    first, bad = letters(rt), counted(registry)
    assert bad == 20 + 6 + 20  # every third message is malformed, and 6 fail the schema, on each topic
    # another consumer group reads both topics from the start, in batches of another size; then the
    # first group's last batch is redelivered grown (more was polled the second time)
    for size in (7, 60):
        for batch in batches("conversations", conversation_message, size):
            rt.pipeline.process_raw(batch)
        for batch in batches("outcomes", outcome_message, size):
            outcomes.handle_envelopes(batch)
    assert letters(rt) == first and counted(registry) == bad
    rt.pipeline.process_raw(batches("conversations", conversation_message, 100, 50, 70)[0])
    assert counted(registry) == bad + 3 + 1  # 62, 65, 68 malformed and 66 invalid are new; the rest is not
    assert len(letters(rt)) == len(first) + 2
    rt.close()


def test_an_empty_message_is_empty_on_the_outcomes_topic_as_on_the_conversations_topic(sqlite_url: str) -> None:
    registry = CollectorRegistry()
    rt = wire(build_runtime(make_settings(sqlite_url), registry=registry), {"consume"})
    rt.pipeline.process_raw([Envelope(b"", "kafka", "conversations", 0, 0, "tombstone")])
    rt.get(OutcomeStore).handle_envelopes(
        [Envelope(b"", "kafka", "outcomes", 0, 0, "tombstone"), Envelope(b"  \n", "kafka", "outcomes", 0, 1, "blank")]
    )
    assert letters(rt) == [("conversations", 0, "empty"), ("outcomes", 0, "empty")]
    assert registry.get_sample_value("vigil_dead_letters_total", {"reason": "empty", "source": "kafka"}) == 3
    rt.close()


def test_an_outcomes_message_failing_for_different_reasons_names_every_reason(sqlite_url: str) -> None:
    rt = wire(build_runtime(make_settings(sqlite_url), registry=CollectorRegistry()), {"consume"})
    items = [{"conversation_id": "c", "type": "chargeback"}, {"type": "csat"}, {"conversation_id": "c", "type": "csat"}]
    batch = rt.get(OutcomeStore).handle_envelopes([Envelope(orjson.dumps(items), "kafka", "outcomes", 0, 4, "k")])
    assert batch.stored == 1 and [d.reason for d in batch.dead_letters] == ["unknown_outcome_type"]
    with rt.sessions() as s:
        [row] = s.scalars(select(DeadLetterRow)).all()
    assert (row.offset, row.reason) == (4, "unknown_outcome_type")
    assert row.detail.startswith("reasons unknown_outcome_type, schema_invalid: item 0: type: ")
    assert "item 1: conversation_id" in row.detail
    rt.close()


def test_a_message_the_database_refuses_between_undecodable_ones_is_recorded_and_once(db_url: str) -> None:
    """A batch the database refuses a conversation of is split: its first half stores the batch's
    undecodable messages (offsets 0 and 5, one row spanning 0-5), a later half the refused one (offset 4).
    Matched by position alone, the refused message counted as recorded already: stored nowhere, counted
    nowhere, its offset committed. Read again, neither is recorded twice."""
    from tests.store.test_store_robustness import refuse_agent

    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    refuse_agent(rt, "evil")
    convs = [{**GOOD, "conversation_id": f"s{i}"} for i in range(4)]
    convs[3]["agent_id"] = "evil"
    envs = [Envelope(b"not json", "kafka", "t", 0, 0, "m0")]
    envs += [Envelope(orjson.dumps(c), "kafka", "t", 0, i + 1, c["conversation_id"]) for i, c in enumerate(convs)]
    envs += [Envelope(b"not json either", "kafka", "t", 0, 5, "m5")]

    def rows() -> list[tuple[str, int]]:
        with rt.sessions() as s:
            found = s.scalars(select(DeadLetterRow).order_by(DeadLetterRow.offset, DeadLetterRow.reason))
            return [(d.reason, d.offset) for d in found]

    def counted(reason: str) -> float:
        value = rt.metrics.registry.get_sample_value("vigil_dead_letters_total", {"reason": reason, "source": "kafka"})
        return value or 0.0

    rt.pipeline.process_raw(envs)
    assert rows() == [("malformed_json", 0), ("store_rejected", 4)]
    assert (counted("malformed_json"), counted("store_rejected")) == (2, 1)
    rt.pipeline.process_raw(envs)  # read again: nothing new
    assert rows() == [("malformed_json", 0), ("store_rejected", 4)]
    assert (counted("malformed_json"), counted("store_rejected")) == (2, 1)
    rt.close()
