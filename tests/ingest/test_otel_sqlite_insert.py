"""On SQLite a request of new spans is inserted without ``ON CONFLICT ... RETURNING``; in one that resends a
stored span that insert fails on the key, and the upsert stores only what is new, in the same transaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import event, func, select

from tests.ingest.test_otel_finish import chat_span
from tests.support.app import make_settings
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.otlp.ingest import TraceIngest
from vigil.ingest.otlp.models import OtelConversationRow, OtelSpanRow

TRACE = "d" * 32


def _spans(numbers: range) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    out = []
    for n in numbers:
        history = [*history, {"role": "user", "parts": [{"type": "text", "content": f"turn {n} " + "x" * 300}]}]
        out.append(
            chat_span(
                TRACE,
                f"{n:016x}",
                "00000000000000ff",
                10**18 + n,
                **{"gen_ai.conversation.id": "resent", "gen_ai.input.messages": orjson.dumps(history).decode()},
            )
        )
    return out


def test_new_spans_skip_the_upsert_and_a_resent_request_stores_only_what_is_new(tmp_path: Path) -> None:
    rt = wire(
        build_runtime(
            make_settings(f"sqlite:///{tmp_path / 'v.db'}", judge_mode="offline"), registry=CollectorRegistry()
        ),
        {"api"},
    )
    statements: list[str] = []

    @event.listens_for(rt.engine, "before_cursor_execute")
    def seen(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        if "otel_spans" in statement:
            statements.append(statement.split(" VALUES ")[0] + (" RETURNING" if "RETURNING" in statement else ""))

    ingest = rt.get(TraceIngest)
    try:
        assert ingest.ingest(_spans(range(1, 6))).stored == 5
        inserts = [s for s in statements if s.startswith("INSERT INTO otel_spans")]
        assert inserts and not any("RETURNING" in s for s in inserts), statements
        statements.clear()

        again = ingest.ingest(_spans(range(1, 9)))  # five stored before, three new
        assert again.stored == 3
        inserts = [s for s in statements if s.startswith("INSERT INTO otel_spans")]
        assert ["RETURNING" in s for s in inserts] == [False, True], statements  # failed on the key, then upserted
        with rt.sessions() as s:
            assert s.scalar(select(func.count()).select_from(OtelSpanRow)) == 8
            c = OtelConversationRow
            assert s.scalar(select(c.span_count).where(c.conversation_key == "resent")) == 8
        spans, _ = ingest._load("resent")
        assert [sp["span_id"] for sp in spans] == [f"{n:016x}" for n in range(1, 9)]
        last = orjson.loads(spans[-1]["attributes"]["gen_ai.input.messages"])
        assert [m["parts"][0]["content"][:7] for m in last] == [f"turn {n} " for n in range(1, 9)]
    finally:
        rt.close()


def test_spans_go_with_their_requests_transaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The spans' insert is the request's first write: it must not commit on its own. A failure after it
    (here the count upsert) leaves no span stored, and the exporter's retry stores them all and counts them."""
    rt = wire(
        build_runtime(
            make_settings(f"sqlite:///{tmp_path / 'v.db'}", judge_mode="offline"), registry=CollectorRegistry()
        ),
        {"api"},
    )
    ingest = rt.get(TraceIngest)
    count = TraceIngest._count

    def failing(self: TraceIngest, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("database gone")

    try:
        monkeypatch.setattr(TraceIngest, "_count", failing)
        with pytest.raises(RuntimeError, match="database gone"):
            ingest.ingest(_spans(range(1, 4)))
        with rt.sessions() as s:
            assert s.scalar(select(func.count()).select_from(OtelSpanRow)) == 0
        monkeypatch.setattr(TraceIngest, "_count", count)
        assert ingest.ingest(_spans(range(1, 4))).stored == 3
        with rt.sessions() as s:
            c = OtelConversationRow
            assert s.scalar(select(c.span_count).where(c.conversation_key == "resent")) == 3
    finally:
        rt.close()
