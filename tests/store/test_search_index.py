"""Migration 0011: trigram indexes for the queue's text search where pg_trgm may be created, and a clear
log line (no failure, no index) where the migrating role may not create it."""

from __future__ import annotations

import logging
import uuid

import psycopg
import pytest
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from tests.support.services import PG_ADMIN_URL
from vigil.store import db

TRGM = {"ix_conversations_task_trgm", "ix_conversations_document_trgm"}


def _indexes(url: str) -> set[str]:
    engine = db.make_engine(url)
    try:
        return {i["name"] for i in inspect(engine).get_indexes("conversations")}
    finally:
        engine.dispose()


def test_the_migration_creates_the_trigram_indexes_and_drops_them_on_downgrade(pg_url: str) -> None:
    from alembic import command

    db.upgrade(pg_url)
    assert _indexes(pg_url) >= TRGM
    cfg = db.alembic_config(pg_url)
    command.downgrade(cfg, "0010_assign_lapse")
    assert not _indexes(pg_url) & TRGM
    command.upgrade(cfg, "head")
    assert _indexes(pg_url) >= TRGM


def test_a_role_that_may_not_create_the_extension_migrates_without_it(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    role = f"vigil_noext_{uuid.uuid4().hex[:8]}"
    database = pg_url.rsplit("/", 1)[1]
    admin = psycopg.connect(PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + database, autocommit=True)
    # tables in the public schema, but no CREATE on the database: a trusted extension needs that
    admin.execute(f"CREATE ROLE {role} LOGIN")
    admin.execute(f"GRANT USAGE, CREATE ON SCHEMA public TO {role}")
    try:
        as_role = make_url(pg_url).set(username=role, password=None).render_as_string(hide_password=False)
        with caplog.at_level(logging.WARNING, logger="vigil.migrations"):
            db.upgrade(as_role)
        (line,) = [r.getMessage() for r in caplog.records if "pg_trgm is not available" in r.getMessage()]
        assert "permission denied" in line and "CREATE EXTENSION pg_trgm" in line
        assert not _indexes(as_role) & TRGM
        version = admin.execute("SELECT version_num FROM alembic_version").fetchone()
        assert version == ("0011_search_trgm",)  # the migration itself went through
    finally:
        admin.execute(f"DROP OWNED BY {role}")
        admin.execute(f"DROP ROLE {role}")
        admin.close()
