"""``vigil replay --to-kafka`` and ``vigil simulate --to-kafka`` against a broker they cannot reach: one
clear line and exit 2 within VIGIL_KAFKA_BOOTSTRAP_TIMEOUT_MS, as ``vigil consume`` does."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from tests.support.app import API_KEYS
from tests.support.cli import cli_runner
from tests.support.services import free_port
from tests.support.traffic import clean
from vigil.app.cli import app


@pytest.mark.parametrize("command", ["replay", "simulate"])
def test_an_unreachable_broker_is_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    recorded = tmp_path / "convs.jsonl"
    recorded.write_bytes(b"".join(orjson.dumps(c) + b"\n" for c in clean(2, "v1", 1)))
    env = {
        "VIGIL_API_KEYS": API_KEYS,
        "VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}",
        "VIGIL_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "VIGIL_KAFKA_BOOTSTRAP_TIMEOUT_MS": "1000",
    }
    args = [command, str(recorded)] if command == "replay" else [command, "--count", "2"]
    started = time.monotonic()
    result = cli_runner().invoke(app, [*args, "--to-kafka"], env=env)
    took = time.monotonic() - started
    assert result.exit_code == 2 and "cannot reach Kafka at 127.0.0.1:" in result.output, result.output[-500:]
    assert "Traceback" not in result.output
    assert took < 15  # the producer's own default waited 30 s before its traceback
