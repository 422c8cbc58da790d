"""The pipeline: decode, rules, store, metrics, then hand the stored batch to downstream stages.

Every source (Kafka, HTTP, replay, OTLP) calls :meth:`Pipeline.process_raw` or
:meth:`Pipeline.process`. One database transaction covers a batch's conversations, findings,
dead letters and whatever downstream stages enqueue, so a batch is stored whole or not at all.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from vigil.errors import without_frames
from vigil.ingest.decode import DecodeError, decode_document, encode_conversation
from vigil.metrics import Metrics
from vigil.observability import span
from vigil.rules import RuleEngine
from vigil.runtime import DownstreamStage, Envelope
from vigil.schema import HOST_BOUND, Conversation, FutureBound
from vigil.settings import Settings
from vigil.store.db import PERMANENT_DB_ERRORS, retry_kind, retry_transient, storable_text
from vigil.store.db import db_detail as _db_detail
from vigil.store.erasure import Tombstones
from vigil.store.writes import BatchResult, Checked, DeadLetter, store_conversations, store_dead_letters

log = logging.getLogger(__name__)


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        rules: RuleEngine,
        metrics: Metrics,
        downstream: Sequence[DownstreamStage] = (),
        bound: FutureBound = HOST_BOUND,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.rules = rules
        self.metrics = metrics
        self.bound = bound  # the database's clock: what a time arriving may not lie ahead of
        self.stopping = threading.Event()  # set on shutdown: a failing write is not retried again
        self.tombstones = Tombstones()  # whether any erased conversation must be looked for in a batch
        self.downstream = downstream if isinstance(downstream, list) else list(downstream)  # the runtime's hooks list
        metrics.rules_loaded.set(len(rules.rules))

    def check(self, conversation: Conversation, document: str | None = None) -> Checked:
        findings = self.rules.evaluate(conversation)
        if document is None:
            document = conversation.model_dump_json(exclude_none=True)
        return Checked(conversation, findings, document)

    def decode_and_check(self, envelopes: Sequence[Envelope]) -> tuple[list[Checked], list[DeadLetter]]:
        checked: list[Checked] = []
        dead: list[DeadLetter] = []
        limit, expansion = self.settings.max_message_bytes, self.settings.max_json_expansion
        latest = self.bound.latest_allowed()
        for env in envelopes:
            if env.refused is not None:
                dead.append(_letter(env, env.refused[0], env.refused[1]))
                continue
            try:
                conv, raw = decode_document(env.raw, limit, expansion, latest)
            except DecodeError as exc:
                dead.append(_letter(env, exc.reason, exc.detail))
                continue
            item = self.check(conv, raw.decode())
            item.origin = env
            checked.append(item)
        return checked, dead

    def process_raw(self, envelopes: Sequence[Envelope]) -> BatchResult:
        source = envelopes[0].source if envelopes else "unknown"
        with span("vigil.batch", **{"vigil.source": source, "vigil.batch.size": len(envelopes)}):
            t0 = time.perf_counter()
            with span("vigil.decode_rules"):
                checked, dead = self.decode_and_check(envelopes)
            t1 = time.perf_counter()
            result = self.store(checked, dead, source=source)
        self._observe(len(envelopes), t0, t1, time.perf_counter())
        return result

    def process(self, conversations: Sequence[Conversation], source: str) -> BatchResult:
        """Conversations built in code (replay, OTLP, simulate) pass the same decoder as raw messages."""
        with span("vigil.batch", **{"vigil.source": source, "vigil.batch.size": len(conversations)}):
            t0 = time.perf_counter()
            checked: list[Checked] = []
            dead: list[DeadLetter] = []
            limit = self.settings.max_message_bytes
            latest = self.bound.latest_allowed()
            with span("vigil.decode_rules"):
                for c in conversations:
                    raw = b""
                    try:
                        raw = encode_conversation(c)
                        conv, raw = decode_document(raw, limit, latest=latest)
                    except DecodeError as exc:
                        dead.append(_letter(None, exc.reason, exc.detail, raw, source, c))
                        continue
                    checked.append(self.check(conv, raw.decode()))
            t1 = time.perf_counter()
            result = self.store(checked, dead, source)
        self._observe(len(conversations), t0, t1, time.perf_counter())
        return result

    def process_documents(
        self, items: Sequence[tuple[Conversation, str, Envelope | None]], dead: list[DeadLetter], source: str
    ) -> BatchResult:
        """Check and store conversations already validated elsewhere (HTTP ingest), with their raw JSON."""
        with span("vigil.batch", **{"vigil.source": source, "vigil.batch.size": len(items)}):
            t0 = time.perf_counter()
            checked = []
            with span("vigil.rules"):
                for conv, document, origin in items:
                    item = self.check(conv, document)
                    item.origin = origin
                    checked.append(item)
            t1 = time.perf_counter()
            result = self.store(checked, dead, source)
        self._observe(len(items), t0, t1, time.perf_counter())
        return result

    def store(self, checked: list[Checked], dead: list[DeadLetter], source: str) -> BatchResult:
        """Write one batch in one transaction.

        Transient database errors (connection lost, lock timeout) propagate: the caller retries the
        same batch. An item the database itself refuses (a value out of range, bad encoding) is
        found by splitting the batch and becomes a ``store_rejected`` dead letter, so one bad
        message can never block the good ones around it.
        """
        try:
            result = self._store_retrying(checked, dead)
        except PERMANENT_DB_ERRORS as exc:
            if not checked and dead:  # the dead letters themselves: kept without what names them
                log.warning("database refused %d dead letter(s): %s; kept without key or detail", len(dead), exc)
                without_frames(exc)
                plain = [replace(d, key=None, detail=storable_text(ascii(d.detail))) for d in dead]
                result = self._store_retrying([], plain)
                self._count(result, source)
                return result
            if len(checked) <= 1:
                rejected = [
                    _letter(c.origin, "store_rejected", _db_detail(exc), c.document, source, c.conversation)
                    for c in checked
                ]
                if len(rejected) + len(dead) == 0:
                    raise
                log.warning("database refused a conversation: %s", _db_detail(exc))
                without_frames(exc)
                result = self._store_retrying([], dead + rejected)
            else:
                # its frames hold this part of the batch, in a cycle through SQLAlchemy's: freed before the halves
                # are written rather than kept through them and then until the collector's next run
                without_frames(exc)
                half = len(checked) // 2
                first = self.store(checked[:half], dead, source)
                second = self.store(checked[half:], [], source)
                return BatchResult(
                    first.received + second.received,
                    first.stored + second.stored,
                    first.duplicates + second.duplicates,
                    first.dead_letters + second.dead_letters,
                    first.new_dead_letters + second.new_dead_letters,
                    first.erased + second.erased,
                )
        self._count(result, source)
        return result

    def _store_retrying(self, checked: list[Checked], dead: list[DeadLetter]) -> BatchResult:
        """One transaction, tried again on deadlocks and lost connections (raises StoreUnavailable at last)."""
        s = self.settings
        return retry_transient(
            lambda: self._store_once(checked, dead),
            s.store_retry_attempts,
            s.store_retry_base_seconds,
            on_retry=lambda exc: self.metrics.store_retries.labels(retry_kind(exc)).inc(),
            stopping=self.stopping.is_set,
        )

    def _store_once(self, checked: list[Checked], dead: list[DeadLetter]) -> BatchResult:
        checked_in = checked
        with (
            span("vigil.store", **{"vigil.conversations": len(checked)}) as store_span,
            self.sessions.begin() as session,
        ):
            # an erased conversation sent again (a redelivery, an exporter's retry, an import run twice) is
            # dropped: one primary-key look-up for the batch's ids, once any tombstone exists
            erased = self.tombstones.erased_among(session, [c.conversation_id for c in checked])
            if erased:
                checked = [c for c in checked if c.conversation_id not in erased]
            stored = store_conversations(session, checked)
            new_dead = store_dead_letters(
                session, dead, self.settings.dead_letter_raw_bytes, self.settings.dead_letter_batch_raw_bytes
            )
            store_span.set_attribute("vigil.stored", len(stored))
            for stage in self.downstream:
                with span(f"vigil.stage.{type(stage).__name__}"):
                    stage.on_stored(session, stored)
        dropped = len(checked_in) - len(checked)
        result = BatchResult(len(checked) + len(dead) + dropped, stored, len(checked) - len(stored), dead)
        result.new_dead_letters, result.erased = new_dead, dropped
        return result

    def _observe(self, n: int, t0: float, t1: float, t2: float) -> None:
        if n:
            h = self.metrics.processing_seconds
            h.labels("rules").observe((t1 - t0) / n)
            h.labels("store").observe((t2 - t1) / n)
            self.metrics.batch_size.observe(n)

    def _count(self, result: BatchResult, source: str) -> None:
        """Count what is new: a first revision, a finding not in the revision it replaced, a new flag.

        Counted per label set first, then added once each: a batch of 1,000 holds a few dozen label
        sets, and each ``labels()`` look-up costs a lock and a hash of its labels.
        """
        m = self.metrics
        counts: Counter[tuple[Any, tuple[str, ...]]] = Counter()
        for item in result.stored:
            c = item.conversation
            agent, version = m.agent(c.agent_id), m.version(c.agent_version)
            if item.replaced:
                counts[m.conversations_updated, (agent, version, source)] += 1
            else:
                counts[m.conversations_processed, (agent, version, source)] += 1
            worst = None
            for f in item.findings:
                if f.details.get("rule_error"):
                    counter = m.rule_timeouts if f.details.get("rule_timeout") else m.rule_errors
                    counts[counter, (m.label(f.rule_id),)] += 1
                    continue
                if (f.rule_id, f.message) in item.previous_findings:
                    continue
                counts[m.findings, (m.label(f.rule_id), f.severity, agent, version)] += 1
                worst = f.severity if worst is None or _rank(f.severity) > _rank(worst) else worst
            if worst is not None and not item.previous_findings:
                counts[m.conversations_flagged, (agent, version, worst)] += 1
        for (metric, labels), n in counts.items():
            metric.labels(*labels).inc(n)
        if result.duplicates:
            m.conversations_duplicate.labels(source).inc(result.duplicates)
        if result.erased:
            m.erased_dropped.labels(source).inc(result.erased)
        for reason, letter_source in result.new_dead_letters:
            m.dead_letters.labels(reason, letter_source).inc()


def _letter(
    origin: Envelope | None,
    reason: str,
    detail: str,
    fallback: str | bytes = b"",
    source: str = "unknown",
    conversation: Conversation | None = None,
) -> DeadLetter:
    """A dead letter at the message's source position, or (no envelope: replay, OTLP) keyed by conversation id."""
    if origin is None:
        raw = fallback.encode() if isinstance(fallback, str) else fallback
        key = conversation.conversation_id if conversation else None
        return DeadLetter(source, reason, detail, raw, key=key)
    raw = origin.raw if isinstance(origin.raw, bytes) else origin.raw.encode()
    size = origin.refused[2] if origin.refused is not None else None
    where = (origin.topic, origin.partition, origin.offset, origin.key)
    return DeadLetter(origin.source, reason, detail, raw, *where, size=size)


def _rank(severity: str) -> int:
    from vigil.rules import SEVERITY_RANK

    return SEVERITY_RANK[severity]
