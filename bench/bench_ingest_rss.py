"""Peak memory of ``vigil serve`` under concurrent large ingest requests.

    python -m bench.bench_ingest_rss [--requests 20] [--format tau2|native|...] [--file PATH] [--budget BYTES]
    python -m bench.bench_ingest_rss --endpoint outcomes|traces|logs [--format pb|json] [--file PATH] ...

Starts this tree's ``vigil serve --no-workers`` on SQLite in a temporary directory, sends ``--requests`` copies of
one τ² results file (2.7 MB, 100 conversations by default) to ``POST /v1/conversations?format=...`` all
at once, each from its own thread, and sends again any request answered 503 after its Retry-After, as a
client does. ``--endpoint outcomes`` sends a batch of 5,000 outcomes for the file's conversations
(1.2 MB) to ``POST /v1/outcomes``; ``traces`` and ``logs`` the first OTLP request made from the file's
conversations (512 GenAI spans, or the log records of their messages; see
``bench.bench_decoded_memory``), protobuf or JSON, to ``POST /v1/traces`` or ``/v1/logs``. Prints the
server's resident memory once started and its peak (``VmHWM``) after every request was answered, and how
many 503s were answered on the way.
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
RETAIL = DATA / "sierra_gpt-4.1_retail_defautl_gpt-4.1_1trials.json"
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


def _send(base: str, body: bytes, path: str, params: dict[str, str], headers: dict[str, str]) -> tuple[int, int]:
    """(final status, 503s answered before it)"""
    busy = 0
    with httpx.Client(base_url=base, timeout=600) as c:
        while True:
            r = c.post(path, params=params, content=body, headers=headers)
            if r.status_code != 503:
                return r.status_code, busy
            busy += 1
            time.sleep(float(r.headers.get("retry-after", "1")))


def _request(endpoint: str, fmt: str, file: Path) -> tuple[bytes, str, dict[str, str], dict[str, str]]:
    """(body, path, query, headers) of the request to send."""
    from bench.bench_decoded_memory import otlp_bodies, outcome_bodies

    if endpoint == "conversations":
        return file.read_bytes(), "/v1/conversations", {} if fmt == "native" else {"format": fmt}, KEY
    if endpoint == "outcomes":
        return outcome_bodies(file)["5000 items"], "/v1/outcomes", {}, KEY
    body = otlp_bodies(file)[f"{endpoint} {fmt}"][0]
    ctype = "application/x-protobuf" if fmt == "pb" else "application/json"
    return body, f"/v1/{endpoint}", {}, {**KEY, "Content-Type": ctype}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--endpoint", default="conversations", choices=("conversations", "outcomes", "traces", "logs"))
    p.add_argument("--requests", type=int, default=20)
    p.add_argument(
        "--format",
        default=None,
        help="conversations: tau2 (default), native (Vigil's schema, no "
        "?format=) ...; traces, logs: pb (default) or json",
    )
    p.add_argument("--file", type=Path, default=None, help="τ² results file (default: telecom; retail for OTLP)")
    p.add_argument("--budget", type=int, default=None, help="VIGIL_MAX_INFLIGHT_BYTES (default: Vigil's)")
    args = p.parse_args()
    otlp = args.endpoint in ("traces", "logs")
    fmt = args.format or ("pb" if otlp else "tau2")
    # retail's first OTLP request is 6.5 MB (telecom's 15 MB, its JSON past VIGIL_OTLP_MAX_BODY_BYTES)
    file = args.file or (RETAIL if otlp else TELECOM)
    body, path, params, headers = _request(args.endpoint, fmt, file)
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
                results = list(pool.map(lambda _: _send(base, body, path, params, headers), range(args.requests)))
            seconds = time.monotonic() - t0
            peak = _status_kb(server.pid, "VmHWM")
        finally:
            server.kill()
            server.wait()
    statuses = sorted({s for s, _ in results})
    what = args.endpoint if args.endpoint == "outcomes" else f"{args.endpoint} {fmt}"
    print(
        f"{args.requests} x {len(body):,} bytes {what}: started {started / 1024:.0f} MB, "
        f"peak {peak / 1024:.0f} MB (+{(peak - started) / 1024:.0f} MB); statuses {statuses}, "
        f"503s answered {sum(b for _, b in results)}, {seconds:.1f} s"
    )


if __name__ == "__main__":
    main()
