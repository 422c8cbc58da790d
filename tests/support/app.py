"""Settings, runtimes and API clients as the tests build them: real database, fresh metrics registry."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def served(rt: Runtime, *, close: bool = False) -> Iterator[str]:
    """``rt``'s app served by uvicorn on a free loopback port, for a browser; yields its base URL.

    ``close``: also close the runtime once the server has stopped."""
    import threading

    import uvicorn

    from tests.support.services import free_port, wait_port
    from vigil.app.server import build_app

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(build_app(rt), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        if not wait_port(port):
            raise RuntimeError("uvicorn did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(10)
        if close:
            rt.close()
