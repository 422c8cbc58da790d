"""``vigil dead-letters list`` and ``replay``: the letters as the API lists them (every value whole when piped),
re-sent by id or ``--all``, exiting 1 when any is refused."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from tests.support.app import API_KEYS, INGEST, make_client, make_settings
from tests.support.cli import cli_runner
from vigil.app.cli import app
from vigil.app.runtime import build_runtime

runner = cli_runner()
CHARGEBACK = {"conversation_id": "c-1", "type": "chargeback", "idempotency_key": "k-1"}


def make_letters(url: str) -> None:
    """A body that is not JSON, and an outcome of a type not declared yet."""
    rt = build_runtime(make_settings(url), registry=CollectorRegistry())
    with make_client(rt) as c:
        assert c.post("/v1/conversations", content=b"{not json", headers=INGEST).status_code == 400
        assert c.post("/v1/outcomes", json=CHARGEBACK, headers=INGEST).status_code == 422
    rt.close()


def run(url: str, *args: str, **env: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, list(args), env={"VIGIL_API_KEYS": API_KEYS, "VIGIL_DATABASE_URL": url, **env})


def test_list_prints_each_letter_whole_and_as_json(sqlite_url: str) -> None:
    make_letters(sqlite_url)
    listed = run(sqlite_url, "dead-letters", "list", "--json")
    assert listed.exit_code == 0, listed.output
    letters = json.loads(listed.stdout)
    assert [d["reason"] for d in letters] == ["unknown_outcome_type", "malformed_json"]
    assert {d["source"] for d in letters} == {"http"}
    assert all(d["replayed_at"] is None for d in letters)
    only = json.loads(run(sqlite_url, "dead-letters", "list", "--json", "--reason", "malformed_json").stdout)
    assert [d["reason"] for d in only] == ["malformed_json"]
    piped = run(sqlite_url, "dead-letters", "list")  # not a terminal: tab-separated, nothing cut
    assert piped.exit_code == 0, piped.output
    header, *rows = piped.stdout.strip().split("\n")
    assert header.split("\t")[:4] == ["id", "received", "source", "reason"]
    assert [r.split("\t")[0] for r in rows] == [str(d["id"]) for d in letters]
    assert letters[0]["detail"] in piped.stdout


def test_replay_exits_1_while_any_is_refused_and_0_once_taken(sqlite_url: str) -> None:
    make_letters(sqlite_url)
    letters = json.loads(run(sqlite_url, "dead-letters", "list", "--json").stdout)
    outcome_id = next(d["id"] for d in letters if d["reason"] == "unknown_outcome_type")

    refused = run(sqlite_url, "dead-letters", "replay", str(outcome_id))
    assert refused.exit_code == 1, refused.output
    assert (
        f"{outcome_id}: refused (422): The outcomes intake refused it again: "
        "item 0 unknown_outcome_type: type: unknown outcome type" in refused.output
    )
    assert "{'" not in refused.output  # worded as the letter's detail, not the answer's dict

    declared = {"VIGIL_OUTCOME_TYPES": "chargeback:bad"}
    taken = run(sqlite_url, "dead-letters", "replay", str(outcome_id), **declared)
    assert taken.exit_code == 0, taken.output
    assert f"{outcome_id}: replayed through outcomes (stored 1, duplicates 0)" in taken.output

    # --all takes the letters not re-sent yet: the malformed body alone, refused again
    rest = run(sqlite_url, "dead-letters", "replay", "--all", "--json", **declared)
    assert rest.exit_code == 1, rest.output
    [answer] = json.loads(rest.stdout)
    assert (answer["status"], answer["refusal"]["reason"]) == (422, "malformed_json")
    assert run(sqlite_url, "dead-letters", "replay", "--all", "--reason", "unknown_outcome_type").exit_code == 0
    assert run(sqlite_url, "dead-letters", "replay", "999999").exit_code == 1

    misuse = run(sqlite_url, "dead-letters", "replay", "--reason", "x", str(outcome_id))
    assert misuse.exit_code == 2 and "--reason and --source choose letters with --all" in misuse.output
    assert run(sqlite_url, "dead-letters", "replay").exit_code == 2


def test_an_id_beyond_any_letter_is_a_usage_error_not_a_traceback(sqlite_url: str) -> None:
    make_letters(sqlite_url)
    for bad in ("99999999999999999999", "0"):
        out = run(sqlite_url, "dead-letters", "replay", "--", bad)
        assert out.exit_code == 2 and not isinstance(out.exception, OverflowError), out.output


def test_replay_refuses_a_format_for_an_outcome_letter_naming_it(sqlite_url: str) -> None:
    make_letters(sqlite_url)
    letters = json.loads(run(sqlite_url, "dead-letters", "list", "--json").stdout)
    outcome_id = next(d["id"] for d in letters if d["reason"] == "unknown_outcome_type")
    declared = {"VIGIL_OUTCOME_TYPES": "chargeback:bad"}
    refused = run(sqlite_url, "dead-letters", "replay", str(outcome_id), "--format", "openai", **declared)
    assert refused.exit_code == 1, refused.output
    assert f"{outcome_id}: refused (422): format: POST /v1/outcomes reads no query parameters" in refused.output
    assert run(sqlite_url, "dead-letters", "replay", str(outcome_id), **declared).exit_code == 0


def test_a_line_vigil_import_refused_is_replayed_in_the_format_it_was_read_in(sqlite_url: str, tmp_path) -> None:
    """Kept as read, an Anthropic line goes back with --format and --agent-id, not as Vigil's own schema."""
    good = {"system": "s", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    bad = {"system": "s", "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}
    path = tmp_path / "claude.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in (good, good | {"system": "t"}, bad)) + "\n")
    imported = run(sqlite_url, "import", "--format", "anthropic", "--agent-id", "bot", str(path))
    assert imported.exit_code == 2, imported.output
    [letter] = json.loads(run(sqlite_url, "dead-letters", "list", "--json").stdout)
    assert (letter["source"], letter["query"]) == ("replay", "format=anthropic&agent_id=bot")
    again = run(sqlite_url, "dead-letters", "replay", str(letter["id"]), "--json")
    assert again.exit_code == 1, again.output
    [answer] = json.loads(again.stdout)
    assert answer["refusal"]["format"] == "anthropic" and "hologram" in answer["refusal"]["detail"], answer
