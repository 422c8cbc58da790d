"""Migration 0021 creates the record of what each conversation was fed as, as the models describe it, and
downgrades keeping the lease's cursor."""

from __future__ import annotations

from datetime import UTC, datetime

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

from vigil.app.wiring import metadata
from vigil.store import db


def test_migration_matches_the_models_and_downgrades_keeping_the_cursor(db_url) -> None:
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), metadata())
        assert [d for d in diffs if "detector_feeds" in repr(d) or "fed_since" in repr(d)] == []
        cursor = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO detector_lease (name, holder, lease_until, cursor) VALUES ('detector', 'a', :t, :t)"),
                {"t": cursor},
            )
        cfg = db.alembic_config(engine.url.render_as_string(hide_password=False))
        command.downgrade(cfg, "0020_judge_requests_conversation")
        assert "detector_feeds" not in inspect(engine).get_table_names()
        assert "fed_since" not in {c["name"] for c in inspect(engine).get_columns("detector_lease")}
        command.upgrade(cfg, "head")
        assert "detector_feeds" in inspect(engine).get_table_names()
        with engine.connect() as conn:
            kept, since = conn.execute(text("SELECT cursor, fed_since FROM detector_lease")).one()
        assert db.aware(kept if isinstance(kept, datetime) else datetime.fromisoformat(kept)) == cursor
        assert since is None  # the detector's next pass begins the record at its cursor
    finally:
        engine.dispose()
