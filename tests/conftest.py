from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parent))

from services import kafka_broker, postgres_database  # noqa: E402
from vigil.app.runtime import build_runtime
from vigil.runtime import Runtime  # noqa: E402
from vigil.settings import PROJECT_ROOT, Settings  # noqa: E402

API_KEYS = "admin:admin:admin-key,ingester:ingest:ingest-key,rita:reviewer:rita-key,raj:reviewer:raj-key"
ADMIN = {"Authorization": "Bearer admin-key"}
INGEST = {"Authorization": "Bearer ingest-key"}
REVIEWER = {"Authorization": "Bearer rita-key"}


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


def make_settings(database_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": database_url,
        "api_keys": API_KEYS,
        "rule_packs": str(PROJECT_ROOT / "rules" / "default.yaml"),
        "metrics_port": 0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


@pytest.fixture
def settings(sqlite_url: str) -> Settings:
    return make_settings(sqlite_url)


@pytest.fixture
def runtime(settings: Settings) -> Iterator[Runtime]:
    rt = build_runtime(settings, registry=CollectorRegistry())
    yield rt
    rt.close()


def make_client(rt: Runtime, roles: set[str] | None = None):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient
    from vigil.app.server import build_app
    from vigil.app.wiring import wire

    wire(rt, roles or {"api"})
    return TestClient(build_app(rt, list(rt.hooks.background)))


@pytest.fixture
def client(runtime: Runtime):  # type: ignore[no-untyped-def]
    with make_client(runtime) as c:
        yield c
