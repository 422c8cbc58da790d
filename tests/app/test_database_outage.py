"""The database goes away under a running Vigil: reads answer 503 with Retry-After (a page under /ui),
not a 500 with a traceback each, and the same process serves again once the database is back."""

from __future__ import annotations

import logging
import re

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import INGEST, REVIEWER, make_client, make_settings
from tests.support.services import PG_ADMIN_URL
from tests.support.traffic import clean
from vigil.app.runtime import build_runtime

pytestmark = pytest.mark.postgres


def _connections(name: str, allowed: bool) -> None:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"true" if allowed else "false"}')
        if not allowed:  # and end the ones open, as a restart does
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )


def test_reads_answer_503_while_the_database_is_away_and_recover(pg_url: str, caplog) -> None:  # type: ignore[no-untyped-def]
    name = pg_url.rsplit("/", 1)[1]
    rt = build_runtime(make_settings(pg_url, store_retry_after_seconds=7), registry=CollectorRegistry())
    with make_client(rt, {"api"}) as c:
        convs = clean(3, "v1", 1)
        assert c.post("/v1/conversations", json=convs, headers=INGEST).status_code == 202
        login = c.get("/ui/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', login.text).group(1)  # type: ignore[union-attr]
        key = REVIEWER["Authorization"].split()[1]
        assert c.post("/ui/login", data={"csrf": csrf, "api_key": key, "next": "/ui"}).status_code == 200
        _connections(name, allowed=False)
        try:
            with caplog.at_level(logging.WARNING):
                r = c.get("/v1/conversations", headers=REVIEWER)
                assert r.status_code == 503, r.text
                assert r.headers["Retry-After"] == "7" and "database is unavailable" in r.json()["detail"]
                page = c.get("/ui/queue")
                assert page.status_code == 503 and "text/html" in page.headers["content-type"]
                assert "database is not answering" in page.text and page.headers["Retry-After"] == "7"
                assert c.get("/healthz").status_code == 200  # alive, not ready
                ready = c.get("/readyz")
                assert ready.status_code == 503
                # anyone may ask /readyz: it says the database is away, not where the database is
                assert ready.json() == {"status": "unavailable", "database": "unreachable", "error": "OperationalError"}
                assert "127.0.0.1" not in ready.text and "5432" not in ready.text and name not in ready.text
                assert any(
                    "readiness" in r.getMessage() and "OperationalError" in r.getMessage() for r in caplog.records
                )
            assert not [r for r in caplog.records if r.exc_info], "a traceback per request floods the log"
        finally:
            _connections(name, allowed=True)
        r = c.get("/v1/conversations", headers=REVIEWER)
        assert r.status_code == 200 and r.json()["total"] == 3  # the same process, no restart
    rt.close()
