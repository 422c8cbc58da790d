"""Replicas started together migrate one empty database at once: every one of them starts.

Without a lock, two of three ``vigil db upgrade`` runs died on SQLite (``table ... already exists``) and
one of three on Postgres (a unique violation creating Alembic's version table), every trial.
"""

from __future__ import annotations

import os
import subprocess
import sys

from sqlalchemy import inspect, text

from tests.support.waiting import scaled
from vigil.store.db import make_engine


def test_three_replicas_migrating_at_once_all_succeed(db_url: str) -> None:
    env = {**os.environ, "VIGIL_DATABASE_URL": db_url}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "vigil", "db", "upgrade"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=scaled(120))[0].decode(errors="replace") for p in procs]
    failed = [(p.returncode, out[-2000:]) for p, out in zip(procs, outputs, strict=True) if p.returncode != 0]
    assert not failed, failed
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        assert len(versions) == 1
        assert {"conversations", "judge_requests", "review_comments"} <= set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrating_logs_what_it_migrates_and_nothing_on_every_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Alembic logs nine INFO lines on every start (its plugins set up, the DDL mode) whether or not it
    # migrates: they came ahead of every `vigil` command's output
    env = {**os.environ, "VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}", "VIGIL_LOG_LEVEL": "INFO"}

    def upgrade() -> str:
        run = subprocess.run(
            [sys.executable, "-m", "vigil", "db", "upgrade"], env=env, capture_output=True, timeout=scaled(120)
        )
        assert run.returncode == 0, run.stderr.decode(errors="replace")
        return (run.stdout + run.stderr).decode(errors="replace")

    first = upgrade()
    assert "Running upgrade  -> 0001" in first
    assert "setup plugin" not in first and "Context impl" not in first and "Will assume" not in first
    again = upgrade()
    assert "alembic" not in again, again
