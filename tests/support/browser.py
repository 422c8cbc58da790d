"""Headless Chromium as the browser tests drive it (Debian's chromium; nothing is downloaded)."""

from __future__ import annotations

import os
import shutil

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
