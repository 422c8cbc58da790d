"""Fixtures every test folder shares; helpers live in ``tests.support``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import make_client, make_settings
from tests.support.services import kafka_broker, postgres_database
from vigil.app.runtime import build_runtime
from vigil.runtime import Runtime
from vigil.settings import Settings

SLOW_SERVICES = ("kafka", "browser", "prometheus")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests of a broker, a browser or Prometheus are slow by nature: ``-m "not slow"`` leaves them out."""
    for item in items:
        if any(item.get_closest_marker(name) for name in SLOW_SERVICES):
            item.add_marker(pytest.mark.slow)


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
