"""A long transcript's page: the first and last messages, the middle folded into windows that links reach."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest

from tests.review.test_review_ui import _csrf, _login
from tests.support.review import long_conversation, review_client, review_runtime, simulated, store
from vigil.ui import folding

ARTICLE = re.compile(r'<article class="msg[^"]*" id="m(\d+)"')


def _shown(html: str) -> list[int]:
    return [int(i) for i in ARTICLE.findall(html)]


@pytest.fixture
def long_ui(db_url: str):  # type: ignore[no-untyped-def]
    # 20,000 messages serialise to about 1.1 MB with their defaults; the limit is not what is tested here
    rt = review_runtime(db_url, max_message_bytes=4_000_000)
    with review_client(rt) as c:
        _login(c)
        yield c, rt
    rt.close()


def test_a_long_transcript_renders_a_bounded_page_whose_links_reach_every_message(long_ui) -> None:
    ui, rt = long_ui
    store(rt, [long_conversation(20_000, "long-1", leak_at=10_000)])
    page = ui.get("/ui/review/long-1")
    assert page.status_code == 200
    html = page.text
    assert len(page.content) < 600_000, len(page.content)
    shown = _shown(html)
    assert shown == [*range(folding.HEAD), *range(20_000 - folding.TAIL, 20_000)]
    assert len(shown) <= folding.HEAD + folding.TAIL
    assert "Messages 100–19,799 folded (19,700)" in html
    assert 'href="/ui/review/long-1?messages=100-399#m100">show 100–399</a>' in html
    # the finding on the folded message 10,000 links to the window around it, which shows it
    assert 'href="/ui/review/long-1?around=10000#m10000" class="evref"' in html
    assert "pii-in-reply" in html  # the findings stay complete
    near = ui.get("/ui/review/long-1?around=10000")
    assert near.status_code == 200
    around = _shown(near.text)
    assert 10_000 in around and len(around) <= folding.WINDOW and around == sorted(around)
    assert 'id="m10000"' in near.text and 'title="pii-in-reply">eve@example.com</mark>' in near.text
    assert 'href="#m10000" class="evref"' in near.text  # now shown: the finding's link is its anchor
    # the fold row's window, and from it the next and the previous windows
    window = ui.get("/ui/review/long-1?messages=100-399")
    assert _shown(window.text) == list(range(100, 400))
    assert "Messages 0–99 folded (100)" in window.text
    assert 'href="/ui/review/long-1?messages=0-99#m0">show them</a>' in window.text
    assert "Messages 400–19,999 folded (19,600)" in window.text
    assert 'href="/ui/review/long-1?messages=400-699#m400">show 400–699</a>' in window.text
    # a window keeps itself
    assert 'href="/ui/review/long-1?messages=100-399&amp;comment_on=150#comment-form"' in window.text
    assert 'id="label-form"' in window.text and 'id="label-form"' in html


def test_a_comment_on_a_folded_message_links_to_it(long_ui) -> None:
    ui, rt = long_ui
    store(rt, [long_conversation(1_000, "long-2")])
    page = ui.get("/ui/review/long-2")
    assert 500 not in _shown(page.text)
    sent = ui.post(
        "/ui/review/long-2/comment",
        data={"csrf": _csrf(page.text), "message_index": "500", "body": "looped here"},
        follow_redirects=False,
    )
    assert sent.status_code == 303
    html = ui.get("/ui/review/long-2").text
    assert 'on <a href="/ui/review/long-2?around=500#m500">message #500</a>' in html
    # asking to comment on a folded message opens the window around it, the message picked in the form
    asked = ui.get("/ui/review/long-2?comment_on=700").text
    assert 700 in _shown(asked) and '<option value="700" selected>' in asked
    shown = ui.get("/ui/review/long-2?around=500").text
    assert 'class="msg-comment small"><b>rita</b> commented: looped here' in shown
    for odd in ("\u0661", "5_0", "\uff15"):  # Arabic-Indic one, an underscore, a fullwidth five: int() took them
        refused = ui.post(
            "/ui/review/long-2/comment",
            data={"csrf": _csrf(page.text), "message_index": odd, "body": "odd"},
            follow_redirects=False,
        )
        assert refused.status_code == 422 and "is not a message number" in refused.text, odd


def test_a_short_conversation_renders_every_message_without_a_fold(long_ui) -> None:
    ui, rt = long_ui
    convs = simulated(5, seed=3)
    store(rt, convs)
    for conv in convs:
        html = ui.get(f"/ui/review/{quote(conv['conversation_id'], safe='')}").text
        assert _shown(html) == list(range(len(conv["messages"])))
        assert "fold-row" not in html and "?around=" not in html
    edge = long_conversation(folding.HEAD + folding.TAIL, "edge")  # exactly as many as the page shows
    store(rt, [edge])
    html = ui.get("/ui/review/edge").text
    assert _shown(html) == list(range(folding.HEAD + folding.TAIL)) and "fold-row" not in html


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("messages=-5-10", "is not a range of message numbers"),
        ("messages=abc", "is not a range of message numbers"),
        ("messages=20-10", "is reversed"),
        ("messages=0-5000", "a page shows 300 at most"),
        ("messages=990-1200", "past the end"),
        ("messages=99999999999999999999-1", "is not a range"),
        ("around=-1", "is not a message number"),
        ("around=1e3", "is not a message number"),
        ("around=1000", "past the end"),
        ("around=5&messages=0-9", "not both"),
    ],
)
def test_bad_window_parameters_get_a_400_page_that_says_why(sqlite_url: str, query: str, says: str) -> None:
    rt = review_runtime(sqlite_url)
    try:
        store(rt, [long_conversation(1_000, "long-3")])
        with review_client(rt) as ui:
            _login(ui)
            page = ui.get(f"/ui/review/long-3?{query}")
            assert page.status_code == 400
            assert says in page.text and "Bad request" in page.text
            assert 'href="/ui/review/long-3"' in page.text  # a way back to the page
    finally:
        rt.close()


def test_folds_of_a_window_at_either_end() -> None:
    start = folding.pick(1_000, None, "3")
    assert start.shown == ((0, folding.WINDOW),) and [g.opens for g in start.gaps()] == [(300, 599)]
    end = folding.pick(1_000, None, "999")
    assert end.shown == ((700, 1_000),) and [(g.start, g.end, g.opens) for g in end.gaps()] == [(0, 699, (400, 699))]
    small = folding.pick(10, None, "4")  # shorter than a window: all of it
    assert small.shown == ((0, 10),) and not small.folded and small.gaps() == []
    assert folding.pick(1_000, "10-10", None).shown == ((10, 11),)
    assert folding.pick(1_000, "", " ") == folding.default(1_000)  # empty parameters: the default page
    assert folding.default(1_000).href(2_000) == "#m2000"  # no such message: no window to open


def test_side_by_side_folds_each_long_side_into_the_conversation_pages_windows(long_ui) -> None:
    ui, rt = long_ui
    a = {**long_conversation(2_000, "long-a"), "task_id": "refactor-1", "agent_version": "v1"}
    b = {**long_conversation(500, "long-b"), "task_id": "refactor-1", "agent_version": "v2"}
    store(rt, [a, b])
    page = ui.get("/ui/side-by-side?task=refactor-1&a=v1&b=v2")
    assert page.status_code == 200
    html = page.text
    assert html.count('<article class="msg') == 2 * (folding.HEAD + folding.TAIL)
    assert "Messages 100–1,799 folded (1,700)" in html and "Messages 100–299 folded (200)" in html
    assert 'href="/ui/review/long-a?messages=100-399#m100">show 100–399</a>' in html
    assert 'href="/ui/review/long-b?messages=100-299#m100">show them</a>' in html
