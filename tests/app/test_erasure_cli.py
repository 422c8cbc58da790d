"""``vigil conversations erase``: by id or by a metadata value, listing and asking first unless --yes; exit 1 when an
id is not stored (or nothing has the value), 2 on a usage error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from tests.http.test_erasure import conversation
from tests.support.app import INGEST, make_client, make_settings
from tests.support.cli import cli_runner
from vigil.app.cli import app
from vigil.app.runtime import build_runtime
from vigil.store.erasure import ErasureRow
from vigil.store.models import ConversationRow


def test_cli_erases_by_id_and_by_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'v.db'}"
    rt = build_runtime(make_settings(url), registry=CollectorRegistry())
    with make_client(rt) as c:
        sent = [conversation(f"c-{i}", metadata={"user_id": "U1" if i < 3 else "U2"}) for i in range(5)]
        assert c.post("/v1/conversations", json=sent, headers=INGEST).status_code == 202
    monkeypatch.setenv("VIGIL_DATABASE_URL", url)
    runner = cli_runner()
    listed = runner.invoke(app, ["conversations", "erase", "--where-metadata", "user_id=U1", "--json"])
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout)["conversation_ids"] == ["c-0", "c-1", "c-2"]
    declined = runner.invoke(app, ["conversations", "erase", "--where-metadata", "user_id=U1"], input="n\n")
    assert declined.exit_code == 1 and "c-0\nc-1\nc-2\n" in declined.stdout
    r = runner.invoke(app, ["conversations", "erase", "--where-metadata", "user_id=U1", "--yes", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["erased"] == 3, r.output
    r = runner.invoke(app, ["conversations", "erase", "c-3", "nope", "--yes"])
    assert r.exit_code == 1 and "c-3\terased" in r.stdout and "nope\tnot_found" in r.stdout, r.output
    r = runner.invoke(app, ["conversations", "erase", "c-4"], input="y\n")
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, ["conversations", "erase"]).exit_code == 2
    assert runner.invoke(app, ["conversations", "erase", "--where-metadata", "nokey"]).exit_code == 2
    assert runner.invoke(app, ["conversations", "erase", "--where-metadata", "user_id=U9"]).exit_code == 1
    with rt.sessions() as s:
        assert s.scalar(select(func.count()).select_from(ConversationRow)) == 0
        assert s.scalar(select(func.count()).select_from(ErasureRow)) == 5
    rt.close()
