"""Finding a conversation: ``/ui/conversations`` (by id, or newest first by filters, keyset pages) and
``vigil conversations list|show``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import ADMIN, INGEST, make_client, make_settings
from tests.support.cli import cli_runner
from vigil.app.cli import app
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire

HOSTILE = 'x"><script>alert(1)</script>'


def _conversation(cid: str, version: str, cancel_delivered: bool = False) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Please cancel order 7."}]
    if cancel_delivered:
        messages += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "t1", "function": {"name": "get_order_details", "arguments": '{"order_id": "7"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": '{"order_id": "7", "status": "delivered"}'},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "t2", "function": {"name": "cancel_pending_order", "arguments": '{"order_id": "7"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "t2", "content": '{"ok": true}'},
        ]
    messages.append({"role": "assistant", "content": "Done."})
    return {"conversation_id": cid, "agent_id": "support-bot", "agent_version": version, "messages": messages}


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[Any]:
    rt = build_runtime(make_settings(f"sqlite:///{tmp_path / 'v.db'}"), registry=CollectorRegistry())
    with make_client(rt) as c:
        batch = [_conversation(f"c-{i:02d}", "v1" if i % 2 else "v2", cancel_delivered=i % 3 == 0) for i in range(60)]
        batch.append(_conversation(HOSTILE, "v2"))
        assert c.post("/v1/conversations", json=batch, headers=INGEST).status_code in (200, 202)
        token = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/login").text)
        assert token
        c.post("/ui/login", data={"csrf": token.group(1), "api_key": "rita-key", "next": "/ui"})
        yield c
    rt.close()


def _listed(html: str) -> list[str]:
    return re.findall(r'<tr data-conversation="([^"]+)">', html)


def test_the_list_pages_newest_first_without_gaps_or_repeats(ui) -> None:
    first = ui.get("/ui/conversations")
    assert first.status_code == 200 and "61 conversations match" in first.text
    assert '<a href="/ui/conversations"' in first.text  # in the navigation
    seen = _listed(first.text)
    html = first.text
    while 'rel="next"' in html:
        older = re.search(r'<a href="([^"]+)" rel="next">', html)
        assert older
        html = ui.get(older.group(1).replace("&amp;", "&")).text
        seen += _listed(html)
    assert len(seen) == len(set(seen)) == 61  # 50 then 11: every conversation once


def test_filters_narrow_the_list_and_the_next_page_keeps_them(ui) -> None:
    v2 = ui.get("/ui/conversations", params={"version": "v2"}).text
    assert "31 conversations match" in v2  # c-00, c-02, ... c-58 and the hostile id
    cancelled = ui.get("/ui/conversations", params={"rule": "no-cancel-delivered-order"}).text
    assert sorted(_listed(cancelled)) == [f"c-{i:02d}" for i in range(0, 60, 3)]
    severe = ui.get("/ui/conversations", params={"severity": "high", "version": "v1", "agent": "support-bot"}).text
    assert sorted(_listed(severe)) == [f"c-{i:02d}" for i in range(3, 60, 6)]
    shouted = ui.get("/ui/conversations", params={"severity": "HIGH", "version": "v1", "agent": "support-bot"}).text
    assert sorted(_listed(shouted)) == sorted(_listed(severe))  # any case, as the API and the review queue
    assert ui.get("/ui/conversations", params={"agent": "nobody"}).text.count("No stored conversation matches") == 1
    # the link to older conversations carries the filters
    page = ui.get("/ui/conversations", params={"version": "v2", "since": "2000-01-01T00:00"}).text
    href = re.search(r'<a href="([^"]+)" rel="next">', page)
    assert href is None  # 31 fit one page
    many = ui.get("/ui/conversations", params={"since": "2000-01-01T00:00"}).text
    href = re.search(r'<a href="([^"]+)" rel="next">', many)
    assert href
    query = parse_qs(urlparse(href.group(1).replace("&amp;", "&")).query)
    assert query["since"] == ["2000-01-01T00:00"] and "cursor" in query


def test_an_id_opens_its_conversation_or_says_there_is_none(ui) -> None:
    hit = ui.get("/ui/conversations", params={"id": " c-07 "}, follow_redirects=False)
    assert hit.status_code == 303 and hit.headers["location"] == "/ui/review/c-07"
    odd = ui.get("/ui/conversations", params={"id": HOSTILE}, follow_redirects=False)
    assert odd.status_code == 303 and odd.headers["location"].startswith("/ui/review/x%22%3E%3Cscript%3E")
    miss = ui.get("/ui/conversations", params={"id": "c-99"})
    assert miss.status_code == 200 and "No conversation has the id &#39;c-99&#39;." in miss.text
    assert miss.text.count("No conversation has the id") == 1  # said once, beside the form, not also atop the page


def test_ingested_ids_and_bad_filters_are_text_not_markup(ui) -> None:
    page = ui.get("/ui/conversations", params={"version": "v2"}).text  # one page holds them all
    assert HOSTILE not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    for params, message in [
        ({"severity": "worst"}, "severity must be one of info, low, medium, high, critical, not &#39;worst&#39;"),
        ({"since": "yesterday"}, "since &#39;yesterday&#39; is not a date and time"),
        ({"since": "2026-02-01", "until": "2026-01-01"}, "since (2026-02-01 00:00) must be before until"),
        ({"cursor": "not-ours"}, "cursor is not one Vigil handed out"),
        ({"agent": "<b>x</b>"}, None),
    ]:
        r = ui.get("/ui/conversations", params=params)
        if message is None:
            assert r.status_code == 200 and "<b>x</b>" not in r.text
        else:
            assert r.status_code == 400 and message in r.text, (params, r.text[-2000:])


def test_the_page_needs_a_reviewer(tmp_path: Path) -> None:
    rt = build_runtime(make_settings(f"sqlite:///{tmp_path / 'v.db'}"), registry=CollectorRegistry())
    with make_client(rt) as c:
        r = c.get("/ui/conversations", params={"id": "c-1"}, follow_redirects=False)
        assert r.status_code in (302, 303, 307) and r.headers["location"].startswith("/ui/login")
    rt.close()


def test_cli_lists_and_shows_conversations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'v.db'}"
    rt = wire(build_runtime(make_settings(url), registry=CollectorRegistry()), {"api"})
    with make_client(rt) as c:
        batch = [_conversation(f"c-{i}", "v1", cancel_delivered=i == 2) for i in range(5)]
        assert c.post("/v1/conversations", json=batch, headers=INGEST).status_code in (200, 202)
    rt.close()
    monkeypatch.setenv("VIGIL_DATABASE_URL", url)
    monkeypatch.setenv("VIGIL_RULE_PACKS", str(Path(__file__).resolve().parents[2] / "rules" / "default.yaml"))
    runner = cli_runner()
    r = runner.invoke(app, ["conversations", "list", "--limit", "3", "--json"])
    assert r.exit_code == 0, r.output
    first = json.loads(r.stdout)
    assert first["total"] == 5 and len(first["items"]) == 3 and first["next_cursor"]
    r = runner.invoke(app, ["conversations", "list", "--limit", "3", "--json", "--cursor", first["next_cursor"]])
    rest = json.loads(r.stdout)
    assert {c["conversation_id"] for c in first["items"] + rest["items"]} == {f"c-{i}" for i in range(5)}
    r = runner.invoke(app, ["conversations", "list", "--severity", "high"])
    assert r.exit_code == 0 and "c-2\tsupport-bot\tv1" in r.stdout and "c-1\t" not in r.stdout
    assert runner.invoke(app, ["conversations", "list", "--severity", "High"]).stdout == r.stdout
    r = runner.invoke(app, ["conversations", "show", "c-2"])
    assert r.exit_code == 0 and "no-cancel-delivered-order\thigh" in r.stdout
    r = runner.invoke(app, ["conversations", "show", "c-2", "--json"])
    assert json.loads(r.stdout)["conversation"]["messages"][0]["content"] == "Please cancel order 7."
    r = runner.invoke(app, ["conversations", "show", "c-9"])
    assert r.exit_code == 1 and "no conversation has the id 'c-9'" in r.output
    for args, message in [
        (["--severity", "worst"], "severity must be one of"),
        (["--since", "soon"], "since 'soon' is not a date and time"),
        (["--cursor", "zz"], "cursor is not one Vigil handed out"),
    ]:
        r = runner.invoke(app, ["conversations", "list", *args])
        assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output, r.output


def test_a_conversation_sent_without_a_status_shows_none_of_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``status`` is optional: a conversation sent without one printed ``None`` in its status column in
    ``vigil conversations show`` and ``list`` and on ``/ui/conversations``; the cell is blank, as a missing
    task's is."""
    url = f"sqlite:///{tmp_path / 'v.db'}"
    rt = wire(build_runtime(make_settings(url), registry=CollectorRegistry()), {"api"})
    finished = dict(_conversation("c-done", "v1"), status="finished", task_id="t-1")
    with make_client(rt) as c:
        assert c.post("/v1/conversations", json=[_conversation("c-bare", "v1"), finished], headers=INGEST).is_success
        token = re.search(r'name="csrf" value="([^"]+)"', c.get("/ui/login").text)
        assert token
        c.post("/ui/login", data={"csrf": token.group(1), "api_key": "rita-key", "next": "/ui"})
        page = c.get("/ui/conversations").text
    rt.close()
    cells = re.findall(r'<td data-label="Status">([^<]*)</td>', page)
    assert sorted(cells) == ["", "finished"], cells
    monkeypatch.setenv("VIGIL_DATABASE_URL", url)
    runner = cli_runner()
    shown = runner.invoke(app, ["conversations", "show", "c-bare"])
    assert shown.exit_code == 0, shown.output
    header, row = shown.stdout.splitlines()[:2]
    assert dict(zip(header.split("\t"), row.split("\t"), strict=True))["status"] == "", row
    done = runner.invoke(app, ["conversations", "show", "c-done"]).stdout.splitlines()[1].split("\t")
    assert done[3:5] == ["t-1", "finished"], done
    listed = runner.invoke(app, ["conversations", "list"]).stdout
    assert "None" not in listed and "c-bare\tsupport-bot\tv1\t\t\t" in listed, listed


def test_cli_show_json_answers_what_the_api_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``conversations show ID --json`` is the document ``GET /v1/conversations/{id}`` answers: with the
    verdicts and review the stages add, and a document deeper than a JSON writer goes (ingest reads 1,024
    levels, orjson writes 255) printed as stored rather than a traceback."""
    url = f"sqlite:///{tmp_path / 'v.db'}"
    rt = wire(build_runtime(make_settings(url), registry=CollectorRegistry()), {"api"})
    deep: Any = 1
    for _ in range(300):
        deep = [deep]
    with make_client(rt) as c:
        batch = [
            _conversation("c-2", "v1", cancel_delivered=True),
            {**_conversation("c-deep", "v1"), "metadata": {"d": deep}},
        ]
        assert c.post("/v1/conversations", json=batch, headers=INGEST).status_code in (200, 202)
        answers = {cid: c.get(f"/v1/conversations/{cid}", headers=ADMIN).json() for cid in ("c-2", "c-deep")}
    rt.close()
    monkeypatch.setenv("VIGIL_DATABASE_URL", url)
    monkeypatch.setenv("VIGIL_RULE_PACKS", str(Path(__file__).resolve().parents[2] / "rules" / "default.yaml"))
    for cid, answer in answers.items():
        r = cli_runner().invoke(app, ["conversations", "show", cid, "--json"])
        assert r.exit_code == 0 and "Traceback" not in r.output, r.output
        shown = json.loads(r.stdout)
        assert set(shown) == set(answer) >= {"conversation", "findings", "outcomes", "verdicts", "review"}
        assert shown["conversation"] == answer["conversation"]
        assert shown == answer  # times too: the API's RFC 3339 UTC form ("...Z"), not "+00:00"


def test_a_failing_page_logs_its_address_without_control_characters(
    ui, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from fastapi.testclient import TestClient

    from vigil.store import reads

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(reads, "get_conversation", broken)
    failing = TestClient(ui.app, raise_server_exceptions=False, cookies=ui.cookies)
    r = failing.get("/ui/review/%1b%5d0%3bpwned%07%1b%5b2J")  # retitles and clears the terminal tailing the log
    assert r.status_code == 500 and "RuntimeError" in r.text
    logged = [rec.getMessage() for rec in caplog.records if "unhandled error" in rec.getMessage()]
    assert logged == ["unhandled error on GET /ui/review/\\x1b]0;pwned\\x07\\x1b[2J"]


def test_a_conversation_opened_from_a_list_has_a_crumb_back_to_it(ui) -> None:
    """The conversation page's crumb was always "Queue ›", also when it was opened from Conversations or
    Compare; the lists' links now say where they came from, and the crumb leads back there."""
    listed = ui.get("/ui/conversations", params={"version": "v1"}).text
    link = re.search(r'href="(/ui/review/c-01\?from=[^"]+)"', listed)
    assert link, "no link to c-01 saying where it came from"
    page = ui.get(link.group(1).replace("&amp;", "&")).text
    assert '<a id="crumb-back" href="/ui/conversations?version=v1">Conversations</a> ›' in page
    assert 'id="crumb-queue"' not in page
    behind = "/ui/compare/conversations?agent=support-bot&version=v2&signal=forbidden_tool&offset=0"
    page = ui.get("/ui/review/c-00", params={"from": behind}).text
    assert f'<a id="crumb-back" href="{behind.replace("&", "&amp;")}">Compare</a> ›' in page
    for elsewhere in (
        "https://example.com/ui/conversations",
        "//example.com/ui/conversations",
        "/ui/queue?x=1",
        "javascript:alert(1)",
        "/ui/conversations\n?x",
        "/ui/conversations" + "?a=1" * 1000,
        "",
    ):
        page = ui.get("/ui/review/c-00", params={"from": elsewhere}).text
        assert 'id="crumb-back"' not in page and '<a id="crumb-queue" href="/ui/queue">Queue</a> ›' in page, elsewhere
    assert '<a id="crumb-queue" href="/ui/queue">Queue</a> ›' in ui.get("/ui/review/c-00").text


def test_conversations_behind_a_signal_link_to_pages_with_a_crumb_back(ui) -> None:
    html = ui.get(
        "/ui/compare/conversations", params={"agent": "support-bot", "version": "v2", "signal": "forbidden_tool"}
    ).text
    assert re.search(r'href="/ui/review/c-\d\d\?from=%2Fui%2Fcompare%2Fconversations%3Fagent%3Dsupport-bot', html)


def test_a_list_too_long_to_lead_back_to_gives_its_rows_no_crumb_address(ui) -> None:
    """Each of the 50 rows carried the list's whole address as from=, however long, while the conversation
    page takes one of at most 2,048 characters: a 6 kB query made a list page of 50 times that."""
    padded = {"version": "v1", "agent": "support-bot", "pad": "x" * 3000}
    listed = ui.get("/ui/conversations", params=padded).text
    assert 'href="/ui/review/c-01"' in listed and "from=" not in listed
    short = ui.get("/ui/conversations", params={"version": "v1", "agent": "support-bot"}).text
    assert re.search(r'href="/ui/review/c-01\?from=', short)
