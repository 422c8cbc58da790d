"""Peak memory of ``vigil serve`` under concurrent large ingest requests.

    python -m bench.bench_ingest_rss [--requests 20] [--format tau2|native|...] [--file PATH] [--budget BYTES]

Starts this tree's ``vigil serve --no-workers`` on SQLite in a temporary directory, sends ``--requests`` copies of
one τ² results file (2.7 MB, 100 conversations by default) to ``POST /v1/conversations?format=...`` all
at once, each from its own thread, and sends again any request answered 503 after its Retry-After, as a
client does. Prints the server's resident memory once started and its peak (``VmHWM``) after every
request was answered, and how many 503s were answered on the way.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tau2" / "trajectories"
TELECOM = DATA / "sierra_gpt-4.1_telecom_default_gpt-4.1_1trials.json"
SERVICE = Path(__file__).resolve().parents[1] / "service"  # this tree's Vigil, whatever the working directory
KEY = {"Authorization": "Bearer bench-key", "Content-Type": "application/json"}


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _send(base: str, body: bytes, fmt: str) -> tuple[int, int]:
    """(final status, 503s answered before it)"""
    busy = 0
    with httpx.Client(base_url=base, timeout=600) as c:
        while True:
            r = c.post(
                "/v1/conversations", params={} if fmt == "native" else {"format": fmt}, content=body, headers=KEY
            )
            if r.status_code != 503:
                return r.status_code, busy
            busy += 1
            time.sleep(float(r.headers.get("retry-after", "1")))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--format", default="tau2", help="native: Vigil's schema, no ?format=")
    p.add_argument("--file", type=Path, default=TELECOM)
    p.add_argument("--budget", type=int, default=None, help="VIGIL_MAX_INFLIGHT_BYTES (default: Vigil's)")
    args = p.parse_args()
    body = args.file.read_bytes()
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "VIGIL_DATABASE_URL": f"sqlite:///{tmp}/vigil.db",
            "VIGIL_API_KEYS": "bench:admin:bench-key",
            "VIGIL_METRICS_PORT": "0",
            "VIGIL_OTLP_GRPC_PORT": "0",
            "VIGIL_JUDGE_MODE": "offline",
            "VIGIL_LOG_LEVEL": "WARNING",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(SERVICE), os.environ.get("PYTHONPATH")])),
        }
        if args.budget is not None:
            env["VIGIL_MAX_INFLIGHT_BYTES"] = str(args.budget)
        cmd = [sys.executable, "-m", "vigil", "serve", "--no-workers", "--host", "127.0.0.1", "--port", str(port)]
        server = subprocess.Popen(cmd, env=env, cwd=tmp)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("vigil serve did not start")
                time.sleep(0.2)
            started = _status_kb(server.pid, "VmRSS")
            t0 = time.monotonic()
            with ThreadPoolExecutor(args.requests) as pool:
                results = list(pool.map(lambda _: _send(base, body, args.format), range(args.requests)))
            seconds = time.monotonic() - t0
            peak = _status_kb(server.pid, "VmHWM")
        finally:
            server.kill()
            server.wait()
    statuses = sorted({s for s, _ in results})
    print(
        f"{args.requests} x {len(body):,} bytes ?format={args.format}: started {started / 1024:.0f} MB, "
        f"peak {peak / 1024:.0f} MB (+{(peak - started) / 1024:.0f} MB); statuses {statuses}, "
        f"503s answered {sum(b for _, b in results)}, {seconds:.1f} s"
    )


if __name__ == "__main__":
    main()
