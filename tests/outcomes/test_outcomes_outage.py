"""POST /v1/outcomes when the database is in trouble: a deadlock with another writer of the same keys is
tried again, not answered 503; a database that is away answers 503 and counts it where the
IngestStoreFailing alert looks, as POST /v1/conversations does."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import INGEST, make_client, make_settings
from tests.support.services import PG_ADMIN_URL
from tests.support.waiting import wait_for
from vigil.app.runtime import build_runtime

pytestmark = pytest.mark.postgres


def _admin_db(pg_url: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + pg_url.rsplit("/", 1)[1]


def _item(key: str) -> dict[str, Any]:
    return {"conversation_id": "c-dl", "type": "escalation", "value": 1.0, "idempotency_key": key}


def _insert(conn: psycopg.Connection, key: str) -> None:
    now = datetime.now(UTC)
    conn.execute(
        "INSERT INTO outcomes (idempotency_key, conversation_id, type, value, occurred_at, received_at, source)"
        " VALUES (%s, 'c-dl', 'escalation', 1.0, %s, %s, 'other')",
        (key, now, now),
    )


def _store_errors(rt: Any) -> float:
    return rt.metrics.registry.get_sample_value("vigil_ingest_errors_total", {"stage": "store"}) or 0.0


def test_a_deadlock_with_another_writer_is_tried_again(pg_url: str) -> None:
    rt = build_runtime(make_settings(pg_url), registry=CollectorRegistry())
    name = pg_url.rsplit("/", 1)[1]
    with make_client(rt) as c, psycopg.connect(_admin_db(pg_url)) as other:
        # the other writer waits long before it looks for deadlocks, so the request is the one Postgres picks
        other.execute("SET deadlock_timeout = '60s'")
        _insert(other, "k-b")  # held, uncommitted: the request's k-a goes in, then it waits on k-b
        answer: dict[str, Any] = {}
        post = threading.Thread(
            target=lambda: answer.update(r=c.post("/v1/outcomes", json=[_item("k-a"), _item("k-b")], headers=INGEST))
        )
        post.start()

        def request_waits() -> bool:
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                row = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'", (name,)
                ).fetchone()
            return bool(row and row[0])

        wait_for(request_waits, what="the request waiting on the other writer's k-b")
        _insert(other, "k-a")  # waits on the request's k-a: a deadlock, which the request loses
        other.commit()
        post.join(60)
        r = answer["r"]
        assert r.status_code == 202, r.text
        assert r.json()["duplicates"] == 2  # both stored by the other writer meanwhile, each once
    assert rt.metrics.registry.get_sample_value("vigil_store_retries_total", {"kind": "deadlock"}) == 1
    rt.close()


def test_an_unavailable_database_is_counted_as_a_failed_store(pg_url: str) -> None:
    rt = build_runtime(make_settings(pg_url), registry=CollectorRegistry())
    name = pg_url.rsplit("/", 1)[1]
    with make_client(rt) as c, psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        assert c.post("/v1/outcomes", json=[_item("k-1")], headers=INGEST).status_code == 202
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        try:
            r = c.post("/v1/outcomes", json=[_item("k-2")], headers=INGEST)
            assert r.status_code == 503 and r.headers["Retry-After"], r.text
            assert _store_errors(rt) == 1
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        assert c.post("/v1/outcomes", json=[_item("k-2")], headers=INGEST).status_code == 202
    rt.close()
