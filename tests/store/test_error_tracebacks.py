"""A failure while an earlier error is handled logs that earlier error's traceback too, though its frames
were dropped (``vigil.errors.without_frames``) so they would not keep a batch alive.

The consumer's log of a batch that failed shows the error it failed with and, before it ("During handling
of the above exception"), the error being handled then: the database refusing the batch, which was then
split, or a message, whose dead letter was then written. With the frames dropped, that error was logged as
its message alone, where the statement was run from lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import text

import vigil.ingest.pipeline as pipeline_module
from tests.support.app import make_settings
from tests.support.traffic import clean
from vigil.app.runtime import build_runtime
from vigil.runtime import Envelope

DURING = "During handling of the above exception, another exception occurred:"


class _Consumer:
    """Enough of a Kafka consumer for the worker's retries: no partitions assigned."""

    def assignment(self) -> set[Any]:
        return set()


def refuse(session: Any) -> None:
    """The database refuses what a row holds, as it refuses a NULL in a NOT NULL column."""
    session.execute(text("CREATE TEMP TABLE IF NOT EXISTS refusing (x INTEGER NOT NULL)"))
    session.execute(text("INSERT INTO refusing VALUES (NULL)"))


def go_away(session: Any) -> None:
    """The database is away, as a locked SQLite database is (an OperationalError, through SQLAlchemy)."""
    session.execute(text("SELECT * FROM a_table_that_is_not_there"))


def _logged_failure(caplog: pytest.LogCaptureFixture) -> str:
    """The consumer's one log record with a traceback, as its handler wrote it."""
    records = [r for r in caplog.records if r.name == "vigil.ingest.kafka" and r.exc_info]
    assert len(records) == 1, [r.getMessage() for r in caplog.records]
    assert records[0].exc_text  # formatted when it was emitted, as every handler of the log saw it
    return records[0].exc_text


def test_a_write_failing_after_a_split_logs_the_refused_batch_with_its_traceback(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from vigil.ingest import kafka

    rt = build_runtime(make_settings(sqlite_url, store_retry_attempts=1), registry=CollectorRegistry())
    try:
        worker = kafka.ConsumerWorker(rt, _Consumer())
        envelopes = [Envelope(orjson.dumps(c), "kafka", "conversations", 0, i) for i, c in enumerate(clean(4, "v1", 7))]
        poison = orjson.loads(envelopes[1].raw)["conversation_id"]
        real: Callable[..., Any] = pipeline_module.store_conversations
        calls: list[int] = []

        def store(session: Any, checked: Any) -> Any:
            calls.append(len(checked))
            if len(calls) == 2:  # the first half, once the whole batch was refused: the database went away
                go_away(session)
            if any(c.conversation.conversation_id == poison for c in checked):
                refuse(session)
            return real(session, checked)

        monkeypatch.setattr(pipeline_module, "store_conversations", store)
        letters: list[Any] = []
        with caplog.at_level(logging.ERROR, logger="vigil.ingest.kafka"):
            assert worker._with_retry(rt.pipeline.process_raw, envelopes, letters)
        assert calls[:2] == [4, 2] and [d.reason for d in letters] == ["store_rejected"]
        refused, later = _logged_failure(caplog).split(DURING)
        assert "IntegrityError" in refused and "NOT NULL constraint failed" in refused
        # where the refused statement ran from, though the error's frames were dropped before the split
        assert 'pipeline.py", line' in refused and "in _store_once" in refused and "in refuse" in refused
        assert "in go_away" in later and "StoreUnavailable" in later
    finally:
        rt.close()


def test_a_dead_letter_write_failing_logs_the_refused_message_with_its_traceback(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from vigil.app.wiring import wire
    from vigil.ingest import kafka
    from vigil.outcomes.ingest import OutcomeStore

    rt = build_runtime(make_settings(sqlite_url, store_retry_attempts=1), registry=CollectorRegistry())
    try:
        wire(rt, {"api"})
        outcomes = rt.get(OutcomeStore)
        worker = kafka.ConsumerWorker(rt, _Consumer())
        body = orjson.dumps({"conversation_id": "c1", "type": "csat", "value": 4})
        envelopes = [Envelope(body, "kafka", "outcomes", 0, 7)]
        real_store, real_dead = outcomes.store, outcomes.ingest_dead
        written: list[Any] = []

        def store(session: Any, items: Any, source: str) -> Any:
            refuse(session)
            return real_store(session, items, source)

        def ingest_dead(letter: Any) -> None:
            written.append(letter)
            if len(written) == 1:  # the message's dead letter, once the message was refused: the database went away
                with outcomes.sessions.begin() as session:
                    go_away(session)
            real_dead(letter)

        monkeypatch.setattr(outcomes, "store", store)
        monkeypatch.setattr(outcomes, "ingest_dead", ingest_dead)
        letters: list[Any] = []
        with caplog.at_level(logging.ERROR, logger="vigil.ingest.kafka"):
            assert worker._with_retry(outcomes.handle_envelopes, envelopes, letters)
        assert len(written) == 2 and [d.reason for d in letters] == ["store_rejected"]
        refused, later = _logged_failure(caplog).split(DURING)
        assert "IntegrityError" in refused and "NOT NULL constraint failed" in refused
        assert 'outcomes/ingest.py", line' in refused and "in _handle_envelopes" in refused and "in refuse" in refused
        assert "in go_away" in later and "OperationalError" in later
    finally:
        rt.close()


def test_frames_dropped_twice_are_written_out_once() -> None:
    """A judge's error is dropped where it is retried and again where it is given up on: one note."""
    from vigil.errors import FRAMES_DROPPED, without_frames

    def fail() -> None:
        raise ValueError("refused")

    try:
        try:
            fail()
        except ValueError as cause:
            raise RuntimeError("gave up") from cause
    except RuntimeError as exc:
        without_frames(exc)
        without_frames(exc)
        err = exc
    assert err.__traceback__ is None and err.__cause__ is not None and err.__cause__.__traceback__ is None
    assert err.__notes__ == [err.__notes__[0]] and err.__notes__[0].startswith(FRAMES_DROPPED)
    assert len(err.__cause__.__notes__) == 1 and "in fail" in err.__cause__.__notes__[0]
