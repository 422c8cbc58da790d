"""A broker that accepts connections and stops answering (a hung process, not a dead one)."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import uuid

import pytest
from prometheus_client import CollectorRegistry

from tests.ingest.test_kafka_consumer import count, produce, start_worker, topic_settings
from tests.support.services import create_topic, free_port, kafka_broker
from tests.support.waiting import wait_for
from vigil.app.runtime import build_runtime
from vigil.ingest import kafka as kafka_ingest
from vigil.ingest.simulate import Simulator, parse_versions

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]


class HangingProxy:
    """Forwards ``port`` to a broker until :meth:`hang`; from then on it accepts connections and reads what
    clients send, and answers nothing. Counts the connections clients close; :meth:`resume` forwards new
    connections again."""

    def __init__(self, port: int, target: str) -> None:
        host, target_port = target.rsplit(":", 1)
        self.target = (host, int(target_port))
        self.hung = threading.Event()
        self.closed_by_clients = 0
        self.server = socket.create_server(("127.0.0.1", port))
        self.sockets: list[socket.socket] = [self.server]
        threading.Thread(target=self._accept, daemon=True).start()

    def hang(self) -> None:
        self.hung.set()

    def resume(self) -> None:
        self.hung.clear()

    def close(self) -> None:
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.sockets.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        broker = None if self.hung.is_set() else socket.create_connection(self.target)
        if broker is not None:
            self.sockets.append(broker)
        try:
            while True:
                # once hung, what the broker sends is left unread and never forwarded
                ends = [client] if broker is None or self.hung.is_set() else [client, broker]
                ready, _, _ = select.select(ends, [], [], 0.2)
                for end in ready:
                    data = end.recv(65536)
                    if not data:
                        if end is client:
                            self.closed_by_clients += 1
                        return
                    if broker is not None and not self.hung.is_set():
                        (broker if end is client else client).sendall(data)
        except OSError:
            return


def test_a_consumer_drops_a_hung_brokers_connections_within_the_request_timeout_and_resumes(pg_url) -> None:
    """The consumer waited 30 s (kafka-python's default floor Vigil kept) for a broker that stopped
    answering, spinning a CPU and growing its heap all the while (measured: 150 MB in 30 s); it now gives
    up after ``VIGIL_KAFKA_REQUEST_TIMEOUT_MS`` (here 5 s), and stores what comes once the broker answers."""
    port = free_port()
    with kafka_broker(advertised_port=port) as real:
        proxy = HangingProxy(port, real)
        bootstrap = f"127.0.0.1:{port}"
        topic, group = f"conv-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, 1)
        rt = build_runtime(
            topic_settings(bootstrap, pg_url, topic, group, kafka_request_timeout_ms=5000),
            registry=CollectorRegistry(),
        )
        convs = list(Simulator(parse_versions("v1:0.0"), seed=21).stream(10))
        worker, thread, _ = start_worker(rt)
        try:
            produce(bootstrap, topic, convs[:5])
            wait_for(lambda: count(rt) == 5, 60, what="5 stored before the broker hangs")
            before = proxy.closed_by_clients
            proxy.hang()
            # inside the 30 s it waited before
            wait_for(lambda: proxy.closed_by_clients > before, 20, what="the consumer dropping the hung connections")
            proxy.resume()
            produce(bootstrap, topic, convs[5:])
            wait_for(lambda: count(rt) == 10, 90, what="the rest stored once the broker answers")
        finally:
            worker.stop()
            thread.join(30)
            proxy.close()
            rt.close()


def test_a_consumer_says_when_no_broker_has_answered_it(pg_url, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the brokers out of reach (stopped, hung, or a network policy in the way), a consumer's gauges kept
    their last values: its partitions stayed assigned and its lag at 0 while nothing was read, and no alert could
    tell. ``vigil_consumer_broker_answered_timestamp_seconds`` moves while a broker answers, even on a quiet
    topic, stops while none does, and moves again once one does."""
    monkeypatch.setattr(kafka_ingest, "BROKER_PROBE_SECONDS", 0.2, raising=False)
    port = free_port()
    with kafka_broker(advertised_port=port) as real:
        proxy = HangingProxy(port, real)
        bootstrap = f"127.0.0.1:{port}"
        topic, group = f"conv-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, 1)
        rt = build_runtime(
            topic_settings(bootstrap, pg_url, topic, group, kafka_request_timeout_ms=5000),
            registry=CollectorRegistry(),
        )
        worker, thread, _ = start_worker(rt)

        def answered() -> float:
            return rt.metrics.registry.get_sample_value("vigil_consumer_broker_answered_timestamp_seconds") or 0.0

        try:
            wait_for(lambda: rt.metrics.consumer_assigned_partitions._value.get() == 1, 60, what="an assignment")
            quiet = answered()
            wait_for(lambda: answered() > quiet, 30, what="a broker answering a consumer of a quiet topic")
            before = proxy.closed_by_clients
            proxy.hang()
            wait_for(lambda: proxy.closed_by_clients > before, 20, what="the consumer dropping the hung connections")
            stalled, dropped = answered(), proxy.closed_by_clients
            # its next connections hang as well, and are dropped in turn: no broker answered meanwhile
            wait_for(lambda: proxy.closed_by_clients > dropped, 30, what="the consumer dropping its next connections")
            assert answered() == stalled, "the consumer says a broker answered while none could"
            proxy.resume()
            wait_for(lambda: answered() > stalled, 90, what="the broker answering again")
        finally:
            worker.stop()
            thread.join(30)
            proxy.close()
            rt.close()
