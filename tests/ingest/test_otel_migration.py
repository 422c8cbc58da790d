"""Migration 0011 keeps OTLP spans and log records as JSON text on Postgres: what was stored as jsonb before
reads back the same, new rows are written as text, and the downgrade brings jsonb back; new spans go in by
COPY."""

from __future__ import annotations

from alembic import command
from sqlalchemy import select, text

from tests.support.services import postgres_database
from vigil.ingest.otlp.models import OtelEventRow, OtelSpanRow
from vigil.store import db

SPAN = {"kind": 3, "attributes": {"gen_ai.input.messages": '[{"role": "user"}]', "n": 7}}
EVENT = {"name": "gen_ai.user.message", "attributes": {"content": "hi"}}


def _types(engine) -> dict[str, str]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT table_name, data_type FROM information_schema.columns "
                "WHERE (table_name, column_name) IN (('otel_spans', 'span'), ('otel_events', 'event'))"
            )
        ).all()
    return dict(rows)  # type: ignore[arg-type]


def _insert(engine, key: str) -> None:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO otel_spans (conversation_key, trace_id, span_id, name, start_ns, end_ns, span, "
                "received_at) VALUES (:k, :t, :s, 'chat', 1, 2, CAST(:span AS jsonb), now())"
            ),
            {"k": key, "t": "a" * 32, "s": key[-16:].rjust(16, "0"), "span": '{"kind": 3, "attributes": {}}'},
        )


def test_spans_and_events_move_to_text_and_back() -> None:
    with postgres_database() as url:
        db.upgrade(url, "0010_assign_lapse")
        engine = db.make_engine(url)
        try:
            assert _types(engine) == {"otel_spans": "jsonb", "otel_events": "jsonb"}
            _insert(engine, "before")
            db.upgrade(url)
            assert _types(engine) == {"otel_spans": "text", "otel_events": "text"}
            with engine.begin() as conn:
                conn.execute(
                    OtelSpanRow.__table__.insert(),
                    {
                        "conversation_key": "after",
                        "trace_id": "b" * 32,
                        "span_id": "1" * 16,
                        "name": "chat",
                        "start_ns": 3,
                        "end_ns": 4,
                        "span": SPAN,
                        "received_at": db.utcnow(),
                    },
                )
                conn.execute(
                    OtelEventRow.__table__.insert(),
                    {
                        "conversation_key": "after",
                        "trace_id": "b" * 32,
                        "digest": "d" * 32,
                        "time_ns": 5,
                        "event": EVENT,
                        "received_at": db.utcnow(),
                    },
                )
            with engine.connect() as conn:
                spans = dict(conn.execute(select(OtelSpanRow.conversation_key, OtelSpanRow.span)).all())
                events = conn.execute(select(OtelEventRow.event)).scalars().all()
            assert spans == {"before": {"kind": 3, "attributes": {}}, "after": SPAN}
            assert events == [EVENT]
            cfg = db.alembic_config(engine.url.render_as_string(hide_password=False))
            command.downgrade(cfg, "0010_assign_lapse")
            assert _types(engine) == {"otel_spans": "jsonb", "otel_events": "jsonb"}
            with engine.connect() as conn:
                kinds = conn.execute(text("SELECT span->>'kind' FROM otel_spans ORDER BY id")).scalars().all()
            assert kinds == ["3", "3"]
        finally:
            engine.dispose()


def test_new_spans_are_copied_and_a_resent_request_takes_the_insert_path() -> None:
    """On Postgres a request of new spans goes in by COPY, with no INSERT into otel_spans; resent, the COPY
    fails on the key and the INSERT ... ON CONFLICT path stores nothing twice."""
    from prometheus_client import CollectorRegistry
    from sqlalchemy import event, func

    from tests.ingest.test_otel_finish import chat_span
    from tests.support.app import make_settings
    from vigil.app.runtime import build_runtime
    from vigil.app.wiring import wire
    from vigil.ingest.otlp.ingest import TraceIngest

    with postgres_database() as url:
        rt = wire(build_runtime(make_settings(url, judge_mode="offline"), registry=CollectorRegistry()), {"api"})
        inserts: list[str] = []

        @event.listens_for(rt.engine, "before_cursor_execute")
        def seen(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
            if statement.startswith("INSERT INTO otel_spans"):
                inserts.append(statement)

        spans = [
            chat_span("c" * 32, f"{n:016x}", "00000000000000ff", 10**18 + n, **{"gen_ai.conversation.id": "copied"})
            for n in range(1, 6)
        ]
        try:
            assert rt.get(TraceIngest).ingest(spans).stored == 5
            assert inserts == []
            again = rt.get(TraceIngest).ingest(spans)
            assert again.stored == 0 and len(inserts) == 1
            with rt.sessions() as s:
                assert s.scalar(select(func.count()).select_from(OtelSpanRow)) == 5
        finally:
            rt.close()
