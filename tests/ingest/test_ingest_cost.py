"""Ingest cost does not grow with the number of distinct agent versions in a batch (statements counted)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry
from sqlalchemy import event

from tests.support.app import make_settings
from tests.support.judge_fakes import judge_dir
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.schema import Conversation


def _statements(db_url: str, tmp_path: Path, distinct: bool) -> int:
    """Statements sent to the database while every stage stores one batch of 1,000 conversations."""
    jd = judge_dir(tmp_path / "judges", sampling={"rate": 0.02, "min_per_agent_version_per_hour": 5})
    rt = build_runtime(make_settings(db_url, judges_dir=str(jd), judge_mode="offline"), registry=CollectorRegistry())
    try:
        wire(rt, {"api"})
        convs = [
            Conversation.model_validate({**c, "agent_version": f"build-{i}" if distinct else "v1"})
            for i, c in enumerate(Simulator(parse_versions("v1:0.3"), 6 if distinct else 5).stream(1000))
        ]
        count = [0]

        def on_execute(*_: object) -> None:
            count[0] += 1

        event.listen(rt.engine, "before_cursor_execute", on_execute)
        rt.pipeline.process(convs, "test")
        event.remove(rt.engine, "before_cursor_execute", on_execute)
        return count[0]
    finally:
        rt.close()


def test_a_batch_of_distinct_versions_takes_the_round_trips_of_one_version(db_url: str, tmp_path: Path) -> None:
    one = _statements(db_url, tmp_path / "one", distinct=False)
    many = _statements(db_url.replace("vigil.db", "many.db"), tmp_path / "many", distinct=True)
    assert one == many
    assert one < 40  # a handful per stage, not one per conversation
