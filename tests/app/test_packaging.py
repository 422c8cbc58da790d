"""`pip install .` gives an importable `vigil` that works outside the checkout, with its data files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vigil.settings import PROJECT_ROOT

PROBE = """
import pathlib, vigil, vigil.settings as s
from vigil.app.wiring import STAGES, metadata
root = pathlib.Path(vigil.__file__).parent
need = ["migrations/env.py", "ui/static/vigil.css", "ui/templates/base.html", "review/templates/queue.html",
        "compare/templates/compare.html", "export/templates/export.html", "review/flagging.yaml"]
missing = [n for n in need if not (root / n).is_file()]
assert not missing, missing
assert len(metadata().tables) > 15 and len(STAGES) >= 8
print(vigil.__file__)
print(s.PROJECT_ROOT)
"""


@pytest.mark.slow
def test_installed_package_resolves_defaults_from_cwd(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(PROJECT_ROOT)],
        check=True,
        timeout=600,
    )
    elsewhere = tmp_path / "app"
    (elsewhere / "rules").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    module_file, root = out.stdout.split()
    assert module_file.startswith(str(target)), f"imported {module_file}, not the installed copy"
    assert Path(root) == elsewhere, "installed outside a checkout, defaults resolve against the working directory"
