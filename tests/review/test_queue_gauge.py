"""The open-items gauge never holds a scrape on a database that stopped answering."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from vigil.review import stage as review_stage
from vigil.review.stage import ReviewStage


def test_a_hung_database_does_not_hold_the_scrape(rt, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """A database that accepts connections and never answers held every scrape of every process (and the
    workers' liveness probe, served by the same handler) for the connect timeout: longer than Prometheus'
    scrape timeout and the probe's, so the targets went down and the pods were restarted during the outage.
    The scrape reports the last count while the new one waits."""
    stage = rt.get(ReviewStage)
    before = stage.open_items()
    assert before == 0.0
    answer = threading.Event()
    asked = threading.Event()

    @contextmanager
    def hung() -> Iterator[Any]:
        asked.set()
        answer.wait()
        raise OperationalError("SELECT count(*)", {}, Exception("server closed the connection"))
        yield

    monkeypatch.setattr(review_stage, "GAUGE_TTL_SECONDS", 0.0)
    monkeypatch.setattr(stage, "sessions", hung)
    scraped: list[float] = []
    scrape = threading.Thread(target=lambda: scraped.append(stage.open_items()), daemon=True)
    try:
        scrape.start()
        assert asked.wait(30), "the gauge never asked the database"
        scrape.join(30)
        assert not scrape.is_alive(), "the scrape waits for a database that does not answer"
        assert scraped == [before]
    finally:
        answer.set()
        scrape.join(30)
        counting = getattr(stage, "_counting", None)
        if counting is not None:  # done before the database goes
            counting.join(30)
    assert stage.open_items() == before  # the failed count kept the last value
