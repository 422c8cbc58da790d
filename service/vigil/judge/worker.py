"""The judge worker: claims due requests with a lease, judges them concurrently, writes verdicts in batches.

Runs in-process in ``vigil serve`` and alone as ``vigil judge-worker``. Every state it needs is in the
database, so any number of workers can run and a restart loses nothing: a request is done only when its
verdict is stored, in the same transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from vigil.judge import store
from vigil.judge.engine import JudgeEngine, JudgeUnavailable, Lane
from vigil.judge.errors import ProviderError
from vigil.judge.offline import OFFLINE_MODEL, findings_of, offline_prompt_hash, offline_raw, offline_verdict
from vigil.judge.parse import Parsed, parse_verdict
from vigil.judge.prompt import build_messages
from vigil.schema import Conversation
from vigil.store.db import aware
from vigil.store.models import VerdictRow

log = logging.getLogger(__name__)
HOUSEKEEPING_SECONDS = 2.0
WRITE_BATCH = 200
FLUSH_AT = 64
FLUSH_SECONDS = 0.1


@dataclass(slots=True)
class Outcome:
    """What to write for one claimed request: a verdict, a retry or a release."""

    req: store.Claimed
    kind: str  # verdict | retry | release
    parsed: Parsed | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    delay: float = 0.0
    error: str | None = None


class JudgeWorker:
    def __init__(
        self,
        engine: JudgeEngine,
        verdict_listeners: list[Any] | None = None,
        owner: str | None = None,
        only_conversation: str | None = None,
    ) -> None:
        self.engine = engine
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
        while not self._stopping:
            try:
                claimed = await self.tick()
            except Exception:  # a database hiccup must not end the worker; the requests stay queued
                log.exception("judge worker tick failed")
                claimed = 0
            if not claimed:
                self._wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.settings.judge_poll_interval_seconds)

    async def run_until_idle(self, timeout: float = 60.0) -> int:
        """Judge until no request of a running judge is pending or in flight (CLI ``--once``, tests).

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
            depth = store.queue_depth(s, self.only_conversation)
            return sum(n for j, n in depth.items() if j in judges)

    # --- the loop ---------------------------------------------------------------------------------

    async def tick(self, force_housekeeping: bool = False) -> int:
        loop = asyncio.get_running_loop()
        if force_housekeeping or loop.time() - self._last_housekeeping >= HOUSEKEEPING_SECONDS:
            self._last_housekeeping = loop.time()
            await asyncio.to_thread(self._housekeeping)
        # Writes and claims are batched: each is a write transaction, and on SQLite the pipeline waits
        # for the same lock, so a transaction per judgement would slow ingest down.
        if self._outbox and (
            len(self._outbox) >= FLUSH_AT
            or not self._tasks
            or loop.time() - self._last_flush >= FLUSH_SECONDS
        ):
            await self._flush()
        total = 0
        total_cap = _with_prefetch(self.settings.judge_concurrency)
        for lane in self.engine.lanes.values():
            limit = min(lane.judge.spec.limits.concurrency, self.settings.judge_concurrency)
            free = min(_with_prefetch(limit) - lane.in_flight, total_cap - self.in_flight)
            if free <= 0 or (lane.in_flight and free < max(1, limit // 8)) or not self.engine.may_claim(lane):
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
                self.engine.clock(),
                self.settings.judge_lease_seconds,
                self.only_conversation,
            )

    def _housekeeping(self) -> None:
        eng = self.engine
        with eng.sessions.begin() as s:
            depth = store.queue_depth(s)
            eng.observe_spend(store.spend_since(s, eng.day_start()))
            statuses = store.load_status(s, eng.lanes)
            for name, lane in eng.lanes.items():
                self.metrics.judge_queue_depth.labels(name).set(depth.get(name, 0))
                row = statuses.get(name)
                asked = row.resume_requested_at if row is not None else None
                if (
                    lane.state == "stopped_config_error"
                    and asked is not None
                    and _after(asked, lane.changed_at)
                ):
                    log.warning("judge %s: resume requested", name)
                    eng.resume(lane)
                eng.refresh(lane)
                if lane.dirty or row is None or row.state != lane.state:
                    store.save_status(s, name, lane.state, lane.detail, self.owner, eng.clock())
                    lane.dirty = False

    # --- one request ------------------------------------------------------------------------------

    async def _judge(self, lane: Lane, req: store.Claimed) -> None:
        try:
            outcome = await self._attempt(lane, req)
        except asyncio.CancelledError:
            outcome = Outcome(req, "release", error="worker stopped")
            self._outbox.append(outcome)
            raise
        except Exception as exc:  # a bug in one request must not stop the others; it is retried later
            log.exception("judging %s with %s failed", req.conversation_id, lane.name)
            outcome = Outcome(
                req, "retry", delay=self.settings.judge_retry_base_seconds, error=repr(exc)[:500]
            )
        finally:
            lane.in_flight -= 1
            self.in_flight -= 1
            if req.id in self._probes:  # a call settled the breaker; a request that made none must not wedge it
                self._probes.discard(req.id)
                lane.breaker.cancel_probe()
        self._outbox.append(outcome)
        if len(self._outbox) >= WRITE_BATCH:
            await self._flush()

    async def _attempt(self, lane: Lane, req: store.Claimed) -> Outcome:
        judge = lane.judge
        if req.document is None:
            return Outcome(
                req, "verdict", Parsed.unscored("conversation_missing"), self._base(lane, judge.prompt_hash)
            )
        try:
            conv = Conversation.model_validate_json(req.document)
        except ValidationError:
            return Outcome(
                req, "verdict", Parsed.unscored("bad_document"), self._base(lane, judge.prompt_hash)
            )
        if lane.offline:
            findings = await asyncio.to_thread(self._findings, req.conversation_id)
            parsed = offline_verdict(judge, conv, findings)
            fields = self._base(lane, offline_prompt_hash(judge))
            fields.update(
                raw_reply=offline_raw(parsed),
                prompt_tokens=0,
                completion_tokens=0,
                cost_usd=0.0,
                latency_ms=0.0,
            )
            return Outcome(req, "verdict", parsed, fields)
        messages = build_messages(judge, conv)
        try:
            # claimed requests beyond the limits wait here, so a freed slot starts the next call at once
            async with (
                self.engine.gate(lane.name, judge.spec.limits.concurrency),
                self.engine.gate("", self.settings.judge_concurrency),
            ):
                # the judge may have stopped or paused while this request waited for a slot
                if not self.engine.accepting(lane) and req.id not in self._probes:
                    raise JudgeUnavailable(lane.name, lane.state, lane.detail)
                reply, latency_ms = await self.engine.call(lane, messages)
        except JudgeUnavailable as exc:
            return Outcome(req, "release", delay=self.settings.judge_poll_interval_seconds, error=str(exc))
        except ProviderError as err:
            decision = self.engine.policy(err, req.attempts)
            if decision.action == "retry":
                return Outcome(req, "retry", delay=decision.delay, error=str(err))
            if decision.action == "give_up":
                # a verdict, not a silent failure: the request is done and every verdict reader sees why
                self.metrics.judge_errors.labels(lane.name, "gave_up").inc()
                why = f"gave up after {req.attempts} attempts: {err}"[:2000]
                return Outcome(req, "verdict", Parsed.unscored("gave_up", why), self._base(lane, judge.prompt_hash))
            if decision.action == "stop_judge":
                return Outcome(req, "release", error=str(err))
            return Outcome(
                req,
                "verdict",
                Parsed.unscored(err.reason, err.detail[:500]),
                self._base(lane, judge.prompt_hash),
            )
        parsed = parse_verdict(reply.text, judge.spec.categories)
        if parsed.verdict == "unscored" and parsed.unscored_reason != "judge_abstained":
            self.metrics.judge_errors.labels(lane.name, "parse").inc()
        fields = self._base(lane, judge.prompt_hash)
        fields.update(
            raw_reply=reply.text,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            cost_usd=reply.cost_usd,
            latency_ms=latency_ms,
        )
        return Outcome(req, "verdict", parsed, fields)

    def _base(self, lane: Lane, prompt_hash: str) -> dict[str, Any]:
        return {
            "model": lane.model,
            "offline": lane.offline,
            "prompt_hash": prompt_hash,
            "judge_version": lane.judge.version,
        }

    def _findings(self, conversation_id: str) -> list[tuple[str, str, str, str]]:
        with self.engine.sessions() as s:
            return findings_of(s, conversation_id)

    # --- writes -----------------------------------------------------------------------------------

    async def _flush(self) -> None:
        self._last_flush = asyncio.get_running_loop().time()
        while self._outbox:
            batch, self._outbox = self._outbox[:WRITE_BATCH], self._outbox[WRITE_BATCH:]
            try:
                rows, again = await asyncio.to_thread(self._write, batch)
            except Exception:  # keep the outcomes and try again next tick; leases cover a crash meanwhile
                log.exception("writing %d judge outcomes failed; will retry", len(batch))
                self._outbox = batch + self._outbox
                await asyncio.sleep(1.0)
                return
            self._count(rows, again)

    def _write(self, batch: list[Outcome]) -> tuple[list[VerdictRow], set[tuple[str, str]]]:
        """Store the batch's outcomes; returns the new verdicts and the (judge, conversation) pairs among
        them that had a verdict already (a newer revision judged again)."""
        eng = self.engine
        now = eng.clock()
        rows: list[VerdictRow] = []
        with eng.sessions.begin() as s:
            for o in batch:
                r = o.req
                if o.kind == "verdict" and o.parsed is not None:
                    if not store.complete(s, r.id, self.owner):
                        continue  # our lease ran out and another worker has it: it writes the verdict
                    p = o.parsed
                    rows.append(
                        VerdictRow(
                            request_id=r.id,
                            judge=r.judge,
                            conversation_id=r.conversation_id,
                            revision=r.stored_revision if r.stored_revision is not None else r.revision,
                            agent_id=r.agent_id,
                            agent_version=r.agent_version,
                            verdict=p.verdict,
                            score=p.score,
                            categories=p.categories,
                            rationale=p.rationale,
                            unscored_reason=p.unscored_reason,
                            attempts=r.attempts,
                            reason=r.reason,
                            created_at=now,
                            **o.fields,
                        )
                    )
                elif o.kind == "retry":
                    store.reschedule(s, r.id, self.owner, eng.next_attempt(o.delay), o.error)
                elif o.kind == "release":
                    store.reschedule(
                        s, r.id, self.owner, eng.next_attempt(o.delay), o.error, refund_attempt=True
                    )
            again: set[tuple[str, str]] = set()
            if rows:
                again = store.judged_before(s, {(v.judge, v.conversation_id) for v in rows})
                s.add_all(rows)
                s.flush()
                for listener in self.listeners:
                    listener(s, rows)
        return rows, again

    def _count(self, rows: list[VerdictRow], again: set[tuple[str, str]]) -> None:
        """Verdicts count each; ``judged`` counts conversations, like eligible and sampled."""
        m = self.metrics
        for v in rows:
            agent, version = m.agent(v.agent_id), m.version(v.agent_version)
            if (v.judge, v.conversation_id) not in again:
                again.add((v.judge, v.conversation_id))
                m.judge_judged.labels(v.judge, v.judge_version, agent, version).inc()
            m.judge_verdicts.labels(
                v.judge, v.judge_version, v.verdict, agent, version, "true" if v.offline else "false"
            ).inc()
            if v.score is not None:
                m.judge_score.labels(v.judge, v.judge_version).observe(v.score)
        self.judged += len(rows)


def _with_prefetch(concurrency: int) -> int:
    """Requests claimed at most: the calls allowed in flight plus a quarter more waiting for a slot."""
    return concurrency + max(1, concurrency // 4)


def _after(a: datetime, b: datetime) -> bool:
    """Compare timestamps from SQLite (naive, UTC) and Postgres or Python (aware) alike."""
    return aware(a) > aware(b)


__all__ = ["JudgeWorker", "OFFLINE_MODEL"]
