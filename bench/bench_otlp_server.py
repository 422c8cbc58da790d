"""OTLP ingest against native ingest, measured in the server process as a deployment runs it.

    python -m bench.bench_otlp_server [--copies 4] [--rounds 3] [--db sqlite|postgres]

``bench.bench_otlp`` serves each Vigil in the benchmark's own process through Starlette's test client,
so what it counts includes the client's side of every request (building and handing over 10 MB
bodies) and leaves out the server's real HTTP work (reading the body from a socket, parsing it). Here
each way in gets a Vigil of its own in a child process, served by uvicorn as ``vigil serve`` serves it
(its heap settled the same way), and the parent sends the same requests over loopback with a plain
HTTP client. What is counted is the child's CPU time (user and system, from ``/proc/<pid>/stat``)
between the first and the last measured request, per 1,000 conversations: what Vigil spends, and
nothing the exporter spends. With ``--db postgres`` each run gets a fresh database on the local server
(``VIGIL_BENCH_PG_URL``, default the test server's) and the CPU of the Postgres backends serving it is
added, as ``bench.bench_hotpath`` counts it: with SQLite the storing is the server process's own work,
with Postgres most of it is the database's. The ratio is the median of each round's ratio to native ingest.

By default (``--lockstep``) the three Vigils of a round run side by side, each in its own process, and
the requests go to them in turn, whichever way is least far through its requests next: the machine's
speed, which on a shared VM drifts by ±15% within a minute, is then the same for all three ways, and the
ratio compares their work, not the minutes they ran in. ``--sequential`` runs the ways one after the
other, each round in another order (how figures before 5 December 2026 were measured).

``--against DIR`` also serves every way from another checkout's ``DIR/service`` (the tree before a
change, say), in the same lockstep: both trees' ratios come from the same minutes, and the benchmark
prints, per round, this tree's cost over the other's, which spreads far less than either ratio does, and
the other tree's OTLP ways against its own native ingest (a change to what both ways share, the
database's settings or the pipeline, moves the ratio through native ingest too).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.bench_hotpath import pg_cpu, pg_delta
from bench.bench_otlp import INTERLEAVED_IDS, KEY, WARM_IDS, conversations, interleaved, native_bodies, whole_traces

_CHILD = """
import sys
from prometheus_client import CollectorRegistry
import uvicorn
from vigil.app.runtime import build_runtime, settle_heap
from vigil.app.server import build_app
from vigil.app.wiring import wire
from vigil.settings import Settings

settings = Settings(
    database_url=sys.argv[1], api_keys="bench:admin:bench-key", metrics_port=0,
    otlp_grpc_port=0, judge_mode="offline",
)
app = build_app(wire(build_runtime(settings, registry=CollectorRegistry()), {"api"}))
settle_heap(long_running=True)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
"""

WAYS = {
    "native": ("/v1/conversations", "application/json"),
    "otlp": ("/v1/traces", "application/x-protobuf"),
    "otlp-interleaved": ("/v1/traces", "application/x-protobuf"),
}
TICK = os.sysconf("SC_CLK_TCK")
WARM = 60  # conversations sent before measuring: imports, compiled statements and rule caches
PG_URL = os.environ.get("VIGIL_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _cpu(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _database(kind: str, tmp: Path, label: str) -> Iterator[tuple[str, Any]]:
    """The database URL of one run and a function giving the CPU-seconds so far of the Postgres backends
    serving it (none with SQLite)."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp / f'{label}.db'}", lambda: {}
        return
    import psycopg

    name = f"vigil_bench_{uuid.uuid4().hex[:10]}"
    admin = psycopg.connect(PG_URL, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://{PG_URL.split('://', 1)[1].rsplit('/', 1)[0]}/{name}", lambda: pg_cpu(admin, name)
    finally:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.close()


def _serve(url: str, tree: Path | None = None) -> tuple[subprocess.Popen[bytes], httpx.Client]:
    """A Vigil server on ``url``'s database, from this checkout or from ``tree``'s ``service/``."""
    port = _free_port()
    env = None
    if tree is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "service"), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, url, str(port)], env=env)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300)
    deadline = time.monotonic() + 120
    while True:
        if child.poll() is not None:
            raise RuntimeError(f"the Vigil server exited with {child.returncode}")
        try:
            if client.get("/healthz").status_code == 200:
                return child, client
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            child.kill()
            raise RuntimeError("the Vigil server did not answer /healthz within 120 s")
        time.sleep(0.1)


def _finished(url: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM conversations WHERE status = 'finished'")).scalar_one())
    finally:
        engine.dispose()


REVISIONS: dict[str, list[float]] = {}  # OTLP revisions through the pipeline per conversation, per round


def _revisions(client: httpx.Client) -> float:
    """Conversation revisions the server assembled from spans (``vigil_otlp_conversation_revisions_total``):
    more than one per conversation when a trace stayed unfinished past ``VIGIL_OTLP_PROGRESS_INTERVAL_SECONDS``."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("vigil_otlp_conversation_revisions_total "):
            return float(line.split()[1])
    return 0.0


AGAINST = "@"  # a way served from the other tree: "otlp@", "otlp-interleaved@"


def _lockstep(
    warm: dict[str, list[bytes]],
    bodies: dict[str, list[bytes]],
    urls: dict[str, tuple[str, Any]],
    n: int,
    against: Path | None = None,
) -> dict[str, tuple[float, float, float]]:
    """User and system CPU-seconds each way's server spent on its ``bodies`` (after its ``warm``, not
    counted), and those of the Postgres backends serving it: one server a way, requests sent in turn."""
    served = {way: _serve(urls[way][0], against if way.endswith(AGAINST) else None) for way in bodies}
    try:
        for way, (_, client) in served.items():
            path, ctype = WAYS[way.rstrip(AGAINST)]
            for body in warm[way]:  # imports, compiled statements and rule caches of a fresh process
                assert client.post(path, content=body, headers={**KEY, "content-type": ctype}).status_code < 300
        before = {way: (_cpu(child.pid), urls[way][1]()) for way, (child, _) in served.items()}
        sent = dict.fromkeys(bodies, 0)
        while True:
            left = [way for way in bodies if sent[way] < len(bodies[way])]
            if not left:
                break
            way = min(left, key=lambda w: (sent[w] + 1) / len(bodies[w]))
            path, ctype = WAYS[way.rstrip(AGAINST)]
            r = served[way][1].post(path, content=bodies[way][sent[way]], headers={**KEY, "content-type": ctype})
            assert r.status_code < 300, r.text[:300]
            sent[way] += 1
        used = {}
        for way, (child, _) in served.items():
            (user0, sys0), pg0 = before[way]
            user1, sys1 = _cpu(child.pid)
            used[way] = (user1 - user0, sys1 - sys0, pg_delta(pg0, urls[way][1]()))
            if not way.startswith("native"):
                REVISIONS.setdefault(way, []).append(_revisions(served[way][1]) / (n + WARM))
    finally:
        for child, client in served.values():
            client.close()
            child.terminate()
        for child, _ in served.values():
            child.wait(30)
    for way in bodies:  # the warm-up's and the measured conversations, each finished once
        finished = _finished(urls[way][0])
        assert finished == n + WARM, f"{way}: {finished} of {n + WARM} conversations finished"
    return used


def compare(
    copies: int, rounds: int, db: str = "sqlite", lockstep: bool = True, against: Path | None = None
) -> dict[str, float]:
    convs = conversations(copies)
    n = len(convs)
    bodies = {"native": native_bodies(convs), "otlp": whole_traces(convs), "otlp-interleaved": interleaved(convs)}
    warm_convs = [{**c, "conversation_id": f"{c['conversation_id']}-warm"} for c in conversations(1)[:WARM]]
    # the warm-up's traces have ids of their own, as every trace has in production: with the measured
    # traces' ids, their spans would be taken for resent ones (skipped, and the COPY refused for a request)
    warm = {"native": native_bodies(warm_convs), "otlp": whole_traces(warm_convs, first=WARM_IDS)}
    warm["otlp-interleaved"] = interleaved(warm_convs, first=WARM_IDS + INTERLEAVED_IDS)
    del convs, warm_convs
    ways = list(WAYS)
    if against is not None:
        for way in WAYS:  # native ingest too: a change to what both ways share moves the ratio through both
            bodies[way + AGAINST], warm[way + AGAINST] = bodies[way], warm[way]
            ways.append(way + AGAINST)
    used: dict[str, list[tuple[float, float, float]]] = {w: [] for w in ways}
    REVISIONS.clear()
    with tempfile.TemporaryDirectory() as d:
        for r in range(rounds):
            if lockstep:
                with ExitStack() as stack:
                    urls = {way: stack.enter_context(_database(db, Path(d), f"{way}-{r}")) for way in ways}
                    for way, run in _lockstep(warm, bodies, urls, n, against).items():
                        used[way].append(run)
                continue
            for way in ways[r % len(ways) :] + ways[: r % len(ways)]:
                with _database(db, Path(d), f"{way}-{r}") as url:
                    used[way].append(_lockstep(warm, {way: bodies[way]}, {way: url}, n, against)[way])
    print(
        f"OTLP against native ingest on {db}, {n:,} τ² conversations, CPU-seconds per 1,000 of the server process"
        f"{' and its Postgres backends' if db == 'postgres' else ''} (median of {rounds} rounds; ratio: median of "
        f"each round's ratio to native; {'the ways in lockstep' if lockstep else 'one way after another'})"
        + (f"; ways ending in {AGAINST} served from {against}" if against is not None else "")
    )
    native = [sum(run) for run in used["native"]]
    out: dict[str, float] = {}
    per = 1000 / n
    for way, runs in used.items():
        total = [sum(run) for run in runs]
        ratio = statistics.median(t / nat for t, nat in zip(total, native, strict=True))
        out[way] = ratio
        user, system, pg = (statistics.median(run[i] for run in runs) * per for i in range(3))
        print(
            f"  {way:<17} {statistics.median(total) * per:5.2f}  (user {user:5.2f}, system {system:5.2f}"
            f"{f', Postgres {pg:5.2f}' if db == 'postgres' else ''})  {ratio:.2f}× native  "
            f"{len(bodies[way])} requests of {sum(map(len, bodies[way])) / len(bodies[way]) / 1e6:.1f} MB"
            + (
                f"; rounds {', '.join(f'{t / nat:.2f}' for t, nat in zip(total, native, strict=True))}"
                if way != "native"
                else ""
            )
            + (f"; {statistics.median(REVISIONS[way]):.2f} revisions a conversation" if way in REVISIONS else "")
        )
    for way in ways:
        if way.endswith(AGAINST):
            mine, theirs = ([sum(run) for run in used[w]] for w in (way.rstrip(AGAINST), way))
            each = [m / t for m, t in zip(mine, theirs, strict=True)]
            print(
                f"  {way.rstrip(AGAINST):<17} this tree / {against}: {statistics.median(each):.3f} "
                f"(rounds {', '.join(f'{e:.3f}' for e in each)})"
            )
    if against is not None:  # each tree's OTLP ways against its own native ingest, round by round
        theirs_native = [sum(run) for run in used["native" + AGAINST]]
        for way in WAYS:
            if way != "native":
                theirs = [sum(run) / nat for run, nat in zip(used[way + AGAINST], theirs_native, strict=True)]
                print(
                    f"  {way:<17} {against}'s own ratio to its native ingest: {statistics.median(theirs):.2f}× "
                    f"(rounds {', '.join(f'{t:.2f}' for t in theirs)})"
                )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=4, help="copies of the 120 τ² conversations")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    order = ap.add_mutually_exclusive_group()
    order.add_argument("--lockstep", dest="lockstep", action="store_true", default=True, help="(default)")
    order.add_argument("--sequential", dest="lockstep", action="store_false")
    ap.add_argument(
        "--against", type=Path, metavar="DIR", help="also serve every way from DIR/service (another checkout)"
    )
    args: Any = ap.parse_args(argv)
    if args.against is not None and not (args.against / "service" / "vigil").is_dir():
        ap.error(f"--against {args.against}: no service/vigil there (give the root of another Vigil checkout)")
    compare(args.copies, args.rounds, args.db, args.lockstep, args.against)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
