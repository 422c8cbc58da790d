"""Rule packs that are not text: a clean error naming the file (exit 2), never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import cli_runner
from tests.support.services import free_port
from vigil.app.cli import app
from vigil.errors import ConfigError
from vigil.rules import RuleEngine, load_pack


def binary_pack(tmp_path: Path) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_bytes(b"pack: p\n\xff\xfe\n")
    return p


def test_pack_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    """A pack holding bytes that are not UTF-8 is a ConfigError 'FILE: cannot read rule pack: ...' with
    the offending byte, like every other unreadable pack (it raised UnicodeDecodeError)."""
    p = binary_pack(tmp_path)
    for load in (lambda: load_pack(p), lambda: RuleEngine.from_paths([p])):
        with pytest.raises(ConfigError) as err:
            load()
        msg = str(err.value)
        assert msg.startswith(f"{p}: cannot read rule pack: not UTF-8"), msg
        assert "0xff" in msg


def test_utf8_pack_with_non_ascii_text_still_loads(tmp_path: Path) -> None:
    """Packs are read as UTF-8 whatever the locale: non-ASCII descriptions load."""
    p = tmp_path / "ok.yaml"
    p.write_bytes(
        "pack: ok\nversion: 1\nrules:\n  - id: r\n    type: regex\n    description: ünïcødé — ok\n"
        "    args: {pattern: 'x'}\n".encode()
    )
    _spec, rules = load_pack(p)
    assert [r.spec.description for r in rules] == ["ünïcødé — ok"]


def test_rules_evaluate_with_a_binary_pack_exits_2_naming_it(tmp_path: Path) -> None:
    """`vigil rules evaluate --packs BAD` prints one error line naming the file and exits 2."""
    p = binary_pack(tmp_path)
    data = tmp_path / "one.jsonl"
    conv = {
        "conversation_id": "c",
        "agent_id": "a",
        "agent_version": "v",
        "messages": [{"role": "user", "content": "x"}],
    }
    data.write_text(json.dumps(conv) + "\n")
    env = {"VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}", "VIGIL_METRICS_PORT": "0"}
    result = cli_runner().invoke(app, ["rules", "evaluate", "--packs", str(p), str(data)], env=env)
    assert result.exit_code == 2, result.output
    assert f"{p}: cannot read rule pack: not UTF-8" in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)


def test_serve_with_a_binary_pack_exits_2_naming_it(tmp_path: Path) -> None:
    """`vigil serve` with such a pack in VIGIL_RULE_PACKS stops before listening, with the same line."""
    p = binary_pack(tmp_path)
    env = {
        "VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}",
        "VIGIL_METRICS_PORT": "0",
        "VIGIL_RULE_PACKS": str(p),
    }
    result = cli_runner().invoke(app, ["serve", "--no-workers", "--port", str(free_port())], env=env)
    assert result.exit_code == 2, result.output
    assert f"{p}: cannot read rule pack: not UTF-8" in result.output
