"""Storing outcome signals: validate, deduplicate by idempotency key, join, tell listeners.

One transaction stores a batch's outcomes, their joins to already stored conversations, any dead
letters, and whatever the outcome listeners (judge, review) write. Outcomes whose conversation has
not arrived yet are kept and joined by :class:`~service.outcomes.join.OutcomeJoin` when it does.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ..metrics import Metrics
from ..pipeline import Envelope
from ..settings import Settings
from ..store.models import OutcomeRow
from ..store.writes import DeadLetter, store_dead_letters
from .join import after_commit, dialect_insert, link_outcomes
from .types import OutcomeType, outcome_types

Listener = Callable[[Session, list[OutcomeRow]], None]


class OutcomeIn(BaseModel):
    """One outcome signal as clients send it (``POST /v1/outcomes``, the outcomes topic)."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str = Field(min_length=1, max_length=256)
    type: str = Field(min_length=1, max_length=64, description="A built-in or declared outcome type.")
    value: float = Field(default=1.0, description="1 for events; the score for score types (csat).")
    occurred_at: datetime | None = Field(default=None, description="When it happened; defaults to arrival.")
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Resending the same key changes nothing; derived from the content when absent.",
    )

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("value must be a finite number")
        return v

    @field_validator("occurred_at")
    @classmethod
    def _aware(cls, v: datetime | None) -> datetime | None:
        if v is None:
            return None
        # stored as UTC: SQLite keeps the wall time and drops the offset
        return v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)

    def key(self) -> str:
        if self.idempotency_key:
            return self.idempotency_key
        when = self.occurred_at.isoformat() if self.occurred_at else ""
        digest = hashlib.sha256(f"{self.conversation_id}\x1f{self.type}\x1f{self.value!r}\x1f{when}".encode())
        return "auto:" + digest.hexdigest()[:40]


@dataclass(slots=True)
class ItemError:
    index: int
    reason: str
    errors: list[dict[str, str]]


@dataclass(slots=True)
class OutcomeBatch:
    received: int = 0
    stored: int = 0
    duplicates: int = 0
    errors: list[ItemError] = field(default_factory=list)


class OutcomeStore:
    """The outcomes stage's write path, shared by the API, the Kafka handler and the demo sink."""

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        metrics: Metrics,
        listeners: list[Listener] | None = None,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics
        self.types: dict[str, OutcomeType] = outcome_types(settings.outcome_types)
        self.listeners: list[Listener] = listeners if listeners is not None else []

    def parse(self, items: Sequence[Any]) -> tuple[list[OutcomeIn], list[ItemError]]:
        valid: list[OutcomeIn] = []
        errors: list[ItemError] = []
        for index, item in enumerate(items):
            try:
                outcome = OutcomeIn.model_validate(item)
            except ValidationError as exc:
                errs = [
                    {"field": ".".join(str(p) for p in e["loc"]) or "(root)", "message": e["msg"]}
                    for e in exc.errors()[:20]
                ]
                errors.append(ItemError(index, "schema_invalid", errs))
                continue
            if outcome.type not in self.types:
                known = ", ".join(sorted(self.types))
                errors.append(
                    ItemError(
                        index,
                        "unknown_outcome_type",
                        [
                            {
                                "field": "type",
                                "message": f"unknown outcome type {outcome.type!r}; known: {known} "
                                "(declare custom ones in VIGIL_OUTCOME_TYPES)",
                            }
                        ],
                    )
                )
                continue
            valid.append(outcome)
        return valid, errors

    def store(self, session: Session, outcomes: Sequence[OutcomeIn], source: str) -> list[OutcomeRow]:
        """Insert new outcomes, join them, call listeners; returns the rows that were new."""
        if not outcomes:
            return []
        now = datetime.now(UTC)
        rows: dict[str, dict[str, Any]] = {}
        for o in outcomes:
            rows.setdefault(
                o.key(),
                {
                    "idempotency_key": o.key(),
                    "conversation_id": o.conversation_id,
                    "type": o.type,
                    "value": o.value,
                    "occurred_at": o.occurred_at or now,
                    "received_at": now,
                    "source": source,
                },
            )
        ins = dialect_insert(session, OutcomeRow)
        stmt = ins.on_conflict_do_nothing(index_elements=["idempotency_key"]).returning(OutcomeRow.id)
        new_ids = list(session.scalars(stmt, list(rows.values())).all())
        new_rows = (
            list(session.scalars(select(OutcomeRow).where(OutcomeRow.id.in_(new_ids))).all())
            if new_ids
            else []
        )
        link_outcomes(
            session, new_rows, self.types, self.settings.outcome_attribution_window_hours, self.metrics
        )
        if new_rows:
            for listener in self.listeners:
                listener(session, new_rows)
        m = self.metrics
        counts = [(r.type, source) for r in new_rows]
        dupes = len(outcomes) - len(new_rows)

        def count() -> None:
            for t, src in counts:
                m.outcomes_received.labels(m.label(t), src).inc()
            if dupes:
                m.outcomes_duplicate.labels(source).inc(dupes)

        after_commit(session, count)
        return new_rows

    def ingest(self, items: Sequence[Any], source: str, raw: bytes | None = None) -> OutcomeBatch:
        """Validate and store decoded items in one transaction; invalid ones become one dead letter."""
        valid, errors = self.parse(items)
        dead = []
        if errors:
            detail = "; ".join(
                f"item {e.index}: " + ", ".join(f"{x['field']}: {x['message']}" for x in e.errors)
                for e in errors
            )
            body = raw if raw is not None else orjson.dumps([items[e.index] for e in errors])
            dead.append(DeadLetter(source, errors[0].reason, detail, body))
        with self.sessions.begin() as session:
            new = self.store(session, valid, source)
            store_dead_letters(session, dead, self.settings.dead_letter_raw_bytes)
        self._count_dead(dead)
        return OutcomeBatch(len(items), len(new), len(valid) - len(new), errors)

    def handle_envelopes(self, envelopes: Sequence[Envelope]) -> OutcomeBatch:
        """Kafka handler of the outcomes topic: each message holds one outcome object or an array."""
        valid: list[OutcomeIn] = []
        dead: list[DeadLetter] = []
        total = OutcomeBatch()
        for env in envelopes:
            try:
                payload = orjson.loads(env.raw)
            except orjson.JSONDecodeError as exc:
                dead.append(
                    DeadLetter(
                        env.source,
                        "malformed_json",
                        str(exc),
                        env.raw,
                        env.topic,
                        env.partition,
                        env.offset,
                        env.key,
                    )
                )
                continue
            items = payload if isinstance(payload, list) else [payload]
            total.received += len(items)
            ok, errors = self.parse(items)
            valid.extend(ok)
            if errors:
                total.errors.extend(errors)
                detail = "; ".join(
                    f"item {e.index}: " + ", ".join(f"{x['field']}: {x['message']}" for x in e.errors)
                    for e in errors
                )
                dead.append(
                    DeadLetter(
                        env.source,
                        errors[0].reason,
                        detail,
                        env.raw,
                        env.topic,
                        env.partition,
                        env.offset,
                        env.key,
                    )
                )
        with self.sessions.begin() as session:
            new = self.store(session, valid, envelopes[0].source if envelopes else "kafka")
            store_dead_letters(session, dead, self.settings.dead_letter_raw_bytes)
        self._count_dead(dead)
        total.stored, total.duplicates = len(new), len(valid) - len(new)
        return total

    def sink(self, items: list[dict[str, Any]]) -> None:
        """``rt.extras["outcome_sink"]``: the demo traffic's outcomes."""
        if items:
            self.ingest(items, "demo")

    def ingest_dead(self, letter: DeadLetter) -> None:
        """Keep a body that could not be read at all."""
        with self.sessions.begin() as session:
            store_dead_letters(session, [letter], self.settings.dead_letter_raw_bytes)
        self._count_dead([letter])

    def _count_dead(self, dead: list[DeadLetter]) -> None:
        for d in dead:
            self.metrics.dead_letters.labels(d.reason, d.source).inc()
