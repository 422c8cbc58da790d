"""What a long transcript costs the conversation page: bytes, server render time, Chromium load time.

Stores one valid conversation of ``--n`` short messages (SQLite in a scratch folder), then fetches its
review page ``--repeat`` times with the fold on (the first and last messages, the middle folded) and
off (every message, as the page was before the fold), alternating the two so the machine's noise falls
on both, and prints the medians and their ratio. With ``--browser`` it also times Chromium loading
each page (navigation to the load event) against a real server.

    python -m bench.bench_transcript_page --n 20000 --repeat 7 --browser
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.review.test_review_ui import _login
from tests.support.app import served
from tests.support.browser import ARGS, CHROMIUM, sign_in
from tests.support.review import long_conversation, review_client, review_runtime, store
from vigil.ui import folding

URL = "/ui/review/long-1"


@contextmanager
def unfolded(on: bool) -> Iterator[None]:
    """Every message on the page (a default view as long as any conversation), when ``on``."""
    head = folding.HEAD
    folding.HEAD = 10**9 if on else head
    try:
        yield
    finally:
        folding.HEAD = head


def alternate(repeat: int, fetch: Callable[[], Any]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"folded": [], "unfolded": []}
    for _ in range(repeat):
        for mode in ("folded", "unfolded"):
            with unfolded(mode == "unfolded"):
                t = time.perf_counter()
                fetch()
                times[mode].append((time.perf_counter() - t) * 1000)
    return times


def report(what: str, times: dict[str, list[float]]) -> None:
    f, u = statistics.median(times["folded"]), statistics.median(times["unfolded"])
    print(f"{what:<28} unfolded {u:8.1f} ms   folded {f:8.1f} ms   ratio {u / f:5.1f}x")


def chromium(rt: Any, repeat: int) -> None:
    from playwright.sync_api import sync_playwright

    with served(rt) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = sign_in(browser.new_page(), base, "/ui/queue")
        report("Chromium load (to onload)", alternate(repeat, lambda: page.goto(base + URL, wait_until="load")))
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000, help="messages in the conversation")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--browser", action="store_true", help="also time Chromium loading the page")
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="vigil-bench-page-")
    # a document of 20,000 messages serialises to about 1.1 MB with its defaults written out
    rt = review_runtime(f"sqlite:///{folder}/vigil.db", max_message_bytes=8_000_000)
    try:
        store(rt, [long_conversation(args.n, "long-1", leak_at=args.n // 2)])
        with review_client(rt) as ui:
            _login(ui)
            ui.get(URL)  # warm the templates
            for mode in ("unfolded", "folded"):
                with unfolded(mode == "unfolded"):
                    page = ui.get(URL)
                    articles = page.text.count('<article class="msg')
                print(f"{mode:<9} page: {len(page.content):>10,} bytes, {articles:,} messages rendered")
            report("server (fetch + render)", alternate(args.repeat, lambda: ui.get(URL)))
        if args.browser:
            chromium(rt, args.repeat)
    finally:
        rt.close()


if __name__ == "__main__":
    main()
