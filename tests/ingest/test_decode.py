"""The one decoder: the same rules on every way in (HTTP, Kafka, replay/OTLP/simulate), per-item errors."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select, update

from tests.support.app import ADMIN, INGEST, REVIEWER, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.ingest.decode import REASONS, DecodeError, decode_batch, decode_document
from vigil.ingest.pipeline import Envelope
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.schema import Conversation
from vigil.store.models import ConversationRow, DeadLetterRow

LIMIT = 1_000_000


def sim(n: int, seed: int = 5) -> list[dict]:
    return list(Simulator(parse_versions("v1:0.0"), seed).stream(n))


BASE = sim(1)[0]

json_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20)
json_scalars |= st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(metadata=st.dictionaries(st.text(max_size=10), json_values, max_size=5), text=st.text(max_size=200))
def test_every_valid_conversation_decodes_and_reads_back(metadata: dict, text: str) -> None:
    conv = dict(BASE, metadata=metadata)
    conv["messages"] = [*conv["messages"], {"role": "assistant", "content": text}]
    decoded, stored = decode_document(orjson.dumps(conv), LIMIT)
    back = orjson.loads(stored)  # what is stored is strict JSON
    assert back["metadata"] == orjson.loads(orjson.dumps(metadata).replace(b"\\u0000", b"\\ufffd"))
    assert decoded.messages[-1].content == text.replace("\x00", "\ufffd")


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_arbitrary_bytes_only_ever_raise_a_decode_error_with_a_known_reason(raw: bytes) -> None:
    try:
        decode_document(raw, LIMIT)
    except DecodeError as exc:
        assert exc.reason in REASONS
    try:
        batch = decode_batch(raw, LIMIT, 1000)
    except DecodeError as exc:
        assert exc.reason in REASONS
    else:
        assert all(i.error is None or i.error.reason in REASONS for i in batch.items)


BAD_VALUES = {
    "NaN": "non_finite_number",
    "-Infinity": "non_finite_number",
    "1e999": "non_finite_number",
    "1" + "0" * 400: "non_finite_number",
    '"\\ud800"': "invalid_unicode",
    '"a\\udfff"': "invalid_unicode",
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bad=st.sampled_from(sorted(BAD_VALUES)),
    where=st.sampled_from(["metadata", "content", "arguments", "usage"]),
    n=st.integers(1, 5),
    at=st.integers(0, 4),
)
def test_a_bad_value_refuses_only_its_item(bad: str, where: str, n: int, at: int) -> None:
    at = at % n
    items = [orjson.dumps(dict(c, conversation_id=f"c{i}")) for i, c in enumerate(sim(n))]
    marker = b'"__BAD__"'
    doc = orjson.loads(items[at])
    if where == "metadata":
        doc["metadata"]["x"] = "__BAD__"
    elif where == "content":
        doc["messages"][0]["content"] = "__BAD__"
    elif where == "arguments":
        doc["messages"].append(
            {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"v": "__BAD__"}}}]}
        )
    else:
        doc["usage"] = {"cost_usd": "__BAD__"}
    items[at] = orjson.dumps(doc).replace(marker, bad.encode())
    body = b"[" + b",".join(items) + b"]"
    batch = decode_batch(body, LIMIT, 1000)
    errors = [(i.index, i.error.reason) for i in batch.invalid()]  # type: ignore[union-attr]
    assert errors == [(at, BAD_VALUES[bad])]
    assert len(list(batch.valid())) == n - 1
    with pytest.raises(DecodeError) as single:
        decode_document(items[at], LIMIT)
    assert single.value.reason == BAD_VALUES[bad]


def test_nul_becomes_replacement_and_size_is_checked() -> None:
    conv = dict(BASE, messages=[{"role": "user", "content": "a\u0000b"}])
    got, stored = decode_document(orjson.dumps(conv), LIMIT)
    assert got.messages[0].content == "a\ufffdb" and b"\\u0000" not in stored
    with pytest.raises(DecodeError) as exc:
        decode_document(orjson.dumps(dict(BASE, metadata={"pad": "x" * 5000})), 4096)
    assert exc.value.reason == "oversized"


def test_kafka_refuses_nan_and_surrogates_and_keeps_the_rest(db_url) -> None:
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    convs = sim(4)
    raws = [orjson.dumps(c) for c in convs]
    raws[1] = raws[1].replace(b'"metadata":{', b'"metadata":{"score":NaN,', 1)
    raws[2] = raws[2].replace(b'"metadata":{', b'"metadata":{"s":"\\ud800",', 1)
    envs = [Envelope(r, "kafka", "t", 0, i, convs[i]["conversation_id"]) for i, r in enumerate(raws)]
    result = rt.pipeline.process_raw(envs)
    assert len(result.stored) == 2
    with rt.sessions() as s:
        dead = s.execute(select(DeadLetterRow.offset, DeadLetterRow.reason).order_by(DeadLetterRow.offset)).all()
        stored = s.scalars(select(ConversationRow.document)).all()
    assert [tuple(d) for d in dead] == [(1, "non_finite_number"), (2, "invalid_unicode")]
    assert all(orjson.loads(doc) for doc in stored)
    rt.close()


def test_http_refuses_a_surrogate_item_not_the_batch(client) -> None:
    convs = sim(3)
    body = orjson.dumps(convs).replace(b'"metadata":{', b'"metadata":{"s":"\\ud800",', 1)
    r = client.post("/v1/conversations", content=body, headers=INGEST)
    assert r.status_code == 422, r.text
    out = r.json()
    assert out["stored"] == 2 and out["errors"][0]["index"] == 0
    assert out["errors"][0]["reason"] == "invalid_unicode" and out["errors"][0]["errors"][0]["field"] == "metadata.s"
    body = orjson.dumps([dict(c, conversation_id=c["conversation_id"] + "n") for c in convs]).replace(
        b'"metadata":{', b'"metadata":{"x":Infinity,', 1
    )
    r = client.post("/v1/conversations", content=body, headers=INGEST)
    assert r.status_code == 422 and r.json()["errors"][0]["reason"] == "non_finite_number"
    assert r.json()["stored"] == 2


def test_replayed_and_simulated_conversations_pass_the_same_decoder(runtime) -> None:
    convs = [Conversation.model_validate(c) for c in sim(3)]
    convs[0].outcomes = [convs[0].outcomes[0].model_copy(update={"value": math.nan})] if convs[0].outcomes else []
    if not convs[0].outcomes:
        convs[0].metadata["reward"] = math.inf
    convs[1].metadata["note"] = "lone \ud800"
    result = runtime.pipeline.process(convs, "replay")
    assert [c.conversation.conversation_id for c in result.stored] == [convs[2].conversation_id]
    reasons = sorted((d.reason, d.key) for d in result.dead_letters)
    assert reasons == sorted(
        [("non_finite_number", convs[0].conversation_id), ("invalid_unicode", convs[1].conversation_id)]
    )


def test_one_dead_letter_per_reason_per_request(client) -> None:
    bad = [{"conversation_id": f"x{i}", "messages": []} for i in range(1000)]
    body = orjson.dumps(bad)
    r = client.post("/v1/conversations", content=body, headers=INGEST)
    assert r.status_code == 422 and r.json()["rejected"] == 1000
    dead = client.get("/v1/dead-letters", headers=ADMIN).json()
    assert len(dead) == 1 and dead[0]["reason"] == "schema_invalid"
    assert dead[0]["raw_size"] <= len(body) + 2 and "1000 invalid item(s)" in dead[0]["detail"]


def test_a_bad_stored_row_fails_no_reader(db_url) -> None:
    """Rows stored before the decoder refused NaN (or garbled since) are read, or skipped and counted."""
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    convs = sim(3)
    with make_client(rt) as c:
        assert c.post("/v1/conversations", json=convs, headers=INGEST).status_code == 202
        nan_id, broken_id, good_id = (x["conversation_id"] for x in convs)
        with rt.sessions.begin() as s:
            doc = s.scalar(select(ConversationRow.document).where(ConversationRow.conversation_id == nan_id))
            s.execute(
                update(ConversationRow)
                .where(ConversationRow.conversation_id == nan_id)
                .values(document=doc.replace('"metadata":{', '"metadata":{"score":NaN,', 1))  # type: ignore[union-attr]
            )
            s.execute(
                update(ConversationRow)
                .where(ConversationRow.conversation_id == broken_id)
                .values(document='{"conversation_id": "trunc')
            )
        got = c.get(f"/v1/conversations/{nan_id}", headers=REVIEWER)
        assert got.status_code == 200 and got.json()["conversation"]["metadata"]["score"] is None
        broken = c.get(f"/v1/conversations/{broken_id}", headers=REVIEWER)
        assert broken.status_code == 200 and broken.json()["conversation"] is None
        assert c.get(f"/v1/conversations/{good_id}", headers=REVIEWER).status_code == 200
        listed = c.get("/v1/conversations", headers=REVIEWER).json()
        assert listed["total"] == 3
    value = rt.metrics.registry.get_sample_value("vigil_unreadable_documents_total", {"reader": "api"})
    assert value == 1.0
    with rt.sessions() as s:
        assert s.scalar(select(func.count()).select_from(ConversationRow)) == 3
    rt.close()


def test_an_unreadable_confirmed_failure_does_not_fail_the_export(db_url) -> None:
    from vigil.export.redact import Redactor
    from vigil.export.run import export
    from vigil.store.models import ReviewLabelRow

    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    convs = sim(3)
    rt.pipeline.process([Conversation.model_validate(c) for c in convs], "replay")
    ids = [c["conversation_id"] for c in convs]
    with rt.sessions.begin() as s:
        for cid in ids:
            s.add(
                ReviewLabelRow(
                    conversation_id=cid,
                    revision=1,
                    reviewer="rita",
                    label="confirmed_failure",
                    version=1,
                    is_current=True,
                    category="policy_violation",
                )
            )
        doc = s.scalar(select(ConversationRow.document).where(ConversationRow.conversation_id == ids[0]))
        nan_doc = doc.replace('"metadata":{', '"metadata":{"score":NaN,', 1)  # type: ignore[union-attr]
        s.execute(update(ConversationRow).where(ConversationRow.conversation_id == ids[0]).values(document=nan_doc))
        s.execute(update(ConversationRow).where(ConversationRow.conversation_id == ids[1]).values(document="{oops"))
    with rt.sessions.begin() as s:
        rules = {r.id: r for r in rt.rules.rules}
        result = export(s, rules, Redactor({}), metrics=rt.metrics)
    tasks = [orjson.loads(line) for line in result.lines]
    exported = {t["source"]["conversation_id"] for t in tasks} | {d for t in tasks for d in t["duplicates"]}
    assert exported == {ids[0], ids[2]}
    assert result.skipped == {ids[1]: "stored document cannot be read"}
    assert rt.metrics.registry.get_sample_value("vigil_unreadable_documents_total", {"reader": "export"}) == 1.0
    rt.close()


@pytest.mark.parametrize("raw", [b"", b"  \n"])
def test_an_empty_message_is_refused_as_empty(raw: bytes) -> None:
    """A Kafka tombstone (null value) or a blank message was 'malformed_json: invalid literal ... char 0'."""
    with pytest.raises(DecodeError) as info:
        decode_document(raw, 1 << 20)
    assert info.value.reason == "empty"
