"""Copies what the Helm chart carries from the repository into ``helm/vigil/files/``.

Helm can only read files inside the chart, so the chart keeps copies of ``rules/*.yaml``,
``judges/<name>/*``, ``dashboards/alerts.yaml`` and ``dashboards/vigil.json``. Run this after
changing any of them; ``--check`` exits 1 and lists the differences (a test runs the same check).

    python helm/sync_chart_files.py [--check]
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ROOT / "helm" / "vigil" / "files"


def wanted() -> dict[Path, Path]:
    """Chart copy → repository source."""
    out: dict[Path, Path] = {}
    for src in sorted((ROOT / "rules").glob("*.yaml")):
        out[FILES / "rules" / src.name] = src
    judges = ROOT / "judges"
    if judges.is_dir():
        for folder in sorted(p for p in judges.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
            for src in sorted(f for f in folder.iterdir() if f.is_file() and not f.name.startswith(".")):
                out[FILES / "judges" / folder.name / src.name] = src
    for name in ("alerts.yaml", "vigil.json"):
        out[FILES / name] = ROOT / "dashboards" / name
    return out


def present() -> set[Path]:
    return {p for p in FILES.rglob("*") if p.is_file()} if FILES.exists() else set()


def drift() -> list[str]:
    """Differences between the chart's copies and their sources (empty when in sync)."""
    problems = []
    want = wanted()
    for dst, src in want.items():
        if not src.exists():
            problems.append(f"{src.relative_to(ROOT)} does not exist")
        elif not dst.exists():
            problems.append(f"{dst.relative_to(ROOT)} is missing (copy of {src.relative_to(ROOT)})")
        elif dst.read_bytes() != src.read_bytes():
            problems.append(f"{dst.relative_to(ROOT)} differs from {src.relative_to(ROOT)}")
    for extra in sorted(present() - set(want)):
        problems.append(f"{extra.relative_to(ROOT)} has no source in the repository")
    return problems


def sync() -> None:
    want = wanted()
    for stale in present() - set(want):
        stale.unlink()
    for dst, src in want.items():
        if src.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    for folder in sorted((p for p in FILES.rglob("*") if p.is_dir()), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()


def main() -> int:
    if "--check" in sys.argv[1:]:
        problems = drift()
        for p in problems:
            print(p)
        return 1 if problems else 0
    sync()
    print(f"synced {len(wanted())} files into {FILES.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
