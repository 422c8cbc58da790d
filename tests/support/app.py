"""Settings, runtimes and API clients as the tests build them: real database, fresh metrics registry."""

from __future__ import annotations

from typing import Any

from vigil.runtime import Runtime
from vigil.settings import PROJECT_ROOT, Settings

API_KEYS = "admin:admin:admin-key,ingester:ingest:ingest-key,rita:reviewer:rita-key,raj:reviewer:raj-key"
ADMIN = {"Authorization": "Bearer admin-key"}
INGEST = {"Authorization": "Bearer ingest-key"}
REVIEWER = {"Authorization": "Bearer rita-key"}


def make_settings(database_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": database_url,
        "api_keys": API_KEYS,
        "rule_packs": str(PROJECT_ROOT / "rules" / "default.yaml"),
        "metrics_port": 0,
        "otlp_grpc_port": 0,  # tests that want the gRPC receiver pick a free port
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def make_client(rt: Runtime, roles: set[str] | None = None) -> Any:
    """A TestClient on ``rt`` wired with every stage for ``roles`` (default: the API alone)."""
    from fastapi.testclient import TestClient

    from vigil.app.server import build_app
    from vigil.app.wiring import wire

    wire(rt, roles or {"api"})
    return TestClient(build_app(rt, list(rt.hooks.background)))
