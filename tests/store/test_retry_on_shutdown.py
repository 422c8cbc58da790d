"""A write failing on a locked or lost database while the process shuts down gives up at once.

Under SIGTERM with the SQLite file locked, ``vigil consume`` ran on for about 150 s (5 attempts of a
30 s busy timeout) before it exited: every retry waited although the process had been told to stop.
Nothing is committed when it gives up: the batch's offsets are not committed, and the next consumer
stores it.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.exc import OperationalError

from tests.support.app import make_settings
from vigil.app.runtime import build_runtime
from vigil.ingest.kafka import ConsumerWorker
from vigil.store.db import StoreUnavailable, retry_transient


def _locked() -> None:
    raise OperationalError("INSERT", {}, Exception("database is locked"))


def test_retries_stop_once_the_process_is_stopping() -> None:
    calls: list[int] = []

    def fn() -> None:
        calls.append(1)
        _locked()

    with pytest.raises(StoreUnavailable, match="giving up after 3 attempts"):
        retry_transient(fn, attempts=3, base_seconds=0.001)
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(StoreUnavailable, match="shutting down"):
        retry_transient(fn, attempts=5, base_seconds=0.001, stopping=lambda: True)
    assert len(calls) == 1


def test_stopping_a_consumer_stops_the_pipelines_retries(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    attempts: list[int] = []

    def locked_store(*_args: object) -> None:
        attempts.append(1)
        if len(attempts) == 1:
            worker.stop()  # SIGTERM arrives while the first attempt waits on the lock
        _locked()

    monkeypatch.setattr(rt.pipeline, "_store_once", locked_store)
    worker = ConsumerWorker(rt, None)
    with pytest.raises(StoreUnavailable, match="shutting down"):
        rt.pipeline.store([], [], "kafka")
    assert len(attempts) == 1
    rt.close()
