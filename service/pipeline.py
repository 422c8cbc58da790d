"""The pipeline: decode, rules, store, metrics, then hand the stored batch to downstream stages.

Every source (Kafka, HTTP, replay, OTLP) calls :meth:`Pipeline.process_raw` or
:meth:`Pipeline.process`. One database transaction covers a batch's conversations, findings,
dead letters and whatever downstream stages enqueue, so a batch is stored whole or not at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy.orm import Session, sessionmaker

from .decode import DecodeError, decode_conversation
from .metrics import Metrics
from .rules import RuleEngine
from .schema import Conversation
from .settings import Settings
from .store.writes import Checked, DeadLetter, store_conversations, store_dead_letters
from .tracing.spans import span

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Envelope:
    """One raw message and where it came from (for dead letters)."""

    raw: bytes
    source: str
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    key: str | None = None


@dataclass(slots=True)
class BatchResult:
    received: int = 0
    stored: list[Checked] = field(default_factory=list)
    duplicates: int = 0
    dead_letters: list[DeadLetter] = field(default_factory=list)


class DownstreamStage(Protocol):
    """A stage fed by stored conversations (sampler, flagger, outcome join). Runs in the batch's transaction."""

    def on_stored(self, session: Session, stored: Sequence[Checked]) -> None: ...


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        rules: RuleEngine,
        metrics: Metrics,
        downstream: Sequence[DownstreamStage] = (),
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.rules = rules
        self.metrics = metrics
        self.downstream = list(downstream)
        metrics.rules_loaded.set(len(rules.rules))

    def check(self, conversation: Conversation, document: str | None = None) -> Checked:
        findings = self.rules.evaluate(conversation)
        if document is None:
            document = conversation.model_dump_json(exclude_none=True)
        return Checked(conversation, findings, document)

    def decode_and_check(self, envelopes: Sequence[Envelope]) -> tuple[list[Checked], list[DeadLetter]]:
        checked: list[Checked] = []
        dead: list[DeadLetter] = []
        limit = self.settings.max_message_bytes
        for env in envelopes:
            try:
                conv = decode_conversation(env.raw, limit)
            except DecodeError as exc:
                dead.append(
                    DeadLetter(
                        env.source,
                        exc.reason,
                        exc.detail,
                        env.raw,
                        env.topic,
                        env.partition,
                        env.offset,
                        env.key,
                    )
                )
                continue
            checked.append(self.check(conv, env.raw.decode() if isinstance(env.raw, bytes) else env.raw))
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
        with span("vigil.batch", **{"vigil.source": source, "vigil.batch.size": len(conversations)}):
            t0 = time.perf_counter()
            with span("vigil.rules"):
                checked = [self.check(c) for c in conversations]
            t1 = time.perf_counter()
            result = self.store(checked, [], source)
        self._observe(len(conversations), t0, t1, time.perf_counter())
        return result

    def store(self, checked: list[Checked], dead: list[DeadLetter], source: str) -> BatchResult:
        """Write one batch in one transaction; raises on database errors (the caller retries)."""
        with (
            span("vigil.store", **{"vigil.conversations": len(checked)}) as store_span,
            self.sessions.begin() as session,
        ):
            stored = store_conversations(session, checked)
            store_dead_letters(session, dead, self.settings.dead_letter_raw_bytes)
            store_span.set_attribute("vigil.stored", len(stored))
            for stage in self.downstream:
                with span(f"vigil.stage.{type(stage).__name__}"):
                    stage.on_stored(session, stored)
        result = BatchResult(len(checked) + len(dead), stored, len(checked) - len(stored), dead)
        self._count(result, source)
        return result

    def _observe(self, n: int, t0: float, t1: float, t2: float) -> None:
        if n:
            h = self.metrics.processing_seconds
            h.labels("rules").observe((t1 - t0) / n)
            h.labels("store").observe((t2 - t1) / n)
            self.metrics.batch_size.observe(n)

    def _count(self, result: BatchResult, source: str) -> None:
        m = self.metrics
        for item in result.stored:
            c = item.conversation
            agent, version = m.agent(c.agent_id), m.version(c.agent_version)
            m.conversations_processed.labels(agent, version, source).inc()
            worst = None
            for f in item.findings:
                if f.details.get("rule_error"):
                    m.rule_errors.labels(m.label(f.rule_id)).inc()
                    continue
                m.findings.labels(m.label(f.rule_id), f.severity, agent, version).inc()
                worst = f.severity if worst is None or _rank(f.severity) > _rank(worst) else worst
            if worst is not None:
                m.conversations_flagged.labels(agent, version, worst).inc()
        if result.duplicates:
            m.conversations_duplicate.labels(source).inc(result.duplicates)
        for d in result.dead_letters:
            m.dead_letters.labels(d.reason, d.source).inc()


def _rank(severity: str) -> int:
    from .rules import SEVERITY_RANK

    return SEVERITY_RANK[severity]
