"""Stores received GenAI spans and turns each touched conversation into a new revision for the pipeline.

Spans are keyed by ``gen_ai.conversation.id`` (from any span of the same trace) or else by their
trace id. A span already stored (same trace and span id) is ignored, so an exporter's retry changes
nothing; every conversation touched by a request is reassembled and processed, so a retry after a
failed store still delivers it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from vigil.ingest.otlp.assemble import assemble, conversation_id_of, is_genai
from vigil.ingest.otlp.models import OtelSpanRow
from vigil.ingest.otlp.otlp import valid_ids
from vigil.runtime import Runtime
from vigil.schema import Conversation

log = logging.getLogger(__name__)

PURGE_EVERY_SECONDS = 60.0


@dataclass
class IngestResult:
    received: int = 0
    stored: int = 0
    rejected: int = 0
    ignored: int = 0
    dropped: int = 0
    conversations: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def message(self) -> str:
        return "; ".join(self.problems[:5])


def trace_key(trace_id: str) -> str:
    return f"otel-{trace_id}"


class TraceIngest:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self._last_purge = 0.0
        self._lock = threading.Lock()

    def ingest(self, spans: list[dict[str, Any]]) -> IngestResult:
        """Store spans, then process the conversations they belong to. Raises on database errors."""
        res = IngestResult(received=len(spans))
        m = self.rt.metrics
        kept: list[dict[str, Any]] = []
        for s in spans:
            if not valid_ids(s):
                res.rejected += 1
                res.problems.append(f"span {s.get('span_id')!r} of trace {s.get('trace_id')!r}: invalid ids")
            elif not is_genai(s):
                res.ignored += 1
            else:
                kept.append(s)
        keys: set[str] = set()
        if kept:
            with self.rt.sessions.begin() as session:
                keys = self._store(session, kept, res)
        conversations = self._assemble(keys, res)
        if conversations:
            self.rt.pipeline.process(conversations, "otlp")
            m.otlp_conversations.inc(len(conversations))
        for outcome, n in (
            ("stored", res.stored),
            ("duplicate", len(kept) - res.stored - res.dropped),
            ("rejected", res.rejected),
            ("ignored", res.ignored),
            ("dropped", res.dropped),
        ):
            if n:
                m.otlp_spans.labels(outcome).inc(n)
        self._maybe_purge()
        return res

    def _store(self, session: Session, spans: list[dict[str, Any]], res: IngestResult) -> set[str]:
        by_trace: dict[str, str] = {}
        for s in spans:
            cid = conversation_id_of(s)
            if cid:
                by_trace.setdefault(s["trace_id"], cid)
        traces = {s["trace_id"] for s in spans}
        known = session.execute(
            select(OtelSpanRow.trace_id, OtelSpanRow.conversation_key)
            .where(OtelSpanRow.trace_id.in_(traces))
            .distinct()
        ).all()
        for trace_id, key in known:
            if key != trace_key(trace_id):
                by_trace.setdefault(trace_id, key)
        for trace_id, key in by_trace.items():
            # spans of this trace that arrived before its conversation id was known join the conversation
            session.execute(
                update(OtelSpanRow)
                .where(OtelSpanRow.trace_id == trace_id, OtelSpanRow.conversation_key == trace_key(trace_id))
                .values(conversation_key=key)
            )
        rows: list[dict[str, Any]] = []
        for s in spans:
            key = conversation_id_of(s) or by_trace.get(s["trace_id"]) or trace_key(s["trace_id"])
            rows.append(
                {
                    "conversation_key": key,
                    "trace_id": s["trace_id"],
                    "span_id": s["span_id"],
                    "parent_span_id": s.get("parent_span_id"),
                    "name": s["name"][:512],
                    "start_ns": s["start_ns"],
                    "end_ns": s["end_ns"],
                    "span": s,
                    "received_at": datetime.now(UTC),
                }
            )
        keys = {r["conversation_key"] for r in rows}
        limit = self.rt.settings.otlp_max_spans_per_conversation
        counts = dict(
            session.execute(
                select(OtelSpanRow.conversation_key, func.count())
                .where(OtelSpanRow.conversation_key.in_(keys))
                .group_by(OtelSpanRow.conversation_key)
            ).all()
        )
        allowed: list[dict[str, Any]] = []
        for r in rows:
            n = counts.get(r["conversation_key"], 0)
            if n >= limit:
                res.dropped += 1
                continue
            counts[r["conversation_key"]] = n + 1
            allowed.append(r)
        if res.dropped:
            res.problems.append(f"{res.dropped} spans dropped: conversation already has {limit} spans")
        if allowed:
            dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
            stmt = (
                dialect.insert(OtelSpanRow)
                .on_conflict_do_nothing(index_elements=["trace_id", "span_id"])
                .returning(OtelSpanRow.id)
            )
            res.stored = len(session.scalars(stmt, allowed).all())
        return keys

    def _assemble(self, keys: set[str], res: IngestResult) -> list[Conversation]:
        out: list[Conversation] = []
        s = self.rt.settings
        for key in sorted(keys):
            with self.rt.sessions() as session:
                spans = list(
                    session.scalars(
                        select(OtelSpanRow.span)
                        .where(OtelSpanRow.conversation_key == key)
                        .order_by(OtelSpanRow.start_ns, OtelSpanRow.id)
                        .limit(s.otlp_max_spans_per_conversation)
                    )
                )
            doc = assemble(key, spans, s.otlp_default_agent_version)
            if doc is None:
                res.pending.append(key)
                continue
            try:
                out.append(Conversation.model_validate(doc))
            except ValidationError as exc:
                res.problems.append(f"conversation {key}: {exc.errors()[0]['msg']}")
                log.warning("OTLP conversation %s does not validate: %s", key, exc)
                continue
            res.conversations.append(doc["conversation_id"])
        return out

    def _maybe_purge(self) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last_purge < PURGE_EVERY_SECONDS:
                return
            self._last_purge = now
        cutoff = datetime.now(UTC) - timedelta(hours=self.rt.settings.otlp_span_retention_hours)
        try:
            with self.rt.sessions.begin() as session:
                session.execute(delete(OtelSpanRow).where(OtelSpanRow.received_at < cutoff))
        except Exception:  # purging is housekeeping; the next request tries again
            log.warning("purging old OTLP spans failed", exc_info=True)
