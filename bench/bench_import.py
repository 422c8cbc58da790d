"""``vigil import`` of a large file of JSON lines: read in parts (as shipped) against read whole.

    python -m bench.bench_import [--conversations 60000] [--store]

Writes ``--conversations`` simulated conversations (``vigil simulate``'s, one JSON line each) to a temporary
file, then runs ``vigil import`` on it in a child process per variant: as shipped (a file over
``PART_BYTES`` read ``PART_LINES`` lines at a time, each part stored before the next is read), and with
``PART_BYTES`` raised past the file's size (the whole file read, then every conversation stored, as before
parts existed). Prints each child's wall time, user and system CPU and peak resident set (``wait4``).
Without ``--store`` the imports are ``--dry-run`` (read and check only); with it, each stores into a
fresh SQLite database.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

_CHILD = """
import sys
from vigil.ingest import importers
if sys.argv[1] != "shipped":
    importers.PART_BYTES = int(sys.argv[1])
from vigil.app.cli import app
sys.argv = ["vigil", *sys.argv[2:]]
app()
"""

ROOT = Path(__file__).resolve().parents[1]


def _write(path: Path, n: int) -> None:
    from vigil.ingest.simulate import Simulator, parse_versions

    with path.open("wb") as fh:
        for conv in Simulator(parse_versions("v1.4.0:0.04,v1.5.0:0.12"), 0).stream(n):
            fh.write(orjson.dumps(conv) + b"\n")


def _run(variant: str, path: Path, store: bool, db: Path) -> tuple[float, float, float, int, int]:
    """Wall, user and system seconds, peak RSS in MB, and exit code of one import."""
    args = ["import", str(path)] if store else ["import", "--dry-run", str(path)]
    env = {**os.environ, "VIGIL_DATABASE_URL": f"sqlite:///{db}", "VIGIL_METRICS_PORT": "0"}
    start = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, variant, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.monotonic() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        err = child.stderr.read().decode(errors="replace") if child.stderr else ""
        raise RuntimeError(f"vigil import exited with {code}: {err[-2000:]}")
    return wall, usage.ru_utime, usage.ru_stime, usage.ru_maxrss // 1024, code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=60_000)
    ap.add_argument("--store", action="store_true", help="store into SQLite instead of --dry-run")
    args: Any = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "conversations.jsonl"
        _write(path, args.conversations)
        size = path.stat().st_size
        print(
            f"vigil import {'' if args.store else '--dry-run '}of {args.conversations:,} simulated conversations, "
            f"{size / 1e6:.0f} MB of JSON lines, one child process each"
        )
        for label, variant in (("in parts (as shipped)", "shipped"), ("whole file", str(size + 1))):
            wall, user, system, peak, _ = _run(variant, path, args.store, Path(d) / f"{variant}.db")
            cpu = f"user {user:6.1f} s  system {system:5.1f} s"
            print(f"  {label:<22} {wall:6.1f} s wall  {cpu}  peak RSS {peak:6,} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
