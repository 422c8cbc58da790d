"""``vigil consume`` against a broker it cannot reach: one clear line and exit 2, within the bootstrap timeout."""

from __future__ import annotations

import time

from tests.support.app import API_KEYS
from tests.support.cli import cli_runner
from tests.support.services import free_port
from vigil.app.cli import app


def test_consume_with_a_dead_letter_topic_and_no_reachable_broker_says_so_in_time(tmp_path) -> None:
    env = {
        "VIGIL_API_KEYS": API_KEYS,
        "VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}",
        "VIGIL_METRICS_PORT": "0",
        "VIGIL_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "VIGIL_KAFKA_BOOTSTRAP_TIMEOUT_MS": "1000",
        "VIGIL_KAFKA_DEAD_LETTER_TOPIC": "dead-letters",  # its producer reaches for the broker too
    }
    started = time.monotonic()
    result = cli_runner().invoke(app, ["consume"], env=env)
    took = time.monotonic() - started
    assert result.exit_code == 2 and "cannot reach Kafka at 127.0.0.1:" in result.output, result.output[-500:]
    assert "Traceback" not in result.output
    assert took < 15  # the producer's own default would wait 30 s before failing
