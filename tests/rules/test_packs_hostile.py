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


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    """YAML keeps the last of two equal keys without a word: a rule that said `args:` twice lost its first
    `tools`, a judge that said `sampling:` twice lost its rate, a policy its first weights. Each file is
    refused instead, naming the key and both lines."""
    from vigil.judge.definitions import load_judge
    from vigil.judge.errors import JudgeDefinitionError
    from vigil.review.policy import FlaggingPolicy

    pack = tmp_path / "shop.yaml"
    pack.write_text(
        "pack: shop\nrules:\n  - id: guard\n    type: forbidden_tool\n    args: {tools: [refund]}\n"
        "    severity: high\n    args: {tools: [cancel]}\n"
    )
    with pytest.raises(
        ConfigError, match=r"(?s)shop\.yaml: cannot read rule pack: .*duplicate key 'args' \(first at line 5\)"
    ):
        load_pack(pack)
    policy = tmp_path / "policy.yaml"
    policy.write_text("findings:\n  rules: {guard: 100}\nfindings:\n  severity: {high: 60}\n")
    with pytest.raises(
        ConfigError, match=r"(?s)policy\.yaml: not valid YAML: .*duplicate key 'findings' \(first at line 1\)"
    ):
        FlaggingPolicy.load(policy)
    judge = tmp_path / "my-judge"
    judge.mkdir()
    (judge / "judge.yaml").write_text(
        "version: '1'\nmodel: openai/gpt-4o-mini\nsampling: {rate: 0.5}\ncategories: [other]\nsampling: {salt: x}\n"
    )
    (judge / "prompt.md").write_text("Grade {{transcript}}\n")
    with pytest.raises(JudgeDefinitionError, match=r"(?s)judge\.yaml: not valid YAML: .*duplicate key 'sampling'"):
        load_judge(judge, {}, 1.0)


def test_anchors_and_merge_keys_still_load(tmp_path: Path) -> None:
    """A merge key may override what it merges: that is YAML, not a key given twice."""
    p = tmp_path / "ok.yaml"
    p.write_text(
        "pack: ok\nrules:\n  - &base {id: a, type: forbidden_tool, severity: low, args: {tools: [x]}}\n"
        "  - <<: *base\n    id: b\n    severity: high\n"
    )
    _spec, rules = load_pack(p)
    assert [(r.id, r.spec.severity) for r in rules] == [("a", "low"), ("b", "high")]


def test_a_pack_larger_than_a_configuration_file_is_refused_before_parsing(tmp_path: Path) -> None:
    """A 50 MB pack (a glob that caught a data file, a generated pack gone wrong) took minutes of CPU and
    gigabytes of memory before start-up went on; any operator file over 1 MiB is refused naming its size."""
    from vigil import config_files
    from vigil.judge.definitions import load_judge
    from vigil.judge.errors import JudgeDefinitionError
    from vigil.review.policy import FlaggingPolicy

    padding = "#" * (config_files.MAX_BYTES + 1) + "\n"
    pack = tmp_path / "huge.yaml"
    pack.write_text("pack: huge\nrules:\n  - {id: a, type: forbidden_tool, args: {tools: [x]}}\n" + padding)
    with pytest.raises(
        ConfigError, match=r"huge\.yaml: cannot read rule pack: 1,048,65\d bytes, more than the 1,048,576"
    ):
        load_pack(pack)
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\n" + padding)
    with pytest.raises(ConfigError, match=r"policy\.yaml: not valid YAML: 1,048,5\d\d bytes, more than"):
        FlaggingPolicy.load(policy)
    judge = tmp_path / "my-judge"
    judge.mkdir()
    (judge / "judge.yaml").write_text("version: '1'\nmodel: openai/gpt-4o-mini\n" + padding)
    (judge / "prompt.md").write_text("Grade {{transcript}}\n")
    with pytest.raises(JudgeDefinitionError, match=r"judge\.yaml: 1,048,6\d\d bytes, more than the 1,048,576"):
        load_judge(judge, {}, 1.0)


def test_a_rule_or_judge_scoped_to_no_agent_is_refused(tmp_path: Path) -> None:
    """`applies_to: {agents: []}` loaded, and the rule (or judge) never ran on any conversation: an empty
    list of agents or versions is an error naming the rule and the field."""
    from vigil.judge.definitions import load_judge
    from vigil.judge.errors import JudgeDefinitionError

    for field in ("agents", "versions"):
        pack = tmp_path / f"{field}.yaml"
        pack.write_text(
            f"pack: shop\nrules:\n  - id: guard\n    type: forbidden_tool\n    applies_to: {{{field}: []}}\n"
            "    args: {tools: [refund]}\n"
        )
        with pytest.raises(ConfigError, match=rf"{field}\.yaml: rule 'guard': applies_to\.{field}: List should have"):
            load_pack(pack)
    judge = tmp_path / "my-judge"
    judge.mkdir()
    (judge / "judge.yaml").write_text(
        "version: '1'\nmodel: openai/gpt-4o-mini\ncategories: [other]\napplies_to: {agents: []}\n"
    )
    (judge / "prompt.md").write_text("Grade {{transcript}}\n")
    with pytest.raises(JudgeDefinitionError, match=r"judge\.yaml: applies_to\.agents: List should have"):
        load_judge(judge, {}, 1.0)


def test_rules_check_validates_packs_before_they_are_deployed(tmp_path: Path) -> None:
    """`vigil rules check` loads packs as start-up does, without a database: each good pack is listed with
    its rules and agents; a bad one is one error line naming the file, the rule and the field (exit 2)."""
    good = tmp_path / "shop.yaml"
    good.write_text(
        "pack: shop\nversion: 2\nrules:\n  - id: guard\n    type: forbidden_tool\n"
        "    applies_to: {agents: [shop-bot]}\n    args: {tools: [refund]}\n"
        "  - id: spare\n    type: budget\n    enabled: false\n    args: {max_turns: 3}\n"
    )
    bad = tmp_path / "typo.yaml"
    bad.write_text("pack: typo\nrules:\n  - id: guard2\n    type: forbiden_tool\n    args: {tools: [x]}\n")
    env = {"VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'absent' / 'v.db'}", "VIGIL_RULE_PACKS": str(good)}
    ok = cli_runner().invoke(app, ["rules", "check"], env=env)
    assert ok.exit_code == 0, ok.output
    assert f"ok: {good}: pack shop v2, 1 of 2 rules enabled, agents *, shop-bot" in ok.output
    result = cli_runner().invoke(app, ["rules", "check", str(good), str(bad)], env=env)
    assert result.exit_code == 2, result.output
    assert f"{bad}: rule 'guard2': type: unknown rule type 'forbiden_tool'" in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert not (tmp_path / "absent").exists()


def test_rules_check_reads_each_pack_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`vigil rules check` read and validated every pack twice (once to build the engine, once to list it):
    each pack's regexes compiled twice, a large pack's YAML parsed twice. Each is read once."""
    from vigil import config_files

    reads: list[Path] = []
    load = config_files.load

    def counted(path: Path) -> object:
        reads.append(Path(path))
        return load(path)

    monkeypatch.setattr(config_files, "load", counted)
    packs = []
    for name in ("shop", "desk"):
        pack = tmp_path / f"{name}.yaml"
        pack.write_text(
            f"pack: {name}\nrules:\n  - id: {name}-guard\n    type: forbidden_tool\n    args: {{tools: [x]}}\n"
        )
        packs.append(pack)
    env = {"VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'absent' / 'v.db'}"}
    result = cli_runner().invoke(app, ["rules", "check", *map(str, packs)], env=env)
    assert result.exit_code == 0, result.output
    assert [line.split(":")[0] for line in result.output.splitlines()] == ["ok", "ok"]
    assert sorted(reads) == sorted(packs), reads


@pytest.mark.parametrize("pattern", ["(?i)full refund|", "(refund)?", "a*", "$", ""])
def test_a_pattern_that_matches_every_text_is_refused(tmp_path: Path, pattern: str) -> None:
    """A trailing '|' (or a wholly optional pattern) matches the empty string anywhere: `regex` with
    `(?i)full refund|` flagged 100 of 100 τ² conversations at high severity, queueing and judging them all.
    Refused at load naming the rule and field; a pattern for a blank text (`^\\s*$`) still loads."""
    pack = tmp_path / "p.yaml"
    pack.write_text(f"pack: p\nrules:\n  - id: talk\n    type: regex\n    args: {{pattern: {json.dumps(pattern)}}}\n")
    with pytest.raises(ConfigError, match=r"rule 'talk': args\.pattern: .*matches the empty string in any text"):
        load_pack(pack)
    pack.write_text("pack: p\nrules:\n  - id: blank\n    type: regex\n    args: {pattern: '^\\s*$'}\n")
    assert [r.id for r in load_pack(pack)[1]] == ["blank"]


def test_a_judge_yaml_too_large_or_not_utf8_names_the_file(tmp_path: Path) -> None:
    from vigil import config_files
    from vigil.judge.definitions import load_judge
    from vigil.judge.errors import JudgeDefinitionError

    judge = tmp_path / "my-judge"
    judge.mkdir()
    (judge / "prompt.md").write_text("Grade {{transcript}}\n")
    (judge / "judge.yaml").write_bytes(b"model: x\n# " + b"a" * config_files.MAX_BYTES + b"\n")
    with pytest.raises(JudgeDefinitionError, match=r"judge\.yaml: [\d,]+ bytes, more than the 1,048,576"):
        load_judge(judge, {}, 1.0)
    (judge / "judge.yaml").write_bytes(b"model: caf\xe9\n")
    with pytest.raises(JudgeDefinitionError, match=r"judge\.yaml: not UTF-8 text \(byte 0xe9 at offset 10\)"):
        load_judge(judge, {}, 1.0)
