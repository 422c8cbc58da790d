from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import ADMIN, INGEST, REVIEWER, make_client, make_settings
from tests.support.waiting import wait_for
from vigil.app.runtime import build_runtime
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.outcomes.ingest import OutcomeStore
from vigil.schema import Conversation
from vigil.store.models import DeadLetterRow, OutcomeLinkRow, OutcomeRow

# the conversations happened two days ago and their outcomes hours after them: an outcome dated ahead of
# now is refused
START = datetime.now(UTC) - timedelta(days=2)


def convs(n: int, versions: str = "v1:0.0", seed: int = 1) -> list[dict]:
    return list(Simulator(parse_versions(versions), seed).stream(n, start=START))


def outcome(cid: str, kind: str = "escalation", hours_after: float = 1.0, key: str | None = None, **kw) -> dict:
    o = {
        "conversation_id": cid,
        "type": kind,
        "occurred_at": (START + timedelta(hours=hours_after)).isoformat(),
    }
    if key:
        o["idempotency_key"] = key
    o.update(kw)
    return o


@pytest.fixture
def rt_client(db_url):  # type: ignore[no-untyped-def]
    rt = build_runtime(make_settings(db_url, outcome_attribution_window_hours=24), registry=CollectorRegistry())
    with make_client(rt) as c:
        yield rt, c
    rt.close()


def links(rt) -> dict[str, OutcomeLinkRow]:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return {r.conversation_id + ":" + r.type: r for r in s.scalars(select(OutcomeLinkRow))}


def test_outcome_before_conversation_is_joined_when_it_arrives(rt_client) -> None:
    rt, c = rt_client
    conv = convs(1, "v7:0.0")[0]
    cid = conv["conversation_id"]
    r = c.post("/v1/outcomes", json=outcome(cid, key="k1"), headers=INGEST)
    assert r.status_code == 202 and r.json()["stored"] == 1
    assert links(rt) == {}
    assert "vigil_outcomes_total{" not in c.get("/metrics").text.replace("# HELP vigil_outcomes_total", "")
    c.post("/v1/conversations", json=conv, headers=INGEST)
    link = links(rt)[f"{cid}:escalation"]
    assert (link.agent_version, link.attributed, link.happened) == ("v7", True, True)
    metrics = c.get("/metrics").text
    assert 'vigil_outcomes_total{agent="support-bot",agent_version="v7",type="escalation"} 1.0' in metrics
    assert 'vigil_outcomes_received_total{source="http",type="escalation"} 1.0' in metrics
    detail = c.get(f"/v1/conversations/{cid}", headers=REVIEWER).json()
    assert [o["type"] for o in detail["outcomes"]] == ["escalation"]


def test_duplicates_change_nothing(rt_client) -> None:
    rt, c = rt_client
    conv = convs(1)[0]
    c.post("/v1/conversations", json=conv, headers=INGEST)
    keyed = outcome(conv["conversation_id"], "refund_reversal", key="refund-1")
    unkeyed = outcome(conv["conversation_id"], "thumbs_down")
    for _ in range(3):
        r = c.post("/v1/outcomes", json=[keyed, unkeyed, keyed], headers=INGEST)
        assert r.status_code == 202
    assert r.json() == {"accepted": 3, "stored": 0, "duplicates": 3, "rejected": 0, "errors": []}
    with rt.sessions() as s:
        assert len(s.scalars(select(OutcomeRow)).all()) == 2
    assert len(links(rt)) == 2
    metrics = c.get("/metrics").text
    assert 'vigil_outcomes_total{agent="support-bot",agent_version="v1",type="refund_reversal"} 1.0' in metrics
    assert 'vigil_outcomes_duplicate_total{source="http"} 7.0' in metrics


def test_attribution_window(rt_client) -> None:
    rt, c = rt_client
    conv = convs(1)[0]
    cid = conv["conversation_id"]
    ended = datetime.fromisoformat(conv["ended_at"])
    late = {
        "conversation_id": cid,
        "type": "escalation",
        "occurred_at": (ended + timedelta(hours=30)).isoformat(),
    }
    inside = {
        "conversation_id": cid,
        "type": "reopened_ticket",
        "occurred_at": (ended + timedelta(hours=23)).isoformat(),
    }
    east = timezone(timedelta(hours=5))  # 23 h after the end, written in another zone
    inside_east = {
        "conversation_id": cid,
        "type": "thumbs_down",
        "occurred_at": (ended + timedelta(hours=23)).astimezone(east).isoformat(),
    }
    c.post("/v1/outcomes", json=[late, inside, inside_east], headers=INGEST)
    c.post("/v1/conversations", json=conv, headers=INGEST)
    got = links(rt)
    assert got[f"{cid}:escalation"].attributed is False
    assert got[f"{cid}:reopened_ticket"].attributed is True
    assert got[f"{cid}:thumbs_down"].attributed is True
    metrics = c.get("/metrics").text
    assert 'vigil_outcomes_outside_window_total{type="escalation"} 1.0' in metrics
    assert 'type="escalation"} 1.0' not in metrics.split("vigil_outcomes_total")[-1].split("# HELP")[0]
    # a newer revision that ends later moves the window: the late outcome now counts
    conv2 = dict(conv, revision=2, ended_at=(ended + timedelta(hours=10)).isoformat())
    c.post("/v1/conversations", json=conv2, headers=INGEST)
    assert links(rt)[f"{cid}:escalation"].attributed is True


def dead_count(rt) -> int:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return len(s.scalars(select(DeadLetterRow)).all())


def test_invalid_items_are_named_dead_lettered_and_valid_ones_kept(rt_client) -> None:
    _, c = rt_client
    cid = convs(1)[0]["conversation_id"]
    items = [
        outcome(cid, "nps_detractor"),
        {"type": "escalation"},
        outcome(cid, "thumbs_up", value="high"),
        outcome(cid, "thumbs_up"),
    ]
    r = c.post("/v1/outcomes", json=items, headers=INGEST)
    assert r.status_code == 422
    body = r.json()
    assert (body["accepted"], body["stored"], body["rejected"]) == (1, 1, 3)
    by_index = {e["index"]: e for e in body["errors"]}
    assert (
        by_index[0]["reason"] == "unknown_outcome_type" and "VIGIL_OUTCOME_TYPES" in by_index[0]["errors"][0]["message"]
    )
    assert by_index[1]["errors"][0]["field"] == "conversation_id"
    assert by_index[2]["errors"][0]["field"] == "value"
    dead = {d["reason"]: d for d in c.get("/v1/dead-letters", headers=ADMIN).json()}  # one letter per reason
    assert sorted(dead) == ["schema_invalid", "unknown_outcome_type"]
    assert (
        "nps_detractor" in dead["unknown_outcome_type"]["detail"]
        and "item 2: value" in dead["schema_invalid"]["detail"]
    )
    assert "nps_detractor" in dead["unknown_outcome_type"]["raw_preview"]
    r = c.post("/v1/outcomes", content=b"{not json", headers=INGEST)
    assert r.status_code == 400
    assert c.get("/v1/dead-letters", params={"reason": "malformed_json"}, headers=ADMIN).json()[0]["raw_size"] == 9
    assert c.post("/v1/outcomes", json=outcome(cid), headers=REVIEWER).status_code == 403


def test_reused_idempotency_key_for_a_different_outcome_is_a_named_conflict(rt_client) -> None:
    rt, c = rt_client
    cid, other = (cv["conversation_id"] for cv in convs(2))
    first = outcome(cid, "escalation", key="k1")
    assert c.post("/v1/outcomes", json=first, headers=INGEST).status_code == 202
    items = [
        dict(first, conversation_id=other),  # same key, other conversation
        dict(first, occurred_at=None),  # identical redelivery (occurred_at is not part of the identity)
        outcome(cid, "thumbs_down", key="k2"),
        outcome(cid, "thumbs_up", key="k2"),  # conflicts with the item before it in this batch
        dict(first, value=0.0),
    ]
    r = c.post("/v1/outcomes", json=items, headers=INGEST)
    assert r.status_code == 422
    body = r.json()
    assert (body["accepted"], body["stored"], body["duplicates"], body["rejected"]) == (2, 1, 1, 3)
    by_index = {e["index"]: e for e in body["errors"]}
    assert set(by_index) == {0, 3, 4} and {e["reason"] for e in body["errors"]} == {"idempotency_conflict"}
    assert [e["field"] for e in by_index[0]["errors"]] == ["conversation_id"]
    assert "'k1'" in by_index[0]["errors"][0]["message"] and other in by_index[0]["errors"][0]["message"]
    assert [e["field"] for e in by_index[3]["errors"]] == ["type"]
    assert [e["field"] for e in by_index[4]["errors"]] == ["value"]
    with rt.sessions() as s:
        stored = {o.idempotency_key: (o.conversation_id, o.type) for o in s.scalars(select(OutcomeRow))}
    assert stored == {"k1": (cid, "escalation"), "k2": (cid, "thumbs_down")}
    dead = c.get("/v1/dead-letters", params={"reason": "idempotency_conflict"}, headers=ADMIN).json()
    assert len(dead) == 1 and other in dead[0]["raw_preview"] and "thumbs_up" in dead[0]["raw_preview"]
    assert "item 0: conversation_id" in dead[0]["detail"] and "item 4: value" in dead[0]["detail"]
    metrics = c.get("/metrics").text
    assert 'vigil_dead_letters_total{reason="idempotency_conflict",source="http"} 1.0' in metrics
    assert 'vigil_outcomes_duplicate_total{source="http"} 1.0' in metrics
    r = c.post("/v1/outcomes", json=[first, first], headers=INGEST)  # plain redelivery stays silent
    assert r.status_code == 202 and r.json()["duplicates"] == 2


def test_outcomes_handler_dead_letters_a_conflicting_key(sqlite_url) -> None:
    from vigil.app.wiring import wire
    from vigil.ingest.pipeline import Envelope

    rt = wire(build_runtime(make_settings(sqlite_url), registry=CollectorRegistry()), {"consume"})
    store = rt.get(OutcomeStore)
    cid = convs(1)[0]["conversation_id"]

    def env(payload: object, offset: int) -> Envelope:
        return Envelope(orjson.dumps(payload), "kafka", "outcomes", 0, offset, cid)

    first = outcome(cid, "escalation", key="e1")
    batch = store.handle_envelopes(
        [
            env(first, 0),
            env([outcome(cid, "thumbs_down", key="e1"), outcome(cid, "bogus")], 1),
            env(first, 2),
        ]
    )
    assert (batch.received, batch.stored, batch.duplicates) == (4, 1, 1)
    assert sorted(e.reason for e in batch.errors) == ["idempotency_conflict", "unknown_outcome_type"]
    with rt.sessions() as s:
        dead = s.scalars(select(DeadLetterRow)).all()
        assert [(d.offset, d.reason) for d in dead] == [(1, "idempotency_conflict")]
        assert "item 0: type" in dead[0].detail and "item 1: type" in dead[0].detail
    store.handle_envelopes([env(outcome(cid, "escalation", key="e1", value=0.5), 3)])
    with rt.sessions() as s:
        assert sorted(d.reason for d in s.scalars(select(DeadLetterRow))) == ["idempotency_conflict"] * 2
        assert [o.value for o in s.scalars(select(OutcomeRow))] == [1.0]
    rt.close()


def test_custom_outcome_types_from_settings(sqlite_url) -> None:
    rt = build_runtime(
        make_settings(sqlite_url, outcome_types="nps_detractor:bad,upsell:good,nps:score"),
        registry=CollectorRegistry(),
    )
    with make_client(rt) as c:
        types = c.get("/v1/outcome-types", headers=INGEST).json()["types"]
        assert types["nps_detractor"] == "bad" and types["nps"] == "score" and types["escalation"] == "bad"
        conv = convs(1)[0]
        c.post("/v1/conversations", json=conv, headers=INGEST)
        r = c.post(
            "/v1/outcomes",
            json=[
                outcome(conv["conversation_id"], "nps_detractor"),
                outcome(conv["conversation_id"], "nps", value=3),
            ],
            headers=INGEST,
        )
        assert r.status_code == 202 and r.json()["stored"] == 2
    from vigil.errors import ConfigError
    from vigil.schema import outcome_types

    with pytest.raises(ConfigError, match="kind of 'x' must be bad, good or score"):
        outcome_types("x:awful")


def test_listeners_run_in_the_storing_transaction(sqlite_url) -> None:
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    seen: list[list[str]] = []

    def listener(session, rows):  # type: ignore[no-untyped-def]
        seen.append([r.type for r in rows])
        assert all(r.id for r in rows) and session.in_transaction()
        if any(r.type == "thumbs_down" for r in rows):
            raise RuntimeError("listener failed")

    rt.hooks.outcome_listeners.append(listener)
    with make_client(rt) as c:
        cid = convs(1)[0]["conversation_id"]
        same = outcome(cid, "escalation")
        c.post("/v1/outcomes", json=[same, same], headers=INGEST)
        assert seen == [["escalation"]]
        with pytest.raises(RuntimeError):
            c.post("/v1/outcomes", json=[outcome(cid, "thumbs_down"), outcome(cid, "thumbs_up")], headers=INGEST)
        with rt.sessions() as s:  # the failing listener rolled the whole batch back
            assert sorted(s.scalars(select(OutcomeRow.type))) == ["escalation"]


def test_inline_outcomes_are_joined_and_reach_listeners_once(sqlite_url) -> None:
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    seen: list[tuple[str, str]] = []
    rt.hooks.outcome_listeners.append(lambda s, rows: seen.extend((r.type, r.source) for r in rows))
    with make_client(rt) as c:
        conv = dict(convs(1)[0], outcomes=[{"type": "task_success", "value": 1.0}])
        for _ in range(2):
            c.post("/v1/conversations", json=conv, headers=INGEST)
        assert seen == [("task_success", "inline")]
        link = links(rt)[f"{conv['conversation_id']}:task_success"]
        assert link.happened and link.attributed
        partial = dict(convs(1, seed=9)[0], outcomes=[{"type": "task_success", "value": 0.5}])
        c.post("/v1/conversations", json=partial, headers=INGEST)
        assert links(rt)[f"{partial['conversation_id']}:task_success"].happened is False


def test_demo_sink_and_simulate_feed_outcomes(sqlite_url) -> None:
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    with make_client(rt, {"serve"}):
        sim = Simulator(parse_versions("v1:0.5"), 3)
        batch = list(sim.stream(40))
        rt.pipeline.process([Conversation.model_validate(b) for b in batch], "demo")
        outs = [o for b in batch for o in sim.outcomes_for(b)]
        rt.hooks.outcome_sink(outs)
        assert len(links(rt)) == len({o["idempotency_key"] for o in outs}) > 0


@pytest.mark.kafka
def test_outcomes_topic_handler_on_a_real_broker(kafka, sqlite_url) -> None:
    from tests.support.services import create_topic
    from vigil.app.wiring import wire
    from vigil.ingest.kafka import ConsumerWorker, kafka_consumer, kafka_producer

    topic = f"outcomes-{uuid.uuid4().hex[:8]}"
    settings = make_settings(
        sqlite_url,
        kafka_bootstrap_servers=kafka,
        kafka_outcomes_topic=topic,
        kafka_conversations_topic=topic + "-conv",
        kafka_group_id=topic,
        kafka_session_timeout_ms=3000,
        kafka_max_poll_interval_ms=4000,
        kafka_poll_timeout_ms=200,
    )
    rt = wire(build_runtime(settings, registry=CollectorRegistry()), {"consume"})
    create_topic(kafka, topic, 2)
    create_topic(kafka, topic + "-conv", 1)
    conv = convs(1)[0]
    rt.pipeline.process([Conversation.model_validate(conv)], "test")
    cid = conv["conversation_id"]
    producer = kafka_producer(kafka)
    messages = [
        outcome(cid, "escalation", key="e1"),
        [outcome(cid, "thumbs_down", key="t1"), outcome(cid, "bogus")],
        outcome(cid, "escalation", key="e1"),
        outcome(cid, "reopened_ticket", key="e1"),
    ]
    for m in messages:
        producer.send(topic, key=cid.encode(), value=orjson.dumps(m))
    producer.send(topic, key=b"x", value=b"\xff not json")
    producer.flush(30)
    producer.close()
    handlers = ConsumerWorker(rt, None).handlers
    assert topic in handlers
    worker = ConsumerWorker(rt, kafka_consumer(rt, list(handlers)), handlers)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    wait_for(lambda: dead_count(rt) >= 3, 60, 0.2, "three dead letters")
    worker.stop()
    thread.join(15)
    got = links(rt)
    assert set(got) == {f"{cid}:escalation", f"{cid}:thumbs_down"}
    with rt.sessions() as s:
        reasons = sorted(d.reason for d in s.scalars(select(DeadLetterRow)))
    assert reasons == ["idempotency_conflict", "malformed_json", "unknown_outcome_type"]
    rt.close()


def test_an_outcome_dated_ahead_of_now_is_refused_naming_the_field(rt_client) -> None:
    """An outcome dated two days ahead was stored and shown as having happened then. Up to five minutes
    ahead (clients' clocks drift) is taken; further is a 422 naming occurred_at, the rest of the batch kept."""
    rt, c = rt_client
    cid = convs(1)[0]["conversation_id"]
    now = datetime.now(UTC)
    skewed = {"conversation_id": cid, "type": "thumbs_up", "occurred_at": (now + timedelta(minutes=2)).isoformat()}
    ahead = {"conversation_id": cid, "type": "refund_reversal", "occurred_at": (now + timedelta(hours=48)).isoformat()}
    r = c.post("/v1/outcomes", json=[skewed, ahead, outcome(cid)], headers=INGEST)
    assert r.status_code == 422, r.text
    body = r.json()
    assert (body["accepted"], body["rejected"]) == (2, 1)
    [error] = body["errors"]
    assert (error["index"], error["reason"]) == (1, "occurred_in_future")
    assert error["errors"][0]["field"] == "occurred_at" and "in the future" in error["errors"][0]["message"]
    with rt.sessions() as s:
        stored = s.scalars(select(OutcomeRow.type).where(OutcomeRow.conversation_id == cid)).all()
    assert sorted(stored) == ["escalation", "thumbs_up"]
    dead = c.get("/v1/dead-letters", params={"reason": "occurred_in_future"}, headers=ADMIN).json()
    assert len(dead) == 1 and "occurred_at" in dead[0]["detail"]


def test_an_outcomes_message_dated_ahead_is_a_dead_letter_at_its_offset(rt_client) -> None:
    """On the outcomes topic an item dated ahead makes its message a dead letter at its offset, under
    occurred_in_future; its message's other items and the other messages are stored. A time without an
    offset is read as UTC; one at +14:00 is compared in UTC."""
    from vigil.runtime import Envelope

    rt, _ = rt_client
    cid = convs(1)[0]["conversation_id"]
    now = datetime.now(UTC)
    ahead = {"conversation_id": cid, "type": "escalation", "occurred_at": (now + timedelta(hours=2)).isoformat()}
    naive_ahead = {
        "conversation_id": cid,
        "type": "thumbs_down",
        "occurred_at": (now + timedelta(minutes=30)).replace(tzinfo=None).isoformat(),
    }
    # 13:00 at +14:00 is 23:00 the day before in UTC: ahead of no clock
    far_east = {
        "conversation_id": cid,
        "type": "thumbs_up",
        "occurred_at": now.astimezone(timezone(timedelta(hours=14))).isoformat(),
    }
    good = outcome(cid, "csat", value=4.0)
    result = rt.get(OutcomeStore).handle_envelopes(
        [
            Envelope(orjson.dumps([good, ahead]), "kafka", "outcomes", 0, 41),
            Envelope(orjson.dumps(naive_ahead), "kafka", "outcomes", 0, 42),
            Envelope(orjson.dumps(far_east), "kafka", "outcomes", 0, 43),
        ]
    )
    assert (result.received, result.stored) == (4, 2)
    assert [(e.index, e.reason) for e in result.errors] == [(1, "occurred_in_future"), (0, "occurred_in_future")]
    with rt.sessions() as s:
        stored = sorted(s.scalars(select(OutcomeRow.type).where(OutcomeRow.conversation_id == cid)))
        dead = [(d.offset, d.last_offset, d.reason) for d in s.scalars(select(DeadLetterRow))]
    assert stored == ["csat", "thumbs_up"]
    assert dead == [(41, 42, "occurred_in_future")]  # neighbouring offsets of one reason: one letter


def test_an_outcome_dated_ahead_without_an_offset_is_told_it_was_read_as_utc(rt_client) -> None:
    """A producer sending its local wall time without an offset, east of UTC, is hours ahead: the error said
    only "in the future", leaving the producer to guess that the time had been read as UTC."""
    rt, c = rt_client
    cid = convs(1)[0]["conversation_id"]
    local = datetime.now(timezone(timedelta(hours=9))).replace(tzinfo=None, microsecond=0).isoformat()
    offset = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    r = c.post(
        "/v1/outcomes",
        json=[
            {"conversation_id": cid, "type": "escalation", "occurred_at": local},
            {"conversation_id": cid, "type": "thumbs_down", "occurred_at": offset},
        ],
        headers=INGEST,
    )
    assert r.status_code == 422, r.text
    naive, aware = (e["errors"][0]["message"] for e in r.json()["errors"])
    assert f"{local!r} has no UTC offset, so it is read as UTC" in naive
    assert "UTC offset" not in aware and "in the future" in aware
