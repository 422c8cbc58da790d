"""Error lines of the CLI print what the input said, verbatim: text from a file or an argument is never
read as Rich markup (a stray "[/x]" crashed with MarkupError, "[bold red]..." styled the terminal, a
regex "[a-z0-9]" in a message vanished)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from tests.support.app import API_KEYS
from tests.support.cli import cli_runner
from vigil.app import cli
from vigil.app.cli import app
from vigil.errors import VigilError

runner = cli_runner()

HOSTILE = ["[/x]", "[bold red]PWNED[/bold red]", "^[a-z0-9][a-z0-9_.-]{0,63}$", "[link=http://e.x]y[/link]"]


def run(args: list[str], tmp_path: Path, **env: str):  # type: ignore[no-untyped-def]
    base = {
        "VIGIL_API_KEYS": API_KEYS,
        "VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}",
        "VIGIL_METRICS_PORT": "0",
    }
    return runner.invoke(app, args, env={**base, **env})


def plain(result) -> str:  # type: ignore[no-untyped-def]
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.output


@pytest.mark.parametrize("key", ["[/x]", "[bold red]PWNED[/bold red] ok"])
def test_import_error_quoting_the_input_prints_it_verbatim(tmp_path: Path, key: str) -> None:
    """`vigil import` of a file of unknown shape names its keys as they are, exit 2 (not a MarkupError)."""
    f = tmp_path / "x.json"
    f.write_text(json.dumps({key: 1}))
    result = run(["import", str(f), "--dry-run"], tmp_path)
    assert result.exit_code == 2, result.output
    assert key in plain(result) and "unknown shape" in result.output


def test_rule_pack_error_shows_the_whole_pattern(tmp_path: Path) -> None:
    """A bad pack name is reported with the pattern it must match, brackets included."""
    pack = tmp_path / "pack.yaml"
    pack.write_text('pack: "Bad Name"\nversion: 1\nrules:\n  - id: r\n    type: regex\n    args: {pattern: "x"}\n')
    data = tmp_path / "one.jsonl"
    conv = {
        "conversation_id": "c",
        "agent_id": "a",
        "agent_version": "v",
        "messages": [{"role": "user", "content": "x"}],
    }
    data.write_text(json.dumps(conv) + "\n")
    result = run(["rules", "evaluate", "--packs", str(pack), str(data)], tmp_path)
    assert result.exit_code == 2, result.output
    assert "'^[a-z0-9][a-z0-9_.-]{0,63}$'" in plain(result)


@pytest.mark.parametrize("text", HOSTILE)
def test_every_error_exit_prints_the_message_verbatim(
    text: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vigil.app.console.fail, Launcher.fail, the triage commands' _fail and cli.main's last resort all
    print the exception's text as text."""
    from vigil.app.console import fail
    from vigil.review.triage_commands import _fail

    for exit_with in (fail, cli.launcher().fail, _fail):
        with pytest.raises(typer.Exit):
            exit_with(VigilError(f"bad {text} here"))
        assert f"error: bad {text} here" in capsys.readouterr().err

    def boom() -> None:
        raise VigilError(f"bad {text} here")

    monkeypatch.setattr(cli, "app", boom)
    with pytest.raises(SystemExit) as code:
        cli.main()
    assert code.value.code == 2 and f"error: bad {text} here" in capsys.readouterr().err


def test_review_policy_error_prints_the_path_verbatim(tmp_path: Path) -> None:
    """`vigil review policy PATH` names a path holding markup-like text as it is."""
    path = tmp_path / "[red]p[" / "red].yaml"  # the path reads ".../[red]p[/red].yaml"
    result = run(["review", "policy", str(path)], tmp_path)
    assert result.exit_code == 2, result.output
    assert f"flagging policy {path}" in plain(result)


def test_judge_validate_error_prints_the_path_verbatim(tmp_path: Path) -> None:
    """`vigil judge validate` names a judge folder holding markup-like text as it is."""
    root = tmp_path / "[red]jd["
    (root / "red]x").mkdir(parents=True)  # ".../[red]jd[/red]x": not a valid judge name
    result = run(["judge", "validate"], tmp_path, VIGIL_JUDGES_DIR=str(root))
    assert result.exit_code == 2, result.output
    assert f"{root}/red]x" in plain(result)


def test_review_bulk_error_prints_the_action_verbatim(tmp_path: Path) -> None:
    """A triage command's error quoting its argument prints it as typed."""
    result = run(["review", "bulk", "[/x]", "c-1", "--as", "me"], tmp_path)
    assert result.exit_code == 2, result.output
    assert "'[/x]'" in plain(result)


def test_table_cells_are_printed_verbatim_on_a_terminal(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """Listing tables on a terminal (reviewer names, ids, agent versions come from data) show every cell as
    it is: markup in a cell neither styles the terminal nor crashes the listing."""
    import sys

    from vigil import tables

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    tables.print_table(["id", "agent"], [[HOSTILE[0], HOSTILE[1]], [HOSTILE[2], HOSTILE[3]]])
    out = capsys.readouterr().out
    for text in ("[/x]", "[bold red]PWNED[/bold red]", "[a-z0-9]", "[link=http://e.x]y[/link]"):
        assert text in out


def test_a_flagging_policy_or_judge_file_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    """Operator-edited files that are not UTF-8 text (a binary, a Latin-1 editor's save) are refused with the
    file and the offending byte, not a UnicodeDecodeError traceback."""
    from vigil.errors import ConfigError
    from vigil.judge.definitions import load_judge
    from vigil.judge.errors import JudgeDefinitionError
    from vigil.review.policy import FlaggingPolicy

    policy = tmp_path / "policy.yaml"
    policy.write_bytes(b"taxonomy:\n  - caf\xe9\n")
    with pytest.raises(ConfigError, match=r"policy\.yaml: not UTF-8 text \(byte 0xe9 at offset 17\)"):
        FlaggingPolicy.load(policy)
    judge = tmp_path / "my-judge"
    judge.mkdir()
    (judge / "judge.yaml").write_bytes(b"model: openai/gpt-4o-mini \xff\n")
    (judge / "prompt.md").write_text("Grade {{transcript}}\n")
    with pytest.raises(JudgeDefinitionError, match=r"judge\.yaml: not UTF-8 text \(byte 0xff"):
        load_judge(judge, {}, 1.0)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"VIGIL_PORT": "abc"}, "VIGIL_PORT='abc': Input should be a valid integer"),
        ({"VIGIL_LOG_LEVEL": "bogus"}, "must be one of DEBUG, INFO"),
        ({"VIGIL_DATABASE_URL": "foo://bar"}, "cannot open the database at foo://bar (VIGIL_DATABASE_URL)"),
        (
            {"VIGIL_DATABASE_URL": "postgresql://vigil:s3cret@127.0.0.1:1/x"},
            "cannot open the database at postgresql+psycopg://vigil:***@127.0.0.1:1/x",
        ),
    ],
    ids=["port", "log-level", "scheme", "unreachable"],
)
def test_serve_with_a_bad_setting_says_so_in_a_line(tmp_path: Path, env: dict[str, str], says: str) -> None:
    """A bad VIGIL_* value or a database that cannot be opened printed 55 to 540 lines of traceback."""
    result = run(["serve", "--no-workers"], tmp_path, **env)
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output and "s3cret" not in result.output
    assert len(result.output.splitlines()) <= 8, result.output


TERMINAL_ATTACK = "where is my order \x1b]0;pwned\x07\x1b[2J\x1b[31m red \u202eevil\u202c"


def test_a_user_message_cannot_drive_the_terminal_that_lists_it(tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """Conversations are written by an agent's users: a first message holding terminal escape sequences
    retitled (ESC ] 0 ; ... BEL) and cleared (ESC [ 2 J) the terminal of whoever ran `vigil review
    near-duplicates`; rich passes ESC through. Every cell prints them written out instead."""
    import sys

    from prometheus_client import CollectorRegistry

    from tests.support.app import make_settings
    from tests.support.review import store
    from vigil import tables
    from vigil.app.runtime import build_runtime
    from vigil.app.wiring import wire

    url = f"sqlite:///{tmp_path / 'v.db'}"
    rt = wire(build_runtime(make_settings(url), registry=CollectorRegistry()), {"api"})
    convs = [
        {
            "conversation_id": f"esc-{i}",
            "agent_id": "support-bot",
            "agent_version": "v1",
            "messages": [{"role": "user", "content": TERMINAL_ATTACK}, {"role": "assistant", "content": ""}],
        }
        for i in range(2)
    ]
    store(rt, convs)
    rt.close()
    piped = run(["review", "near-duplicates"], tmp_path, VIGIL_DATABASE_URL=url)
    assert piped.exit_code == 0, piped.output
    assert "where is my order" in piped.stdout
    for raw in ("\x1b", "\x07", "\u202e"):
        assert raw not in piped.stdout
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31m red \\u202eevil\\u202c" in piped.stdout
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    tables.print_table(["first message"], [[TERMINAL_ATTACK]])
    out = capsys.readouterr().out
    assert "pwned" in out and "\x1b]0" not in out and "\x1b[2J" not in out
    # error lines too: an error quoting a file's text
    with pytest.raises(typer.Exit):
        from vigil.app.console import fail

        fail(VigilError(f"bad line: {TERMINAL_ATTACK}"))
    err = capsys.readouterr()
    assert "\x1b[2J" not in err.out + err.err and "\\x1b[2J" in err.out + err.err
