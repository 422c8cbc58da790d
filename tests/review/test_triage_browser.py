"""Triage in a real headless Chromium at 1280x800: queue search, sort and bulk actions, the label form's
checks, toast and counter, one keymap, comments, and a cluster of 20 near-duplicates labelled in one action."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from tests.review.test_review_triage import near_duplicates
from tests.review.test_ui_browser import _login, _shot, browser, server  # noqa: F401 (fixtures)
from tests.support.review import simulated, store
from vigil.review.models import ReviewCommentRow
from vigil.store.models import ReviewLabelRow

pytestmark = pytest.mark.browser
VIEWPORT = {"width": 1280, "height": 800}


def _view(page, name: str) -> None:  # type: ignore[no-untyped-def]
    """What the screen shows (the docs' screenshots are these)."""
    from tests.support.browser import ARTIFACTS

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name))


def _labels(rt) -> list[ReviewLabelRow]:  # type: ignore[no-untyped-def]
    with rt.sessions() as s:
        return list(s.scalars(select(ReviewLabelRow).where(ReviewLabelRow.is_current)))


def test_a_cluster_of_20_near_duplicates_is_labelled_in_one_action(browser, server) -> None:  # noqa: F811
    base, rt = server
    dups = near_duplicates(20)
    others = [c for c in simulated(30, "v1.4.0:0.6", seed=9) if c["metadata"]["simulated_defect"] != "pii_leak"]
    store(rt, dups + others)
    page = browser.new_page(viewport=VIEWPORT)
    _login(page, base)
    page.goto(f"{base}/ui/clusters")
    row = page.locator("table.open-cluster-list tbody tr", has=page.locator("span.prio", has_text="20"))
    assert row.count() == 1
    _shot(page, "clusters-open.png")
    row.locator("a.review-cluster").click()
    page.wait_for_url(f"{base}/ui/clusters/*")
    members = page.locator('input[name="member"]')
    assert members.count() == 20
    assert page.locator('input[name="member"]:checked').count() == 20
    assert page.locator("#member-count").inner_text() == "20"
    # the rubric and the categories' meaning are in the form
    assert "pick the category" in page.locator("#cluster-form").inner_text()

    # no label yet: Enter says so instead of sending
    url = page.url
    page.keyboard.press("Enter")
    assert page.locator("#label-missing").is_visible() and page.url == url
    # a confirmed failure without a category is refused before any round trip, as an error on the field
    page.keyboard.press("c")
    assert not page.locator("#label-missing").is_visible()
    url = page.url
    page.keyboard.press("Enter")
    assert page.locator("#category-error").is_visible()
    assert page.evaluate("document.activeElement.id") == "category"
    assert "error" in (page.locator("#category-error").get_attribute("class") or "")
    assert page.url == url and _labels(rt) == []

    page.select_option("#category", "privacy_leak")
    assert "personal or payment data" in page.locator("#category-help").inner_text()
    assert not page.locator("#category-error").is_visible()
    page.fill("#notes", "receipt emailed to the address in the reply")
    _shot(page, "cluster-review.png")
    _view(page, "triage-cluster-desktop.png")
    page.click("#label-cluster")
    page.wait_for_url(f"{base}/ui/clusters?*")
    assert "Labelled 20 conversations in one action" in page.locator(".notice").inner_text()

    labels = {r.conversation_id: r for r in _labels(rt)}
    dup_ids = [c["conversation_id"] for c in dups]
    assert set(labels) == set(dup_ids)
    sample = [r for r in labels.values() if r.propagated_from is None]
    assert len(sample) == 1
    propagated = [r for r in labels.values() if r.propagated_from == sample[0].conversation_id]
    assert len(propagated) == 19
    assert all(
        (r.reviewer, r.label, r.category) == ("rita", "confirmed_failure", "privacy_leak") for r in labels.values()
    )

    # a member's page says where its label came from
    member = propagated[0].conversation_id
    page.goto(f"{base}/ui/review/{member}")
    assert f"to the cluster of {sample[0].conversation_id}" in page.locator(".history").inner_text()


def test_queue_search_sort_bulk_and_the_label_keys(browser, server) -> None:  # noqa: F811
    base, rt = server
    convs = simulated(40, "v1.4.0:0.3,v1.5.0:0.6", seed=11)
    store(rt, convs)
    page = browser.new_page(viewport=VIEWPORT)
    _login(page, base)

    # search with "/" and case-insensitive filters picked from known values
    total = page.locator("table.queue tbody tr").count()
    assert total >= 6
    first_id = page.locator("a.cid").first.inner_text()
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "queue-search"
    page.keyboard.type(first_id[-8:].upper())
    page.keyboard.press("Enter")
    page.wait_for_url("**search=*")
    assert page.locator("a.cid").all_inner_texts() == [first_id]
    page.goto(f"{base}/ui/queue")
    assert "support-bot" in page.locator("#filter-agent option").all_inner_texts()
    page.goto(f"{base}/ui/queue?agent=Support-Bot&version=V1.5.0")
    versions = page.locator("table.queue tbody tr td.agent .muted").all_inner_texts()
    assert versions and set(versions) == {"v1.5.0"}
    assert page.locator("#filter-version").input_value() == "v1.5.0"

    # sortable columns, first-message snippets and times
    page.goto(f"{base}/ui/queue")
    page.click("th >> text=Received")
    page.wait_for_url("**sort=received*")
    assert page.locator("th[aria-sort]").inner_text().startswith("Received")
    assert page.locator(".snippet").count() == page.locator("table.queue tbody tr").count()
    assert page.locator("td.received time").first.get_attribute("datetime")
    _shot(page, "queue-triage.png")
    _view(page, "triage-queue-desktop.png")

    # bulk skip: tick two rows
    boxes = page.locator('input[name="ids"]')
    skipped = [boxes.nth(i).get_attribute("value") for i in (0, 1)]
    boxes.nth(0).check()
    boxes.nth(1).check()
    assert page.locator("#bulk-count").inner_text() == "2"
    page.click("#bulk-skip")
    page.wait_for_url("**bulk=skip*")
    assert "Skipped 2 items." in page.locator(".notice").inner_text()

    # n claims the next item (never one just skipped)
    page.keyboard.press("n")
    page.wait_for_url(f"{base}/ui/review/**")
    first = page.locator("h1.cid-title").inner_text()
    assert first not in skipped
    box = page.locator("#save-next").bounding_box()
    assert box is not None and box["y"] + box["height"] <= VIEWPORT["height"]  # above the fold
    _shot(page, "conversation-1280.png")

    # a confirmed failure without a category: an error on the focused field, nothing sent
    page.keyboard.press("c")
    url = page.url
    page.keyboard.press("Enter")
    assert page.locator("#category-error").is_visible() and page.url == url
    assert page.evaluate("document.activeElement.id") == "category"
    page.keyboard.press("Escape")
    page.keyboard.press("2")
    page.keyboard.press("Enter")
    page.wait_for_url(lambda u: u.split("?")[0] != url.split("?")[0])
    assert page.locator("#toast").inner_text() == "Saved"
    assert page.locator("#session-count").inner_text() == "1 labelled this session"
    second = page.locator("h1.cid-title").inner_text()
    assert {r.conversation_id for r in _labels(rt)} == {first}

    # ? shows the one keymap; n on a conversation goes on without saving
    page.keyboard.press("?")
    help_text = page.locator("#help").inner_text()
    assert page.locator("#help").is_visible() and "Next item" in help_text and "Save the label" in help_text
    page.keyboard.press("Escape")
    assert not page.locator("#help").is_visible()

    # comments, on the conversation and on a message, shown escaped
    hostile = "<img src=x onerror=window.__xss=1> check turn 1"
    page.select_option("#comment-on", "1")
    page.fill("#comment-body", hostile)
    page.click("#add-comment")
    page.wait_for_url("**notice=commented*")
    assert hostile in page.locator(".comment-list").inner_text()
    assert hostile in page.locator("#m1 .msg-comment").inner_text()
    assert page.evaluate("typeof window.__xss") == "undefined"
    with rt.sessions() as s:
        assert [(c.author, c.message_index) for c in s.scalars(select(ReviewCommentRow))] == [("rita", 1)]

    page.keyboard.press("n")
    page.wait_for_url(lambda u: second not in u and "/ui/review/" in u)
    assert {r.conversation_id for r in _labels(rt)} == {first}


def test_side_by_side_from_a_conversation_to_a_pairwise_choice(browser, server) -> None:  # noqa: F811
    from tests.review.test_review_triage import _shared_task
    from vigil.review.models import ReviewPairwiseRow

    base, rt = server
    convs = simulated(60, "v1.4.0:0.3,v1.5.0:0.6", seed=11)
    store(rt, convs)
    task = _shared_task(convs)
    cid = next(c["conversation_id"] for c in convs if c["task_id"] == task and c["agent_version"] == "v1.4.0")
    page = browser.new_page(viewport=VIEWPORT)
    _login(page, base)
    page.goto(f"{base}/ui/review/{cid}")
    page.click("#side-by-side")
    page.wait_for_url("**/ui/side-by-side?*")
    left, right = page.locator("section.side-a"), page.locator("section.side-b")
    assert "v1.4.0" in left.locator("h2").inner_text() and "v1.5.0" in right.locator("h2").inner_text()
    assert cid in left.inner_text()
    a_box, b_box = left.bounding_box(), right.bounding_box()
    assert a_box and b_box and b_box["x"] >= a_box["x"] + a_box["width"]  # two columns
    assert left.locator(".msg").count() > 0 and right.locator(".msg").count() > 0
    _shot(page, "side-by-side.png")
    _view(page, "triage-side-by-side-desktop.png")
    page.check("input[name=choice][value=b]")
    page.fill("#pairwise-notes", "B confirmed before cancelling")
    page.click("#save-choice")
    page.wait_for_url("**notice=chosen*")
    assert "rita chose b" in page.locator(".pairwise").inner_text()
    with rt.sessions() as s:
        [row] = s.scalars(select(ReviewPairwiseRow)).all()
    assert (row.conversation_a, row.version_b, row.choice, row.reviewer) == (cid, "v1.5.0", "b", "rita")


@pytest.mark.parametrize("viewport", [VIEWPORT, {"width": 390, "height": 844}], ids=["1280x800", "390x844"])
def test_triage_pages_pass_axe_and_fit_the_screen(browser, server, viewport) -> None:  # noqa: F811
    from tests.review.test_review_triage import _shared_task
    from tests.support.browser import axe_script, axe_violations, describe
    from tests.support.services import missing

    base, rt = server
    script = axe_script()
    if script is None:
        missing("axe-core (npm install axe-core@4)")
    convs = simulated(60, "v1.4.0:0.3,v1.5.0:0.6", seed=11)
    store(rt, near_duplicates(6, "axe") + convs)
    task = _shared_task(convs)
    context = browser.new_context(viewport=viewport, bypass_csp=True)  # axe arrives as an injected script
    page = context.new_page()
    _login(page, base)
    page.goto(f"{base}/ui/clusters")
    cluster = page.locator("a.review-cluster").first.get_attribute("href")
    cid = convs[0]["conversation_id"]
    page.goto(f"{base}/ui/review/{cid}")
    page.fill("#comment-body", "a comment to show")
    page.click("#add-comment")
    page.wait_for_url("**notice=commented*")
    failures = []
    for path in (
        "/ui/queue",
        "/ui/queue?search=cancel&sort=received",
        "/ui/clusters",
        cluster,
        f"/ui/review/{cid}",
        f"/ui/side-by-side?task={task}",
    ):
        page.goto(base + str(path))
        found = axe_violations(page, script)
        if found:
            failures.append(f"{path}:\n{describe(found)}")
        wide = page.evaluate("document.documentElement.scrollWidth")
        if wide > viewport["width"]:
            failures.append(f"{path}: {wide} px wide at {viewport['width']} px (sideways scroll)")
    if viewport["width"] < 500:
        _view(page, "triage-side-by-side-phone.png")
        page.goto(base + str(cluster))
        _view(page, "triage-cluster-phone.png")
    context.close()
    assert not failures, "\n".join(failures)


@pytest.fixture
def console_server(sqlite_url: str):  # type: ignore[no-untyped-def]
    """Every stage's pages (home and compare too), served."""
    from tests.support.app import served
    from tests.support.console import console_runtime

    rt = console_runtime(sqlite_url)
    with served(rt, close=True) as base:
        yield base, rt


def long_values() -> list[dict]:
    """Valid conversations whose every value is as long as the schema lets it be, in one unbroken run: ids of
    240 characters, versions of 122, a tool name of 170, words of 300 and more; two of them are near-duplicate
    runs of one task from two versions (a cluster to review, a side by side, a comparison)."""
    agent, task = "qa-agent-" + "a" * 200, "task-" + "t" * 240
    lone = {
        "conversation_id": "qa-long-" + "x" * 232,
        "agent_id": agent,
        "agent_version": "v-" + "9" * 120,
        "task_id": task,
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "Cancel_my_order_" + "W" * 400 + " please"},
            {"role": "assistant", "tool_calls": [{"id": "t1", "type": "function", "function": {
                "name": "cancel_pending_order_" + "z" * 149, "arguments": '{"order_id": "#' + "9" * 300 + '"}'}}]},
            {"role": "tool", "tool_call_id": "t1", "content": '{"status": "' + "c" * 500 + '"}'},
            {"role": "assistant", "content": "Done " + "y" * 600},
        ],
    }  # fmt: skip
    runs = []
    for i, version in enumerate(("v-" + "9" * 120, "w-" + "8" * 120)):
        runs.append({
            "conversation_id": f"qa-longdup-{i}-" + "y" * 220,
            "agent_id": agent,
            "agent_version": version,
            "task_id": task,
            "messages": [
                {"role": "system", "content": "You are a retail support agent. Confirm before any write action."},
                {"role": "user", "content": "Cancel my order " + "Q" * 300 + " please now"},
                {"role": "assistant", "tool_calls": [{"id": "t1", "type": "function", "function": {
                    "name": "get_order_details", "arguments": '{"order_id": "#W1234567"}'}}]},
                {"role": "tool", "tool_call_id": "t1", "content": '{"status": "delivered"}'},
                {"role": "assistant", "tool_calls": [{"id": "t2", "type": "function", "function": {
                    "name": "cancel_pending_order", "arguments": '{"order_id": "#W1234567", "reason": "gone"}'}}]},
                {"role": "tool", "tool_call_id": "t2", "content": '{"status": "cancelled"}'},
                {"role": "assistant", "content": "Done, cancelled."},
            ],
        })  # fmt: skip
    return [lone, *runs]


@pytest.mark.parametrize("viewport", [VIEWPORT, {"width": 390, "height": 844}], ids=["1280x800", "390x844"])
def test_long_unbroken_text_wraps_inside_the_screen(browser, console_server, viewport) -> None:  # noqa: F811
    """A message of one unbroken run (base64 of a zero-padded file: AAAA...) wraps inside its column.
    Kerned, Chromium took 20 s to lay out 150 kB of it (unkerned 0.3 s: measured, not timed here);
    whatever the text's wrapping rules, the page must not scroll sideways. Nor may a long valid value
    anywhere else (a version on the home page, a tool's name, an id in a heading, a version in the
    pairwise choice): on a phone each such page scrolled sideways, up to 1,791 px wide."""
    from urllib.parse import quote, urlencode

    base, rt = console_server
    [conv] = simulated(1, "v1.4.0:0.0", seed=3)
    conv["conversation_id"] = "long-line"
    conv["messages"][-1]["content"] = "A" * 20_000
    conv["messages"][1]["tool_calls"] = [
        {"id": "x1", "type": "function", "function": {"name": "lookup", "arguments": '{"blob":"' + "B" * 5_000 + '"}'}}
    ]
    conv["messages"].insert(2, {"role": "tool", "tool_call_id": "x1", "content": "C" * 5_000})
    lone, run_a, run_b = long_values()
    store(rt, [conv, lone, run_a, run_b])
    page = browser.new_page(viewport=viewport)
    _login(page, base)
    page.goto(f"{base}/ui/review/long-line")
    assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
    widest = page.evaluate(
        "Math.max(...[...document.querySelectorAll('.text, pre.args')].map(e => e.getBoundingClientRect().right))"
    )
    assert 0 < widest <= viewport["width"]
    page.goto(f"{base}/ui/clusters")
    cluster = page.locator("a.review-cluster").first.get_attribute("href")
    assert cluster, "the two runs make a near-duplicate cluster"
    versions = {"a": run_a["agent_version"], "b": run_b["agent_version"]}
    wide = []
    for path in (
        "/ui",
        "/ui/queue",
        "/ui/review/" + quote(lone["conversation_id"], safe=""),
        "/ui/review/" + quote(run_a["conversation_id"], safe=""),
        "/ui/compare",
        "/ui/compare?" + urlencode({"agent": run_a["agent_id"], "baseline": versions["a"], "candidate": versions["b"]}),
        cluster,
        "/ui/side-by-side?" + urlencode({"task": run_a["task_id"], **versions}),
    ):
        assert page.goto(base + path).ok, path
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > viewport["width"]:
            wide.append(f"{path[:40]}: {width} px wide at {viewport['width']} px")
    assert "pairwise" in page.content() and versions["b"] in page.content()  # the choice names both versions
    page.close()
    assert not wide, "\n".join(wide)
