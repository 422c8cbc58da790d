"""The judge worker: claims due requests with a lease, judges them concurrently, writes verdicts in batches.

Runs in-process in ``vigil serve`` and alone as ``vigil judge-worker``. Every state it needs is in the
database, so any number of workers can run and a restart loses nothing: a request is done only when its
verdict is stored, in the same transaction. One request's attempt is :mod:`vigil.judge.attempt`; what it
writes, :mod:`vigil.judge.verdicts`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy.exc import InterfaceError, OperationalError

from vigil.heartbeat import Heartbeat
from vigil.judge import store, verdicts
from vigil.judge.attempt import attempt, failed_unexpectedly
from vigil.judge.engine import JudgeEngine, Lane
from vigil.judge.offline import OFFLINE_MODEL
from vigil.judge.verdicts import Outcome
from vigil.store.db import StoreUnavailable, aware, db_detail

log = logging.getLogger(__name__)
HOUSEKEEPING_SECONDS = 2.0
WRITE_BATCH = 200
FLUSH_AT = 64
FLUSH_SECONDS = 0.1


class JudgeWorker:
    def __init__(
        self,
        engine: JudgeEngine,
        verdict_listeners: list[Any] | None = None,
        owner: str | None = None,
        only_conversation: str | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        self.engine = engine
        # beaten by each turn of :meth:`run`, which claims and writes; the judge calls run beside it as tasks,
        # so a slow provider never holds it up, and a loop that stops turning (the event loop blocked) shows
        self.heartbeat = heartbeat or Heartbeat()
        self.settings = engine.settings
        self.metrics = engine.metrics
        self.listeners = verdict_listeners if verdict_listeners is not None else []
        self.owner = owner or f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.in_flight = 0
        self._tasks: dict[asyncio.Task[None], store.Claimed] = {}
        self._outbox: list[Outcome] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self._main: asyncio.Task[None] | None = None
        self._last_housekeeping = 0.0
        self._last_flush = 0.0
        self._probes: set[int] = set()
        self.judged = 0
        self.only_conversation = only_conversation  # ``vigil judge run``: claim nothing else
        self._undefined: set[str] = set()  # judges with queued requests that no definition here defines

    # --- lifecycle (the ``background`` protocol of ``vigil serve``) -------------------------------

    async def start(self) -> None:
        self._stopping = False
        self._wake = asyncio.Event()
        self._main = asyncio.create_task(self.run())

    async def stop(self, grace: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._main:
            with contextlib.suppress(asyncio.CancelledError):
                await self._main
        if self._tasks:
            _, pending = await asyncio.wait(list(self._tasks), timeout=grace)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self._flush()

    async def run(self) -> None:
        with self.heartbeat.loop():
            await self._run()

    async def _run(self) -> None:
        backoff = 0.0  # while the database is away: a line per failure, at growing intervals
        while not self._stopping:
            try:
                claimed = await self.tick()
                backoff = 0.0
            except (OperationalError, InterfaceError, StoreUnavailable) as exc:
                # the database is down or restarting: the requests stay queued; one line, not a traceback
                # twice a second (13,757 log lines in a 35 s outage)
                backoff = min(30.0, max(1.0, backoff * 2))
                log.warning("judge worker: database unavailable (%s); trying again in %.0f s", db_detail(exc), backoff)
                claimed = 0
            except Exception:  # a bug must not end the worker either; the requests stay queued
                backoff = min(30.0, max(1.0, backoff * 2))
                log.exception("judge worker tick failed; trying again in %.0f s", backoff)
                claimed = 0
            idle = max(backoff, self.settings.judge_poll_interval_seconds) if not claimed else 0.0
            self.heartbeat.beat(idle=idle)
            if not claimed:
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), idle)

    async def run_until_idle(self, timeout: float = 60.0) -> int:
        """Judge until no request of a running judge is pending or in flight here (CLI ``--once``, tests); a
        request another worker is running is its own (waiting for it waited for its lease, up to 300 s).

        Requests waiting for a retry are waited for; those of a paused or stopped judge, or of one whose
        circuit is open (its cooldown may be long), are not: they stay queued for a later run.
        Returns the number of verdicts stored.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        before = self.judged
        while loop.time() < deadline:
            claimed = await self.tick(force_housekeeping=True)
            if self._tasks:
                await asyncio.wait(
                    list(self._tasks),
                    timeout=max(0.0, deadline - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            await self._flush()
            if not claimed and not self._tasks:
                waiting = [n for n, lane in self.engine.lanes.items() if self.engine.accepting(lane)]
                if not waiting or not await asyncio.to_thread(self._pending, waiting):
                    break
                await asyncio.sleep(self.settings.judge_poll_interval_seconds)
        return self.judged - before

    def _pending(self, judges: list[str]) -> int:
        with self.engine.sessions() as s:
            return store.left_for(s, judges, self.owner, self.engine.now(s), self.only_conversation)

    # --- the loop ---------------------------------------------------------------------------------

    async def tick(self, force_housekeeping: bool = False) -> int:
        loop = asyncio.get_running_loop()
        if force_housekeeping or loop.time() - self._last_housekeeping >= HOUSEKEEPING_SECONDS:
            self._last_housekeeping = loop.time()
            await asyncio.to_thread(self._housekeeping)
        # Writes and claims are batched: each is a write transaction, and on SQLite the pipeline waits
        # for the same lock, so a transaction per judgement would slow ingest down.
        if self._outbox and (
            len(self._outbox) >= FLUSH_AT or not self._tasks or loop.time() - self._last_flush >= FLUSH_SECONDS
        ):
            await self._flush()
        total = 0
        total_cap = _with_prefetch(self.settings.judge_concurrency)
        for lane in self.engine.lanes.values():
            limit = min(lane.judge.spec.limits.concurrency, self.settings.judge_concurrency)
            # claim no more than the calls the judge may send now (its window grows as calls succeed)
            free = min(_with_prefetch(min(limit, lane.window)) - lane.in_flight, total_cap - self.in_flight)
            # nor more than its rate limit lets start while their leases run (less a call's timeout): a
            # request waiting for a token past its lease is claimed again and paid for twice
            room = self.settings.judge_lease_seconds - lane.judge.spec.timeout_seconds
            free = min(free, max(1, lane.limiter.calls_within(room)) - lane.in_flight)
            if (
                free <= 0
                or (lane.in_flight and free < max(1, min(limit, lane.window) // 8))
                or not self.engine.may_claim(lane)
            ):
                continue
            probing = lane.state == "circuit_open"
            claimed = await asyncio.to_thread(self._claim, lane.name, 1 if probing else free)
            if probing:
                self._probes.update(r.id for r in claimed)
                if not claimed:
                    lane.breaker.cancel_probe()
            for req in claimed:
                lane.in_flight += 1
                self.in_flight += 1
                task = asyncio.create_task(self._judge(lane, req))
                self._tasks[task] = req
                task.add_done_callback(self._done)
            total += len(claimed)
        return total

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        self._wake.set()

    def _claim(self, judge: str, limit: int) -> list[store.Claimed]:
        with self.engine.sessions.begin() as s:
            return store.claim(
                s,
                judge,
                limit,
                self.owner,
                self.engine.now(s),
                self.settings.judge_lease_seconds,
                self.only_conversation,
            )

    def _housekeeping(self) -> None:
        eng = self.engine
        with eng.sessions.begin() as s:
            now = eng.now(s)
            depth = store.queue_depth(s)
            eng.observe_spend(store.spend_since(s, eng.day_start(now)), now)
            statuses = store.load_status(s, eng.lanes)
            # a removed or renamed judge's requests stay queued: its depth is still exported (and alerts on)
            for name in sorted(set(depth) - set(eng.lanes)):
                self.metrics.judge_queue_depth.labels(name).set(depth[name])
                if name not in self._undefined:
                    log.warning("%d judge requests wait for judge %s, which no definition defines", depth[name], name)
            for name in self._undefined - set(depth) - set(eng.lanes):
                self.metrics.judge_queue_depth.labels(name).set(0)
            self._undefined = set(depth) - set(eng.lanes)
            for name, lane in eng.lanes.items():
                self.metrics.judge_queue_depth.labels(name).set(depth.get(name, 0))
                row = statuses.get(name)
                asked = row.resume_requested_at if row is not None else None
                if lane.state == "stopped_config_error" and asked is not None and _after(asked, lane.changed_at):
                    log.warning("judge %s: resume requested", name)
                    eng.resume(lane)
                eng.refresh(lane)
                if lane.dirty or row is None or row.state != lane.state:
                    store.save_status(s, name, lane.state, lane.detail, self.owner, now)
                    lane.dirty = False

    # --- one request ------------------------------------------------------------------------------

    async def _judge(self, lane: Lane, req: store.Claimed) -> None:
        try:
            outcome = await attempt(self.engine, lane, req, self._probes)
        except asyncio.CancelledError:
            outcome = Outcome(req, "release", error="worker stopped")
            self._outbox.append(outcome)
            raise
        except Exception as exc:  # a bug in one request must not stop the others; retried, bounded, later
            log.exception("judging %s with %s failed", req.conversation_id, lane.name)
            outcome = failed_unexpectedly(self.engine, lane, req, exc)
        finally:
            lane.in_flight -= 1
            self.in_flight -= 1
            if req.id in self._probes:  # a call settled the breaker; a request that made none must not wedge it
                self._probes.discard(req.id)
                lane.breaker.cancel_probe()
        self._outbox.append(outcome)
        if len(self._outbox) >= WRITE_BATCH:
            await self._flush()

    # --- writes -----------------------------------------------------------------------------------

    async def _flush(self) -> None:
        self._last_flush = asyncio.get_running_loop().time()
        while self._outbox:
            batch, self._outbox = self._outbox[:WRITE_BATCH], self._outbox[WRITE_BATCH:]
            try:
                try:
                    rows, again = await asyncio.to_thread(
                        verdicts.write, self.engine, self.owner, self.listeners, batch
                    )
                except Exception as exc:
                    if not verdicts.refused_by_database(exc):
                        raise
                    # what one outcome holds must not block every later write: the rest go in alone
                    log.warning("the database refused a batch of %d judge outcomes: %s", len(batch), exc)
                    rows, again = await asyncio.to_thread(
                        verdicts.write_each, self.engine, self.owner, self.listeners, batch
                    )
            except Exception:  # keep the outcomes and try again next tick; leases cover a crash meanwhile
                log.exception("writing %d judge outcomes failed; will retry", len(batch))
                self._outbox = batch + self._outbox
                await asyncio.sleep(1.0)
                return
            verdicts.count(self.metrics, rows, again)
            self.judged += len(rows)


def _with_prefetch(concurrency: int) -> int:
    """Requests claimed at most: the calls allowed in flight plus a quarter more waiting for a slot."""
    return concurrency + max(1, concurrency // 4)


def _after(a: datetime, b: datetime) -> bool:
    """Compare timestamps from SQLite (naive, UTC) and Postgres or Python (aware) alike."""
    return aware(a) > aware(b)


__all__ = ["JudgeWorker", "OFFLINE_MODEL"]
