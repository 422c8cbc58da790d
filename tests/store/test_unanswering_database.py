"""A Postgres that stops answering fails a connection in bounded time instead of holding it for ever."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from vigil.store import db


@pytest.fixture
def unanswering() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel completes them) and never says a word: a server
    hung, or a host behind a proxy whose other side is gone."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    try:
        yield srv.getsockname()[1]
    finally:
        srv.close()


def test_a_connection_to_a_database_that_never_answers_fails_after_the_connect_timeout(
    unanswering: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(db.PG_CONNECT_DEFAULTS, "connect_timeout", 2)
    engine = db.make_engine(f"postgresql://vigil@127.0.0.1:{unanswering}/vigil")
    raised: list[BaseException] = []

    def connect() -> None:
        try:
            engine.connect().close()
        except BaseException as exc:  # noqa: BLE001  (the test reports it)
            raised.append(exc)

    attempt = threading.Thread(target=connect, daemon=True)  # without a timeout it never returns
    attempt.start()
    attempt.join(60)
    engine.dispose()
    assert not attempt.is_alive(), "the connection attempt still waits on a database that never answers"
    assert len(raised) == 1 and isinstance(raised[0], OperationalError), raised
    assert "timeout" in str(raised[0]).lower()


def _dsn(url: str) -> dict[str, str]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            dsn = conn.connection.driver_connection.info.dsn  # type: ignore[union-attr]
    finally:
        engine.dispose()
    return dict(part.split("=", 1) for part in dsn.split())


def test_connections_get_timeouts_and_keepalives_unless_the_url_sets_its_own(pg_url: str) -> None:
    dsn = _dsn(pg_url)
    assert {k: dsn.get(k) for k in db.PG_CONNECT_DEFAULTS} == {k: str(v) for k, v in db.PG_CONNECT_DEFAULTS.items()}
    with db.make_engine(pg_url).connect() as conn:  # and the connection works
        assert conn.execute(text("SELECT 1")).scalar_one() == 1
    mine = _dsn(f"{pg_url}?connect_timeout=7&keepalives_idle=45")
    assert (mine["connect_timeout"], mine["keepalives_idle"], mine["tcp_user_timeout"]) == ("7", "45", "120000")


def test_what_the_environment_or_a_connection_service_sets_is_left_to_libpq(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "4")
    assert db.pg_connect_args(pg_url) == {k: v for k, v in db.PG_CONNECT_DEFAULTS.items() if k != "connect_timeout"}
    assert _dsn(pg_url)["connect_timeout"] == "4"
    monkeypatch.delenv("PGCONNECT_TIMEOUT")
    services = tmp_path / "pg_service.conf"
    services.write_text("[vigil]\nconnect_timeout=3\nkeepalives_idle=99\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    url = f"{pg_url}?service=vigil"
    assert db.pg_connect_args(url) == {}
    dsn = _dsn(url)
    assert (dsn["connect_timeout"], dsn["keepalives_idle"]) == ("3", "99")
    assert "tcp_user_timeout" not in dsn
