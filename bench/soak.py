"""Soak test: Vigil as production runs it, under steady mixed traffic for a long time, watched for slow
leaks and degradation.

    python -m bench.soak --minutes 30 --rate 25 --every 60     # needs Postgres on 127.0.0.1:5432

Starts, as processes on a fresh Postgres database (created on ``VIGIL_BENCH_PG_URL``'s server, default
the test server, and dropped at the end): the API (``vigil serve --no-workers``, as the chart's API
pods run it), a judge worker (``vigil judge-worker``, offline judge) and the detector (``vigil
detector``), with the detector, rollups and retention on short intervals and retention windows of a few
minutes, so tables reach a steady size within the run. Then, for ``--minutes``, at ``--rate``
conversations a second:

- simulated conversations (``vigil simulate``'s generator) and the real τ² conversations of
  ``../shared/data/tau2`` under new ids, posted in small batches to ``/v1/conversations``;
- growing conversations: ``in_progress`` revisions 1, 2, 3 of more and more messages, then the finished one;
- outcomes posted 5–30 s after their conversation (``/v1/outcomes``);
- OTLP traces of conversations (``/v1/traces``, protobuf), each with trace ids of its own;
- reads, one at a time, of the UI pages (home, queue, compare, quality, alerts, conversations) and
  the API (``/v1/compare``, ``/v1/quality``, ``/v1/alerts``, ``/v1/review/queue``) and ``/metrics``.

Every ``--every`` seconds one line: elapsed, RSS / open fds / threads of each Vigil process, ingest
latency p50/p99 of the interval, read latency p50/p99 per page, rows per main table, ``/metrics``
series of each process, dead letters. At the end: growth per hour (least-squares slope over the run
after ``--warmup`` seconds) of RSS, fds, threads, series and each latency, a flag on whatever keeps
growing, and the metric families whose series count grew.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

from tests.support.services import free_port, wait_port
from vigil.ingest.simulate import Simulator, parse_versions

ROOT = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("VIGIL_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
KEY = "soak-admin"
AUTH = {"Authorization": f"Bearer {KEY}"}
TABLES = (
    "conversations",
    "findings",
    "outcomes",
    "outcome_links",
    "judge_requests",
    "verdicts",
    "review_items",
    "review_reasons",
    "review_audit",
    "rollup_members",
    "detector_feeds",
    "otel_spans",
    "dead_letters",
)
READS = {
    "home": "/ui/",
    "queue": "/ui/queue",
    "compare": "/ui/compare",
    "quality": "/ui/quality",
    "alerts": "/ui/alerts",
    "convs": "/ui/conversations",
    "api-compare": "/v1/compare?agent=support-bot&baseline=v1.4.0&candidate=v1.5.0",
    "api-quality": "/v1/quality?agent=support-bot&version=v1.5.0",
    "api-alerts": "/v1/alerts",
    "api-queue": "/v1/review/queue",
    "metrics": "/metrics",
}


# --- the processes ---------------------------------------------------------------------------------


@contextlib.contextmanager
def database() -> Iterator[str]:
    name = f"vigil_soak_{uuid.uuid4().hex[:10]}"
    admin = psycopg.connect(PG_URL, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://{PG_URL.split('://', 1)[1].rsplit('/', 1)[0]}/{name}"
    finally:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()


class Stack:
    """``vigil serve --no-workers``, ``vigil judge-worker`` and ``vigil detector`` on one database."""

    def __init__(self, url: str, work: Path, retention_minutes: float) -> None:
        days = f"{retention_minutes / 1440:.6f}"
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "service"), str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "VIGIL_DATABASE_URL": url,
            "VIGIL_API_KEYS": f"admin:admin:{KEY}",
            "VIGIL_RULE_PACKS": str(ROOT / "rules" / "default.yaml"),
            "VIGIL_JUDGE_MODE": "offline",
            "VIGIL_DETECTOR_INTERVAL_SECONDS": "5",
            "VIGIL_DETECTOR_SETTLE_SECONDS": "5",
            "VIGIL_ROLLUP_INTERVAL_SECONDS": "15",
            "VIGIL_RETENTION_INTERVAL_SECONDS": "30",
            "VIGIL_RETENTION_CONVERSATIONS_DAYS": days,
            "VIGIL_RETENTION_UNJOINED_OUTCOMES_DAYS": days,
            "VIGIL_RETENTION_FINDINGS_DAYS": days,
            "VIGIL_RETENTION_VERDICTS_DAYS": days,
            "VIGIL_RETENTION_DEAD_LETTERS_DAYS": days,
            "VIGIL_OTLP_PROGRESS_INTERVAL_SECONDS": "5",
            "VIGIL_OTLP_FINISH_INTERVAL_SECONDS": "5",
            "VIGIL_OTLP_GRPC_PORT": "0",
            "VIGIL_MIGRATE_ON_START": "false",
            "VIGIL_LOG_LEVEL": "WARNING",
        }
        self.work = work
        subprocess.run(
            [sys.executable, "-m", "vigil.app.cli", "db", "upgrade"],
            cwd=ROOT,
            env=self.env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        self.port = free_port()
        self.ports = {"api": self.port, "judge": free_port(), "detector": free_port()}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._start("api", ["serve", "--no-workers"], {"VIGIL_PORT": str(self.port), "VIGIL_METRICS_PORT": "0"})
        self._start("judge", ["judge-worker"], {"VIGIL_METRICS_PORT": str(self.ports["judge"])})
        self._start("detector", ["detector"], {"VIGIL_METRICS_PORT": str(self.ports["detector"])})
        for name, port in self.ports.items():
            if not wait_port(port, 120):
                self.stop()
                raise RuntimeError(f"{name} did not listen on {port}: see {work}")

    def _start(self, name: str, args: list[str], env: dict[str, str]) -> None:
        log = open(self.work / f"{name}.log", "wb")  # noqa: SIM115 (kept for the run)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "vigil.app.cli", *args],
            cwd=ROOT,
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(20)


def proc_stats(pid: int) -> tuple[float, int, int]:
    """RSS (MB), open fds and threads of a process."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss / 1024, len(os.listdir(f"/proc/{pid}/fd")), threads


def series(text: str) -> collections.Counter[str]:
    """Series per metric family of a /metrics text."""
    out: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            for suffix in ("_bucket", "_count", "_sum", "_total", "_created"):
                if name.endswith(suffix):
                    name = name[: -len(suffix)]
                    break
            out[name] += 1
    return out


# --- the traffic -----------------------------------------------------------------------------------


def tau2() -> list[dict[str, Any]]:
    from bench.bench_pipeline import tau2_messages

    return [orjson.loads(r) for r in tau2_messages()]


class Traffic:
    """Mixed ingest at ``rate`` conversations a second; latencies of each request in ``self.lat``."""

    def __init__(self, base: str, rate: float, seed: int = 11) -> None:
        self.base = base
        self.rate = rate
        self.sim = Simulator(parse_versions("v1.4.0:0.04,v1.5.0:0.12"), seed)
        self.tau = tau2()
        self.rng = random.Random(seed)
        self.n = itertools.count()
        self.lat: list[float] = []  # seconds per ingest request, the interval's
        self.errors: collections.Counter[str] = collections.Counter()
        self.sent = collections.Counter[str]()
        self.later: list[tuple[float, list[dict[str, Any]]]] = []  # (due, outcomes)
        self.growing: list[tuple[float, dict[str, Any], int]] = []  # (due, conversation, next revision)
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def _post(self, c: httpx.Client, path: str, body: bytes, ctype: str = "application/json") -> None:
        t0 = time.perf_counter()
        try:
            r = c.post(path, content=body, headers={**AUTH, "content-type": ctype})
            code = r.status_code
        except httpx.HTTPError as exc:
            code = type(exc).__name__  # type: ignore[assignment]
        dt = time.perf_counter() - t0
        with self.lock:
            self.lat.append(dt)
            if not (isinstance(code, int) and code < 300):
                self.errors[f"{path} {code}"] += 1

    def _conversation(self) -> dict[str, Any]:
        i = next(self.n)
        if i % 4 == 0:  # a real τ² conversation under a new id, received now
            c = dict(self.tau[i // 4 % len(self.tau)])
            c["conversation_id"] = f"{c['conversation_id']}:soak{i}"
            now = datetime.now(UTC)
            c["started_at"], c["ended_at"] = (now - timedelta(seconds=60)).isoformat(), now.isoformat()
            c["metadata"] = {**(c.get("metadata") or {}), "simulated_defect": None}
            return c
        return self.sim.conversation(self.rng.choices(self.sim.profiles)[0], datetime.now(UTC))

    def run(self) -> None:
        from bench.bench_otlp import _requests as otlp_requests
        from bench.bench_otlp import trace_spans

        trace_n = itertools.count(90_000_000)
        batch = 5
        tick = batch / self.rate
        with httpx.Client(base_url=self.base, timeout=60) as c:
            nxt = time.monotonic()
            for b in itertools.count():
                if self.stop.is_set():
                    break
                convs = [self._conversation() for _ in range(batch)]
                now = time.monotonic()
                plain, traced = [], []
                for k, conv in enumerate(convs):
                    outcomes = self.sim.outcomes_for(conv) if conv.get("metadata", {}).get("tenant") else []
                    if k == 0:  # growing: revisions of more and more messages, the finished one last
                        self.growing.append((now + 3, conv, 1))
                    elif k == 1 and b % 2 == 0:  # every other batch's second conversation as a trace
                        traced.append(conv)
                    else:
                        plain.append(conv)
                    if outcomes:
                        self.later.append((now + self.rng.uniform(5, 30), outcomes))
                if plain:
                    self._post(c, "/v1/conversations", orjson.dumps(plain))
                    self.sent["plain"] += len(plain)
                for conv in traced:
                    for body in otlp_requests((conv["agent_id"], sp) for sp in trace_spans(conv, next(trace_n))):
                        self._post(c, "/v1/traces", body, "application/x-protobuf")
                    self.sent["otlp"] += 1
                due = [g for g in self.growing if g[0] <= now]
                self.growing = [g for g in self.growing if g[0] > now]
                revs = []
                for _, conv, rev in due:
                    msgs = conv["messages"]
                    if rev < 4:
                        cut = max(2, len(msgs) * rev // 4)
                        revs.append({**conv, "revision": rev, "status": "in_progress", "messages": msgs[:cut]})
                        self.growing.append((now + 3, conv, rev + 1))
                    else:
                        revs.append({**conv, "revision": rev, "status": "finished"})
                        self.sent["grown"] += 1
                if revs:
                    self._post(c, "/v1/conversations", orjson.dumps(revs))
                ready = [o for t, outs in self.later if t <= now for o in outs]
                self.later = [(t, outs) for t, outs in self.later if t > now]
                if ready:
                    self._post(c, "/v1/outcomes", orjson.dumps(ready))
                    self.sent["outcomes"] += len(ready)
                nxt += tick
                self.stop.wait(max(0.0, nxt - time.monotonic()))

    def take(self) -> list[float]:
        with self.lock:
            out, self.lat = self.lat, []
        return out


class Reader:
    """Reads each page in turn, one at a time, logged in as a reviewer in the UI."""

    def __init__(self, base: str, pause: float) -> None:
        self.base = base
        self.pause = pause
        self.lat: dict[str, list[float]] = collections.defaultdict(list)
        self.errors: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def run(self) -> None:
        import re

        with httpx.Client(base_url=self.base, timeout=120) as c:
            page = c.get("/ui/login")
            token = re.search(r'name="csrf" value="([^"]+)"', page.text)
            c.post("/ui/login", data={"csrf": token.group(1) if token else "", "api_key": KEY})
            for name in itertools.cycle(READS):
                if self.stop.is_set():
                    return
                t0 = time.perf_counter()
                try:
                    r = c.get(READS[name], headers=AUTH, follow_redirects=False)
                    code: Any = r.status_code
                except httpx.HTTPError as exc:
                    code = type(exc).__name__
                dt = time.perf_counter() - t0
                with self.lock:
                    self.lat[name].append(dt)
                    if code != 200:
                        self.errors[f"{name} {code}"] += 1
                self.stop.wait(self.pause)

    def take(self) -> dict[str, list[float]]:
        with self.lock:
            out, self.lat = self.lat, collections.defaultdict(list)
        return out


# --- watching --------------------------------------------------------------------------------------


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def slope_per_hour(ts: list[float], ys: list[float]) -> float:
    pts = [(t, y) for t, y in zip(ts, ys, strict=True) if y == y]  # drop NaN
    if len(pts) < 3:
        return float("nan")
    mt = statistics.fmean(t for t, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    den = sum((t - mt) ** 2 for t, _ in pts)
    return sum((t - mt) * (y - my) for t, y in pts) / den * 3600 if den else float("nan")


def rows(url: str) -> dict[str, int]:
    out = {}
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        present = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        for t in TABLES:
            if t in present:
                out[t] = int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0])  # type: ignore[index]
    return out


def scrape_series(port: int) -> collections.Counter[str]:
    with contextlib.suppress(httpx.HTTPError):
        return series(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text)
    return collections.Counter()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=25.0, help="conversations a second")
    ap.add_argument("--every", type=float, default=60.0, help="seconds between report lines")
    ap.add_argument("--warmup", type=float, default=180.0, help="seconds left out of the growth fit")
    ap.add_argument("--retention-minutes", type=float, default=8.0)
    ap.add_argument("--read-pause", type=float, default=0.5, help="seconds between two reads")
    args = ap.parse_args(argv)
    # SIGTERM stops the run as Ctrl-C does: the Vigil processes are killed and the database dropped
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    print(
        f"soak: {args.minutes:g} min at {args.rate:g} conversations/s (a quarter τ², a fifth growing over 4 "
        f"revisions, a tenth OTLP), reads every {args.read_pause:g} s, retention {args.retention_minutes:g} min; "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d, database() as url:
        stack = Stack(url, Path(d), args.retention_minutes)
        try:
            base = f"http://127.0.0.1:{stack.port}"
            traffic, reader = Traffic(base, args.rate), Reader(base, args.read_pause)
            threads = [threading.Thread(target=x.run, daemon=True) for x in (traffic, reader)]
            for t in threads:
                t.start()
            t0 = time.monotonic()
            first_series: dict[str, collections.Counter[str]] = {}
            last_series: dict[str, collections.Counter[str]] = {}
            while time.monotonic() - t0 < args.minutes * 60:
                time.sleep(args.every)
                for name, p in stack.procs.items():
                    if p.poll() is not None:
                        raise RuntimeError(f"{name} exited with {p.returncode}: see {d}")
                elapsed = time.monotonic() - t0
                s: dict[str, Any] = {"t": elapsed}
                for name, p in stack.procs.items():
                    s[f"rss:{name}"], s[f"fds:{name}"], s[f"thr:{name}"] = proc_stats(p.pid)
                    ser = scrape_series(stack.ports[name])
                    first_series.setdefault(name, ser)
                    last_series[name] = ser
                    s[f"series:{name}"] = sum(ser.values())
                ing = traffic.take()
                s["ingest_p50"], s["ingest_p99"] = pct(ing, 0.5), pct(ing, 0.99)
                for page, lat in reader.take().items():
                    s[f"{page}_p50"], s[f"{page}_p99"] = pct(lat, 0.5), pct(lat, 0.99)
                s.update({f"rows:{k}": v for k, v in rows(url).items()})
                samples.append(s)
                procs = " ".join(
                    f"{n}={s[f'rss:{n}']:.0f}MB/{s[f'fds:{n}']}fd/{s[f'thr:{n}']}t/{s[f'series:{n}']}ser"
                    for n in stack.procs
                )
                pages = " ".join(
                    f"{p}={s.get(f'{p}_p50', float('nan')):.0f}/{s.get(f'{p}_p99', float('nan')):.0f}" for p in READS
                )
                table = " ".join(f"{k}={s[f'rows:{k}']}" for k in TABLES if f"rows:{k}" in s)
                print(
                    f"[{elapsed / 60:5.1f} min] {procs} | ingest {len(ing)} req p50/p99 "
                    f"{s['ingest_p50']:.0f}/{s['ingest_p99']:.0f} ms | reads ms {pages} | rows {table} "
                    f"| errors {dict(traffic.errors) or 0} {dict(reader.errors) or 0}",
                    flush=True,
                )
            traffic.stop.set()
            reader.stop.set()
            for t in threads:
                t.join(120)
            print(f"sent: {dict(traffic.sent)}")
        finally:
            stack.stop()
    fit = [s for s in samples if s["t"] >= args.warmup] or samples
    ts = [s["t"] for s in fit]
    print(f"\ngrowth per hour (least squares over {ts[0] / 60:.0f}–{ts[-1] / 60:.0f} min), first → last:")
    flagged = []
    keys = [k for k in fit[-1] if k != "t" and not k.startswith("rows:")]
    for k in keys:
        ys = [float(s.get(k, float("nan"))) for s in fit]
        per_h = slope_per_hour(ts, ys)
        first, last = ys[0], ys[-1]
        # growing without bound: rising steadily (the last third above the first third by >10% and the
        # slope over the run positive) for counts; latencies and RSS alike
        thirds = max(1, len(ys) // 3)
        a = statistics.fmean(y for y in ys[:thirds] if y == y) if any(y == y for y in ys[:thirds]) else float("nan")
        b = statistics.fmean(y for y in ys[-thirds:] if y == y) if any(y == y for y in ys[-thirds:]) else float("nan")
        grows = per_h > 0 and a == a and b > a * 1.10 + (1 if k.split(":")[0] in ("fds", "thr", "series") else 0)
        mark = "  <-- GROWING" if grows else ""
        if grows:
            flagged.append(k)
        print(f"  {k:<22} {first:9.1f} → {last:9.1f}   {per_h:+10.1f}/h{mark}")
    for name in last_series:
        grew = {m: (first_series[name][m], n) for m, n in last_series[name].items() if n > first_series[name][m]}
        if grew:
            print(f"  /metrics of {name}, families whose series grew: {grew}")
    print("flagged: " + (", ".join(flagged) if flagged else "nothing grows"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
