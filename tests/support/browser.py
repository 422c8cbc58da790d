"""Headless Chromium as the browser tests drive it (Debian's chromium; nothing is downloaded)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from vigil.settings import PROJECT_ROOT

CHROMIUM = os.environ.get("VIGIL_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = PROJECT_ROOT / "test-artifacts"  # screenshots of failed browser tests


ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def sign_in(page: Any, base: str, path: str, key: str = "rita-key") -> Any:
    """Open ``path``, which sends a signed-out browser to the login form, sign in with ``key`` and wait to be
    sent back; returns the page."""
    page.goto(f"{base}{path}")
    assert "/ui/login" in page.url, page.url
    page.fill("#api_key", key)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}{path}")
    return page


# axe-core from npm (never a CDN), installed once into a cache folder outside the repository
AXE_VERSION = "4"
AXE_DIR = Path(os.environ.get("VIGIL_TEST_AXE_DIR") or Path.home() / ".cache" / "vigil-tests" / "axe")
AXE_JS = AXE_DIR / "node_modules" / "axe-core" / "axe.min.js"
# what the browser tests fail on; "moderate" and "minor" findings are reported, not failed
AXE_FAILING = ("serious", "critical")


def axe_script() -> Path | None:
    """axe.min.js, installed with ``npm install --prefix AXE_DIR axe-core@4`` when absent; None if it cannot be."""
    if AXE_JS.exists():
        return AXE_JS
    npm = shutil.which("npm")
    if npm is None:
        return None
    AXE_DIR.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [npm, "install", "--prefix", str(AXE_DIR), "--no-audit", "--no-fund", f"axe-core@{AXE_VERSION}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        print(f"npm install axe-core failed: {done.stderr[-2000:]}")
    return AXE_JS if AXE_JS.exists() else None


def axe_violations(page: Any, script: Path) -> list[dict[str, Any]]:
    """Run axe-core on the page (its context must bypass the page's CSP to take the script); serious ones only."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(script))
    found = page.evaluate("async () => (await window.axe.run(document, {resultTypes: ['violations']})).violations")
    return [v for v in found if v.get("impact") in AXE_FAILING]


def describe(violations: list[dict[str, Any]]) -> str:
    lines = []
    for v in violations:
        targets = [", ".join(n.get("target", [])) for n in v.get("nodes", [])[:4]]
        lines.append(f"{v['impact']} {v['id']}: {v['help']} at {targets}")
    return "\n".join(lines)
