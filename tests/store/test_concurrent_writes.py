"""Overlapping batches from concurrent writers on two app instances: no deadlock reaches a client."""

from __future__ import annotations

import random
import threading

import orjson
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from tests.support.app import make_settings
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.http import ingest_body
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.store.models import ConversationRow, ReviewItemRow

POOL = 400
WRITERS = 4
BATCHES = 25
BATCH = 120


def test_four_writers_on_two_instances_store_every_conversation_once(pg_url) -> None:
    runtimes = [build_runtime(make_settings(pg_url), registry=CollectorRegistry()) for _ in range(2)]
    for rt in runtimes:
        wire(rt, {"api"})
    pool = list(Simulator(parse_versions("v1:0.3,v2:0.3"), 11).stream(POOL))
    errors: list[BaseException] = []
    statuses: list[int] = []
    newest: dict[str, int] = {}
    lock = threading.Lock()
    start = threading.Barrier(WRITERS)

    def writer(k: int) -> None:
        rng = random.Random(k)
        rt = runtimes[k % 2]
        start.wait()
        for b in range(BATCHES):
            batch = []
            for conv in rng.sample(pool, BATCH):  # each batch in its own random order
                revision = 1 + b * WRITERS + k
                batch.append(dict(conv, revision=revision))
                with lock:
                    newest[conv["conversation_id"]] = max(newest.get(conv["conversation_id"], 0), revision)
            try:
                answer = ingest_body(rt, orjson.dumps(batch))
                statuses.append(answer.status)
            except BaseException as exc:  # noqa: BLE001 - any failure is what this test counts
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert statuses == [202] * (WRITERS * BATCHES)
    with runtimes[0].sessions() as s:
        stored = dict(s.execute(select(ConversationRow.conversation_id, ConversationRow.revision)).all())
        queue_items = s.scalar(select(func.count()).select_from(ReviewItemRow))
        distinct_items = s.scalar(select(func.count(func.distinct(ReviewItemRow.conversation_id))))
    assert len(stored) == len(newest) and stored == newest  # each stored once, at its newest revision
    assert queue_items == distinct_items
    for rt in runtimes:
        rt.close()
