"""Scale-out at CI size: three `vigil consume` processes over six partitions, one killed mid-stream.

Runs ``bench/bench_scaleout.py``'s kill scenario with 3,000 conversations from `vigil simulate`
against the Kafka-protocol broker and a fresh Postgres database.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from vigil.settings import PROJECT_ROOT

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]


def bench():  # type: ignore[no-untyped-def]
    path = PROJECT_ROOT / "bench" / "bench_scaleout.py"
    spec = importlib.util.spec_from_file_location("bench_scaleout", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_scaleout"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_three_consumers_one_killed_store_everything_exactly_once(kafka: str, tmp_path: Path) -> None:
    from tests.support.services import create_topic

    b = bench()
    n, partitions = 3000, 6
    topic = "scaleout-ci"
    create_topic(kafka, topic, partitions)
    items = b.simulate(n, seed=7, out=tmp_path / "conversations.jsonl")
    assert len(items) == n and len({k for k, _ in items}) == n
    ends = b.produce(kafka, topic, items)
    assert sorted(ends) == list(range(partitions)) and sum(ends.values()) == n

    result = b.run_group(kafka, topic, items, ends, n_consumers=3, kill=True, batch_size=100, timeout=240)

    assert 0 < result.killed_at[1] < n, "the consumer was killed mid-stream"
    assert result.victim_partitions, "the killed consumer held partitions"
    assert result.stored == n and result.exactly_once, "every conversation stored exactly once"
    assert result.survivor_partitions == list(range(partitions)), "the survivors took over every partition"
    assert set(result.victim_partitions) <= set(result.survivor_partitions)
    assert result.committed_to_end, "the group's offsets reached the end of every partition"
