"""A conversation's spans are found through the traces they came in (``otel_conversation_traces``), not an
index on the span table's conversation key: read back after a restart, after waiting under their trace's
key, after an upgrade from the revision before, and purged together; on both databases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, func, select, text, update

from tests.ingest.test_otel_shared_values import _conversation, _copy, _runtime, _sent_and_stopped
from vigil.ingest.otlp import ingest as otlp_ingest
from vigil.ingest.otlp.ingest import TraceIngest, purge_conversations
from vigil.ingest.otlp.models import OtelConversationRow, OtelConversationTraceRow, OtelEventRow, OtelSpanRow
from vigil.store import db


def _traces(url: str) -> set[tuple[str, str]]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            m = OtelConversationTraceRow
            return {(k, t) for k, t in conn.execute(select(m.conversation_key, m.trace_id))}
    finally:
        engine.dispose()


def _read_after_restart(url: str, key: str) -> list[dict[str, Any]]:
    runtime = _runtime(url)  # a process that received none of them: nothing in memory
    try:
        return runtime.get(TraceIngest)._load(key)[0]
    finally:
        runtime.close()


def test_spans_are_read_back_through_their_traces_after_a_restart(db_url: str) -> None:
    sent = _sent_and_stopped(db_url)
    assert _traces(db_url) == {("conv-1", f"{1:032x}"), ("conv-2", f"{2:032x}")}
    for n, spans in sent.items():
        read = _read_after_restart(db_url, f"conv-{n}")
        assert [s["span_id"] for s in read] == [s["span_id"] for s in sorted(spans, key=lambda s: s["start_ns"])]
        assert {s["span_id"]: s["attributes"] for s in read} == {s["span_id"]: s["attributes"] for s in spans}


def test_a_conversation_spread_over_two_traces_and_a_trace_over_two_conversations(db_url: str) -> None:
    first, second = _conversation(1), _conversation(2)
    for s in second:  # trace 2 also carries conversation 1's spans: only these belong to it
        s["attributes"] = {**s["attributes"], "gen_ai.conversation.id": "conv-1"}
        s["span_id"] = "f" + s["span_id"][1:]
    other = _conversation(3)
    for s in other:  # and a span of conversation 3 sent in trace 1
        s["trace_id"] = f"{1:032x}"
    runtime = _runtime(db_url)
    try:
        runtime.get(TraceIngest).ingest(_copy(first[:2]))
        runtime.get(TraceIngest).ingest(_copy(second[:2] + other[:1]))
    finally:
        runtime.close()
    assert _traces(db_url) == {("conv-1", f"{1:032x}"), ("conv-1", f"{2:032x}"), ("conv-3", f"{1:032x}")}
    assert {s["span_id"] for s in _read_after_restart(db_url, "conv-1")} == {
        s["span_id"] for s in first[:2] + second[:2]
    }
    assert [s["span_id"] for s in _read_after_restart(db_url, "conv-3")] == [other[0]["span_id"]]


def test_spans_that_waited_under_their_trace_are_read_back_under_the_conversation(db_url: str) -> None:
    spans = _conversation(4)
    unnamed = [
        {**s, "attributes": {k: v for k, v in s["attributes"].items() if k != "gen_ai.conversation.id"}}
        for s in spans[:1]
    ]
    runtime = _runtime(db_url)
    try:
        runtime.get(TraceIngest).ingest(_copy(unnamed))
        assert _traces(db_url) == {(f"otel-{4:032x}", f"{4:032x}")}
    finally:
        runtime.close()
    runtime = _runtime(db_url)  # another process names the conversation: it knows nothing of the first span
    try:
        runtime.get(TraceIngest).ingest(_copy(spans[1:2]))
    finally:
        runtime.close()
    assert _traces(db_url) == {("conv-4", f"{4:032x}")}
    assert [s["span_id"] for s in _read_after_restart(db_url, "conv-4")] == [s["span_id"] for s in spans[:2]]


def test_old_conversations_are_purged_with_their_spans_traces_and_log_records(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(otlp_ingest, "PURGE_BATCH", 2)  # several transactions
    runtime = _runtime(db_url)
    try:
        for n in range(1, 7):
            runtime.get(TraceIngest).ingest(_copy(_conversation(n)[:2]))  # unfinished: they stay in the buffer
        long_ago = datetime.now(UTC) - timedelta(hours=100)
        with runtime.sessions.begin() as s:
            s.add(
                OtelEventRow(
                    conversation_key="conv-1",
                    trace_id=f"{1:032x}",
                    span_id=None,
                    digest="d" * 32,
                    time_ns=1,
                    event={"name": "gen_ai.user.message"},
                )
            )
            c = OtelConversationRow
            s.execute(
                update(c)
                .where(c.conversation_key.in_(["conv-1", "conv-2", "conv-3", "conv-5", "conv-6"]))
                .values(last_seen_at=long_ago)
            )
            s.execute(update(c).where(c.conversation_key == "conv-6").values(last_seen_at=datetime.now(UTC)))
        purged = purge_conversations(runtime.sessions, datetime.now(UTC) - timedelta(hours=1))
        with runtime.sessions() as s:
            left = set(s.scalars(select(OtelSpanRow.conversation_key).distinct()))
            events = s.scalar(select(func.count()).select_from(OtelEventRow))
            rows = set(s.scalars(select(OtelConversationRow.conversation_key)))
    finally:
        runtime.close()
    assert purged == 4
    assert left == rows == {"conv-4", "conv-6"}
    assert _traces(db_url) == {("conv-4", f"{4:032x}"), ("conv-6", f"{6:032x}")}
    assert events == 0


def test_upgrading_finds_the_spans_stored_before_and_downgrading_brings_the_index_back(db_url: str) -> None:
    runtime = _runtime(db_url)
    try:
        runtime.get(TraceIngest).ingest(_copy(_conversation(1)[:2]))
    finally:
        runtime.close()
    db.downgrade(db_url, "0013_otel_values")
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            tables = set(db_tables(conn))
            indexes = {i["name"] for i in _inspect(conn).get_indexes("otel_spans")}
    finally:
        engine.dispose()
    assert "otel_conversation_traces" not in tables
    assert "ix_otel_spans_conversation" in indexes
    db.upgrade(db_url)  # the traces of the spans stored meanwhile are filled in
    assert _traces(db_url) == {("conv-1", f"{1:032x}")}
    assert [s["span_id"] for s in _read_after_restart(db_url, "conv-1")] == [s["span_id"] for s in _conversation(1)[:2]]
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            assert "ix_otel_spans_conversation" not in {i["name"] for i in _inspect(conn).get_indexes("otel_spans")}
            assert conn.execute(text("SELECT count(*) FROM otel_spans")).scalar_one() == 2
    finally:
        engine.dispose()


def _inspect(conn: Any) -> Any:
    from sqlalchemy import inspect

    return inspect(conn)


def db_tables(conn: Any) -> list[str]:
    return list(_inspect(conn).get_table_names())


def test_a_span_row_keeps_what_was_sent(db_url: str) -> None:
    """The rows hold every span once, under its conversation, whatever way they are found."""
    runtime = _runtime(db_url)
    spans = _conversation(9)
    try:
        runtime.get(TraceIngest).ingest(_copy(spans))
        runtime.get(TraceIngest).ingest(_copy(spans))  # resent: nothing stored twice, no trace twice
        with runtime.sessions() as s:
            stored = s.execute(select(OtelSpanRow.conversation_key, OtelSpanRow.span_id)).all()
    finally:
        runtime.close()
    assert sorted(stored) == sorted(("conv-9", sp["span_id"]) for sp in spans)
    assert _traces(db_url) == {("conv-9", f"{9:032x}")}


def test_a_conversation_purged_and_sent_again_is_linked_again_by_the_process_that_linked_it(db_url: str) -> None:
    """A process remembers the traces it linked; a purge (by any replica) forgets them in the database."""
    spans = _conversation(5)
    runtime = _runtime(db_url)
    try:
        traces = runtime.get(TraceIngest)
        traces.ingest(_copy(spans[:1]))
        traces.ingest(_copy(spans[1:2]))  # the same pair again: not linked again
        assert purge_conversations(runtime.sessions, datetime.now(UTC) + timedelta(hours=1)) == 1
        assert _traces(db_url) == set()
        traces.ingest(_copy(spans[2:]))  # the root, after the purge
    finally:
        runtime.close()
    assert _traces(db_url) == {("conv-5", f"{5:032x}")}
    assert [s["span_id"] for s in _read_after_restart(db_url, "conv-5")] == [spans[2]["span_id"]]


def test_a_pair_is_linked_once_while_its_conversation_row_lasts(db_url: str) -> None:
    spans = _conversation(6)
    runtime = _runtime(db_url)
    statements: list[str] = []

    def record(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if "otel_conversation_traces" in statement:
            statements.append(statement)

    try:
        traces = runtime.get(TraceIngest)
        event.listen(runtime.engine, "before_cursor_execute", record)
        for span in spans:  # three requests
            traces.ingest(_copy([span]))
    finally:
        event.remove(runtime.engine, "before_cursor_execute", record)
        runtime.close()
    # the first request links the pair in the row its counts created; the next two find it linked in that
    # very row (the age their counts' upsert returns) and write nothing
    assert len([s for s in statements if s.lstrip().upper().startswith("INSERT")]) == 1
    assert _traces(db_url) == {("conv-6", f"{6:032x}")}
