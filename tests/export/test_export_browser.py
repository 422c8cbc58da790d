"""The export page in headless Chromium: after *Download JSONL* the file downloads and the page lists the run it
made, pending, with the button that marks it saved. A plain form post left the page as it was: "No exports
yet" after the first download, and no way to mark a run saved short of reloading the page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.app import served
from tests.support.browser import ARGS, CHROMIUM, sign_in
from tests.support.console import console_runtime
from tests.support.review import simulated, store
from tests.support.services import missing

pytestmark = pytest.mark.browser


@pytest.fixture
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("python playwright")
    if not Path(CHROMIUM).exists():
        missing(f"Chromium at {CHROMIUM}")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


def test_after_a_download_the_page_lists_the_pending_run_to_mark_saved(browser, sqlite_url: str) -> None:
    rt = console_runtime(sqlite_url)
    convs = simulated(6, "v1.4.0:0.9", seed=5)
    store(rt, convs)
    with served(rt, close=True) as base:
        with httpx.Client(base_url=base, headers={"Authorization": "Bearer rita-key"}) as api:
            for c in convs[:3]:
                sent = {"label": "confirmed_failure", "category": "policy_violation"}
                assert api.post(f"/v1/review/items/{c['conversation_id']}/labels", json=sent).status_code == 201
        context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
        page = sign_in(context.new_page(), base, "/ui/export", "admin-key")
        assert page.locator("#no-exports").count() == 1
        with page.expect_download() as download:
            page.click("#export-form button[type=submit]")
        assert download.value.suggested_filename.startswith("vigil-native-run1-")
        page.wait_for_url(f"{base}/ui/export?run=1")
        assert page.locator("#no-exports").count() == 0
        notice = page.locator("#exported").inner_text()
        assert "Run 1" in notice and "3 tasks" in notice and "mark" in notice
        row = page.locator("tr[data-run='1']")
        assert row.get_attribute("data-state") == "pending"
        row.locator("button", has_text="mark exported").click()
        page.wait_for_url(f"{base}/ui/export")
        assert page.locator("tr[data-run='1']").get_attribute("data-state") == "done"
        context.close()
