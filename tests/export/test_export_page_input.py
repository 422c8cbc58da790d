"""The export page's form: a "since" watermark that is not a 64-bit label id is a 422 page saying so
(a number past the database's integer answered 500), no run is recorded for it, and the export itself
runs in a worker thread, not on the event loop."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from tests.support.app import make_settings
from vigil.app.runtime import build_runtime
from vigil.export.models import ExportRunRow


@pytest.fixture
def ui(db_url: str) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from vigil.app.server import build_app
    from vigil.app.wiring import wire

    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    wire(rt, {"api"})
    with TestClient(build_app(rt)) as client:
        page = client.get("/ui/login")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        client.post("/ui/login", data={"csrf": token, "api_key": "admin-key"})
        page = client.get("/ui/export")
        client.csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        client.runtime = rt
        yield client
    rt.close()


def _runs(ui: Any) -> int:
    with ui.runtime.sessions() as s:
        return int(s.scalar(select(func.count()).select_from(ExportRunRow)) or 0)


@pytest.mark.parametrize("since", [str(2**63), "9" * 30, "-4", "abc", "1e3", "\u0661", "\u00b2"])
def test_a_watermark_that_is_not_a_label_id_is_a_422_page_and_records_no_run(ui: Any, since: str) -> None:
    r = ui.post("/ui/export", data={"csrf": ui.csrf, "format": "native", "since": since})
    assert r.status_code == 422, r.text[:500]
    assert "Export failed" in r.text and "since must be a label id" in r.text
    assert _runs(ui) == 0


def test_the_largest_watermark_exports_and_the_export_runs_off_the_event_loop(ui: Any, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import vigil.export.run as run_module

    loops: list[bool] = []
    real = run_module.export

    def export(*args: Any, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
            loops.append(True)
        except RuntimeError:
            loops.append(False)
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "export", export)
    r = ui.post("/ui/export", data={"csrf": ui.csrf, "format": "native", "since": str(2**63 - 1)})
    assert r.status_code == 200, r.text[:500]
    # nothing past that watermark: an empty run, which waits for no receipt
    assert r.headers["x-vigil-export-state"] == "done" and r.headers["x-vigil-watermark"] == str(2**63 - 1)
    assert loops == [False]
    assert _runs(ui) == 1


@pytest.mark.parametrize(("sent", "every"), [("on", True), ("1", True), ("true", True), ("0", False), ("false", False)])
def test_all_means_what_it_says(ui: Any, monkeypatch: pytest.MonkeyPatch, sent: str, every: bool) -> None:
    """The form's "all" was any non-empty value: a scripted all=0 or all=false re-exported everything, where
    POST /v1/exports?all=false exports what is new since the last acknowledged run."""
    import vigil.export.run as run_module

    seen: list[bool] = []
    real = run_module.export

    def export(*args: Any, **kwargs: Any) -> Any:
        seen.append(args[5])
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "export", export)
    r = ui.post("/ui/export", data={"csrf": ui.csrf, "format": "native", "all": sent})
    assert r.status_code == 200, r.text[:500]
    assert seen == [every]
