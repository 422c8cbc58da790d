"""A write error handled and not raised again leaves nothing for the garbage collector.

SQLAlchemy keeps the error it raises in a local of a frame it was raised through: a cycle through the
error's traceback, which holds every frame from the write up to the one that caught it and their locals
(the batch, its decoded documents, the statement's parameters). Freed only when the collector next runs,
whatever the catcher did with the error: a busy writer retrying deadlocks or a locked database piled up
its batches between two collections, outside every memory budget.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text

import vigil.ingest.pipeline as pipeline_module
from tests.support.app import make_settings
from tests.support.frames import garbage_frames
from tests.support.traffic import clean
from vigil.app.runtime import build_runtime
from vigil.runtime import Envelope


def _fail_first(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """The pipeline's first ``times`` writes fail as a locked SQLite database does, through SQLAlchemy."""
    calls: list[int] = []
    real: Callable[..., Any] = pipeline_module.store_conversations

    def store(session: Any, checked: Any) -> Any:
        calls.append(1)
        if len(calls) <= times:  # an OperationalError raised and wrapped by SQLAlchemy, as "database is locked" is
            session.execute(text("SELECT * FROM a_table_that_is_not_there"))
        return real(session, checked)

    monkeypatch.setattr(pipeline_module, "store_conversations", store)
    return calls


def _envelopes(n: int) -> list[Envelope]:
    return [Envelope(orjson.dumps(c), "kafka", "conversations", 0, i) for i, c in enumerate(clean(n, "v1", seed=7))]


def test_a_retried_write_leaves_nothing_for_the_garbage_collector(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write tried again (a deadlock, a serialization failure, a locked database) kept the batch it
    failed on, through the caught error's frames, until the collector next ran."""
    rt = build_runtime(make_settings(sqlite_url, store_retry_base_seconds=0.001), registry=CollectorRegistry())
    try:
        envelopes = _envelopes(20)
        calls = _fail_first(monkeypatch, 1)
        with garbage_frames() as held:
            result = rt.pipeline.process_raw(envelopes)
        assert len(calls) == 2 and len(result.stored) == 20
        assert not held, f"frames of Vigil's left for the garbage collector: {held}"
    finally:
        rt.close()


class _Consumer:
    """Enough of a Kafka consumer for the worker's retries: no partitions assigned."""

    def assignment(self) -> set[Any]:
        return set()


def test_a_batch_the_consumer_stores_again_leaves_nothing_for_the_garbage_collector(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch whose write gave up (StoreUnavailable, the database away for longer than the write's own
    retries) is stored again by the consumer after a wait of up to 30 s: the error, alive through that
    wait and then in a cycle until the collector ran, kept the batch's decoded documents with it."""
    import logging

    from vigil.ingest import kafka

    rt = build_runtime(make_settings(sqlite_url, store_retry_attempts=1), registry=CollectorRegistry())
    # a record kept by pytest's log capture would hold the error alive; Vigil's own handlers format and drop it
    quiet = logging.getLogger("test_error_frames.quiet")
    quiet.propagate = False
    monkeypatch.setattr(kafka, "log", quiet)
    try:
        worker = kafka.ConsumerWorker(rt, _Consumer())
        envelopes = _envelopes(20)
        calls = _fail_first(monkeypatch, 1)
        letters: list[Any] = []
        with garbage_frames() as held:
            assert worker._with_retry(rt.pipeline.process_raw, envelopes, letters)
        assert len(calls) == 2 and not letters
        assert not held, f"frames of Vigil's left for the garbage collector: {held}"
    finally:
        rt.close()


def test_a_batch_split_to_find_a_refused_message_leaves_nothing_for_the_garbage_collector(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch the database refuses for what one message holds is split until that message is found (a
    ``store_rejected`` dead letter): each split's error kept the part of the batch it failed on, alive
    through the halves' writes and then until the collector ran."""
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    try:
        envelopes = _envelopes(20)
        poison = orjson.loads(envelopes[13].raw)["conversation_id"]
        real: Callable[..., Any] = pipeline_module.store_conversations

        def store(session: Any, checked: Any) -> Any:
            if any(c.conversation.conversation_id == poison for c in checked):  # refused as a NOT NULL column is
                session.execute(text("CREATE TEMP TABLE IF NOT EXISTS refusing (x INTEGER NOT NULL)"))
                session.execute(text("INSERT INTO refusing VALUES (NULL)"))
            return real(session, checked)

        monkeypatch.setattr(pipeline_module, "store_conversations", store)
        with garbage_frames() as held:
            result = rt.pipeline.process_raw(envelopes)
        assert len(result.stored) == 19 and [d.reason for d in result.dead_letters] == ["store_rejected"]
        assert not held, f"frames of Vigil's left for the garbage collector: {held}"
    finally:
        rt.close()


def test_an_outcomes_batch_split_to_find_a_refused_message_leaves_nothing_for_the_garbage_collector(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outcomes topic's handler splits a refused batch the same way."""
    from vigil.app.wiring import wire
    from vigil.outcomes.ingest import OutcomeStore

    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    try:
        wire(rt, {"api"})
        outcomes = rt.get(OutcomeStore)
        envelopes = [
            Envelope(orjson.dumps({"conversation_id": f"c{i}", "type": "csat", "value": 4}), "kafka", "outcomes", 0, i)
            for i in range(20)
        ]
        real = outcomes.store

        def store(session: Any, items: Any, source: str) -> Any:
            if any(o.conversation_id == "c13" for o in items):  # refused as a NOT NULL column is
                session.execute(text("CREATE TEMP TABLE IF NOT EXISTS refusing (x INTEGER NOT NULL)"))
                session.execute(text("INSERT INTO refusing VALUES (NULL)"))
            return real(session, items, source)

        monkeypatch.setattr(outcomes, "store", store)
        with garbage_frames() as held:
            result = outcomes.handle_envelopes(envelopes)
        assert result.stored == 19 and [d.reason for d in result.dead_letters] == ["store_rejected"]
        assert not held, f"frames of Vigil's left for the garbage collector: {held}"
    finally:
        rt.close()


def test_a_request_answered_503_leaves_nothing_for_the_garbage_collector(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During an outage every write gives up (StoreUnavailable) and the request is answered 503, to be sent
    again: the error kept the request's decoded body (up to the in-flight budget) until the collector ran,
    so clients retrying through an outage piled up bodies outside the budget."""
    import logging

    from tests.support.app import INGEST, make_client
    from vigil.ingest import http

    rt = build_runtime(make_settings(sqlite_url, store_retry_attempts=1), registry=CollectorRegistry())
    # a record kept by pytest's log capture would hold the error (its argument) alive
    quiet = logging.getLogger("test_error_frames.quiet")
    quiet.propagate = False
    monkeypatch.setattr(http, "log", quiet)
    try:
        with make_client(rt) as client:
            _fail_first(monkeypatch, 1)
            body = orjson.dumps(clean(20, "v1", seed=7))
            headers = {"content-type": "application/json", **INGEST}
            with garbage_frames(frozenset({"ingest_body", "process_documents", "_store_once"})) as held:
                r = client.post("/v1/conversations", content=body, headers=headers)
            assert r.status_code == 503, r.text
            assert not held, f"frames of Vigil's left for the garbage collector: {held}"
    finally:
        rt.close()


def test_an_outcomes_request_answered_503_leaves_nothing_for_the_garbage_collector(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for the endpoints whose 503 the app's handler answers (outcomes, OTLP, the console)."""
    from tests.support.app import INGEST, make_client
    from vigil.outcomes.ingest import OutcomeStore

    rt = build_runtime(make_settings(sqlite_url, store_retry_attempts=1), registry=CollectorRegistry())
    try:
        with make_client(rt) as client:
            outcomes = rt.get(OutcomeStore)
            real = outcomes.store

            def store(session: Any, items: Any, source: str) -> Any:
                session.execute(text("SELECT * FROM a_table_that_is_not_there"))
                return real(session, items, source)

            monkeypatch.setattr(outcomes, "store", store)
            body = orjson.dumps([{"conversation_id": f"c{i}", "type": "csat", "value": 4} for i in range(20)])
            headers = {"content-type": "application/json", **INGEST}
            with garbage_frames(frozenset({"ingest", "write", "_post_outcomes"})) as held:
                r = client.post("/v1/outcomes", content=body, headers=headers)
            assert r.status_code == 503, r.text
            assert not held, f"frames of Vigil's left for the garbage collector: {held}"
    finally:
        rt.close()
