"""The idle-trace finisher during a database outage: one traceback, then a line a round, and a line when
it works again, not a traceback every few seconds in every process."""

from __future__ import annotations

import logging

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import make_settings
from tests.support.services import PG_ADMIN_URL
from tests.support.waiting import wait_for
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.otlp.finisher import TraceFinisher

pytestmark = pytest.mark.postgres

FAILED = "finishing idle traced conversations failed"


def _connections(name: str, allowed: bool) -> None:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"true" if allowed else "false"}')
        if not allowed:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )


def test_an_outage_logs_one_traceback_then_a_line_a_round(pg_url: str, caplog) -> None:  # type: ignore[no-untyped-def]
    name = pg_url.rsplit("/", 1)[1]
    rt = wire(build_runtime(make_settings(pg_url), registry=CollectorRegistry()), {"consume"})
    finisher = rt.find(TraceFinisher)
    assert finisher is not None
    finisher.interval = 0.01
    _connections(name, allowed=False)
    caplog.set_level(logging.INFO, logger="vigil.ingest.otlp.finisher")
    finisher.start_thread()
    try:
        failed = lambda: [r for r in caplog.records if r.getMessage().startswith(FAILED)]  # noqa: E731
        wait_for(lambda: len(failed()) >= 3, what="three failed rounds")
    finally:
        _connections(name, allowed=True)
    wait_for(lambda: any("works again" in r.getMessage() for r in caplog.records), what="the recovery line")
    finisher.stop_thread()
    rounds = failed()
    assert [bool(r.exc_info) for r in rounds[:3]] == [True, False, False]
    assert "not currently accepting connections" in rounds[1].getMessage()
    rt.close()
