"""``vigil review ...`` against a real database."""

from __future__ import annotations

import orjson
from typer.testing import CliRunner

from tests.support.cli import cli_runner
from tests.support.review import review_runtime, simulated, store
from vigil.app.cli import app
from vigil.review.stage import ReviewStage


def test_review_commands(sqlite_url, tmp_path, monkeypatch) -> None:
    rt = review_runtime(sqlite_url)
    convs = simulated(30, "v1:0.0", seed=2)
    store(rt, convs)
    rt.close()
    monkeypatch.setenv("VIGIL_DATABASE_URL", sqlite_url)
    runner = cli_runner()
    ids = [c["conversation_id"] for c in convs[:2]]
    r = runner.invoke(app, ["review", "enqueue", *ids, "missing-id", "--note", "from a ticket"])
    assert r.exit_code == 1 and "missing-id" in r.output
    r = runner.invoke(app, ["review", "queue", "--reason", "manual"])
    assert r.exit_code == 0 and "manual:cli" in r.output
    again = runner.invoke(app, ["review", "enqueue", ids[0]])
    assert again.exit_code == 0 and "0 added" in again.output

    rt = review_runtime(sqlite_url)
    from vigil.review import queue

    with rt.sessions.begin() as s:
        queue.label(s, ids[0], "rita", queue.LabelIn("confirmed_failure", "wrong_action"), rt.get(ReviewStage).policy)
    rt.close()
    out = tmp_path / "labels.jsonl"
    assert runner.invoke(app, ["review", "labels", "--out", str(out)]).exit_code == 0
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [(r["conversation_id"], r["label"], r["category"]) for r in rows] == [
        (ids[0], "confirmed_failure", "wrong_action")
    ]
    r = runner.invoke(app, ["review", "clusters", "--json"])
    assert r.exit_code == 0 and '"total": 1' in r.stdout
    assert runner.invoke(app, ["review", "progress"]).exit_code == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("sample: {rate: 5}")
    r = runner.invoke(app, ["review", "policy", str(bad)])
    assert r.exit_code == 2 and "sample.rate" in r.output
    assert runner.invoke(app, ["review", "policy"]).exit_code == 0


def test_listings_print_json_and_full_ids_when_piped(sqlite_url, monkeypatch) -> None:
    rt = review_runtime(sqlite_url)
    convs = simulated(3, "v1:0.0", seed=3)
    long_id = "conversation-" + "x" * 120  # wider than any terminal
    convs[0]["conversation_id"] = long_id
    store(rt, convs)
    rt.close()
    monkeypatch.setenv("VIGIL_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("COLUMNS", "80")
    runner = CliRunner()
    assert runner.invoke(app, ["review", "enqueue", long_id]).exit_code == 0
    r = runner.invoke(app, ["review", "queue"])  # stdout is not a terminal: plain lines, nothing cut
    assert r.exit_code == 0 and long_id in r.stdout.split("\t") and "…" not in r.stdout
    r = runner.invoke(app, ["review", "queue", "--json"])
    data = orjson.loads(r.stdout)
    assert [it["conversation_id"] for it in data["items"]] == [long_id] and data["counts"]["available"] == 1
    r = runner.invoke(app, ["review", "progress", "--json"])
    assert r.exit_code == 0 and set(orjson.loads(r.stdout)) >= {"reviewers", "agreement"}
    r = runner.invoke(app, ["alerts", "--json"])
    assert r.exit_code == 0 and set(orjson.loads(r.stdout)) == {"active", "past"}


def test_review_queue_limit_is_bounded_and_the_next_page_is_a_cursor(sqlite_url, monkeypatch) -> None:
    """``--limit 0`` died with an IndexError traceback, ``--limit -1`` printed the whole queue (SQLite reads
    LIMIT -1 as none) and any large limit read every item at once: the queue had no way to page."""
    rt = review_runtime(sqlite_url)
    store(rt, simulated(60, "v1:0.9", seed=4))
    rt.close()
    monkeypatch.setenv("VIGIL_DATABASE_URL", sqlite_url)
    runner = cli_runner()
    for bad in ("0", "-1", "501"):
        r = runner.invoke(app, ["review", "queue", "--limit", bad])
        assert r.exit_code == 2 and "--limit" in r.output and "Traceback" not in r.output, (bad, r.output)
    everything = orjson.loads(runner.invoke(app, ["review", "queue", "--limit", "500", "--json"]).stdout)
    order = [it["conversation_id"] for it in everything["items"]]
    assert len(order) > 10
    first = runner.invoke(app, ["review", "queue", "--limit", "5"])
    assert first.exit_code == 0
    cursor = first.stderr.split("older: --cursor ")[1].split()[0]
    page = orjson.loads(runner.invoke(app, ["review", "queue", "--limit", "5", "--cursor", cursor, "--json"]).stdout)
    assert [it["conversation_id"] for it in page["items"]] == order[5:10]
    r = runner.invoke(app, ["review", "queue", "--cursor", "nonsense"])
    assert r.exit_code == 2 and "cursor" in r.output
    r = runner.invoke(app, ["review", "queue", "--cursor", cursor, "--sort", "agent"])
    assert r.exit_code == 2 and "cursor" in r.output


def test_review_queue_refuses_a_mistyped_severity_or_reason_as_the_api_does(sqlite_url, monkeypatch) -> None:
    """``--severity hgh`` listed an empty queue (exit 0), as if nothing were flagged; the API answers 422."""
    rt = review_runtime(sqlite_url)
    store(rt, simulated(20, "v1:0.9", seed=4))
    rt.close()
    monkeypatch.setenv("VIGIL_DATABASE_URL", sqlite_url)
    runner = cli_runner()
    for option, typo in (("--severity", "hgh"), ("--reason", "findings")):
        r = runner.invoke(app, ["review", "queue", option, typo])
        assert r.exit_code == 2 and repr(typo) in r.output, (option, r.output)
    assert runner.invoke(app, ["review", "queue", "--severity", "HIGH"]).exit_code == 0
