"""The compare page in the reviewer UI: over HTTP, and in a real headless Chromium."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import make_settings, served
from tests.support.browser import ARGS, CHROMIUM, sign_in
from tests.support.services import missing
from tests.support.traffic import cheaper, clean, with_defect
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.schema import Conversation


def loaded_runtime(url: str):  # type: ignore[no-untyped-def]
    rt = wire(
        build_runtime(make_settings(url, compare_bootstrap_resamples=200), registry=CollectorRegistry()),
        {"api"},
    )
    base = clean(200, "v1", 1)
    cand = cheaper(clean(180, "v2", 2) + with_defect(20, "v2", "cancel_delivered", 3))
    for batch in (base, cand):
        rt.pipeline.process([Conversation.model_validate(c) for c in batch], "test")
    return rt


def test_compare_page_over_http(sqlite_url) -> None:
    from fastapi.testclient import TestClient

    from vigil.app.server import build_app

    rt = loaded_runtime(sqlite_url)
    with TestClient(build_app(rt)) as ui:
        r = ui.get("/ui/compare", follow_redirects=False)
        assert r.status_code == 303 and "/ui/login" in r.headers["location"]
        page = ui.get("/ui/login")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        ui.post("/ui/login", data={"csrf": token, "api_key": "rita-key", "next": "/ui/compare"})
        html = ui.get("/ui/compare").text
        assert 'href="/ui/compare"' in html and "Compare" in html
        # one agent: the newest two versions are picked
        assert 'data-signal="forbidden_tool" data-verdict="worse" class="flagged"' in html
        assert "Red flags" in html and "0.0% → 10.0%" in html
        assert "Holm" in html and "p<sub>adj</sub>" in html
        other = ui.get("/ui/compare", params={"agent": "support-bot", "baseline": "v1", "candidate": "v9"}).text
        assert "no agent has conversations of both" not in other and "no finished conversations" in other
    rt.close()


def logged_in(ui):  # type: ignore[no-untyped-def]
    page = ui.get("/ui/login")
    token = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    ui.post("/ui/login", data={"csrf": token, "api_key": "rita-key", "next": "/ui/compare"})
    return ui


def test_conversations_behind_a_row_paged_past_the_end_say_so(sqlite_url) -> None:
    from fastapi.testclient import TestClient

    from vigil.app.server import build_app

    rt = loaded_runtime(sqlite_url)
    params = {"agent": "support-bot", "version": "v2", "signal": "forbidden_tool"}
    with TestClient(build_app(rt)) as ui:
        api = ui.get("/v1/compare/conversations", params=params, headers={"Authorization": "Bearer rita-key"})
        first = api.json()
        assert first["total"] == 20 and not first["more"] and not first["past_end"]
        for offset in (20, 10_000, 2_147_483_647):
            r = ui.get(
                "/v1/compare/conversations",
                params={**params, "offset": offset},
                headers={"Authorization": "Bearer rita-key"},
            )
            body = r.json()
            # no count is made up from the offset, and no next page is offered
            assert body["conversations"] == [] and body["total"] is None, body
            assert body["past_end"] and not body["more"]
        html = logged_in(ui).get("/ui/compare/conversations", params={**params, "offset": 10_000}).text
        assert "past the last conversation" in html and "10000 conversations" not in html
        assert "offset=0" in html  # the way back
    rt.close()


def test_conversations_behind_a_row_lead_on_to_the_queue_chart_and_alerts(sqlite_url) -> None:
    """The list of a row's conversations was a dead end: no way on to its queue, chart or alerts but the
    browser's back button and the top menu, and a rule's row did not say what the rule checks."""
    from urllib.parse import urlencode

    from fastapi.testclient import TestClient

    from vigil.app.server import build_app

    rt = loaded_runtime(sqlite_url)
    rule = "no-cancel-delivered-order"
    params = {"agent": "support-bot", "version": "v2", "signal": f"rule:{rule}"}
    with TestClient(build_app(rt)) as ui:
        html = logged_in(ui).get("/ui/compare/conversations", params=params).text
        onward = re.findall(r'<a class="button (to-[a-z]+)" href="([^"]+)"', html)
        hrefs = {k: v.replace("&amp;", "&") for k, v in onward}
        assert hrefs == {
            "to-queue": "/ui/queue?" + urlencode({**params, "rule": rule}),
            "to-chart": "/ui/quality?agent=support-bot&version=v2#signal-rule-" + rule,
            "to-alerts": "/ui/alerts?" + urlencode(params),
        }
        for href in hrefs.values():
            assert ui.get(href.split("#")[0]).status_code == 200, href
        described = next(r.spec.description for r in rt.rules.rules if r.id == rule)
        assert f'id="rule-description">The rule: {described}</p>' in html
    rt.close()


def test_versions_stored_together_order_by_name_and_an_agent_is_picked(sqlite_url) -> None:
    """As in the demo: two versions first stored in one batch; and a second agent stored earlier."""
    from fastapi.testclient import TestClient

    from vigil.app.server import build_app

    rt = wire(
        build_runtime(make_settings(sqlite_url, compare_bootstrap_resamples=200), registry=CollectorRegistry()),
        {"api"},
    )
    older = clean(30, "v1", 5) + clean(30, "v2", 6)
    for c in older:
        c["agent_id"] = "billing-bot"
    rt.pipeline.process([Conversation.model_validate(c) for c in older], "test")
    together = clean(40, "v1.5.0", 7) + clean(40, "v1.4.0", 8)
    rt.pipeline.process([Conversation.model_validate(c) for c in together], "test")
    with TestClient(build_app(rt)) as ui:
        html = logged_in(ui).get("/ui/compare").text
        assert '<option value="support-bot" selected>' in html
        assert "baseline <b>v1.4.0</b>" in html and "candidate <b>v1.5.0</b>" in html
        other = ui.get("/ui/compare", params={"agent": "billing-bot"}).text
        assert "baseline <b>v1</b>" in other and "candidate <b>v2</b>" in other
    rt.close()


def test_an_agent_with_one_version_is_not_the_default_and_says_why_nothing_compares(sqlite_url) -> None:
    """After importing a benchmark run as its own agent (one version, stored last), /ui/compare opened on
    that agent and showed an empty page; picking the other agent then sent the first one's version as
    both sides and was refused."""
    from fastapi.testclient import TestClient

    from vigil.app.server import build_app

    rt = loaded_runtime(sqlite_url)
    solo = clean(20, "tau2-gpt41", 9)
    for c in solo:
        c["agent_id"] = "tau2-retail"
    rt.pipeline.process([Conversation.model_validate(c) for c in solo], "test")
    with TestClient(build_app(rt)) as ui:
        html = logged_in(ui).get("/ui/compare").text
        assert '<option value="support-bot" selected>' in html
        assert "baseline <b>v1</b>" in html and "candidate <b>v2</b>" in html
        one = ui.get("/ui/compare", params={"agent": "tau2-retail"}).text
        assert "tau2-retail has one version (tau2-gpt41): nothing to compare it with yet." in one
        unknown = ui.get("/ui/compare", params={"agent": "<b>nobody</b>"}).text
        assert "No conversations of agent &lt;b&gt;nobody&lt;/b&gt; are stored" in unknown
        switched = ui.get(
            "/ui/compare", params={"agent": "support-bot", "baseline": "tau2-gpt41", "candidate": "tau2-gpt41"}
        ).text
        assert "compared with itself" not in switched
        assert "baseline <b>v1</b>" in switched and "candidate <b>v2</b>" in switched
    rt.close()


@pytest.mark.browser
def test_compare_page_in_a_browser(sqlite_url) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("python playwright")
    if not Path(CHROMIUM).exists():
        missing(f"Chromium at {CHROMIUM}")

    rt = loaded_runtime(sqlite_url)
    with served(rt, close=True) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = sign_in(browser.new_page(), base, "/ui/compare")
        page.select_option("select[name=baseline]", "v2")
        page.select_option("select[name=candidate]", "v1")
        page.click("#compare-form button[type=submit]")
        page.wait_for_url(re.compile(r".*baseline=v2.*candidate=v1.*"))
        row = page.locator('tr[data-signal="forbidden_tool"]')
        assert row.get_attribute("data-verdict") == "better"
        assert page.locator('tr[data-signal="cost_usd"]').get_attribute("data-verdict") == "worse"
        assert page.locator("#red-flags").count() == 1  # cost got worse while forbidden tools improved
        assert page.locator("nav.nav a", has_text="Compare").get_attribute("aria-current") == "page"
        browser.close()


@pytest.mark.browser
def test_compare_headline_order_folding_and_links_in_a_browser(sqlite_url) -> None:
    """The headline counts, worse rows first, 0-vs-0 rows folded, pp and money, links to the conversations."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("python playwright")
    if not Path(CHROMIUM).exists():
        missing(f"Chromium at {CHROMIUM}")

    rt = loaded_runtime(sqlite_url)
    with served(rt, close=True) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = sign_in(browser.new_page(viewport={"width": 1280, "height": 800}), base, "/ui/compare")
        headline = page.locator("#headline")
        assert headline.is_visible()
        worse = int(headline.get_attribute("data-worse") or "0")
        assert worse >= 2 and headline.inner_text().startswith(f"v2 vs v1: {worse} signals worse, ")
        assert headline.inner_text().endswith(f"{headline.get_attribute('data-red-flags')} red flags")
        verdicts = page.locator("#compare-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.verdict)")
        assert verdicts[:worse] == ["worse"] * worse and "worse" not in verdicts[worse:]
        assert page.locator("#compare-table tbody tr").first.get_attribute("class") == "flagged"
        # rates that are 0 on both sides are folded, not rows
        folded = page.locator("#folded li")
        assert folded.count() >= 1
        zero = folded.first.get_attribute("data-signal")
        assert page.locator(f'#compare-table tr[data-signal="{zero}"]').count() == 0
        forbidden = page.locator('tr[data-signal="forbidden_tool"]')
        assert forbidden.locator("td.diff").inner_text().startswith("+10.0 pp")
        cost = page.locator('tr[data-signal="cost_usd"]')
        assert re.match(r"\$0\.0\d", cost.locator("a.behind").first.inner_text())
        assert "e-0" not in cost.inner_text()
        # a row's candidate figure leads to the conversations behind it, and on to one of them
        forbidden.locator('a.behind[data-behind="candidate"]').click()
        page.wait_for_url(re.compile(r".*/ui/compare/conversations\?.*signal=forbidden_tool.*"))
        assert page.locator("#behind tbody tr").count() == 20
        assert "conversations with a forbidden tool call" in page.locator("h1").inner_text()
        page.locator("#behind tbody tr a").first.click()
        page.wait_for_url(re.compile(r".*/ui/review/.*"))
        # a version compared with itself is refused with a message
        page.goto(f"{base}/ui/compare?agent=support-bot&baseline=v2&candidate=v2")
        assert "compared with itself" in page.locator("#compare-error").inner_text()
        assert page.locator("#compare-table").count() == 0
        browser.close()
