"""Two reviewers never hold the same item, however many claim at once."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import select

from tests.support.review import review_runtime, simulated, store
from tests.support.services import free_port, wait_port
from vigil.review import queue
from vigil.review.stage import ReviewStage
from vigil.store.models import ReviewItemRow, utcnow

CLIENTS = 20
KEYS = ",".join(f"r{i}:reviewer:key-{i}" for i in range(CLIENTS)) + ",admin:admin:admin-key"


def _flagged_runtime(url: str, items: int):  # type: ignore[no-untyped-def]
    """A runtime whose queue holds exactly ``items`` available items."""
    rt = review_runtime(url, api_keys=KEYS)
    convs = [
        c
        for c in simulated(400, "v1:0.5", seed=5)
        if c["metadata"]["simulated_defect"] in ("cancel_delivered", "pii_leak", "no_confirmation")
    ]
    store(rt, convs[:items])
    with rt.sessions() as s:
        assert s.query(ReviewItemRow).count() == items
    return rt


@pytest.mark.postgres
def test_twenty_clients_claim_at_once_over_http_and_get_twenty_items(pg_url) -> None:
    import uvicorn

    from vigil.app.server import build_app

    rt = _flagged_runtime(pg_url, CLIENTS)
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(build_app(rt), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    assert wait_port(port)
    barrier = threading.Barrier(CLIENTS)
    results: dict[int, httpx.Response] = {}

    def claim(i: int) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            c.get("/healthz")  # connect before the barrier so the claims really overlap
            barrier.wait()
            results[i] = c.post("/v1/review/claim", headers={"Authorization": f"Bearer key-{i}"})

    try:
        workers = [threading.Thread(target=claim, args=(i,)) for i in range(CLIENTS)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
    finally:
        srv.should_exit = True
        thread.join(10)
    assert [r.status_code for r in results.values()] == [200] * CLIENTS
    claimed = [r.json()["conversation_id"] for r in results.values()]
    assert len(set(claimed)) == CLIENTS
    with rt.sessions() as s:
        holders = dict(s.execute(select(ReviewItemRow.conversation_id, ReviewItemRow.claimed_by)).all())
    assert sorted(holders.values()) == sorted(f"r{i}" for i in range(CLIENTS))
    assert all(holders[r.json()["conversation_id"]] == f"r{i}" for i, r in results.items())
    rt.close()


@pytest.mark.parametrize("more_clients_than_items", [False, True])
def test_concurrent_claims_never_share_an_item(db_url, more_clients_than_items) -> None:
    items = CLIENTS // 2 if more_clients_than_items else CLIENTS
    rt = _flagged_runtime(db_url, items)
    barrier = threading.Barrier(CLIENTS)
    got: dict[int, str | None] = {}
    errors: list[BaseException] = []

    def claim(i: int) -> None:
        try:
            barrier.wait()
            with rt.sessions.begin() as s:
                got[i] = queue.claim_next(s, f"r{i}", 600)
        except BaseException as exc:  # surfaced below: a thread's failure must fail the test
            errors.append(exc)

    workers = [threading.Thread(target=claim, args=(i,)) for i in range(CLIENTS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert errors == []
    claimed = [c for c in got.values() if c is not None]
    assert len(claimed) == len(set(claimed)) == items
    assert Counter(c is None for c in got.values())[True] == CLIENTS - items
    rt.close()


def test_an_expired_lease_goes_back_to_the_queue(sqlite_url) -> None:
    rt = _flagged_runtime(sqlite_url, 2)
    t0 = utcnow()
    with rt.sessions.begin() as s:
        a = queue.claim_next(s, "rita", 60, now=t0)
        b = queue.claim_next(s, "raj", 60, now=t0)
        assert queue.claim_next(s, "ann", 60, now=t0 + timedelta(seconds=59)) is None
        # rita extends in time, raj does not
        queue.extend(s, a, "rita", 60, now=t0 + timedelta(seconds=50))
        assert queue.claim_next(s, "ann", 60, now=t0 + timedelta(seconds=61)) == b
        with pytest.raises(queue.Conflict):
            queue.extend(s, b, "raj", 60, now=t0 + timedelta(seconds=62))
        assert queue.claim_next(s, "bob", 60, now=t0 + timedelta(seconds=109)) is None
        assert queue.claim_next(s, "bob", 60, now=t0 + timedelta(seconds=111)) == a
    rt.close()


def test_an_assignment_lapses_and_the_item_goes_back_to_everyone(db_url) -> None:
    from vigil.review import triage

    rt = _flagged_runtime(db_url, 2)
    t0 = utcnow()
    with rt.sessions.begin() as s:
        ids = list(s.scalars(select(ReviewItemRow.conversation_id).order_by(ReviewItemRow.id)))
        assert triage.bulk(s, "assign", ids, "lead", assignee="raj", now=t0)["done"] == ids
        # within the assignment's life nobody else is offered raj's items, with or without a lapse set
        assert queue.claim_next(s, "rita", 60, now=t0 + timedelta(hours=71), assignment_hours=72) is None
        assert queue.claim_next(s, "rita", 60, now=t0 + timedelta(hours=500)) is None  # 0: never lapses
        # raj takes one (and holds it: a long lease); the other's assignment lapses after 72 hours: rita gets it
        mine = queue.claim_next(s, "raj", 10**7, now=t0 + timedelta(hours=1), assignment_hours=72)
        assert mine in ids
        other = queue.claim_next(s, "rita", 60, now=t0 + timedelta(hours=73), assignment_hours=72)
        assert other in ids and other != mine
        # unassigning clears when it was assigned; a fresh assignment starts a fresh clock
        triage.bulk(s, "unassign", [other], "lead", now=t0 + timedelta(hours=74))
        item = s.scalar(select(ReviewItemRow).where(ReviewItemRow.conversation_id == other))
        assert item is not None and item.assignee is None and item.assigned_at is None
    rt.close()


def test_concurrent_signals_for_one_conversation_add_up(db_url) -> None:
    from vigil.review.flagger import enqueue
    from vigil.review.policy import Reason

    rt = review_runtime(db_url)
    policy = rt.get(ReviewStage).policy
    convs = simulated(10, "v1:0.0", seed=6)
    store(rt, convs)
    workers = 8
    errors: list[BaseException] = []
    for conv in convs[:3]:
        cid = conv["conversation_id"]
        barrier = threading.Barrier(workers)

        def flag(i: int, cid: str = cid, barrier: threading.Barrier = barrier) -> None:
            try:
                barrier.wait()
                with rt.sessions.begin() as s:
                    enqueue(s, policy, {cid: [Reason("outcome", f"type-{i}", 10.0), Reason("sample", "s", 1.0)]})
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=flag, args=(i,)) for i in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        with rt.sessions() as s:
            item = s.scalar(select(ReviewItemRow).where(ReviewItemRow.conversation_id == cid))
        assert item is not None and item.priority == 10.0 * workers + 1.0
    rt.close()
