"""Migration 0009: conversation documents are compressed with lz4 on Postgres; SQLite is untouched."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

from vigil.store import db


def _conversation(i: int) -> dict[str, object]:
    words = " ".join(f"policy clause {k} applies to order #W{k:07d}" for k in range(400))
    return {
        "conversation_id": f"lz4-{i}",
        "agent_id": "a",
        "agent_version": "v1",
        "messages": [{"role": "system", "content": words}, {"role": "user", "content": "hello"}],
    }


def _store(url: str) -> None:
    import orjson
    from prometheus_client import CollectorRegistry

    from vigil.app.runtime import build_runtime
    from vigil.runtime import Envelope
    from vigil.settings import Settings

    rt = build_runtime(Settings(database_url=url, metrics_port=0), registry=CollectorRegistry(), migrate=False)  # type: ignore[arg-type]
    try:
        envs = [Envelope(orjson.dumps(_conversation(i)), "test") for i in range(3)]
        assert len(rt.pipeline.process_raw(envs).stored) == 3
    finally:
        rt.close()


def test_documents_use_lz4_on_postgres_and_read_back(db_url) -> None:
    db.upgrade(db_url)
    _store(db_url)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            docs = conn.execute(text("SELECT document FROM conversations ORDER BY conversation_id")).scalars().all()
            assert [d.count("policy clause") for d in docs] == [400, 400, 400]
            if engine.dialect.name == "postgresql":
                available = conn.execute(
                    text("SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'")
                ).scalar()
                methods = (
                    conn.execute(text("SELECT DISTINCT pg_column_compression(document) FROM conversations"))
                    .scalars()
                    .all()
                )
                assert methods == (["lz4"] if "lz4" in available else ["pglz"])
        cfg = db.alembic_config(engine.url.render_as_string(hide_password=False))
        command.downgrade(cfg, "0008")
        command.upgrade(cfg, "head")
    finally:
        engine.dispose()
