"""Reviewer UI over HTTP: log-in, cookie sessions, CSRF, escaping, navigation (the browser tests cover JS)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any
from urllib.parse import quote, unquote, urlencode

import pytest
from fastapi import APIRouter, Depends, Request
from markupsafe import escape

from tests.support.app import ADMIN, REVIEWER
from tests.support.review import XSS_PAYLOADS, review_client, review_runtime, simulated, store, xss_conversation
from vigil.http.auth import Principal
from vigil.review import failures
from vigil.ui.render import render_page, ui_user
from vigil.ui.session import COOKIE


@pytest.fixture
def rt(sqlite_url: str):  # type: ignore[no-untyped-def]
    runtime = review_runtime(sqlite_url)
    yield runtime
    runtime.close()


@pytest.fixture
def ui(rt):  # type: ignore[no-untyped-def]
    with review_client(rt) as c:
        yield c


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF token in the page"
    return m.group(1)


def _login(ui, key: str = "rita-key"):  # type: ignore[no-untyped-def]
    page = ui.get("/ui/login")
    return ui.post(
        "/ui/login",
        data={"csrf": _csrf(page.text), "api_key": key, "next": "/ui/queue"},
        follow_redirects=False,
    )


def test_login_logout_and_key_checks(ui, rt) -> None:
    r = ui.get("/ui/queue", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=%2Fui%2Fqueue"
    assert _login(ui, "nope").status_code == 401
    bad = _login(ui, "ingest-key")
    assert bad.status_code == 401 and "not a reviewer or admin key" in bad.text
    ok = _login(ui)
    assert ok.status_code == 303 and ok.headers["location"] == "/ui/queue"
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "rita-key" not in cookie
    page = ui.get("/ui/queue")
    assert page.status_code == 200 and ">rita<" in page.text
    # log-out needs the form token
    assert ui.post("/ui/logout", data={}, follow_redirects=False).status_code == 403
    out = ui.post("/ui/logout", data={"csrf": _csrf(page.text)}, follow_redirects=False)
    assert out.status_code == 303
    ui.cookies.clear()
    ui.cookies.set(COOKIE, out.cookies.get(COOKIE) or "")
    assert ui.get("/ui/queue", follow_redirects=False).status_code == 303


def test_login_form_needs_its_token_and_next_stays_on_site(ui) -> None:
    ui.get("/ui/login")
    assert ui.post("/ui/login", data={"api_key": "rita-key"}, follow_redirects=False).status_code == 403
    for evil in (
        "//evil.example/x",
        "https://evil.example/",
        "/\\evil.example",
        "/\t/evil.example",
        "/ui/" + "q" * 5000,
    ):
        page = ui.get("/ui/login", params={"next": evil})
        r = ui.post(
            "/ui/login",
            data={"csrf": _csrf(page.text), "api_key": "rita-key", "next": evil},
            follow_redirects=False,
        )
        assert r.headers["location"] == "/ui/queue"


def test_session_ends_when_its_key_is_removed_or_the_cookie_is_forged(ui) -> None:
    _login(ui)
    assert ui.get("/ui/queue", follow_redirects=False).status_code == 200
    value = ui.cookies.get(COOKIE)
    ui.cookies.clear()
    ui.cookies.set(COOKIE, value[:-3] + ("AAA" if not value.endswith("AAA") else "BBB"))
    assert ui.get("/ui/queue", follow_redirects=False).status_code == 303
    ui.cookies.clear()
    ui.cookies.set(COOKIE, value)
    assert ui.get("/ui/queue", follow_redirects=False).status_code == 200
    ring = ui.app.state.keyring
    ring.keys = [k for k in ring.keys if k.name != "rita"]
    assert ui.get("/ui/queue", follow_redirects=False).status_code == 303


def test_a_form_or_header_token_of_non_ascii_is_a_stale_form_not_a_500(ui, rt) -> None:
    convs = simulated(5, "v1:0.6", seed=1)
    store(rt, convs)
    cid = convs[0]["conversation_id"]
    ui.get("/ui/login")
    refused = ui.post("/ui/login", data={"csrf": "é", "api_key": "rita-key"}, follow_redirects=False)
    assert refused.status_code == 403
    _login(ui)
    for path in ("/ui/queue/claim", "/ui/logout", f"/ui/review/{cid}/label", f"/ui/review/{cid}/comment"):
        r = ui.post(path, data={"csrf": "jeton-périmé", "label": "unsure", "body": "x"}, follow_redirects=False)
        assert r.status_code == 403, (path, r.status_code)
    api = ui.post("/v1/review/claim", headers={"X-CSRF-Token": "été".encode("latin-1")})
    assert api.status_code == 403 and "stale CSRF token" in api.json()["detail"]


def test_cookie_session_calls_the_api_with_a_csrf_header(ui, rt) -> None:
    store(rt, simulated(30, "v1:0.6", seed=1))
    page = _login(ui) and ui.get("/ui/queue")
    token = _csrf(page.text)
    assert ui.get("/v1/review/queue").status_code == 200
    missing_token = ui.post("/v1/review/claim")
    assert missing_token.status_code == 403 and "missing CSRF token" in missing_token.json()["detail"]
    stale = ui.post("/v1/review/claim", headers={"X-CSRF-Token": "wrong"})
    assert stale.status_code == 403 and "stale CSRF token" in stale.json()["detail"]
    r = ui.post("/v1/review/claim", headers={"X-CSRF-Token": token})
    assert r.status_code == 200 and r.json()["item"]["claimed_by"] == "rita"


def _expire_session(ui, rt, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Replace the session cookie by the same session signed longer ago than its maximum age."""
    sessions = ui.app.state.ui_sessions
    data = sessions._signer.loads(ui.cookies.get(COOKIE))
    long_ago = sessions.now() - timedelta(seconds=sessions.max_age + 60)
    with monkeypatch.context() as m:
        m.setitem(sessions._signer.signer_kwargs, "now", lambda: long_ago)
        old = sessions._signer.dumps(data)
    ui.cookies.clear()
    ui.cookies.set(COOKIE, old)


def test_an_expired_session_keeps_the_typed_label(ui, rt, monkeypatch) -> None:
    store(rt, simulated(30, "v1:0.6", seed=1))
    _login(ui)
    r = ui.post("/ui/queue/claim", data={"csrf": _csrf(ui.get("/ui/queue").text)}, follow_redirects=False)
    url = r.headers["location"]
    cid = url.rsplit("/", 1)[1]
    token = _csrf(ui.get(url).text)
    typed = {
        "csrf": token,
        "label": "confirmed_failure",
        "category": "wrong_action",
        "severity": "high",
        "notes": "Cancelled a <b>delivered</b> order",
        "expected_behavior": "Refuse and explain the policy.",
    }
    _expire_session(ui, rt, monkeypatch)  # the session expired while the reviewer typed
    r = ui.post(url + "/label", data=typed, follow_redirects=False)
    assert r.status_code == 401 and "text/html" in r.headers["content-type"]
    assert "your label was not saved" in r.text and f'name="next" value="{url}"' in r.text
    assert "Cancelled a &lt;b&gt;delivered&lt;/b&gt; order</textarea>" in r.text
    assert "Refuse and explain the policy.</textarea>" in r.text
    assert api_labels(ui, cid) == []
    # logging in again from that page: back to the conversation with everything filled in
    hidden = dict(re.findall(r'<input type="hidden" name="(draft_\w+)" value="([^"]*)"', r.text))
    assert hidden == {"draft_label": "confirmed_failure", "draft_category": "wrong_action", "draft_severity": "high"}
    back = ui.post(
        "/ui/login",
        data={
            "csrf": _csrf(r.text),
            "api_key": "rita-key",
            "next": url,
            **hidden,
            "draft_notes": typed["notes"],
            "draft_expected_behavior": typed["expected_behavior"],
        },
        follow_redirects=False,
    )
    assert back.status_code == 200 and 'id="draft-notice"' in back.text and "Logged in again" in back.text
    assert 'value="confirmed_failure" data-key="c" required checked' in back.text
    assert 'value="wrong_action" data-description=' in back.text and "selected>1 · wrong action" in back.text
    assert "Cancelled a &lt;b&gt;delivered&lt;/b&gt; order</textarea>" in back.text
    saved = ui.post(url + "/label", data={**typed, "csrf": _csrf(back.text)}, follow_redirects=False)
    assert saved.status_code == 303 and saved.headers["location"].endswith("notice=labelled")
    assert [lab["notes"] for lab in api_labels(ui, cid)] == [typed["notes"]]


def test_a_stale_form_token_keeps_the_label_and_other_forms_say_why(ui, rt, monkeypatch) -> None:
    store(rt, simulated(30, "v1:0.6", seed=1))
    _login(ui)
    r = ui.post("/ui/queue/claim", data={"csrf": _csrf(ui.get("/ui/queue").text)}, follow_redirects=False)
    url = r.headers["location"]
    cid = url.rsplit("/", 1)[1]
    typed = {"csrf": "from-an-old-tab", "label": "unsure", "notes": "could not tell"}
    stale = ui.post(url + "/label", data=typed)
    assert stale.status_code == 403 and "text/html" in stale.headers["content-type"]
    assert "your label was not saved" in stale.text and "could not tell</textarea>" in stale.text
    assert 'value="unsure" data-key="u" required checked' in stale.text and api_labels(ui, cid) == []
    ok = ui.post(url + "/label", data={**typed, "csrf": _csrf(stale.text)}, follow_redirects=False)
    assert ok.status_code == 303 and [lab["label"] for lab in api_labels(ui, cid)] == ["unsure"]
    # other forms: a page that says what happened, or the log-in page and back
    page = ui.post(url + "/claim", data={"csrf": "from-an-old-tab"})
    assert page.status_code == 403 and "This form had expired" in page.text and f'href="{url}"' in page.text
    _expire_session(ui, rt, monkeypatch)
    gone = ui.post(url + "/extend", data={"csrf": "x"}, follow_redirects=False)
    assert gone.status_code == 303
    assert gone.headers["location"] == "/ui/login?" + urlencode({"next": url, "expired": "1"})
    assert "Your session expired" in ui.get(gone.headers["location"]).text


def test_a_comment_survives_a_stale_form_an_expired_session_and_a_bad_message_number(ui, rt, monkeypatch) -> None:
    store(rt, simulated(30, "v1:0.6", seed=1))
    _login(ui)
    r = ui.post("/ui/queue/claim", data={"csrf": _csrf(ui.get("/ui/queue").text)}, follow_redirects=False)
    url = r.headers["location"]
    cid = unquote(url.rsplit("/", 1)[1])
    typed = {"csrf": "from-an-old-tab", "body": "The refund went to the <i>wrong</i> card", "message_index": "2"}
    stale = ui.post(url + "/comment", data=typed)
    assert stale.status_code == 403 and "your comment was not added" in stale.text
    assert "The refund went to the &lt;i&gt;wrong&lt;/i&gt; card</textarea>" in stale.text
    assert '<option value="2" selected>' in stale.text
    bad = ui.post(url + "/comment", data={**typed, "csrf": _csrf(stale.text), "message_index": "x"})
    assert bad.status_code == 422 and "wrong&lt;/i&gt; card</textarea>" in bad.text
    _expire_session(ui, rt, monkeypatch)
    gone = ui.post(url + "/comment", data={**typed, "csrf": _csrf(bad.text)}, follow_redirects=False)
    assert gone.status_code == 401 and "your comment was not added" in gone.text
    assert "wrong&lt;/i&gt; card</textarea>" in gone.text and 'id="draft"' not in gone.text  # no label to carry
    back = ui.post(
        "/ui/login",
        data={
            "csrf": _csrf(gone.text),
            "api_key": "rita-key",
            "next": url,
            "draft_comment": typed["body"],
            "draft_comment_on": "2",
        },
        follow_redirects=False,
    )
    assert back.status_code == 200 and "Your comment was not added yet" in back.text
    assert "wrong&lt;/i&gt; card</textarea>" in back.text and 'id="draft-notice"' not in back.text
    added = ui.post(url + "/comment", data={**typed, "csrf": _csrf(back.text)}, follow_redirects=False)
    assert added.status_code == 303
    from tests.support.app import ADMIN

    said = ui.get(f"/v1/review/items/{quote(cid, safe='')}/comments", headers=ADMIN).json()
    assert [(c["body"], c["message_index"]) for c in said] == [(typed["body"], 2)]


def api_labels(ui, cid: str) -> list[dict]:  # type: ignore[no-untyped-def]
    from tests.support.app import ADMIN

    r = ui.get(f"/v1/review/items/{quote(unquote(cid), safe='')}", headers=ADMIN)
    return r.json()["labels"] if r.status_code == 200 else []


def test_forms_claim_label_and_next(ui, rt) -> None:
    store(rt, simulated(40, "v1:0.6", seed=1))
    _login(ui)
    token = _csrf(ui.get("/ui/queue").text)
    assert ui.post("/ui/queue/claim", data={}, follow_redirects=False).status_code == 403
    r = ui.post("/ui/queue/claim", data={"csrf": token}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/review/")
    url = r.headers["location"]
    page = ui.get(url)
    assert "Yours for" in page.text and 'id="label-form"' in page.text
    bad = ui.post(url + "/label", data={"csrf": token, "label": "confirmed_failure"})
    assert bad.status_code == 422 and "needs a category" in bad.text
    nxt = ui.post(
        url + "/label",
        data={
            "csrf": token,
            "label": "confirmed_failure",
            "category": "wrong_action",
            "notes": "<b>bold</b>",
            "next": "1",
        },
        follow_redirects=False,
    )
    assert nxt.status_code == 303 and nxt.headers["location"].endswith("?notice=labelled")
    next_url = nxt.headers["location"].split("?")[0]
    assert next_url != url
    again = ui.get(url)
    assert "&lt;b&gt;bold&lt;/b&gt;" in again.text and "<b>bold</b>" not in again.text
    assert "You labelled this confirmed failure (version 1)" in again.text
    done = ui.post(url + "/claim", data={"csrf": token}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"].endswith("notice=done")
    assert "This item is done" in ui.get(done.headers["location"]).text

    for action in ("extend", "release", "skip"):
        assert ui.post(next_url + f"/{action}", data={}).status_code == 403
    assert (
        ui.post(next_url + "/extend", data={"csrf": token}, follow_redirects=False)
        .headers["location"]
        .endswith("notice=extended")
    )
    released = ui.post(next_url + "/release", data={"csrf": token}, follow_redirects=False)
    assert released.headers["location"].endswith("notice=released")
    assert "Claim this item" in ui.get(next_url).text


def test_extending_an_item_claiming_another_gave_back_says_so_not_that_someone_holds_it(ui, rt) -> None:
    store(rt, simulated(30, "v1:0.6", seed=1))
    _login(ui)
    token = _csrf(ui.get("/ui/queue").text)
    first = ui.post("/ui/queue/claim", data={"csrf": token}, follow_redirects=False).headers["location"]
    # a second tab takes the next item: the first one goes back to the queue, held by nobody
    second = ui.post("/ui/queue/claim", data={"csrf": token}, follow_redirects=False).headers["location"]
    assert second != first
    for action in ("extend", "release"):
        r = ui.post(f"{first}/{action}", data={"csrf": token}, follow_redirects=False)
        assert r.headers["location"].endswith("notice=not_held"), r.headers["location"]
        page = ui.get(r.headers["location"]).text
        assert "You no longer hold this item" in page and "Someone else holds" not in page
        assert "Claim this item" in page


def test_skipping_a_conversation_outside_the_queue_is_a_404_page(ui, rt) -> None:
    convs = simulated(30, "v1:0.0", seed=5)
    store(rt, convs)
    with rt.sessions() as s:
        from vigil.store.models import ReviewItemRow

        queued = set(s.scalars(ReviewItemRow.__table__.select().with_only_columns(ReviewItemRow.conversation_id)))
    outside = next(c["conversation_id"] for c in convs if c["conversation_id"] not in queued)
    _login(ui)
    url = f"/ui/review/{quote(outside, safe='')}"
    token = _csrf(ui.get(url).text)
    r = ui.post(url + "/skip", data={"csrf": token, "next": "1"}, follow_redirects=False)
    assert r.status_code == 404 and "is not in the review queue" in r.text
    assert "text/html" in r.headers["content-type"] and f'href="{url}"' in r.text


def _handler_attributes(html: str) -> list[str]:
    """Attributes named on* of any tag, as a browser parses them (text inside a quoted value is no attribute)."""
    from html.parser import HTMLParser

    found: list[str] = []

    class Attrs(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            found.extend(f"{tag} {name}" for name, _ in attrs if name.lower().startswith("on"))

    Attrs().feed(html)
    return found


def test_hostile_transcript_is_escaped_and_pages_carry_a_csp(ui, rt) -> None:
    conv = xss_conversation()
    store(rt, [conv])
    _login(ui)
    for url in ("/ui/queue", f"/ui/review/{quote(conv['conversation_id'], safe='')}"):
        page = ui.get(url)
        assert page.status_code == 200
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        html = page.text
        for tag in ("<script>window", "<img", "<iframe", "<svg", '<a href="javascript'):
            assert tag not in html
        assert _handler_attributes(html) == []  # no event handler attribute in any tag
        assert len(re.findall(r"<script\b", html)) == 1  # the UI's own vigil.js
    assert "&lt;script&gt;window.__xss = 1; alert(1)&lt;/script&gt;" in html
    assert "{{ 7 * 7 }}" in html and ">49<" not in html
    for payload in XSS_PAYLOADS[:2]:
        assert payload not in html


def test_nav_is_data_driven_and_other_stages_can_extend_the_layout(sqlite_url, tmp_path) -> None:
    (tmp_path / "other_stage_page.html").write_text(
        '{% extends "base.html" %}{% block content %}<h1>Compare {{ who }}</h1>{% endblock %}'
    )
    router = APIRouter()

    @router.get("/ui/compare")
    def compare(request: Request, user: Principal = Depends(ui_user)):  # type: ignore[no-untyped-def]
        return render_page(request, "other_stage_page.html", title="Compare", who="<v1 vs v2>")

    rt = review_runtime(sqlite_url)
    rt.hooks.nav.append(("Compare", "/ui/compare"))
    rt.hooks.templates.append(tmp_path)
    rt.hooks.routers.append(router)
    try:
        with review_client(rt) as ui:
            _login(ui)
            page = ui.get("/ui/compare")
            assert "<h1>Compare &lt;v1 vs v2&gt;</h1>" in page.text
            assert re.findall(r'<a href="(/ui/[a-z]+)"', page.text)[:4] == [
                "/ui/queue",
                "/ui/progress",
                "/ui/clusters",
                "/ui/compare",
            ]
            assert 'class="active" aria-current="page">Compare' in page.text
    finally:
        rt.close()


def test_static_files_and_unknown_conversation(ui) -> None:
    assert ui.get("/ui/static/vigil.css").status_code == 200
    assert ui.get("/ui/static/..%2Fpages.py").status_code == 404
    assert ui.get("/ui/static/nope.js").status_code == 404
    _login(ui)
    assert ui.get("/ui/review/does-not-exist").status_code == 404
    assert ui.get("/ui/progress").status_code == 200
    assert "No confirmed failures yet" in ui.get("/ui/clusters").text
    assert ui.get("/v1/review/queue", headers=REVIEWER).status_code == 200


def test_double_review_is_blind_until_you_label(sqlite_url, tmp_path) -> None:
    policy = tmp_path / "flagging.yaml"
    policy.write_text("multi_review: {share: 1.0, reviewers: 2}\ntaxonomy: {wrong_action: x, other: y}\n")
    rt = review_runtime(sqlite_url, review_policy=str(policy))
    try:
        store(rt, simulated(30, "v1:0.6", seed=1))
        with review_client(rt) as ui:
            cid = ui.post("/v1/review/claim", headers=REVIEWER).json()["conversation_id"]
            ui.post(
                f"/v1/review/items/{cid}/labels",
                json={"label": "confirmed_failure", "category": "other", "notes": "rita's secret note"},
                headers=REVIEWER,
            )
            # a comment says what its author thinks as plainly as a label: hidden alike
            said = {"body": "clearly a wrong refund, rita thinks"}
            assert ui.post(f"/v1/review/items/{cid}/comments", json=said, headers=REVIEWER).status_code == 201
            raj = {"Authorization": "Bearer raj-key"}
            assert ui.get(f"/v1/review/items/{cid}/comments", headers=raj).json() == []
            assert len(ui.get(f"/v1/review/items/{cid}/comments", headers=REVIEWER).json()) == 1
            _login(ui, "raj-key")
            url = f"/ui/review/{quote(cid, safe='')}"
            page = ui.get(url).text
            assert "stay hidden until you save yours" in page and "rita&#39;s secret note" not in page
            assert "rita thinks" not in page and "1 comment by other reviewers hidden" in page
            assert "<b>rita</b> label" not in page  # nor, in the audit log, that rita labelled (as the API hides it)
            assert "(hidden until done)" in ui.get("/ui/queue").text
            token = _csrf(page)
            ui.post(url + "/label", data={"csrf": token, "label": "not_a_failure"})
            page = ui.get(url).text
            assert "rita&#39;s secret note" in page and "stay hidden" not in page
            assert "<b>rita</b> label" in page and "rita thinks" in page and "hidden until you give" not in page
            assert len(ui.get(f"/v1/review/items/{cid}/comments", headers=raj).json()) == 1
    finally:
        rt.close()


def test_logout_revokes_the_session_for_every_copy_of_the_cookie(ui, rt) -> None:
    from fastapi.testclient import TestClient

    from vigil.ui.models import UiSessionRow

    store(rt, simulated(5, "v1:0.6", seed=1))
    _login(ui)
    page = ui.get("/ui/queue")
    copied = ui.cookies.get(COOKIE)
    with rt.sessions() as s:
        [row] = s.query(UiSessionRow).all()
        assert row.key_name == "rita" and copied and row.id_hash not in copied  # only the id's hash is stored
    thief = TestClient(ui.app)
    thief.cookies.set(COOKIE, copied)
    assert thief.get("/ui/queue", follow_redirects=False).status_code == 200
    assert ui.post("/ui/logout", data={"csrf": _csrf(page.text)}, follow_redirects=False).status_code == 303
    with rt.sessions() as s:
        assert s.query(UiSessionRow).count() == 0
    # the copy made before log-out no longer claims, labels or reads
    assert thief.get("/ui/queue", follow_redirects=False).status_code == 303
    token = _csrf(page.text)
    assert thief.post("/v1/review/claim", headers={"X-CSRF-Token": token}).status_code == 401
    assert thief.get("/v1/review/queue").status_code == 401


def test_a_new_login_gets_a_new_session_id(ui, rt) -> None:
    _login(ui)
    first = ui.cookies.get(COOKIE)
    _login(ui)
    second = ui.cookies.get(COOKIE)
    assert first != second
    stale = type(ui)(ui.app)
    stale.cookies.set(COOKIE, first)
    assert stale.get("/ui/queue", follow_redirects=False).status_code == 303  # logging in again revoked it
    assert ui.get("/ui/queue", follow_redirects=False).status_code == 200


def test_login_errors_come_from_fixed_codes(ui) -> None:
    page = ui.get("/ui/login", params={"error": "bad_credentials"})
    assert "Unknown API key." in page.text
    for text in ("Your account is locked: call +1 555 0100", "<b>pwned</b>", "x" * 50):
        page = ui.get("/ui/login", params={"error": text})
        assert page.status_code == 200
        assert text not in page.text and "pwned" not in page.text and "locked" not in page.text
        assert 'role="alert"' not in page.text


@pytest.mark.parametrize(
    "url",
    [
        "/ui/queue?bulk=skip&done=abc",
        "/ui/queue?bulk=skip&left=1x",
        "/ui/queue?bulk=assign&done=-3&left=" + "9" * 5000,
        "/ui/clusters?notice=cluster_labelled&n=abc",
        "/ui/clusters?notice=cluster_labelled&left=1x",
        "/ui/clusters?notice=cluster_labelled&n=" + "9" * 5000,
        "/ui/clusters?notice=cluster_labelled&n=%D9%A3",  # an Arabic-Indic digit: isdigit, not a count
    ],
)
def test_a_notice_count_that_is_not_a_number_reads_as_zero(ui, url: str) -> None:  # type: ignore[no-untyped-def]
    _login(ui)
    r = ui.get(url)
    assert r.status_code == 200, r.text[:500]
    assert "The page failed" not in r.text


def test_claim_next_echoes_bounded_filters_into_its_redirect(ui, rt) -> None:
    """A 100 kB filter field came back whole in the Location header, and one holding NUL sent the browser
    to an address the NUL guard refuses with JSON."""
    store(rt, simulated(5, "v1:0.6", seed=1))
    _login(ui)
    token = _csrf(ui.get("/ui/queue").text)
    r = ui.post("/ui/queue/claim", data={"csrf": token, "agent": "x" * 100_000}, follow_redirects=False)
    assert r.status_code == 303 and len(r.headers["location"]) < 600
    assert r.headers["location"].startswith("/ui/queue?agent=xxx") and "notice=empty" in r.headers["location"]
    r = ui.post("/ui/queue/claim", data={"csrf": token, "agent": "a\x00b", "version": "v9"}, follow_redirects=False)
    assert r.status_code == 303 and "%00" not in r.headers["location"] and "version=v9" in r.headers["location"]
    assert ui.get(r.headers["location"]).status_code == 200


@pytest.mark.parametrize("url", ["/ui/queue?agent=a%00b", "/ui/conversations?id=%00", "/ui/review/ab%00cd"])
def test_a_nul_in_a_page_address_gets_the_400_page_not_the_apis_json(ui, url: str) -> None:
    """The NUL guard answered every path with the API's JSON: a browser showed ``{"detail": ...}`` for a
    page, where the console's other unreadable parameters get a 400 page with links home and to the queue."""
    _login(ui)
    r = ui.get(url)
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("text/html")
    assert "NUL" in r.text and '<a href="/ui">Home</a>' in r.text and '"detail"' not in r.text
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    api = ui.get("/v1/review/queue?agent=a%00b", headers=REVIEWER)
    assert api.status_code == 400 and "NUL" in api.json()["detail"]


def test_characters_that_draw_nothing_or_turn_text_are_shown_as_marks(ui, rt) -> None:
    # a reviewer decides on what the page shows: a right-to-left override drew "refund $05" as "50$ dnufer"
    # the wrong way round, a terminal colour code's ESC drew nothing
    conv = {
        "conversation_id": "bidi-1",
        "agent_id": "support-bot",
        "agent_version": "v1",
        "messages": [
            {"role": "user", "content": "Please refund my order."},
            {"role": "assistant", "content": "I issued a refund of \u202e$05\u202c <b>today</b>."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "refund\u2066", "arguments": '{"a": 1}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "\x1b[31mdone\x1b[0m"},
            {"role": "assistant", "content": "Done 👨\u200d👩\u200d👧 family refund."},
        ],
    }
    store(rt, [conv])
    _login(ui)
    html = ui.get("/ui/review/bidi-1").text
    for raw in ("\u202e", "\u202c", "\u2066", "\x1b"):
        assert raw not in html
    assert 'refund of <span class="ctl" title="U+202E RIGHT-TO-LEFT OVERRIDE">U+202E</span>' in html
    assert '<span class="ctl" title="U+202C POP DIRECTIONAL FORMATTING">U+202C</span> &lt;b&gt;today' in html
    assert 'title="U+001B ESCAPE">U+001B</span>[31mdone' in html
    assert 'refund<span class="ctl" title="U+2066 LEFT-TO-RIGHT ISOLATE">' in html  # in a tool's name too
    assert "&lt;b&gt;today&lt;/b&gt;" in html  # still escaped
    assert "👨\u200d👩\u200d👧" in html  # joiners are drawn as they are: emoji need them
    note = re.search(r'id="hidden-note">(.*?)</p>', html)
    assert note and "holds 5 characters that draw nothing" in note.group(1)
    # a conversation with none of them (stored here: unstored, the page was a 404 and this proved nothing)
    store(rt, [xss_conversation()])
    plain = ui.get(f"/ui/review/{quote(xss_conversation()['conversation_id'], safe='')}")
    assert plain.status_code == 200 and "Transcript" in plain.text and 'id="hidden-note"' not in plain.text


def test_reviewers_notes_ids_and_reasons_are_shown_with_marks_too(ui, rt) -> None:
    # a comment was drawn with marks while the same text as a label's notes or expected behaviour, a manual
    # reason's note or an id was drawn raw: "$05" read as "50$" in the label history
    text = "refund of $\u202e05\u202c ok \x1b[31m"
    cid = "bidi-\u202eid"
    conv = {
        "conversation_id": cid,
        "agent_id": "support-bot",
        "agent_version": "v\u202e1",
        "task_id": "task\u202e7",
        "messages": [{"role": "user", "content": "Please refund."}, {"role": "assistant", "content": "Done."}],
    }
    store(rt, [conv])
    raj = {"Authorization": "Bearer raj-key"}
    item = ui.post("/v1/review/items", json={"conversation_id": cid, "note": text}, headers=raj)
    assert item.status_code == 201, item.text
    body = {"label": "not_a_failure", "notes": text, "expected_behavior": text}
    assert ui.post(f"/v1/review/items/{quote(cid, safe='')}/labels", json=body, headers=raj).status_code == 201
    _login(ui)
    html = ui.get(f"/ui/review/{quote(cid, safe='')}").text
    history = re.search(r'<ol class="history">(.*?)</ol>', html, re.S)
    reasons = re.search(r'<ul class="reasons-list">(.*?)</ul>', html, re.S)
    title = re.search(r'<h1 class="cid-title">(.*?)</h1>\s*<p class="muted">(.*?)</p>', html, re.S)
    assert history and reasons and title
    for part in (history.group(1), reasons.group(1), title.group(1), title.group(2)):
        assert "\u202e" not in part and "\x1b" not in part
        assert 'title="U+202E RIGHT-TO-LEFT OVERRIDE">U+202E</span>' in part
    assert history.group(1).count('title="U+001B ESCAPE">U+001B</span>[31m') == 2  # notes and expected
    queue = ui.get("/ui/queue", params={"status": "all"}).text
    row = re.search(r'<a class="cid" href="[^"]*">(.*?)</a>', queue)
    assert row and row.group(1) == 'bidi-<span class="ctl" title="U+202E RIGHT-TO-LEFT OVERRIDE">U+202E</span>id'


def _cancelled(cid: str) -> dict[str, Any]:
    """Revision 1 of a short conversation; tests store a revision 2 of other text over it."""
    return {
        "conversation_id": cid,
        "revision": 1,
        "agent_id": "support-bot",
        "agent_version": "v1",
        "messages": [{"role": "user", "content": "Cancel order 1."}, {"role": "assistant", "content": "Done."}],
    }


def test_a_newer_revision_sends_a_labelled_item_back_to_the_queue(ui, rt) -> None:
    # the label was given on what the reviewer read; revision 2 is other text, so the item needs a new label
    # and the page says why the old one no longer counts
    conv = _cancelled("rev-1")
    store(rt, [conv])
    body = {"label": "confirmed_failure", "category": "wrong_action"}
    assert ui.post("/v1/review/items/rev-1/labels", json=body, headers=REVIEWER).status_code == 201
    assert ui.get("/v1/review/items/rev-1", headers=REVIEWER).json()["state"] == "done"
    assert ui.get("/v1/review/clusters", headers=REVIEWER).json()["total"] == 1
    store(rt, [{**conv, "revision": 2, "messages": [{"role": "user", "content": "Opening hours?"}]}])
    item = ui.get("/v1/review/items/rev-1", headers=REVIEWER).json()
    assert (item["state"], item["review_count"], item["labels"]) == ("available", 0, [])
    with rt.sessions() as s:  # the API's clusters are kept up to 30 s; what they are computed from:
        assert failures.clusters(s)["total"] == 0
    assert ui.get("/v1/review/labels", headers=REVIEWER).json() == []
    assert ui.post("/v1/review/claim", headers=REVIEWER).json()["conversation_id"] == "rev-1"  # offered again
    _login(ui)
    html = ui.get("/ui/review/rev-1").text
    assert "Labelled on revision 1; the conversation is now at revision 2." in html
    # storing revision 2 again changes nothing; a label on it counts
    store(rt, [{**conv, "revision": 2, "messages": [{"role": "user", "content": "Opening hours?"}]}])
    again = ui.post("/v1/review/items/rev-1/labels", json={"label": "not_a_failure"}, headers=REVIEWER)
    assert again.status_code == 201
    item = ui.get("/v1/review/items/rev-1", headers=REVIEWER).json()
    assert item["state"] == "done" and [lab["revision"] for lab in item["labels"]] == [2]


def test_visible_escapes_and_marks_only_what_draws_nothing() -> None:
    from vigil.ui.visible import visible

    assert str(visible("a <b> & 'c'")) == "a &lt;b&gt; &amp; &#39;c&#39;"
    assert str(visible(None)) == ""
    assert str(visible("tab\there\nnew line\r\n")) == "tab\there\nnew line\r\n"
    assert str(visible("x\x85y\x00")) == (
        'x<span class="ctl" title="U+0085 control character">U+0085</span>y'
        '<span class="ctl" title="U+0000 NULL">U+0000</span>'
    )
    assert str(visible("عربي\u061c")).endswith('title="U+061C ARABIC LETTER MARK">U+061C</span>')


def test_a_label_of_a_revision_no_longer_stored_is_refused_and_the_page_sends_what_it_showed(ui, rt) -> None:
    """The label form carried no revision: a reviewer reading revision 1 who saved after revision 2 arrived
    (a growing conversation) had the label stamped with revision 2, content they never read, and it
    counted for export and calibration. The page sends the revision it showed; another one is a 409."""
    conv = _cancelled("rev-read")
    store(rt, [conv])
    _login(ui)
    page = ui.get("/ui/review/rev-read").text
    assert '<input type="hidden" name="revision" value="1">' in page
    store(rt, [{**conv, "revision": 2, "messages": [{"role": "user", "content": "Opening hours?"}]}])
    body = {"label": "confirmed_failure", "category": "wrong_action", "revision": 1}
    r = ui.post("/v1/review/items/rev-read/labels", json=body, headers=REVIEWER)
    assert r.status_code == 409 and "you read revision 1, it is now at revision 2" in r.json()["detail"]
    assert ui.get("/v1/review/labels", headers=REVIEWER).json() == []
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    form = {"csrf": csrf, "revision": "1", "label": "confirmed_failure", "category": "wrong_action"}
    r = ui.post("/ui/review/rev-read/label", data=form)
    assert r.status_code == 409 and "you read revision 1, it is now at revision 2" in r.text
    assert ui.get("/v1/review/labels", headers=REVIEWER).json() == []
    ok = ui.post("/v1/review/items/rev-read/labels", json={**body, "revision": 2}, headers=REVIEWER)
    assert ok.status_code == 201 and ok.json()["revision"] == 2


def test_a_revision_field_that_is_no_ascii_number_is_ignored_not_a_500(ui, rt) -> None:
    """'²' is a digit to str.isdigit but not to int(): the label form answered 500."""
    conv = _cancelled("rev-odd")
    store(rt, [conv])
    _login(ui)
    page = ui.get("/ui/review/rev-odd").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    form = {"csrf": csrf, "revision": "²", "label": "not_a_failure"}
    r = ui.post("/ui/review/rev-odd/label", data=form, follow_redirects=False)
    assert r.status_code in (302, 303), (r.status_code, r.text[:300])
    assert [lab["label"] for lab in ui.get("/v1/review/labels", headers=REVIEWER).json()] == ["not_a_failure"]


def test_a_queue_page_past_the_end_says_so_and_links_back(ui, rt) -> None:
    """``?page=99`` of a one-page queue said "Nothing here" above no pager, as if the queue were empty."""
    store(rt, simulated(40, "v1:0.6", seed=5))
    _login(ui)
    first = ui.get("/ui/queue").text
    assert 'class="cid"' in first
    past = ui.get("/ui/queue", params={"page": 99, "agent": "support-bot"}).text
    assert 'class="cid"' not in past and "Nothing here" not in past
    assert "Page 99 is past the end" in past
    assert 'href="/ui/queue?agent=support-bot&amp;status=open&amp;page=1"' in past
    empty = ui.get("/ui/queue", params={"agent": "nobody"}).text
    assert "Nothing here" in empty and "past the end" not in empty


def test_a_queue_page_deeper_than_numbered_pages_says_so_and_older_goes_on_by_keyset(sqlite_url: str) -> None:
    """``?page=`` past ``list_max_offset`` showed the deepest numbered page under the number asked for, and
    that page's *Older* link led to itself: the rest of the queue could not be reached from the UI."""
    rt = review_runtime(sqlite_url, list_max_offset=100)  # pages 1 to 3 by number, 50 items each
    try:
        store(rt, simulated(400, "v1:0.9", seed=3))
        with review_client(rt) as ui:
            _login(ui)
            open_items = ui.get("/v1/review/queue", params={"limit": 500}, headers=REVIEWER).json()
            assert open_items["total"] > 200
            order = [it["conversation_id"] for it in open_items["items"]]

            deep = ui.get("/ui/queue", params={"page": 4})
            assert deep.status_code == 400, deep.status_code
            assert 'class="cid"' not in deep.text
            assert "Page 4 is past the deepest numbered page (3)" in deep.text
            assert 'href="/ui/queue?status=open&amp;page=3"' in deep.text
            assert ui.get("/ui/queue", params={"page": 0}).status_code == 400

            third = ui.get("/ui/queue", params={"page": 3}).text
            older = re.search(r'<a href="(/ui/queue\?[^"]*)">Older', third)
            assert older, "no Older link on the deepest numbered page"
            url = older.group(1).replace("&amp;", "&")
            assert "cursor=" in url and "page=" not in url
            fourth = ui.get(url)
            assert fourth.status_code == 200
            shown = re.findall(r'href="/ui/review/([^"?]+)"', fourth.text)
            assert [unquote(c) for c in dict.fromkeys(shown)][:50] == order[150:200]
            assert "past page 3" in fourth.text
            assert ui.get("/ui/queue", params={"cursor": "nonsense"}).status_code == 400
            by_agent = ui.get("/ui/queue", params={"page": 3, "sort": "agent"}).text
            assert "Older" not in by_agent and "deepest numbered page of a sorted list" in by_agent
    finally:
        rt.close()


def test_every_claim_the_ui_makes_is_counted_in_the_claims_metric(ui, rt) -> None:
    """*Save & next*, *Skip & next* and a conversation page's *Claim* each claim an item, yet only the
    queue's *Claim next* counted in ``vigil_review_claims_total``: the metric saw a fraction of the claims
    the audit log holds (a reviewer working through the queue with *Save & next* counted once)."""
    store(rt, simulated(40, "v1:0.6", seed=5))
    _login(ui)

    def claims(result: str = "claimed") -> float:
        m = re.search(rf'^vigil_review_claims_total{{result="{result}"}} (\S+)$', ui.get("/metrics").text, re.M)
        return float(m.group(1)) if m else 0.0

    first = ui.post("/ui/queue/claim", data={"csrf": _csrf(ui.get("/ui/queue").text)}, follow_redirects=False)
    page = ui.get(first.headers["location"]).text
    cid = unquote(first.headers["location"].split("?")[0].removeprefix("/ui/review/"))
    form = {"csrf": _csrf(page), "revision": "1", "label": "not_a_failure", "next": "1"}
    saved = ui.post(f"/ui/review/{quote(cid, safe='')}/label", data=form, follow_redirects=False)
    nxt = unquote(saved.headers["location"].split("?")[0].removeprefix("/ui/review/"))
    assert nxt != cid
    skipped = ui.post(
        f"/ui/review/{quote(nxt, safe='')}/skip", data={"csrf": _csrf(page), "next": "1"}, follow_redirects=False
    )
    third = unquote(skipped.headers["location"].split("?")[0].removeprefix("/ui/review/"))
    assert third not in (cid, nxt)
    ui.post(f"/ui/review/{quote(third, safe='')}/release", data={"csrf": _csrf(page)})
    ui.post(f"/ui/review/{quote(third, safe='')}/claim", data={"csrf": _csrf(page)})
    audit = ui.get("/v1/review/audit", params={"actor": "rita", "action": "claim"}, headers=ADMIN).json()
    assert len(audit) == 4
    assert claims() == 4.0


def _version_of(rt, url: str) -> str:  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from vigil.store.models import ReviewItemRow

    cid = unquote(url.split("?")[0].removeprefix("/ui/review/"))
    with rt.sessions() as s:
        return str(s.scalar(select(ReviewItemRow.agent_version).where(ReviewItemRow.conversation_id == cid)))


def test_skip_and_next_says_the_item_was_skipped(ui, rt) -> None:
    """*Skip & next* opened the next item with no word of what happened to the skipped one, where
    *Save & next* says "Saved"."""
    store(rt, simulated(40, "v1:0.6", seed=5))
    _login(ui)
    first = ui.post("/ui/queue/claim", data={"csrf": _csrf(ui.get("/ui/queue").text)}, follow_redirects=False)
    url = first.headers["location"].split("?")[0]
    page = ui.get(url).text
    assert 'id="toast"' not in page
    r = ui.post(url + "/skip", data={"csrf": _csrf(page), "next": "1"}, follow_redirects=False)
    nxt = r.headers["location"]
    assert nxt.startswith("/ui/review/") and nxt.split("?")[0] != url
    assert 'class="toast" id="toast" role="status">Skipped: this is the next item<' in ui.get(nxt).text


def test_save_and_next_and_skip_claim_from_the_queue_the_reviewer_filtered(ui, rt) -> None:
    """Claim next from a queue filtered to one version, then "Save & next" (or "Skip") claimed the next
    item of the whole queue: the reviewer was thrown into the other version's items."""
    store(rt, simulated(80, "v1.4.0:0.5,v1.5.0:0.5", seed=3))
    _login(ui)
    token = _csrf(ui.get("/ui/queue").text)
    url = ui.post("/ui/queue/claim", data={"csrf": token, "version": "v1.4.0"}, follow_redirects=False)
    url = url.headers["location"]
    seen = [_version_of(rt, url)]
    page = ui.get(url).text
    assert "filtered to version v1.4.0" in page
    assert '<input type="hidden" name="version" value="v1.4.0">' in page  # "Next item" keeps the filter too
    # the "Queue" crumb atop the page goes back to the filtered queue, not the whole one
    assert 'id="crumb-queue" href="/ui/queue?version=v1.4.0"' in page
    for _ in range(4):
        r = ui.post(
            url.split("?")[0] + "/label",
            data={"csrf": token, "label": "not_a_failure", "next": "1"},
            follow_redirects=False,
        )
        url = r.headers["location"]
        assert url.startswith("/ui/review/"), url
        seen.append(_version_of(rt, url))
    r = ui.post(url.split("?")[0] + "/skip", data={"csrf": token, "next": "1"}, follow_redirects=False)
    seen.append(_version_of(rt, r.headers["location"]))
    assert set(seen) == {"v1.4.0"}, seen
    # claiming from the unfiltered queue forgets the filter
    ui.post("/ui/queue/claim", data={"csrf": token}, follow_redirects=False)
    assert "filtered to" not in ui.get(r.headers["location"].split("?")[0]).text


def test_a_queue_filter_no_item_can_have_says_so_instead_of_an_empty_queue(ui, rt) -> None:
    """/ui/queue?severity=hihg listed nothing, as if nothing were flagged; claiming with it said the queue
    was empty. Both now lead to a 400 page naming the value and the known ones."""
    store(rt, simulated(30, "v1:0.6", seed=1))
    _login(ui)
    r = ui.get("/ui/queue", params={"severity": "hihg"})
    assert r.status_code == 400, r.text
    assert "hihg" in r.text and "critical" in r.text
    r = ui.post(
        "/ui/queue/claim", data={"csrf": _csrf(ui.get("/ui/queue").text), "reason": "findings"}, follow_redirects=False
    )
    assert r.status_code == 303 and "/ui/review/" not in r.headers["location"]  # nothing claimed
    page = ui.get(r.headers["location"])
    assert page.status_code == 400 and "findings" in page.text and "judge_fail" in page.text
    assert ui.get("/ui/queue", params={"severity": "High"}).status_code == 200


def test_every_finding_says_what_its_rule_checks(ui, rt) -> None:
    """A pii-in-reply or tool-errors finding showed no "what it checks" line: their rules had no description."""
    from sqlalchemy import select

    from vigil.store.models import FindingRow

    store(rt, simulated(60, "v1.5.0:0.8", seed=2))
    with rt.sessions() as s:
        found = s.execute(
            select(FindingRow.conversation_id, FindingRow.rule_id)
            .where(FindingRow.rule_id.in_(["pii-in-reply", "tool-errors", "user-repeated", "empty-or-truncated"]))
            .limit(200)
        ).all()
    shown: dict[str, str] = dict((rule, cid) for cid, rule in found)
    assert {"pii-in-reply", "tool-errors"} <= set(shown)
    _login(ui)
    for rule, cid in shown.items():
        html = ui.get(f"/ui/review/{quote(cid, safe='')}").text
        described = next(r.description for r in rt.rules.rules if r.id == rule)
        assert f'class="small muted rule-description">{escape(described)}</div>' in html, rule


def test_a_finding_says_what_its_rule_checks_and_links_to_the_rules_conversations_and_chart(ui, rt) -> None:
    """A finding showed only the rule's id: what the rule checks, its other conversations and its rate
    over time were each a search away from the page a reviewer reads it on."""
    from sqlalchemy import select

    from vigil.store.models import FindingRow

    store(rt, simulated(40, "v1.5.0:0.6", seed=1))
    with rt.sessions() as s:
        cid, agent, version, rule = s.execute(
            select(FindingRow.conversation_id, FindingRow.agent_id, FindingRow.agent_version, FindingRow.rule_id)
            .where(FindingRow.rule_id == "no-cancel-delivered-order")
            .limit(1)
        ).one()
    _login(ui)
    html = ui.get(f"/ui/review/{quote(cid, safe='')}").text
    described = next(r.spec.description for r in rt.rules.rules if r.id == rule)
    assert described and f'class="small muted rule-description">{described}</div>' in html
    listed = "/ui/conversations?" + urlencode({"agent": agent, "version": version, "rule": rule})
    chart = "/ui/quality?" + urlencode({"agent": agent, "version": version}) + f"#signal-rule-{rule}"
    assert f'class="rule-conversations" href="{listed.replace("&", "&amp;")}"' in html
    assert f'class="rule-chart" href="{chart.replace("&", "&amp;")}"' in html


def test_counts_on_the_conversation_page_agree_with_their_number(ui, rt) -> None:
    """ "1 tool calls · 1 tool errors": each count now takes its noun in the singular for one."""
    conv = xss_conversation("one-of-each")
    store(rt, [conv])
    _login(ui, "admin-key")
    page = ui.get("/ui/review/one-of-each")
    assert page.status_code == 200
    text = re.sub(r"<[^>]+>", "", page.text)
    assert "5 messages" in text and re.search(r"\b1 tool call\b", text) and "1 tool error" in text
    assert "1 tool calls" not in text and "1 tool errors" not in text


def test_counts_read_with_thousands_separators() -> None:
    from vigil.ui.render import count_of, thousands

    assert (
        thousands(2804) == "2,804" and thousands(7) == "7" and thousands(True) == "True" and thousands(None) == "None"
    )
    assert count_of(1, "tool error") == "1 tool error"
    assert count_of(0, "finding") == "0 findings"
    assert count_of(12345, "message") == "12,345 messages"
    assert count_of(2, "entry", "entries") == "2 entries"
