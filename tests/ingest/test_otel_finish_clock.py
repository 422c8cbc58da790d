"""The idle finisher and the requests that make a traced conversation grow read one clock, the database's,
whatever the replicas' host clocks say (simulated by patching the OTLP ingest module's ``datetime``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest
from sqlalchemy import update

from tests.ingest.test_otel_finish import chat_span, replica
from tests.support.clocks import skewed
from vigil.ingest.otlp import ingest as otlp_ingest
from vigil.ingest.otlp.ingest import TraceIngest
from vigil.ingest.otlp.models import OtelConversationRow

MSGS = orjson.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "working on it"}]}]).decode()


def _open_trace(rt, n: int) -> str:  # type: ignore[no-untyped-def]
    span = chat_span(f"{n:032x}", "00000000000000a1", "00000000000000ff", 10**18, **{"gen_ai.output.messages": MSGS})
    rt.get(TraceIngest).ingest([span])
    return f"otel-{n:032x}"


def test_a_finisher_whose_clock_runs_ahead_neither_finishes_early_nor_takes_a_live_claim(
    db_url: str, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A replica 3 h ahead saw every conversation that grew in the last 3 h as idle, finished them while
    their spans still came, and took over the claims of replicas still finishing others."""
    rt = replica(db_url)
    try:
        _open_trace(rt, 1)  # grew a moment ago
        claimed = _open_trace(rt, 2)
        with rt.sessions.begin() as s:  # idle by now, but another replica claimed it a moment ago
            s.execute(
                update(OtelConversationRow)
                .where(OtelConversationRow.conversation_key == claimed)
                .values(
                    last_seen_at=datetime.now(UTC) - timedelta(seconds=60),
                    claimed_by="other",
                    claim_until=datetime.now(UTC) + timedelta(seconds=300),
                )
            )
        monkeypatch.setattr(otlp_ingest, "datetime", skewed(3))
        assert rt.get(TraceIngest).finish_idle("ahead") == []
        monkeypatch.setattr(otlp_ingest, "datetime", datetime)
        with rt.sessions.begin() as s:  # the other replica died: its claim ran out
            s.execute(
                update(OtelConversationRow)
                .where(OtelConversationRow.conversation_key == claimed)
                .values(claim_until=datetime.now(UTC) - timedelta(seconds=1))
            )
        assert rt.get(TraceIngest).finish_idle("right") == [claimed]
    finally:
        rt.close()


@pytest.mark.postgres
def test_a_replica_whose_clock_runs_behind_does_not_get_its_conversations_finished_early(
    pg_url: str, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Spans stored by a replica 3 h behind stamped their conversation as last grown 3 h ago, so the idle
    finisher of any other replica finished it at once, while its spans still came. (A SQLite database and
    every replica writing to it share one host, so one clock.)"""
    rt = replica(pg_url)
    try:
        monkeypatch.setattr(otlp_ingest, "datetime", skewed(-3))
        _open_trace(rt, 3)
        monkeypatch.setattr(otlp_ingest, "datetime", datetime)
        assert rt.get(TraceIngest).finish_idle("right") == []
    finally:
        rt.close()


@pytest.mark.postgres
def test_a_replica_whose_clock_runs_ahead_purges_no_conversation_still_growing(pg_url: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A conversation's last growth is stamped on the database's clock; the purge of old buffered spans read
    its cutoff from the host's, so a replica 3 h ahead with a 2 h span retention deleted a trace it had just
    stored spans of, while they still came."""
    rt = replica(pg_url, otlp_span_retention_hours=2.0)
    try:
        monkeypatch.setattr(otlp_ingest, "datetime", skewed(3))
        key = _open_trace(rt, 4)  # the first request of a process also purges
        monkeypatch.setattr(otlp_ingest, "datetime", datetime)
        with rt.sessions() as s:
            assert s.get(OtelConversationRow, key) is not None
    finally:
        rt.close()


@pytest.mark.postgres
def test_a_replica_whose_clock_runs_behind_shows_a_long_conversations_progress(pg_url: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A conversation's start is stamped on the database's clock; a replica 3 h behind held every request of
    a trace that began 2 h ago as "processed less than the progress interval (1 h) ago", so nothing of it went
    through the pipeline until its root came or it went idle."""
    rt = replica(pg_url, otlp_progress_interval_seconds=3600.0)
    try:
        monkeypatch.setattr(otlp_ingest, "datetime", skewed(-3))
        key = _open_trace(rt, 5)  # began a moment ago: waits for the interval
        with rt.sessions.begin() as s:  # began 2 h ago, never through the pipeline
            s.execute(
                update(OtelConversationRow)
                .where(OtelConversationRow.conversation_key == key)
                .values(first_seen_at=datetime.now(UTC) - timedelta(hours=2), processed_at=None)
            )
        span = chat_span(
            f"{5:032x}", "00000000000000a2", "00000000000000ff", 10**18 + 5000, **{"gen_ai.output.messages": MSGS}
        )
        res = rt.get(TraceIngest).ingest([span])
        monkeypatch.setattr(otlp_ingest, "datetime", datetime)
        assert key not in res.pending
    finally:
        rt.close()
