"""Migration 0003 creates exactly the review tables the models describe, and downgrades cleanly."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from vigil.app.wiring import metadata
from vigil.store import db

REVIEW_TABLES = {
    "review_items",
    "review_reasons",
    "review_labels",
    "review_skips",
    "review_audit",
    "review_comments",
    "review_pairwise",
}


def _review_diffs(url: str) -> list:  # type: ignore[type-arg]
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), metadata())
    finally:
        engine.dispose()

    return [d for d in diffs if any(t in repr(d) for t in REVIEW_TABLES)]


def test_migration_matches_models_and_downgrades(db_url) -> None:
    db.upgrade(db_url)
    assert _review_diffs(db_url) == []
    engine = db.make_engine(db_url)
    assert set(inspect(engine).get_table_names()) >= REVIEW_TABLES
    cfg = db.alembic_config(engine.url.render_as_string(hide_password=False))
    command.downgrade(cfg, "0002")
    assert not REVIEW_TABLES & set(inspect(engine).get_table_names())
    command.upgrade(cfg, "head")
    assert set(inspect(engine).get_table_names()) >= REVIEW_TABLES
    engine.dispose()


def test_ui_sessions_migration_matches_the_model_and_downgrades(db_url) -> None:
    db.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            diffs = compare_metadata(MigrationContext.configure(conn), metadata())
        assert [d for d in diffs if "ui_sessions" in repr(d)] == []
        cfg = db.alembic_config(engine.url.render_as_string(hide_password=False))
        command.downgrade(cfg, "0008")
        assert "ui_sessions" not in inspect(engine).get_table_names()
        command.upgrade(cfg, "head")
        assert "ui_sessions" in inspect(engine).get_table_names()
    finally:
        engine.dispose()
