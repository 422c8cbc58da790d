"""Screenshots of every console page at 1280x800 and 390x844 for the docs (``docs/img/console-*.png``).

Starts a server on a scratch SQLite database seeded like the demo (a week of the baseline version, then a
regressed canary the detector raises an alert on, some reviewers' labels), logs in and photographs each page
in headless Chromium. Prints each file with its size and how long the page took to load.

    python -m bench.screenshots                 # writes docs/img/
    python -m bench.screenshots --out /tmp/shots
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from tests.support.app import REVIEWER
from tests.support.browser import ARGS, CHROMIUM
from tests.support.console import AGENT, BASELINE, CANDIDATE, console_runtime, raise_alert, seed_week
from tests.support.services import free_port, wait_port

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
TALLEST = 2.5  # a page is photographed down to this many screen heights


def pages(conversation: str, task: str) -> list[tuple[str, str]]:
    return [
        ("home", "/ui"),
        ("alerts", "/ui/alerts"),
        ("quality", f"/ui/quality?agent={AGENT}&version={BASELINE}&last=7d"),
        ("queue", "/ui/queue"),
        ("conversation", f"/ui/review/{quote(conversation, safe='')}"),
        ("side-by-side", f"/ui/side-by-side?task={quote(task, safe='')}&a={BASELINE}&b={CANDIDATE}"),
        ("progress", "/ui/progress"),
        ("clusters", "/ui/clusters"),
        ("compare", f"/ui/compare?agent={AGENT}&baseline={BASELINE}&candidate={CANDIDATE}"),
        ("compare-conversations", f"/ui/compare/conversations?agent={AGENT}&version={CANDIDATE}&signal=forbidden_tool"),
        ("conversations", f"/ui/conversations?agent={AGENT}&severity=medium"),
        ("calibration", "/ui/calibration"),
        ("export", "/ui/export"),
        ("not-found", "/ui/no-such-page"),
    ]


def label_some(base: str, n: int) -> tuple[str, str]:
    """Reviewers work part of the queue (so throughput and progress show); returns an open item's id and task."""
    taxonomy = ["wrong_action", "policy_violation", "missing_confirmation"]
    with httpx.Client(base_url=base, headers=REVIEWER, timeout=30) as c:
        for i in range(n):
            r = c.post("/v1/review/claim", json={})
            if r.status_code == 204:
                break
            cid = r.json()["conversation_id"]
            bad = i % 3 != 2
            body = {"label": "confirmed_failure" if bad else "not_a_failure", "notes": "seeded for the docs"}
            if bad:
                body["category"] = taxonomy[i % len(taxonomy)]
            c.post(f"/v1/review/items/{quote(cid, safe='')}/labels", json=body).raise_for_status()
        items = c.get("/v1/review/queue", params={"version": CANDIDATE, "rule": "no-cancel-delivered-order"}).json()
    first = (items.get("items") or [{}])[0]
    return first.get("conversation_id", ""), first.get("task_id") or ""


def photograph(base: str, out: Path, conversation: str, task: str) -> list[tuple[str, int, float]]:
    from playwright.sync_api import sync_playwright

    shots = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for size, viewport in SIZES.items():
            context = browser.new_context(viewport=viewport)
            page = context.new_page()
            page.goto(f"{base}/ui/login?next=/ui")
            shots.append(save(page, out / f"console-login-{size}.png", viewport, 0.0))
            page.fill("#api_key", "rita-key")
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/ui")
            for name, path in pages(conversation, task):
                started = time.perf_counter()
                page.goto(base + path)
                took = time.perf_counter() - started
                shots.append(save(page, out / f"console-{name}-{size}.png", viewport, took))
            context.close()
        browser.close()
    return shots


def save(page: Any, path: Path, viewport: dict[str, int], took: float) -> tuple[str, int, float]:
    height = min(page.evaluate("document.documentElement.scrollHeight"), int(viewport["height"] * TALLEST))
    page.screenshot(path=str(path), full_page=True, clip={"x": 0, "y": 0, "width": viewport["width"], "height": height})
    shrink(path)
    return path.name, path.stat().st_size, took


def shrink(path: Path) -> None:
    """Store the picture with a 256-colour palette (a third of the bytes; the UI has few colours)."""
    try:
        from PIL import Image
    except ImportError:  # pillow is optional: the full-colour PNG stays
        return
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    ap.add_argument("--labels", type=int, default=24, help="labels the seeded reviewers save first")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import uvicorn

    from vigil.app.server import build_app

    with tempfile.TemporaryDirectory() as tmp:
        rt = console_runtime(f"sqlite:///{Path(tmp) / 'vigil.db'}")
        started = time.perf_counter()
        stored = seed_week(rt, per_hour=12)
        alerts = raise_alert(rt)
        print(f"seeded {stored} conversations and {len(alerts)} alerts in {time.perf_counter() - started:.1f} s")
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(build_app(rt), host="127.0.0.1", port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        if not wait_port(port):
            raise SystemExit("the server did not start")
        base = f"http://127.0.0.1:{port}"
        try:
            conversation, task = label_some(base, args.labels)
            for name, size, took in photograph(base, args.out, conversation, task):
                print(f"{name:40} {size / 1024:7.0f} KiB  page {took * 1000:6.0f} ms")
        finally:
            server.should_exit = True
            thread.join(10)
            rt.close()


if __name__ == "__main__":
    main()
