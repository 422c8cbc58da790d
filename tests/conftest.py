"""Fixtures every test folder shares; helpers live in ``tests.support``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import make_client, make_settings
from tests.support.cli import WIDTH
from tests.support.services import kafka_broker, postgres_database
from tests.support.waiting import scaled, time_scale
from vigil.app.runtime import build_runtime
from vigil.runtime import Runtime
from vigil.settings import Settings

SLOW_SERVICES = ("kafka", "browser", "prometheus")

# Output is never wrapped at the width of whatever terminal runs the suite: the CLI commands the tests
# start (in process or as subprocesses) print as on a wide terminal (tests.support.cli).
os.environ["COLUMNS"] = os.environ["TERMINAL_WIDTH"] = WIDTH


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests of a broker, a browser or Prometheus are slow by nature: ``-m "not slow"`` leaves them out.

    Each test's pytest-timeout (the ini's ``timeout``, or its own marker) is stretched by
    ``VIGIL_TEST_TIME_SCALE`` like every other deadline.
    """
    base = float(config.getini("timeout") or 0)
    for item in items:
        if any(item.get_closest_marker(name) for name in SLOW_SERVICES):
            item.add_marker(pytest.mark.slow)
        own = item.get_closest_marker("timeout")
        limit = float(own.args[0]) if own and own.args else base
        if limit and time_scale() > 1:
            item.add_marker(pytest.mark.timeout(scaled(limit)))


@pytest.fixture(scope="session")
def kafka() -> Iterator[str]:
    """Bootstrap address of a real Kafka-protocol broker, for the whole session."""
    with kafka_broker() as bootstrap:
        yield bootstrap


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'vigil.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Runs the test once on SQLite and once on Postgres."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'vigil.db'}"
    else:
        with postgres_database() as url:
            yield url


@pytest.fixture
def settings(sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


@pytest.fixture
def runtime(settings: Settings) -> Iterator[Runtime]:
    rt = build_runtime(settings, registry=CollectorRegistry())
    yield rt
    rt.close()


@pytest.fixture
def client(runtime: Runtime):  # type: ignore[no-untyped-def]
    with make_client(runtime) as c:
        yield c
