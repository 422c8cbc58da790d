"""The CLI answers bad input and unreachable services with one clear line, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.app import API_KEYS
from tests.support.cli import cli_runner
from tests.support.services import free_port
from vigil.app.cli import app

runner = cli_runner()


def run(args: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return runner.invoke(app, args, env={"VIGIL_API_KEYS": API_KEYS, **(env or {})})


def test_simulate_to_url_needs_a_key() -> None:
    result = run(["simulate", "--count", "3", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "--url needs an ingest key" in result.output
    assert "Traceback" not in result.output


def test_simulate_to_an_unreachable_url_says_so() -> None:
    result = run(["simulate", "--count", "3", "--url", f"http://127.0.0.1:{free_port()}", "--api-key", "k"])
    assert result.exit_code == 2 and "sending simulated traffic failed" in result.output


def test_replay_with_the_wrong_format_names_the_file(tmp_path) -> None:
    f = tmp_path / "x.jsonl"
    f.write_text(json.dumps({"a": 1}) + "\n")
    result = run(["replay", "--format", "tau2", str(f)])
    assert result.exit_code == 2 and "not a τ²-bench results file" in result.output
    result = run(["replay", "--format", "nope", str(f)])
    assert result.exit_code == 2 and "--format must be" in result.output


@pytest.mark.slow
def test_consume_without_a_reachable_broker(tmp_path) -> None:
    db = f"sqlite:///{tmp_path / 'v.db'}"
    result = run(["consume"], {"VIGIL_DATABASE_URL": db, "VIGIL_METRICS_PORT": "0"})
    assert result.exit_code == 2 and "VIGIL_KAFKA_BOOTSTRAP_SERVERS is not set" in result.output
    env = {
        "VIGIL_DATABASE_URL": db,
        "VIGIL_METRICS_PORT": "0",
        "VIGIL_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
        "VIGIL_KAFKA_BOOTSTRAP_TIMEOUT_MS": "1000",  # kafka-python's default 30 s is the operator's to shorten
    }
    result = run(["consume"], env)
    assert result.exit_code == 2 and "cannot reach Kafka" in result.output


def test_settings_markdown_has_every_default() -> None:
    result = run(["settings", "--markdown"])
    assert result.exit_code == 0 and "PydanticUndefined" not in result.output
    assert "`VIGIL_DATABASE_URL`" in result.output


def test_version_names_vigil_and_the_package_version() -> None:
    from importlib.metadata import version

    import vigil

    result = run(["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"vigil {vigil.__version__}"
    assert vigil.__version__ == version("vigil")  # the string printed is the installed package's version


def test_db_downgrade_takes_the_schema_back_and_refuses_an_unknown_revision(tmp_path) -> None:
    from sqlalchemy import create_engine, text

    url = f"sqlite:///{tmp_path / 'v.db'}"
    env = {"VIGIL_DATABASE_URL": url}
    assert run(["db", "upgrade"], env).exit_code == 0
    result = run(["db", "downgrade", "0012_drop_search_trgm"], env)
    assert result.exit_code == 0 and "database at 0012_drop_search_trgm" in result.output
    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0012_drop_search_trgm"
    engine.dispose()
    result = run(["db", "downgrade", "no-such-revision"], env)
    assert result.exit_code == 2 and "cannot downgrade to 'no-such-revision'" in result.output
    assert "Traceback" not in result.output


# a script that runs `vigil ARGS...` in this interpreter, prints its exit code, then reports on the modules
RUN_VIGIL = (
    "import sys, runpy\n"
    "sys.argv = ['vigil', *sys.argv[1:]]\n"
    "try:\n"
    "    runpy.run_module('vigil', run_name='__main__')\n"
    "except SystemExit as e:\n"
    "    print('EXIT', e.code or 0)\n"
)


def test_the_command_line_starts_without_the_statistics_libraries(tmp_path) -> None:
    """scipy, statsmodels and pandas take about 1.3 s to import, and every `vigil` command paid it at start
    (`vigil --version` took 3.8 s): they are imported where intervals are computed, not with the CLI or the
    stages' wiring. A listing that computes none (the review queue) starts without them."""
    import os
    import subprocess
    import sys

    from tests.support.waiting import scaled

    heavy = ("scipy", "statsmodels", "pandas")
    probe = RUN_VIGIL + f"print('LOADED', sorted(m for m in {heavy!r} if m in sys.modules))\n"
    env = {**os.environ, "VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}"}
    for args in (["--version"], ["review", "queue"]):
        run = subprocess.run(
            [sys.executable, "-c", probe, *args], env=env, capture_output=True, text=True, timeout=scaled(120)
        )
        # the command ran (a start that failed early would load nothing either)
        assert "EXIT 0" in run.stdout and "LOADED []" in run.stdout, (args, run.stdout[-500:], run.stderr[-2000:])


def test_commands_that_build_offline_judges_start_without_litellm(tmp_path) -> None:
    """Telling an offline judge from a live one imported litellm (2.7 s): `vigil status` and `judge list`
    took 5.7 s. With no key of a known provider set, the judges are offline without it; with a key set,
    litellm is loaded, because the live judge needs it."""
    import os
    import subprocess
    import sys

    from tests.support.waiting import scaled
    from vigil.judge.client import PROVIDER_KEYS

    probe = RUN_VIGIL + "print('LITELLM', 'litellm' in sys.modules)\n"
    keys = {k for names in PROVIDER_KEYS.values() for k in names}
    base = {k: v for k, v in os.environ.items() if k not in keys}
    base |= {
        "VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}",
        "VIGIL_JUDGES_DIR": str(Path(__file__).parents[2] / "judges"),
    }
    for env, mode, loaded in ((base, "offline", False), ({**base, "OPENAI_API_KEY": "sk-test"}, "live", True)):
        run = subprocess.run(
            [sys.executable, "-c", probe, "judge", "list", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(120),
        )
        assert "EXIT 0" in run.stdout and f"LITELLM {loaded}" in run.stdout, (
            mode,
            run.stdout[-500:],
            run.stderr[-2000:],
        )
        assert f'"mode": "{mode}"' in run.stdout, (mode, run.stdout[-1500:])


def test_a_long_running_process_imports_the_statistics_libraries_before_its_heap_settles() -> None:
    """Imported after start-up, they would be scanned by every full collection of a server's life, and its
    first compare page would wait for them; a one-shot command does not import them at all."""
    import subprocess
    import sys

    from tests.support.waiting import scaled

    probe = (
        "import sys\n"
        "from vigil.app.runtime import STATISTICS, settle_heap\n"
        "settle_heap(long_running=sys.argv[1] == 'long')\n"
        "print('LOADED', [n for n in STATISTICS if n in sys.modules])\n"
    )
    for how, expected in (("long", "['scipy.stats', 'statsmodels.stats.proportion']"), ("once", "[]")):
        run = subprocess.run([sys.executable, "-c", probe, how], capture_output=True, text=True, timeout=scaled(120))
        assert f"LOADED {expected}" in run.stdout, (how, run.stdout, run.stderr[-2000:])


@pytest.mark.parametrize("command", [["db", "upgrade"], ["retention", "run", "--dry-run"], ["status"], ["alerts"]])
def test_a_bad_setting_is_one_line_naming_its_variable_and_value(tmp_path, command: list[str]) -> None:
    """`vigil db upgrade` and `retention run` printed a 55-line traceback for a bad VIGIL_* value; the
    others printed pydantic's report, which names the field (`judge_mode`), not the variable set."""
    env = {"VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}", "VIGIL_JUDGE_MODE": "bogus", "VIGIL_PORT": "x"}
    result = run(command, env)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "errors.pydantic.dev" not in result.output
    assert "VIGIL_JUDGE_MODE='bogus': Input should be 'auto', 'live' or 'offline'" in result.output, result.output
    assert "VIGIL_PORT='x'" in result.output


@pytest.mark.parametrize("url", ["postgresql://vigil:s3cr3t@db:notaport/vigil", "s3cr3t is no url"])
def test_a_malformed_database_url_is_named_without_its_password(url: str) -> None:
    """A port that is not a number raised from SQLAlchemy's URL parser deep in start-up: a traceback."""
    result = run(["status"], {"VIGIL_DATABASE_URL": url})
    assert result.exit_code == 2 and "VIGIL_DATABASE_URL: Value error, not a database URL" in result.output
    assert "s3cr3t" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("option", "value"), [("--count", "-5"), ("--rate", "-1"), ("--batch", "0")], ids=["count", "rate", "batch"]
)
def test_simulate_refuses_negative_counts_rates_and_empty_batches(tmp_path, option: str, value: str) -> None:
    """`--count -5` printed "simulated 0 conversations" and exited 0; a batch of 0 or -3 and a negative
    rate ran as if unset."""
    result = run(["simulate", option, value, "--out", str(tmp_path / "sim.jsonl")])
    assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output, result.output
    assert not (tmp_path / "sim.jsonl").exists()


def test_simulate_runs_have_their_own_conversation_ids_unless_a_seed_repeats_one(tmp_path) -> None:
    """Every run used seed 0, as `vigil serve --demo` does: `vigil simulate --url` against the demo sent the
    demo's own conversation ids again, and their outcomes were refused as idempotency conflicts."""
    import orjson

    def ids(*args: str) -> list[str]:
        out = tmp_path / f"sim-{len(list(tmp_path.iterdir()))}.jsonl"
        result = run(["simulate", "--count", "5", "--no-outcomes", "--out", str(out), *args])
        assert result.exit_code == 0, result.output
        return [orjson.loads(line)["conversation_id"] for line in out.read_bytes().splitlines()]

    first, second = ids(), ids()
    assert len(set(first)) == 5 and not set(first) & set(second)
    assert ids("--seed", "7") == ids("--seed", "7")


def test_a_restarted_demo_sends_new_conversations(tmp_path) -> None:
    """The demo always used seed 0: restarted on the same database it sent only conversations it had stored
    before (a 40,000-conversation demo database showed nothing new for 40 minutes)."""
    from prometheus_client import CollectorRegistry
    from sqlalchemy import func, select

    from tests.support.app import make_settings
    from vigil.app.runtime import build_runtime
    from vigil.app.server import DemoTraffic
    from vigil.store.models import ConversationRow

    rt = build_runtime(make_settings(f"sqlite:///{tmp_path / 'v.db'}"), registry=CollectorRegistry())
    try:
        for _ in range(2):  # two starts of `vigil serve --demo` on one database
            DemoTraffic(rt, 10.0, "v1:0.1", batch=10)._feed()
        with rt.sessions() as s:
            assert s.scalar(select(func.count()).select_from(ConversationRow)) == 20
    finally:
        rt.close()


def test_a_worker_whose_metrics_port_is_taken_says_which_setting_to_change(tmp_path) -> None:
    """Two workers on one host (the docs' `vigil consume &`, once per partition) both took port 9108: the second
    died with a traceback ending in "Address already in use", naming neither the port nor the setting."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {
            "VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}",
            "VIGIL_METRICS_HOST": "127.0.0.1",
            "VIGIL_METRICS_PORT": str(port),
        }
        result = run(["judge-worker"], env)
    assert result.exit_code == 2, result.output
    assert f"127.0.0.1:{port}" in result.output and "VIGIL_METRICS_PORT" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("args", [["conversations", "list"], ["alerts", "--json"], ["--version"]])
def test_output_whose_reader_went_first_ends_quietly_as_sigpipe_would(tmp_path, args: list[str]) -> None:
    """`vigil conversations list | head -1`: the reader gone, Click ended the command with status 1, as if it
    had failed. Now it ends as `cat` or `grep` do, with a shell's status for SIGPIPE (141) and no noise."""
    import os
    import subprocess
    import sys

    from tests.support.waiting import scaled

    env = {**os.environ, "VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}"}
    reader = subprocess.Popen([sys.executable, "-c", "import os; os.close(0)"], stdin=subprocess.PIPE)
    assert reader.wait(timeout=scaled(60)) == 0  # gone before the command writes a byte: its writes all fail
    assert reader.stdin is not None
    try:
        run = subprocess.run(
            [sys.executable, "-m", "vigil", *args],
            stdout=reader.stdin,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            timeout=scaled(120),
        )
    finally:
        reader.stdin.close()
    assert run.returncode == 141, (run.returncode, run.stderr[-2000:])
    assert not any(noise in run.stderr for noise in ("Traceback", "BrokenPipe", "Broken pipe", "Exception ignored"))
