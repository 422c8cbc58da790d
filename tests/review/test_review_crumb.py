"""The conversation page's crumb back to the list it was opened from (``from=``) survives every way the
page leads back to itself: its fold links, its forms (Save, comment, claim, extend, release) and their
redirects, a refused label and a log-in in between; a ``from`` that is not one of Vigil's lists never does."""

from __future__ import annotations

import re
from html import unescape
from typing import Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import pytest
from markupsafe import escape

from tests.review.test_review_ui import _csrf, _expire_session, _login
from tests.support.review import long_conversation, review_client, review_runtime, store

CID = "long-c"
URL = f"/ui/review/{CID}"
LIST = "/ui/conversations?agent=coder&version=v1&label=none"  # the list, with its filters
CRUMB = f'<a id="crumb-back" href="{escape(LIST)}">Conversations</a> ›'
HOSTILE = (
    "https://evil.example/ui/conversations",
    "//evil.example/ui/conversations",
    "/\\evil.example/ui/conversations",
    "javascript:alert(1)//ui/conversations",
    "/ui/conversations\r\nSet-Cookie: evil=1",
    "/ui/conversations?agent=" + "a" * 2100,  # longer than a list's address is
    "/ui/queue?x=1",  # one of ours, but not a list the crumb leads back to
)
FORM = re.compile(r'<form method="post" action="([^"]+)"[^>]*>(.*?)</form>', re.S)
HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)"')
OWN = re.compile(r'href="((?:/ui/review/' + CID + r')?(?:\?[^"#]*)?)(?:#[^"]*)?"')


@pytest.fixture
def ui(sqlite_url: str):  # type: ignore[no-untyped-def]
    rt = review_runtime(sqlite_url)
    store(rt, [long_conversation(1_000, CID, leak_at=500)])  # folded, a finding on a folded message, queued
    with review_client(rt) as c:
        _login(c)
        yield c
    rt.close()


def _crumbed(html: str) -> None:
    assert CRUMB in html and 'id="crumb-queue"' not in html


def _queue_crumb(html: str) -> None:
    assert 'id="crumb-back"' not in html and '<a id="crumb-queue" href="/ui/queue">Queue</a> ›' in html
    assert 'name="from"' not in html and "from=" not in html and "evil" not in html


def _own_links(html: str) -> list[str]:
    """The page's links to itself (fold rows, windows, comment-on links), fragments dropped."""
    return [unescape(h) for h in OWN.findall(html) if h]


def _forms(html: str) -> dict[str, dict[str, str]]:
    """Each post form's action → its hidden fields."""
    return {unescape(a): {n: unescape(v) for n, v in HIDDEN.findall(body)} for a, body in FORM.findall(html)}


def _kind(href: str) -> frozenset[str]:
    return frozenset(parse_qs(urlsplit(href).query)) - {"from"}


def _follow(ui: Any, response: Any) -> str:
    assert response.status_code == 303, response.text[:500]
    page = ui.get(response.headers["location"])
    assert page.status_code == 200
    return str(page.text)


def test_every_fold_link_of_the_page_keeps_the_crumb(ui) -> None:
    page = ui.get(URL, params={"from": LIST}).text
    _crumbed(page)
    assert 'href="?' not in page  # relative to a form post's answer, a link asked for "<id>/label"
    todo, seen = [(h, "the page") for h in _own_links(page)], set()
    while todo:
        href, on = todo.pop(0)
        assert href.startswith(URL + "?") and parse_qs(urlsplit(href).query)["from"] == [LIST], (href, on)
        if _kind(href) in seen:
            continue
        seen.add(_kind(href))
        html = ui.get(href).text
        _crumbed(html)
        todo += [(h, href) for h in _own_links(html)]
    # fold rows, a finding's folded evidence, comment-on links, a window's own, back to the first and last
    assert seen >= {frozenset({"messages"}), frozenset({"around"}), frozenset({"comment_on"}), frozenset()}
    assert frozenset({"messages", "comment_on"}) in seen


def test_save_and_every_form_that_comes_back_to_the_page_keep_the_crumb(ui) -> None:
    page = ui.get(URL, params={"from": LIST}).text
    forms = _forms(page)
    assert forms[f"{URL}/claim"]["from"] == forms[f"{URL}/label"]["from"] == forms[f"{URL}/comment"]["from"] == LIST
    assert "from" not in forms["/ui/queue/claim"]  # Next item: the queue's next one, whose crumb is the queue
    page = _follow(ui, ui.post(f"{URL}/claim", data=forms[f"{URL}/claim"], follow_redirects=False))
    _crumbed(page)
    assert "Claimed" in page
    forms = _forms(page)
    page = _follow(ui, ui.post(f"{URL}/extend", data=forms[f"{URL}/extend"], follow_redirects=False))
    _crumbed(page)
    comment = {**_forms(page)[f"{URL}/comment"], "message_index": "3", "body": "looped"}
    page = _follow(ui, ui.post(f"{URL}/comment", data=comment, follow_redirects=False))
    _crumbed(page)
    # a refused Save (a confirmed failure needs a category) shows the page again: crumb and links kept
    label = {**_forms(page)[f"{URL}/label"], "label": "confirmed_failure", "notes": "leaks"}
    refused = ui.post(f"{URL}/label", data=label)
    assert refused.status_code == 422 and 'id="label-error"' in refused.text
    _crumbed(refused.text)
    assert 'href="?' not in refused.text and _forms(refused.text)[f"{URL}/label"]["from"] == LIST
    fold_open = next(h for h in _own_links(refused.text) if _kind(h) == {"messages"})
    _crumbed(ui.get(fold_open).text)
    stale = ui.post(f"{URL}/label", data={**label, "csrf": "from-an-old-tab"})
    assert stale.status_code == 403
    _crumbed(stale.text)
    # a plain Save: the redirect carries the crumb back
    saved = ui.post(f"{URL}/label", data={**label, "label": "not_a_failure"}, follow_redirects=False)
    assert saved.headers["location"] == f"{URL}?" + urlencode({"notice": "labelled", "from": LIST})
    page = _follow(ui, saved)
    _crumbed(page)
    assert 'id="toast"' in page
    release = _forms(page).get(f"{URL}/release") or {"csrf": _csrf(page), "from": LIST}
    _crumbed(_follow(ui, ui.post(f"{URL}/release", data=release, follow_redirects=False)))


def test_the_crumb_survives_a_log_in_between_typing_and_saving(ui, monkeypatch) -> None:
    page = ui.get(URL, params={"from": LIST}).text
    label = {**_forms(page)[f"{URL}/label"], "label": "unsure", "notes": "could not tell"}
    _expire_session(ui, None, monkeypatch)
    login = ui.post(f"{URL}/label", data=label)
    back = f"{URL}?from={quote(LIST, safe='')}"
    assert login.status_code == 401 and f'name="next" value="{escape(back)}"' in login.text
    drafted = dict(re.findall(r'<input type="hidden" name="(draft_\w+)" value="([^"]*)"', login.text))
    again = {"csrf": _csrf(login.text), "api_key": "rita-key", "next": back, **drafted, "draft_notes": "could not tell"}
    resumed = ui.post("/ui/login", data=again, follow_redirects=False)
    assert resumed.status_code == 200 and 'id="draft-notice"' in resumed.text
    assert "could not tell</textarea>" in resumed.text
    _crumbed(resumed.text)
    assert 'href="?' not in resumed.text  # its links lead to the conversation, not to the log-in page
    saved = ui.post(f"{URL}/label", data={**label, "csrf": _csrf(resumed.text)}, follow_redirects=False)
    _crumbed(_follow(ui, saved))


@pytest.mark.parametrize("bad", HOSTILE)
def test_a_foreign_or_overlong_from_is_dropped_before_and_after_a_save(ui, bad: str) -> None:
    page = ui.get(URL, params={"from": bad}).text
    _queue_crumb(page)
    token = _csrf(page)
    # a forged form carrying it anyway: the redirect drops it, and so does every page shown in answer
    label = {"csrf": token, "label": "not_a_failure", "from": bad}
    saved = ui.post(f"{URL}/label", data=label, follow_redirects=False)
    assert saved.status_code == 303 and saved.headers["location"] == f"{URL}?notice=labelled"
    _queue_crumb(_follow(ui, saved))
    refused = ui.post(f"{URL}/label", data={**label, "label": "confirmed_failure"})
    assert refused.status_code == 422
    _queue_crumb(refused.text)
    _queue_crumb(ui.post(f"{URL}/label", data={**label, "csrf": "stale"}).text)
    commented = ui.post(f"{URL}/comment", data={"csrf": token, "body": "x", "from": bad}, follow_redirects=False)
    assert commented.headers["location"] == f"{URL}?notice=commented#comments"
    claimed = ui.post(f"{URL}/claim", data={"csrf": token, "from": bad}, follow_redirects=False)
    assert claimed.headers["location"].startswith(f"{URL}?notice=") and "from" not in claimed.headers["location"]
    _queue_crumb(ui.get(URL, params={"from": bad, "messages": "100-399"}).text)
