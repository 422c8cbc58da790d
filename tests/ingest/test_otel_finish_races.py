"""Spans of one trace reaching two replicas (or two threads) at once, out of order: whatever the order in
which their transactions commit, the conversation's last revision holds every span, without waiting for
the idle timeout.

Each test runs one replica's request inside another's, at the point where they race: between assembling
a finished revision and marking it finished, between reading a conversation's state and counting spans
into it, and between assembling a trace whose root came first (no message yet) and finishing it. Every
replica waits ``VIGIL_OTLP_PROGRESS_INTERVAL_SECONDS`` (60 here) before showing an unfinished
conversation's progress, as in production, so a span left for "the next revision" is only ever processed
if some replica takes it up.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event

from tests.ingest.test_otel_shared_values import _conversation, _copy
from tests.ingest.test_otel_store_hostile import document, replica
from vigil.ingest.otlp.ingest import TraceIngest
from vigil.ingest.otlp.models import OtelConversationRow
from vigil.runtime import Runtime


def _two(url: str) -> tuple[Runtime, Runtime]:
    return tuple(replica(url, otlp_progress_interval_seconds=60.0) for _ in range(2))  # type: ignore[return-value]


def _finished_at(rt: Runtime, key: str) -> Any:
    with rt.sessions() as s:
        row = s.get(OtelConversationRow, key)
        return row.finished_at if row else None


def test_a_finished_revision_assembled_before_another_replica_stored_a_span_is_processed_again(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica A assembles conv-1 from its first chat span and its root (finished, revision 2); before A
    stores that revision, replica B stores the second chat span and, seeing conv-1 unfinished, leaves it
    for the next revision. A's revision is then not the last word: A processes conv-1 again at once."""
    a, b = _two(db_url)
    chat0, chat1, root = _conversation(1)
    real = a.pipeline.process_documents

    def meanwhile(*args: Any, **kwargs: Any) -> Any:
        res = b.get(TraceIngest).ingest(_copy([chat1]))
        assert res.pending == ["conv-1"]  # B left it for the next revision
        return real(*args, **kwargs)

    try:
        monkeypatch.setattr(a.pipeline, "process_documents", meanwhile)
        a.get(TraceIngest).ingest(_copy([chat0, root]))
        doc = document(a, "conv-1")
        assert doc is not None and (doc["revision"], doc["status"]) == (3, "finished")
        assert _finished_at(a, "conv-1") is not None
    finally:
        a.close()
        b.close()


def test_spans_counted_after_another_replica_finished_the_conversation_are_processed_at_once(db_url: str) -> None:
    """Replica B, which stored conv-1's first chat span before (so it knows the trace), reads conv-1's state
    (unfinished) for its second; before B counts it in, replica A stores the root and finishes conv-1
    (revision 2). B's count finds the row finished, so B's span goes through the pipeline at once (revision
    3) instead of waiting for a next revision that never comes."""
    a, b = _two(db_url)
    chat0, chat1, root = _conversation(1)
    armed = [False]

    def meanwhile(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if armed[0] and statement.lstrip().startswith("SELECT") and "otel_conversations.span_count" in statement:
            armed[0] = False
            a.get(TraceIngest).ingest(_copy([root]))
            doc = document(a, "conv-1")
            assert doc is not None and (doc["revision"], doc["status"]) == (2, "finished")

    try:
        assert b.get(TraceIngest).ingest(_copy([chat0])).pending == ["conv-1"]
        event.listen(b.engine, "after_cursor_execute", meanwhile)
        armed[0] = True
        res = b.get(TraceIngest).ingest(_copy([chat1]))
        assert not armed[0]
        assert res.pending == []
        doc = document(b, "conv-1")
        assert doc is not None and (doc["revision"], doc["status"]) == (3, "finished")
    finally:
        event.remove(b.engine, "after_cursor_execute", meanwhile)
        a.close()
        b.close()


def test_a_root_exported_before_its_spans_finishes_the_conversation_for_the_spans_to_come(db_url: str) -> None:
    """The root span comes first (an exporter flushing the root's batch before its children's): nothing to
    judge yet, but every trace of conv-1 has ended, so the chat spans that follow are processed as they
    come, by any replica, instead of waiting for the idle timeout."""
    a, b = _two(db_url)
    chat0, chat1, root = _conversation(1)
    try:
        res = a.get(TraceIngest).ingest(_copy([root]))
        assert res.pending == ["conv-1"] and document(a, "conv-1") is None
        assert _finished_at(a, "conv-1") is not None
        b.get(TraceIngest).ingest(_copy([chat0]))
        doc = document(b, "conv-1")
        assert doc is not None and (doc["revision"], doc["status"]) == (2, "finished")
        a.get(TraceIngest).ingest(_copy([chat1]))
        doc = document(a, "conv-1")
        assert doc is not None and (doc["revision"], doc["status"]) == (3, "finished")
    finally:
        a.close()
        b.close()


def test_a_root_first_trace_that_grew_while_it_was_finished_is_processed_again(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica A assembles conv-1 from its root alone (nothing to judge); before A finishes it, replica B
    stores both chat spans and, seeing conv-1 unfinished, leaves them for the next revision. A finds the
    conversation grew, does not finish it empty, and processes it again with every span."""
    a, b = _two(db_url)
    chat0, chat1, root = _conversation(1)
    ingest = a.get(TraceIngest)
    real = ingest._finish_ended

    def meanwhile(ended: dict[str, int]) -> list[str]:
        res = b.get(TraceIngest).ingest(_copy([chat0, chat1]))
        assert res.pending == ["conv-1"]
        return real(ended)

    try:
        monkeypatch.setattr(ingest, "_finish_ended", meanwhile)
        ingest.ingest(_copy([root]))
        doc = document(a, "conv-1")
        assert doc is not None and (doc["revision"], doc["status"]) == (3, "finished")
    finally:
        a.close()
        b.close()
