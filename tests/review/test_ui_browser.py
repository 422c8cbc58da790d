"""The reviewer UI in a real headless Chromium against a real uvicorn server.

Screenshots go to ``test-artifacts/`` (look at them when the UI changes).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest

from tests.support.app import served
from tests.support.browser import ARGS, ARTIFACTS, CHROMIUM, sign_in
from tests.support.review import review_runtime, simulated, store, xss_conversation
from tests.support.services import missing
from vigil.review.stage import ReviewStage
from vigil.store.models import ReviewItemRow, ReviewLabelRow

pytestmark = pytest.mark.browser


@pytest.fixture
def browser():  # type: ignore[no-untyped-def]
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


@pytest.fixture
def server(sqlite_url: str) -> Iterator[tuple[str, object]]:

    rt = review_runtime(sqlite_url)
    with served(rt, close=True) as base:
        yield base, rt


def _login(page, base: str, key: str = "rita-key") -> None:  # type: ignore[no-untyped-def]
    sign_in(page, base, "/ui/queue", key)


def _shot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def test_login_claim_label_with_keyboard(browser, server) -> None:
    base, rt = server
    store(rt, simulated(40, "v1.4.0:0.3,v1.5.0:0.6", seed=11))
    with rt.sessions() as s:
        open_before = s.query(ReviewItemRow).filter_by(status="open").count()
    assert open_before >= 3

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    _login(page, base)
    assert page.locator("table.queue tbody tr").count() == open_before
    _shot(page, "queue.png")

    page.keyboard.press("n")  # claim next
    page.wait_for_url(f"{base}/ui/review/**")
    first = page.locator("h1.cid-title").inner_text()
    assert page.locator("[data-lease-until]").count() == 1
    assert page.locator("mark.hl").count() + page.locator(".msg.flagged").count() > 0
    _shot(page, "conversation.png")

    page.keyboard.press("c")
    page.keyboard.press("1")
    assert page.locator("input[value=confirmed_failure]").is_checked()
    url = page.url
    page.keyboard.press("Enter")  # save and go to the next item
    page.wait_for_url(lambda u: u != url and "/ui/review/" in u)
    second = page.locator("h1.cid-title").inner_text()
    assert second != first

    page.keyboard.press("r")
    url = page.url
    page.keyboard.press("Enter")
    page.wait_for_url(lambda u: u != url)

    with rt.sessions() as s:
        labels = {r.conversation_id: r for r in s.query(ReviewLabelRow).all()}
    assert labels[first].label == "confirmed_failure" and labels[first].reviewer == "rita"
    assert labels[first].category == next(iter(rt.get(ReviewStage).policy.taxonomy))
    assert labels[second].label == "not_a_failure"

    page.goto(f"{base}/ui/queue")
    listed = page.locator("a.cid").all_inner_texts()
    assert first not in listed and second not in listed
    assert page.locator("table.queue tbody tr").count() == open_before - 2
    page.goto(f"{base}/ui/queue?status=done")
    assert set(page.locator("a.cid").all_inner_texts()) == {first, second}

    page.goto(f"{base}/ui/clusters")
    assert "1 of 1 failures" in page.locator("ol.clusters").inner_text()
    _shot(page, "clusters.png")
    page.goto(f"{base}/ui/progress")
    _shot(page, "progress.png")

    # log out: the queue asks for a key again
    page.click("text=Log out")
    page.wait_for_url(f"{base}/ui/login")
    page.goto(f"{base}/ui/queue")
    assert "/ui/login" in page.url


def test_hostile_transcript_renders_inert(browser, server) -> None:
    base, rt = server
    conv = xss_conversation()
    store(rt, [conv])
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    _login(page, base)

    for url in (f"{base}/ui/queue", f"{base}/ui/review/{quote(conv['conversation_id'], safe='')}"):
        page.goto(url)
        page.wait_for_load_state("load")
        page.wait_for_timeout(300)
        assert page.evaluate("typeof window.__xss") == "undefined"
        assert page.evaluate("typeof window.parent.__xss") == "undefined"
        handlers = page.evaluate(
            "Array.from(document.querySelectorAll('*')).flatMap(e => Array.from(e.attributes)"
            ".filter(a => a.name.toLowerCase().startsWith('on')).map(a => e.tagName + ' ' + a.name))"
        )
        assert handlers == []
        assert page.locator("a[href^='javascript:' i]").count() == 0
        assert page.locator("iframe, img, svg, object, embed").count() == 0
        scripts = page.evaluate("Array.from(document.scripts).map(s => s.getAttribute('src'))")
        assert scripts == ["/ui/static/vigil.js"]
    assert dialogs == []

    text = page.locator("section.transcript").inner_text()
    assert "<script>window.__xss = 1; alert(1)</script>" in text
    assert '<img src=x onerror="window.__xss = 2; alert(2)">' in text
    assert "{{ 7 * 7 }}" in text and "49" not in text
    assert "get_order_details<script>window.__xss=7</script>" in page.locator(".call-head code").inner_text()
    assert page.locator(".msg.is-error").count() == 1
    # the PII finding's evidence is highlighted inside the assistant's text
    assert "eve@example.com" in page.locator("mark.hl").all_inner_texts()
    _shot(page, "conversation-xss.png")


def test_a_long_transcript_folds_and_its_links_reach_folded_messages(browser, server) -> None:
    from tests.support.browser import axe_script, axe_violations, describe
    from tests.support.review import long_conversation

    base, rt = server
    store(rt, [long_conversation(2_000, "long-b", leak_at=1_000)])
    script = axe_script()
    context = browser.new_context(viewport={"width": 1280, "height": 800}, bypass_csp=script is not None)
    page = context.new_page()
    _login(page, base)
    page.goto(f"{base}/ui/review/long-b")
    assert page.locator("article.msg").count() == 300
    fold = page.locator(".fold-row")
    assert fold.inner_text().startswith("Messages 100–1,799 folded (1,700)")
    failures = []
    if script is not None:
        found = axe_violations(page, script)
        if found:
            failures.append(f"folded page:\n{describe(found)}")
    # the finding's evidence on folded message 1,000: its link opens the window around it, scrolled to it
    page.click('a.evref[href*="around=1000"]')
    page.wait_for_url("**around=1000#m1000")
    target = page.locator("#m1000")
    assert target.is_visible() and "eve@example.com" in target.inner_text()
    box = target.bounding_box()
    assert box is not None and 0 <= box["y"] < 800  # on screen: the anchor landed
    # paging on from the window with the fold row below it
    page.locator(".fold-row a.fold-open").last.click()
    page.wait_for_url("**messages=*")
    assert page.locator("article.msg").count() <= 300
    if script is not None:
        found = axe_violations(page, script)
        if found:
            failures.append(f"window page:\n{describe(found)}")
    _shot(page, "conversation-window.png")
    context.close()
    assert not failures, "\n".join(failures)


def test_the_crumb_back_to_a_list_survives_a_fold_link_and_a_save(browser, server) -> None:
    """Following a fold row, then saving a label, the crumb fell back to "Queue": both dropped ``from``."""
    from tests.support.review import long_conversation

    base, rt = server
    store(rt, [long_conversation(1_000, "long-crumb", leak_at=500)])
    listed = "/ui/conversations?agent=coder&version=v1"
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    _login(page, base)
    page.goto(f"{base}/ui/review/long-crumb?" + urlencode({"from": listed}))
    crumb = page.locator("#crumb-back")
    assert crumb.get_attribute("href") == listed
    page.locator(".fold-row a.fold-open").first.click()
    page.wait_for_url("**messages=*")
    assert crumb.count() == 1, "the fold link dropped the crumb"
    assert crumb.inner_text() == "Conversations" and crumb.get_attribute("href") == listed
    page.keyboard.press("r")  # not a failure
    page.click("#save")
    page.wait_for_url("**notice=labelled*")
    assert crumb.count() == 1, "the Save dropped the crumb"
    assert page.locator("#toast").is_visible() and crumb.get_attribute("href") == listed
    crumb.click()
    page.wait_for_url(f"{base}{listed}")


def test_real_shapes_fit_the_screen_a_long_task_id_and_a_long_policy(browser, server) -> None:
    """τ² task ids are one long word ("telecom:[mms_issue]airplane_mode_on|bad_wifi_calling|..."), which widened
    the queue's table past the screen and hid its other columns; τ² policies (16-23 kB) filled the first
    screens of every review. The queue fits 1280 pixels, and the review opens on the conversation."""
    base, rt = server
    task = "telecom:[mms_issue]" + "|".join(f"break_setting_number_{i}_on" for i in range(8)) + "[PERSONA:None]"
    policy = "# Telecom Agent Policy\nThe current time is 2025-02-25 12:08:00 EST.\n" + "- a rule\n" * 2_000
    convs = simulated(6, "v1:0.9", seed=3)
    for c in convs:
        c["task_id"] = task
        c["messages"] = [{"role": "system", "content": policy}, *[m for m in c["messages"] if m["role"] != "system"]]
    store(rt, convs)
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    _login(page, base)
    page.goto(f"{base}/ui/queue")
    assert page.locator("tbody tr").count() >= 1 and task[:20] in page.inner_text("table")
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the queue is {overflow} px wider than the screen"
    page.goto(f"{base}/ui/review/{quote(convs[0]['conversation_id'], safe='')}")
    assert "The current time is 2025-02-25" in page.inner_text("#m0")
    first_turn = page.locator("#m1").bounding_box()
    assert first_turn is not None and first_turn["y"] < 800  # the conversation starts on the first screen
    rest = page.locator("#rest-0")
    assert not rest.evaluate("d => d.open") and "more lines" in rest.locator("summary").inner_text()
    rest.locator("summary").click()
    assert rest.evaluate("d => d.open") and rest.locator(".text").is_visible()
    page.close()


def test_queue_state_words_are_not_broken_mid_word(browser, server) -> None:
    """The long-value rule (break anywhere) reached the state pill: at 1280 px every "available" showed as
    "avail" over "able"."""
    base, rt = server
    store(rt, simulated(40, "v1.4.0:0.3,v1.5.0:0.6", seed=11))
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    _login(page, base)
    lines = page.eval_on_selector_all(
        "td[data-label=State] .pill, td[data-label=Labels] .pill",
        "els => els.map(e => { const r = document.createRange(); r.selectNodeContents(e);"
        " return [e.textContent, r.getClientRects().length]; })",
    )
    assert lines and all(n == 1 for _, n in lines), lines


def test_taking_the_next_item_or_skipping_asks_before_dropping_typed_notes(browser, server) -> None:
    """Notes typed on the label form were dropped without a word by ``n`` (next item) or ``s`` (skip)."""
    base, rt = server
    store(rt, simulated(40, "v1.4.0:0.3,v1.5.0:0.6", seed=11))
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    asked: list[str] = []
    answer = {"accept": False}

    def reply(d) -> None:  # type: ignore[no-untyped-def]
        asked.append(d.message)
        d.accept() if answer["accept"] else d.dismiss()

    page.on("dialog", reply)
    _login(page, base)
    page.keyboard.press("n")
    page.wait_for_url(f"{base}/ui/review/**")
    here = page.url
    page.keyboard.press("n")  # nothing typed: no question
    page.wait_for_url(lambda u: u != here)
    assert asked == []
    here = page.url
    page.fill("textarea[name=notes]", "the refund went to the wrong card")
    page.keyboard.press("Escape")
    for n, key in enumerate(("n", "s"), 1):
        page.keyboard.press(key)  # confirm() blocks the key's handler until the dialog is answered
        assert len(asked) == n and "not saved" in asked[-1]
        assert page.url == here and page.input_value("textarea[name=notes]") == "the refund went to the wrong card"
    answer["accept"] = True
    page.keyboard.press("n")
    page.wait_for_url(lambda u: u != here)


def test_leaving_the_item_by_a_link_warns_only_about_unsaved_typed_notes(browser, server) -> None:
    """Following a nav link off the label page dropped typed notes without a word; now the browser's
    leave-page question comes up, and only while the form holds text it was not saved with."""
    base, rt = server
    store(rt, simulated(40, "v1.4.0:0.3,v1.5.0:0.6", seed=11))
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    asked: list[str] = []

    def reply(d) -> None:  # type: ignore[no-untyped-def]
        asked.append(d.type)
        d.accept() if d.type == "confirm" else d.dismiss()

    page.on("dialog", reply)
    _login(page, base)
    queue = page.locator("nav.nav-wide a", has_text="Queue")
    page.keyboard.press("n")
    page.wait_for_url(f"{base}/ui/review/**")
    page.keyboard.press("c")  # a label picked but no text typed: nothing to lose in the notes
    queue.click()  # nothing typed: no question
    page.wait_for_url(f"{base}/ui/queue**")
    assert asked == []

    page.keyboard.press("n")
    page.wait_for_url(f"{base}/ui/review/**")
    here = page.url
    page.click("textarea[name=notes]")
    page.keyboard.type("the refund went to the wrong card")
    with page.expect_event("dialog", timeout=10_000):
        queue.click()  # the browser asks; staying keeps the page and the text
    assert asked == ["beforeunload"]
    assert page.url == here and page.input_value("textarea[name=notes]") == "the refund went to the wrong card"

    page.keyboard.press("Escape")
    page.keyboard.press("n")  # the reviewer already said yes to leaving: the browser does not ask again
    page.wait_for_url(lambda u: u != here)
    assert asked == ["beforeunload", "confirm"]

    here = page.url
    page.click("textarea[name=notes]")
    page.keyboard.type("looked fine to me")
    page.keyboard.press("Escape")
    page.keyboard.press("r")
    page.click("#save")  # saving is no leaving (staying would have kept the save from going through)
    page.wait_for_url(lambda u: u.startswith(here) and u.endswith("notice=labelled"), timeout=10_000)
    assert asked == ["beforeunload", "confirm"]
    assert page.input_value("textarea[name=notes]") == "looked fine to me"
    queue.click()  # after saving, the notes on the page are the saved ones: no question
    page.wait_for_url(f"{base}/ui/queue**")
    assert asked == ["beforeunload", "confirm"]


def _next_item(browser, base: str, width: int, height: int):  # type: ignore[no-untyped-def]
    """A reviewer's page, at this screen size, on the item ``n`` claims from the queue."""
    page = browser.new_page(viewport={"width": width, "height": height})
    _login(page, base)
    page.keyboard.press("n")
    page.wait_for_url(f"{base}/ui/review/**")
    return page


def _covers(page) -> float:  # type: ignore[no-untyped-def]
    """The share of the screen's height the label form covers."""
    box = page.locator("#label-form").bounding_box()
    return float(page.evaluate("h => Math.max(0, innerHeight - h)", box["y"])) / page.viewport_size["height"]


def test_on_a_phone_the_label_form_is_a_folded_sheet_over_a_readable_transcript(browser, server) -> None:
    """At 390 px the label form, fixed at the bottom, covered about half the screen over the transcript.
    It starts folded to a bar; tapping it, a label key, or saving without a label opens it."""
    base, rt = server
    store(rt, simulated(40, "v1.4.0:0.3,v1.5.0:0.6", seed=11))
    page = _next_item(browser, base, 390, 844)
    toggle = page.locator("#label-form .sheet-toggle")
    assert toggle.get_attribute("aria-expanded") == "false"
    assert _covers(page) < 0.1
    page.locator("section.transcript").evaluate("el => el.scrollIntoView({block: 'start'})")
    for share in (0.3, 0.6, 0.88):  # down the screen it is the transcript one reads, not the form
        hit = page.evaluate("y => !!document.elementFromPoint(30, y).closest('section.transcript')", 844 * share)
        assert hit, share
    _shot(page, "conversation-phone.png")

    toggle.click()
    assert toggle.get_attribute("aria-expanded") == "true" and _covers(page) > 0.3
    _shot(page, "conversation-phone-open.png")
    toggle.click()
    assert toggle.get_attribute("aria-expanded") == "false"
    page.keyboard.press("c")  # a label key opens it on the label it chose
    assert toggle.get_attribute("aria-expanded") == "true"
    assert page.locator("input[value=confirmed_failure]").is_checked()
    toggle.click()
    page.locator("input[value=confirmed_failure]").evaluate("el => { el.checked = false; }")
    page.evaluate("document.activeElement.blur()")
    assert toggle.get_attribute("aria-expanded") == "false"
    page.keyboard.press("Enter")  # nothing chosen: the form opens on what is missing
    assert toggle.get_attribute("aria-expanded") == "true"
    assert page.locator("#label-missing").is_visible()


def test_on_a_wide_screen_the_label_form_has_no_sheet_bar(browser, server) -> None:
    base, rt = server
    store(rt, simulated(10, "v1.4.0:0.3", seed=11))
    page = _next_item(browser, base, 1280, 800)
    assert not page.locator("#label-form .sheet-toggle").is_visible()
    assert page.locator("#label-form #save-next").is_visible()


def test_a_long_unbroken_comment_or_note_keeps_the_review_column_on_screen(browser, server) -> None:
    """A comment or a label's notes holding one long word (a pasted address, a token, minified JSON) widened
    the review column to that word's length (about 25,000 px for 3,000 characters): the column scrolled sideways
    inside itself and the label form's right half (Severity, the rubric, the save buttons' row) was cut off,
    for every reviewer who opened the conversation, on a wide screen and on a phone."""
    import httpx

    base, rt = server
    convs = simulated(3, "v1.4.0:0.9", seed=5)
    store(rt, convs)
    cid = convs[0]["conversation_id"]
    word = "https://example.com/trace?id=" + "0123456789abcdef" * 200
    with httpx.Client(base_url=base, headers={"Authorization": "Bearer raj-key"}) as api:
        assert api.post(f"/v1/review/items/{quote(cid, safe='')}/comments", json={"body": word}).status_code == 201
        labelled = api.post(
            f"/v1/review/items/{quote(cid, safe='')}/labels",
            json={"label": "unsure", "notes": word, "expected_behavior": word},
            headers={"Authorization": "Bearer rita-key"},
        )
        assert labelled.status_code == 201, labelled.text
    for width, height in ((1280, 800), (390, 844)):
        page = browser.new_page(viewport={"width": width, "height": height})
        sign_in(page, base, f"/ui/review/{quote(cid, safe='')}")
        assert word[:40] in page.inner_text("#comments") and word[:40] in page.inner_text(".history .label-notes")
        side = page.evaluate(
            "() => { const a = document.querySelector('aside.side'); return [a.scrollWidth, a.clientWidth] }"
        )
        assert side[0] <= side[1], f"at {width} px the review column is {side[0]} px wide inside {side[1]} px"
        right = page.evaluate("() => document.querySelector('aside.side').getBoundingClientRect().right")
        # on a phone the label form is a sheet folded to its bar; on a wide screen it sits in the column
        form = "#severity" if width > 800 else "#add-comment"
        for sel in ("#comments .comment-body", ".history .label-notes", "#comment-body", form):
            box = page.locator(sel).first.bounding_box()
            assert box is not None and box["x"] + box["width"] <= right + 1, (width, sel, box, right)
        page.close()


def _unconfirmed_cancel(cid: str, lines: int) -> dict[str, object]:
    """A cancel made after the user only asked a question (confirm-before-write quotes it), whose order lookup
    has ``lines`` lines of arguments and of result: both scroll inside their boxes."""
    order = {"order_id": "#W4431295", "items": [{"name": f"item {i}", "price": i} for i in range(lines)]}
    call = {"type": "function"}
    return {
        "schema_version": 1,
        "conversation_id": cid,
        "agent_id": "support-bot",
        "agent_version": "v1.5.0",
        "messages": [
            {"role": "system", "content": "You are a retail support agent. Confirm before any write action."},
            {"role": "user", "content": "Hi, I want to cancel my order #W4431295, the hiking boots."},
            {
                "role": "assistant",
                "tool_calls": [
                    {**call, "id": "c1", "function": {"name": "get_order_details", "arguments": json.dumps(order)}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": json.dumps({**order, "status": "pending"})},
            {"role": "assistant", "content": "Shall I cancel it and refund $396.34 to your original payment method?"},
            {"role": "user", "content": "Hmm, what would the refund timeline be?"},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        **call,
                        "id": "c2",
                        "function": {"name": "cancel_pending_order", "arguments": '{"order_id":"#W4431295"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c2", "content": '{"status":"cancelled"}'},
            {"role": "assistant", "content": "Your order is cancelled."},
        ],
    }


@pytest.mark.parametrize("width,height", [(1280, 800), (390, 844)], ids=["1280x800", "390x844"])
def test_a_conversation_with_long_tool_output_and_quoted_evidence_passes_axe(browser, server, width, height) -> None:
    """Tool arguments and results scroll inside boxes of a few hundred pixels, which a keyboard could not
    reach (axe: scrollable-region-focusable, serious): a 40-line order lookup's last lines could be read with
    a mouse only. A finding's links to its evidence, followed by the quote, were told from the text around them
    by colour alone (link-in-text-block, serious). The page passes axe with both."""
    from tests.support.browser import axe_script, axe_violations, describe

    base, rt = server
    script = axe_script()
    if script is None:
        missing("axe-core (npm install axe-core@4)")
    conv = _unconfirmed_cancel("long-tool-output", 40)
    store(rt, [conv])
    context = browser.new_context(viewport={"width": width, "height": height}, bypass_csp=True)
    page = sign_in(context.new_page(), base, "/ui/review/long-tool-output")
    assert page.locator(".findings q").count() >= 1  # quoted evidence is there
    scrolling = page.evaluate(
        "() => Array.from(document.querySelectorAll('.transcript pre.args, .transcript .text'))"
        ".filter(e => e.scrollHeight > e.clientHeight).length"
    )
    assert scrolling == 2  # the lookup's arguments and its result
    found = axe_violations(page, script)
    assert not found, describe(found)
    page.locator("#m3 .text").focus()
    page.keyboard.press("End")  # the keyboard reaches the result's last lines
    page.wait_for_function(
        "() => { const e = document.querySelector('#m3 .text');"
        " return e.scrollTop + e.clientHeight >= e.scrollHeight - 1 }"
    )
    context.close()


def test_the_shortcuts_dialog_takes_the_focus_and_gives_it_back(browser, server) -> None:
    """ "?" showed the keymap, but the focus stayed behind it: a screen reader did not read the dialog, and
    Tab moved through the page underneath. Now the dialog takes the focus, and closing it (Escape, or its
    Close button) gives the focus back to where it was."""
    base, rt = server
    store(rt, simulated(20, "v1.4.0:0.3,v1.5.0:0.6", seed=11))
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    _login(page, base)
    page.focus("table.queue tbody tr a")
    opener = page.evaluate("document.activeElement.outerHTML")
    page.keyboard.press("?")
    assert page.locator("#help").is_visible()
    assert page.evaluate("document.activeElement.getAttribute('role')") == "dialog"
    page.keyboard.press("Escape")
    assert page.locator("#help").is_hidden()
    assert page.evaluate("document.activeElement.outerHTML") == opener
    page.keyboard.press("?")
    page.click("#help-close")
    assert page.locator("#help").is_hidden()
    assert page.evaluate("document.activeElement.outerHTML") == opener


@pytest.mark.parametrize("hours", [2, -2])
def test_the_lease_countdown_reads_what_is_left_not_the_browsers_clock(browser, server, hours: int) -> None:  # type: ignore[no-untyped-def]
    """The countdown subtracted the browser's clock from the lease's end (the database's clock): a laptop 2 h
    ahead showed a lease claimed a moment ago as expired, one 2 h behind showed 2 h 30 min left of 30 min."""
    base, rt = server
    store(rt, simulated(10, "v1:0.6", seed=5))
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.clock.set_system_time(datetime.now(UTC) + timedelta(hours=hours))
    _login(page, base)
    page.keyboard.press("n")  # claim next
    page.wait_for_url(f"{base}/ui/review/**")
    page.wait_for_function("!/UTC/.test(document.querySelector('[data-lease-until]').textContent)")  # counting
    shown = page.locator("[data-lease-until]").inner_text()
    assert shown.endswith(" more"), shown
    minutes, seconds = map(int, shown.removesuffix(" more").split(":"))
    lease_seconds = rt.settings.review_lease_seconds
    assert lease_seconds - 60 < minutes * 60 + seconds <= lease_seconds, shown
