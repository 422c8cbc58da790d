"""A database migrated by the release that made trigram indexes (revision ``0011_search_trgm``) upgrades:
that revision's file had been deleted, so no later release could start on it ("Can't locate revision
identified by '0011_search_trgm'")."""

from __future__ import annotations

from sqlalchemy import inspect, text

from vigil.store import db


def test_a_database_at_the_removed_trigram_revision_upgrades_and_loses_its_indexes(db_url: str) -> None:
    db.upgrade(db_url, "0010_assign_lapse")
    engine = db.make_engine(db_url)
    try:
        with engine.begin() as conn:  # as that release left it
            conn.execute(text("UPDATE alembic_version SET version_num = '0011_search_trgm'"))
            if engine.dialect.name == "postgresql":
                conn.execute(text("CREATE INDEX ix_conversations_task_trgm ON conversations (task_id)"))
            conn.execute(
                text(
                    "INSERT INTO conversations (conversation_id, revision, schema_version, agent_id, agent_version, "
                    "received_at, message_count, tool_call_count, tool_error_count, finding_count, document) "
                    "VALUES ('kept', 1, 1, 'a', 'v1', CURRENT_TIMESTAMP, 1, 0, 0, 0, '{}')"
                )
            )
        db.upgrade(db_url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [
                "0018_detector_feeds"
            ]
            assert conn.execute(text("SELECT conversation_id FROM conversations")).scalars().all() == ["kept"]
        names = {i["name"] for i in inspect(engine).get_indexes("conversations")}
        assert "ix_conversations_task_trgm" not in names
        if engine.dialect.name == "postgresql":  # and 0011_otlp_text ran on the way
            with engine.connect() as conn:
                kind = conn.execute(
                    text(
                        "SELECT data_type FROM information_schema.columns "
                        "WHERE table_name = 'otel_spans' AND column_name = 'span'"
                    )
                ).scalar()
            assert kind == "text"
    finally:
        engine.dispose()


def test_a_fresh_database_reaches_the_single_head(db_url: str) -> None:
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [
                "0018_detector_feeds"
            ]
    finally:
        engine.dispose()
