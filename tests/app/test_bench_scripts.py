"""Every benchmark script still imports against the service it measures: docs/benchmarks.md tells users to
run them, and a renamed or removed function otherwise shows only when someone does."""

from __future__ import annotations

import importlib

import pytest

from tests.support.app import PROJECT_ROOT

SCRIPTS = sorted(p.stem for p in (PROJECT_ROOT / "bench").glob("bench_*.py"))


def test_there_are_benchmark_scripts() -> None:
    assert len(SCRIPTS) > 20


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_benchmark_script_imports(name: str) -> None:
    assert importlib.import_module(f"bench.{name}").__name__ == f"bench.{name}"
