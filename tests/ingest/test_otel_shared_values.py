"""Long span values that several conversations send (their instructions) are stored once, in
``otel_values``, and read back whole: after a restart, across requests and on both databases."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select, text

from tests.support.app import make_settings
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.otlp import shared
from vigil.ingest.otlp.ingest import TraceIngest
from vigil.ingest.otlp.models import OtelSpanRow, OtelValueRow
from vigil.runtime import Runtime
from vigil.store import db
from vigil.store.models import ConversationRow

POLICY = "# Shop policy\n" + "".join(f"Rule {i}: refunds over ${i * 10} need a supervisor. " for i in range(80))
INSTRUCTIONS = orjson.dumps([{"type": "text", "content": POLICY}]).decode()


def _runtime(url: str) -> Runtime:
    settings = make_settings(url, otlp_progress_interval_seconds=0)
    return wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})


@pytest.fixture
def rt(db_url: str) -> Iterator[Runtime]:
    runtime = _runtime(db_url)
    yield runtime
    runtime.close()


def _conversation(n: int, instructions: str = INSTRUCTIONS) -> list[dict[str, Any]]:
    """Two chat spans and a root of conversation ``conv-n``, every chat span sending ``instructions``."""
    trace = f"{n:032x}"
    cid = f"conv-{n}"
    details = "It left the warehouse on Monday and the carrier has it now. " * 6  # long enough to be compacted
    history = [{"role": "user", "parts": [{"type": "text", "content": f"where is order {n}? {details}"}]}]
    spans = []
    for turn in range(2):
        said = f"order {n} ships in {turn + 1} days. {details}"
        reply = {"role": "assistant", "parts": [{"type": "text", "content": said}]}
        spans.append(
            {
                "trace_id": trace,
                "span_id": f"{n * 100 + turn + 1:016x}",
                "parent_span_id": f"{n * 100:016x}",
                "name": "chat gpt-4o",
                "kind": 3,
                "start_ns": 1_700_000_000_000_000_000 + n * 10**9 + turn * 10**6,
                "end_ns": 1_700_000_000_000_000_000 + n * 10**9 + turn * 10**6 + 500,
                "attributes": {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.conversation.id": cid,
                    "gen_ai.system_instructions": instructions,
                    "gen_ai.input.messages": orjson.dumps(history).decode(),
                    "gen_ai.output.messages": orjson.dumps([reply]).decode(),
                },
                "events": [],
                "status": {"code": 0, "message": ""},
                "resource": {"service.name": "shop-agent", "service.version": "2.0"},
            }
        )
        history += [reply, {"role": "user", "parts": [{"type": "text", "content": "and the other one?"}]}]
    root = {
        **spans[0],
        "span_id": f"{n * 100:016x}",
        "parent_span_id": None,
        "name": "invoke_agent",
        "start_ns": spans[0]["start_ns"] - 1,
        "end_ns": spans[-1]["end_ns"] + 1,
        "attributes": {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": cid},
    }
    return [*spans, root]


def _copy(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return orjson.loads(orjson.dumps(spans))  # ingest may replace strings in place: keep what was sent


def _sent_and_stopped(url: str) -> dict[int, list[dict[str, Any]]]:
    """Conversations 1 and 2 (sharing their instructions), each ingested whole by one process, then stopped."""
    runtime = _runtime(url)
    sent = {n: _conversation(n) for n in (1, 2)}
    try:
        for spans in sent.values():
            runtime.get(TraceIngest).ingest(_copy(spans))
    finally:
        runtime.close()
    return sent


def test_instructions_several_conversations_send_are_stored_once_and_read_back_whole(rt: Runtime, db_url: str) -> None:
    ingest = rt.get(TraceIngest)
    sent = {n: _conversation(n) for n in (1, 2, 3, 4)}
    ingest.ingest(_copy(sent[1]))
    ingest.ingest(_copy(sent[2]))
    ingest.ingest(_copy(sent[3]) + _copy(sent[4]))  # two in one request
    with rt.sessions() as s:
        values = s.execute(select(OtelValueRow.digest, OtelValueRow.value)).all()
        rows = [orjson.dumps(span).decode() for span in s.scalars(select(OtelSpanRow.span))]
    assert values == [(shared.digest(INSTRUCTIONS), INSTRUCTIONS)]
    # the first conversation keeps its copy (no other had sent it); each later one refers to the value
    assert sum("Rule 7: refunds over $70" in row for row in rows) == 1
    assert sum('"$val"' in row for row in rows) == 3
    # and each second chat span's history names the first's output instead of repeating it
    assert sum('"out":"gen_ai.output.messages"' in row for row in rows) == 4
    # read back by a process that never saw them (a restart, or another replica): as received
    other = _runtime(db_url)
    try:
        for n, spans in sent.items():
            read = other.get(TraceIngest)._load(f"conv-{n}")[0]
            assert sorted(read, key=lambda s: s["span_id"]) == sorted(spans, key=lambda s: s["span_id"])
    finally:
        other.close()
    with rt.sessions() as s:
        docs = {r.conversation_id: orjson.loads(r.document) for r in s.scalars(select(ConversationRow))}
    for n in sent:
        assert docs[f"conv-{n}"]["messages"][0] == {"role": "system", "content": POLICY}


def test_short_values_and_values_one_conversation_sends_stay_in_the_span(rt: Runtime) -> None:
    ingest = rt.get(TraceIngest)
    ingest.ingest(_copy(_conversation(1, instructions=orjson.dumps([{"type": "text", "content": "be kind"}]).decode())))
    ingest.ingest(_copy(_conversation(2, instructions=orjson.dumps([{"type": "text", "content": "be kind"}]).decode())))
    ingest.ingest(_copy(_conversation(3)))
    with rt.sessions() as s:
        assert s.scalar(select(text("count(*)")).select_from(OtelValueRow.__table__)) == 0


def test_a_value_is_touched_again_once_the_interval_passed_and_old_values_are_purged(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingest = rt.get(TraceIngest)
    ingest.ingest(_copy(_conversation(1)))
    ingest.ingest(_copy(_conversation(2)))
    long_ago = datetime.now(UTC) - timedelta(days=30)
    with rt.sessions.begin() as s:
        s.execute(OtelValueRow.__table__.update().values(touched_at=long_ago))
    ingest.ingest(_copy(_conversation(3)))  # within the interval: this process knows it is stored
    with rt.sessions() as s:
        assert db.aware(s.scalar(select(OtelValueRow.touched_at))) == long_ago
    monkeypatch.setattr(shared, "TOUCH_EVERY_SECONDS", 0.0)
    ingest.ingest(_copy(_conversation(4)))
    with rt.sessions() as s:
        touched = db.aware(s.scalar(select(OtelValueRow.touched_at)))
    assert touched > datetime.now(UTC) - timedelta(minutes=5)
    # purged only once no span can refer to it: older than the spans' horizon and two touch intervals
    with rt.sessions.begin() as s:
        shared.purge_values(s, touched - timedelta(hours=1))
    with rt.sessions() as s:
        assert s.scalar(select(text("count(*)")).select_from(OtelValueRow.__table__)) == 1
    with rt.sessions.begin() as s:
        shared.purge_values(s, touched + timedelta(seconds=1))
    with rt.sessions() as s:
        assert s.scalar(select(text("count(*)")).select_from(OtelValueRow.__table__)) == 0
        # a span whose value is gone reads back without that attribute, not as the reference
        read = rt.get(TraceIngest)._load("conv-2")[0]
    assert read and all("gen_ai.system_instructions" not in span["attributes"] for span in read)


def test_downgrading_writes_the_spans_back_whole(db_url: str) -> None:
    """Releases before revision 0013 read neither ``$val`` nor ``out``: a downgrade leaves spans they read."""
    sent = _sent_and_stopped(db_url)
    db.downgrade(db_url, "0012_drop_search_trgm")
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            stored = {r[0]: orjson.loads(r[1]) for r in conn.execute(text("SELECT span_id, span FROM otel_spans"))}
            tables = set(db_tables(conn))
    finally:
        engine.dispose()
    assert "otel_values" not in tables
    for span in (s for spans in sent.values() for s in spans):
        assert stored[span["span_id"]]["attributes"] == span["attributes"]


def db_tables(conn: Any) -> list[str]:
    from sqlalchemy import inspect

    return list(inspect(conn).get_table_names())


def test_values_an_exporter_sends_that_look_like_references_read_back_as_sent(rt: Runtime, db_url: str) -> None:
    """A key-value list attribute shaped like Vigil's own references (``$val`` naming a stored value,
    ``$same``, ``$ext``) is the exporter's data: read back after a restart, it is what was sent, and
    it never pulls in another conversation's stored value."""
    ingest = rt.get(TraceIngest)
    ingest.ingest(_copy(_conversation(1)))
    ingest.ingest(_copy(_conversation(2)))  # the instructions are now a stored value
    odd = {
        "gen_ai.tool.definitions": {"$val": shared.digest(INSTRUCTIONS)},
        "app.same": {"$same": f"{301:016x}", "t": ""},
        "app.ext": {"$ext": f"{301:016x}", "n": 1, "rest": "]"},
        "app.lit": {"$lit": "x"},
    }
    spans = _conversation(3)
    spans[0]["attributes"].update(odd)
    ingest.ingest(_copy(spans))
    other = _runtime(db_url)
    try:
        read = {s["span_id"]: s for s in other.get(TraceIngest)._load("conv-3")[0]}
    finally:
        other.close()
    assert read[spans[0]["span_id"]]["attributes"] == spans[0]["attributes"]
    assert {k: read[spans[0]["span_id"]]["attributes"][k] for k in odd} == odd


def test_a_shared_value_holding_nul_stays_in_the_spans(rt: Runtime, db_url: str) -> None:
    """Postgres text cannot hold NUL: such a value stays escaped in each span's JSON, and its requests are
    stored, not refused and retried without end."""
    odd = POLICY + "\x00 end"  # plain text, as some instrumentations send instructions
    ingest = rt.get(TraceIngest)
    for n in (1, 2):
        assert ingest.ingest(_copy(_conversation(n, instructions=odd))).stored == 3
    with rt.sessions() as s:
        assert s.scalar(select(text("count(*)")).select_from(OtelValueRow.__table__)) == 0
    other = _runtime(db_url)
    try:
        read = other.get(TraceIngest)._load("conv-2")[0]
    finally:
        other.close()
    assert {s["attributes"].get("gen_ai.system_instructions") for s in read} - {None} == {odd}


def test_a_resent_span_rewritten_whole_keeps_reference_shaped_values_as_sent(rt: Runtime, db_url: str) -> None:
    """An exporter resends a stored span beside a new one that refers to it: the new span is written whole
    (``_unrefer``), and its reference-shaped values stay the exporter's, not Vigil's references."""
    ingest = rt.get(TraceIngest)
    ingest.ingest(_copy(_conversation(1)))
    ingest.ingest(_copy(_conversation(2)))  # the instructions are now a stored value
    first, second, root = _conversation(3)
    odd = {"app.doc": {"$val": shared.digest(INSTRUCTIONS)}, "app.same": {"$same": first["span_id"], "t": ""}}
    second["attributes"].update(odd)
    ingest.ingest(_copy([first]))
    ingest.ingest(_copy([first, second, root]))  # a retry after a time-out resends the first
    other = _runtime(db_url)
    try:
        read = {s["span_id"]: s for s in other.get(TraceIngest)._load("conv-3")[0]}
    finally:
        other.close()
    assert read[second["span_id"]]["attributes"] == second["attributes"]


def test_reference_shaped_values_stored_before_the_upgrade_read_back_as_sent(db_url: str) -> None:
    """Rows an earlier release stored hold exporter values such as ``{"$val": ...}`` as they came; revision
    0013 keeps them as the exporter's, so they are not read as references to stored values."""
    db.upgrade(db_url, "0012_drop_search_trgm")
    span = _conversation(1)[0]
    span["attributes"].update({"app.lit": {"$lit": "x", "n": 1}, "app.val": {"$val": shared.digest(INSTRUCTIONS)}})
    stored = {k: v for k, v in span.items() if k not in ("trace_id", "span_id", "parent_span_id", "start_ns", "end_ns")}
    engine = db.make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO otel_spans (conversation_key, trace_id, span_id, parent_span_id, name, start_ns, "
                    "end_ns, span, received_at) VALUES ('conv-1', :t, :s, :p, :n, :a, :b, :j, CURRENT_TIMESTAMP)"
                ),
                {
                    "t": span["trace_id"],
                    "s": span["span_id"],
                    "p": span["parent_span_id"],
                    "n": span["name"],
                    "a": span["start_ns"],
                    "b": span["end_ns"],
                    "j": orjson.dumps(stored).decode(),
                },
            )
    finally:
        engine.dispose()
    runtime = _runtime(db_url)  # migrates to the head on start
    try:
        runtime.get(TraceIngest).ingest(_copy(_conversation(2)))  # and the instructions become a stored value
        runtime.get(TraceIngest).ingest(_copy(_conversation(3)))
        read = runtime.get(TraceIngest)._load("conv-1")[0]
    finally:
        runtime.close()
    assert read == [span]


def test_a_stream_of_one_off_long_values_does_not_push_a_shared_value_out(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every long output is a value only one conversation sends: however many pass, the instructions
    every conversation shares stay known as stored, so the next conversation refers to them."""
    monkeypatch.setattr(shared, "FIRST_DIGESTS", 4)
    ingest = rt.get(TraceIngest)
    ingest.ingest(_copy(_conversation(1)))
    ingest.ingest(_copy(_conversation(2)))  # the instructions are now a stored value
    for n in range(3, 9):  # one-off long values, more than FIRST_DIGESTS
        spans = _conversation(n, instructions=orjson.dumps([{"type": "text", "content": f"{n}: {POLICY}"}]).decode())
        ingest.ingest(_copy(spans))
    ingest.ingest(_copy(_conversation(9)))
    with rt.sessions() as s:
        rows = [
            orjson.dumps(span).decode()
            for span in s.scalars(select(OtelSpanRow.span).where(OtelSpanRow.conversation_key == "conv-9"))
        ]
    assert sum('"$val"' in row for row in rows) == 1 and not any("Rule 7: refunds over $70" in row for row in rows)


def test_remembered_digests_are_the_digests_and_their_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The digests of recent long values are remembered (the instructions each conversation resends as a
    new string), within a bound of characters; a value larger than an eighth of it is never kept."""
    monkeypatch.setattr(shared, "DIGESTS_CHARS", 80_000)
    values = shared.SharedValues()
    hashed: list[str] = []
    monkeypatch.setattr(shared, "digest", lambda v: hashed.append(v) or f"d{len(hashed)}")
    policy = "Politique é " * 500
    first = values._digest(policy)
    assert values._digest("".join(list(policy))) == first and len(hashed) == 1  # another string, the same text
    for n in range(100):
        values._digest(f"{n} " + "x" * 5_000)
        assert values._digest_chars <= 80_000
        assert values._digest_chars == sum(len(v) for v in values._digests)
    huge = "y" * 20_000
    values._digest(huge)
    assert huge not in values._digests
    assert values._digest(policy) != first  # pushed out by newer values: hashed again
