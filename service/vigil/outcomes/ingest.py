"""Storing outcome signals: validate, deduplicate by idempotency key, join, tell listeners.

An idempotency key names one outcome: resending it unchanged is a silent duplicate, reusing it for a
different conversation_id, type or value is an ``idempotency_conflict`` (named error, dead letter).

One transaction stores a batch's outcomes, their joins to already stored conversations, any dead
letters, and whatever the outcome listeners (judge, review) write. Outcomes whose conversation has
not arrived yet are kept and joined by :class:`~vigil.outcomes.join.OutcomeJoin` when it does.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from vigil.errors import without_frames
from vigil.metrics import Metrics
from vigil.outcomes.join import link_outcomes
from vigil.runtime import Envelope
from vigil.schema import (
    HOST_BOUND,
    INCOMING,
    UNSTORABLE,
    ConversationId,
    FutureBound,
    OutcomeType,
    UnreadableJson,
    in_future,
    in_utc,
    item_raw,
    outcome_types,
    read_items,
    too_dense,
)
from vigil.settings import Settings
from vigil.store.db import (
    PERMANENT_DB_ERRORS,
    after_commit,
    among,
    db_detail,
    retry_kind,
    retry_transient,
    upsert,
    write_clock,
)
from vigil.store.models import OutcomeRow
from vigil.store.writes import DeadLetter, store_dead_letters

Listener = Callable[[Session, Sequence[OutcomeRow]], None]

log = logging.getLogger(__name__)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

LISTENER_CHUNK = 5_000  # outcomes handed to a listener at once: the most one POST /v1/outcomes holds

_FUTURE_ADVICE = "send the outcome once it has happened, or leave occurred_at out for the time it arrives"

# What an idempotency key names; occurred_at is left out because it defaults to arrival time on redelivery.
IDENTITY = ("conversation_id", "type", "value")


class OutcomeIn(BaseModel):
    """One outcome signal as clients send it (``POST /v1/outcomes``, the outcomes topic)."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: ConversationId
    type: str = Field(min_length=1, max_length=64, description="A built-in or declared outcome type.")
    value: float = Field(default=1.0, description="1 for events; the score for score types (csat).")
    occurred_at: datetime | None = Field(default=None, description="When it happened; defaults to arrival.")
    idempotency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Resending the same key changes nothing; derived from the content when absent.",
    )

    @field_validator("idempotency_key")
    @classmethod
    def _printable_key(cls, v: str | None) -> str | None:
        # a key names the outcome in logs, dead letters and the API; NUL cannot be stored on Postgres
        if v is not None and (bad := _CONTROL.search(v)) is not None:
            raise ValueError(f"must not contain control characters (found {bad.group()!r} at position {bad.start()})")
        return v

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("value must be a finite number")
        return v

    @field_validator("occurred_at")
    @classmethod
    def _aware(cls, v: datetime | None) -> datetime | None:
        # stored as UTC: SQLite keeps the wall time and drops the offset; a time that leaves the years
        # 1 to 9999 in UTC is this item's error (the OverflowError of converting it was a 500 for the batch)
        return None if v is None else in_utc(v)

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
class Stored:
    """What :meth:`OutcomeStore.store` did; ``conflicts`` maps positions in its input to field errors."""

    new: list[OutcomeRow] = field(default_factory=list)
    duplicates: int = 0
    conflicts: dict[int, list[dict[str, str]]] = field(default_factory=dict)


def _items_raw(items: list[Any]) -> bytes:
    """The refused items as one JSON array to keep (a NaN kept as Python writes it)."""
    return b"[" + b",".join(item_raw(item) for item in items) + b"]"


DETAIL_ITEMS = 20  # item errors a dead letter's detail lists


def _detail(errors: Sequence[ItemError]) -> str:
    """The first items' errors: 330,000 invalid items in one message made a detail of 22 MB."""
    shown = "; ".join(
        f"item {e.index}: " + ", ".join(f"{x['field']}: {x['message']}" for x in e.errors)
        for e in errors[:DETAIL_ITEMS]
    )
    more = len(errors) - DETAIL_ITEMS
    return shown + (f"; ... and {more} more items" if more > 0 else "")


def _conflict(key: str, stored: tuple[Any, ...], sent: tuple[Any, ...]) -> list[dict[str, str]]:
    return [
        {
            "field": name,
            "message": f"idempotency key {key!r} is already stored with {name} {old!r}, this item has {new!r}; "
            "a key names one outcome, so send a different outcome under a new key",
        }
        for name, old, new in zip(IDENTITY, stored, sent, strict=True)
        if old != new
    ]


def _letter(env: Envelope, reason: str, detail: str) -> DeadLetter:
    """A dead letter of the whole message, at its position."""
    size = env.refused[2] if env.refused is not None else None
    return DeadLetter(env.source, reason, detail, env.raw, env.topic, env.partition, env.offset, env.key, size=size)


@dataclass(slots=True)
class OutcomeBatch:
    received: int = 0
    stored: int = 0
    duplicates: int = 0
    errors: list[ItemError] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)  # as kept: a consumer also sends them on


class OutcomeStore:
    """The outcomes stage's write path, shared by the API, the Kafka handler and the demo sink."""

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        metrics: Metrics,
        listeners: list[Listener] | None = None,
        bound: FutureBound = HOST_BOUND,
    ) -> None:
        self.settings = settings
        self.bound = bound  # the database's clock: what an outcome's occurred_at may not lie ahead of
        self.sessions = sessions
        self.metrics = metrics
        self.types: dict[str, OutcomeType] = outcome_types(settings.outcome_types)
        self.listeners: list[Listener] = listeners if listeners is not None else []

    def parse(
        self, items: Sequence[Any], refused: Mapping[int, tuple[str, str]] | None = None
    ) -> tuple[list[tuple[int, OutcomeIn]], list[ItemError]]:
        """Valid outcomes with their index in ``items``, and the errors of the others; ``refused`` holds, by
        index, the items ``read_items`` found strict JSON cannot hold (a NaN value)."""
        valid: list[tuple[int, OutcomeIn]] = []
        errors: list[ItemError] = []
        refused = refused or {}
        latest = self.bound.latest_allowed()
        for index, item in enumerate(items):
            if index in refused:
                reason, where = refused[index]
                errors.append(ItemError(index, reason, [{"field": where, "message": UNSTORABLE[reason]}]))
                continue
            try:
                outcome = OutcomeIn.model_validate(item, context=INCOMING)
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
            if outcome.occurred_at is not None and outcome.occurred_at > latest.at:
                sent = item.get("occurred_at") if isinstance(item, dict) else None
                error = in_future("occurred_at", outcome.occurred_at, latest, _FUTURE_ADVICE, sent)
                errors.append(ItemError(index, "occurred_in_future", [error]))
                continue
            valid.append((index, outcome))
        return valid, errors

    def store(self, session: Session, outcomes: Sequence[OutcomeIn], source: str) -> Stored:
        """Insert new outcomes, join them, call listeners.

        A key seen again with the same conversation_id, type and value is a duplicate; with any of them
        different it is a conflict, stored nowhere here (the callers dead-letter it).
        """
        if not outcomes:
            return Stored()
        now = write_clock(session)  # the database's clock, which retention's walk of outcomes runs on
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
        ins = upsert(session, OutcomeRow)
        stmt = ins.on_conflict_do_nothing(index_elements=["idempotency_key"]).returning(OutcomeRow.id)
        new_ids = list(session.scalars(stmt, list(rows.values())).all())
        # ``among``, not ``IN``: one parameter however many outcomes (Postgres takes at most 65,535 a
        # statement, and a message of more outcomes than that would fail here on every redelivery)
        new_rows = (
            list(session.scalars(select(OutcomeRow).where(among(session, OutcomeRow.id, new_ids))).all())
            if new_ids
            else []
        )
        identity: dict[str, tuple[Any, ...]] = {k: tuple(r[f] for f in IDENTITY) for k, r in rows.items()}
        old_keys = sorted(set(rows) - {r.idempotency_key for r in new_rows})
        if old_keys:
            cols = [getattr(OutcomeRow, f) for f in IDENTITY]
            for key, *stored in session.execute(
                select(OutcomeRow.idempotency_key, *cols).where(among(session, OutcomeRow.idempotency_key, old_keys))
            ):
                identity[key] = tuple(stored)
        conflicts: dict[int, list[dict[str, str]]] = {}
        for pos, o in enumerate(outcomes):
            sent = tuple(getattr(o, f) for f in IDENTITY)
            if sent != identity[o.key()]:
                conflicts[pos] = _conflict(o.key(), identity[o.key()], sent)
        link_outcomes(session, new_rows, self.types, self.settings.outcome_attribution_window_hours, self.metrics)
        if new_rows:
            # a listener reads what it needs of the outcomes' conversations in one look-up: given at most a
            # request's worth of outcomes at a time, however many one message or poll holds
            ordered = sorted(new_rows, key=lambda r: r.conversation_id)
            for start in range(0, len(ordered), LISTENER_CHUNK):
                for listener in self.listeners:
                    listener(session, ordered[start : start + LISTENER_CHUNK])
        m = self.metrics
        counts = [(r.type, source) for r in new_rows]
        dupes = len(outcomes) - len(new_rows) - len(conflicts)

        def count() -> None:
            for t, src in counts:
                m.outcomes_received.labels(m.label(t), src).inc()
            if dupes:
                m.outcomes_duplicate.labels(source).inc(dupes)

        after_commit(session, count)
        return Stored(new_rows, dupes, conflicts)

    def ingest(
        self,
        items: Sequence[Any],
        source: str,
        raw: bytes | None = None,
        refused: Mapping[int, tuple[str, str]] | None = None,
        keep_letters: bool = True,
    ) -> OutcomeBatch:
        """Validate and store decoded items in one transaction.

        Invalid items become one dead letter per reason (as a request's conversations do), items reusing a
        key for a different outcome another (reason ``idempotency_conflict``); all are named in the
        returned errors. ``keep_letters`` False (a dead letter re-sent): they are named only.
        """
        valid, errors = self.parse(items, refused)
        dead = []
        by_reason: dict[str, list[ItemError]] = {}
        for e in errors:
            by_reason.setdefault(e.reason, []).append(e)
        for reason, errs in by_reason.items():
            body = raw if raw is not None else _items_raw([items[e.index] for e in errs])
            dead.append(DeadLetter(source, reason, _detail(errs), body))

        def write() -> tuple[Stored, list[ItemError], list[tuple[str, str]]]:
            with self.sessions.begin() as session:
                result = self.store(session, [o for _, o in valid], source)
                conflicts = [
                    ItemError(valid[pos][0], "idempotency_conflict", errs) for pos, errs in result.conflicts.items()
                ]
                letters = list(dead) if keep_letters else []
                if conflicts and keep_letters:
                    body = raw if raw is not None else _items_raw([items[e.index] for e in conflicts])
                    letters.append(DeadLetter(source, "idempotency_conflict", _detail(conflicts), body))
                new_dead = store_dead_letters(
                    session, letters, self.settings.dead_letter_raw_bytes, self.settings.dead_letter_batch_raw_bytes
                )
            return result, conflicts, new_dead

        # a deadlock with another batch of the same keys, or a connection lost, is tried again as every other
        # write is (two requests overlapping in keys deadlocked and one was answered 503 at the first try)
        s = self.settings
        result, conflicts, new_dead = retry_transient(
            write,
            s.store_retry_attempts,
            s.store_retry_base_seconds,
            on_retry=lambda exc: self.metrics.store_retries.labels(retry_kind(exc)).inc(),
        )
        self._count_dead(new_dead)
        errors = sorted(errors + conflicts, key=lambda e: e.index)
        return OutcomeBatch(len(items), len(result.new), result.duplicates, errors)

    def handle_envelopes(self, envelopes: Sequence[Envelope]) -> OutcomeBatch:
        """Kafka handler of the outcomes topic: each message holds one outcome object or an array.

        A message with invalid or conflicting items becomes one dead letter (its offset is its identity).
        A batch the database refuses for what a row holds is split until the message at fault is found,
        which becomes a ``store_rejected`` dead letter: one message never holds up the topic (the
        consumer retries a failed batch without end, which is right only for an outage).
        """
        try:
            return self._handle_envelopes(envelopes)
        except PERMANENT_DB_ERRORS as exc:
            if len(envelopes) > 1:
                # its frames hold this part of the batch, in a cycle through SQLAlchemy's: freed before the halves
                # are handled rather than kept through them and then until the collector's next run
                without_frames(exc)
                half = len(envelopes) // 2
                a, b = self.handle_envelopes(envelopes[:half]), self.handle_envelopes(envelopes[half:])
                return OutcomeBatch(
                    a.received + b.received,
                    a.stored + b.stored,
                    a.duplicates + b.duplicates,
                    a.errors + b.errors,
                    a.dead_letters + b.dead_letters,
                )
            if not envelopes:
                raise
            env = envelopes[0]
            log.warning("database refused an outcomes message: %s", db_detail(exc))
            detail = f"the database refused this message: {db_detail(exc)}"
            without_frames(exc)
            letter = _letter(env, "store_rejected", detail)
            self.ingest_dead(letter)
            error = ItemError(0, "store_rejected", [{"field": "(root)", "message": detail}])
            return OutcomeBatch(errors=[error], dead_letters=[letter])

    def _handle_envelopes(self, envelopes: Sequence[Envelope]) -> OutcomeBatch:
        valid: list[OutcomeIn] = []
        origin: list[tuple[int, int]] = []  # (envelope, item index) of each valid outcome
        failed: dict[int, list[ItemError]] = {}
        dead: list[DeadLetter] = []
        total = OutcomeBatch()
        for n, env in enumerate(envelopes):
            if env.refused is not None:  # by the consumer: too large, or not JSON
                dead.append(_letter(env, env.refused[0], env.refused[1]))
                continue
            if not env.raw.strip():  # a tombstone (null value) or a blank message, as on the conversations topic
                dead.append(_letter(env, "empty", "empty message; an outcome is a JSON object or an array of them"))
                continue
            # as the API refuses such a body: a message of 1 MB of empty objects took 27 s and 300 MB to read
            why = too_dense(env.raw, self.settings.max_json_expansion, what="message", advice="split it")
            if why is not None:
                dead.append(_letter(env, "oversized", why))
                continue
            try:
                items, refused = read_items(env.raw)
            except UnreadableJson as exc:
                dead.append(_letter(env, "malformed_json", str(exc)))
                continue
            total.received += len(items)
            ok, errors = self.parse(items, refused)
            valid.extend(o for _, o in ok)
            origin.extend((n, i) for i, _ in ok)
            if errors:
                failed[n] = errors
        with self.sessions.begin() as session:
            result = self.store(session, valid, envelopes[0].source if envelopes else "kafka")
            for pos, errs in result.conflicts.items():
                n, index = origin[pos]
                failed.setdefault(n, []).append(ItemError(index, "idempotency_conflict", errs))
            for n, errors in sorted(failed.items()):
                errors.sort(key=lambda e: e.index)
                total.errors.extend(errors)
                # one letter a message (its offset is its identity), under its first item's reason
                reasons = list(dict.fromkeys(e.reason for e in errors))
                also = f"reasons {', '.join(reasons)}: " if len(reasons) > 1 else ""
                dead.append(_letter(envelopes[n], errors[0].reason, also + _detail(errors)))
            new_dead = store_dead_letters(
                session, dead, self.settings.dead_letter_raw_bytes, self.settings.dead_letter_batch_raw_bytes
            )
        self._count_dead(new_dead)
        total.stored, total.duplicates = len(result.new), result.duplicates
        total.dead_letters = dead
        return total

    def sink(self, items: list[dict[str, Any]]) -> None:
        """``rt.hooks.outcome_sink``: the demo traffic's outcomes."""
        if items:
            self.ingest(items, "demo")

    def ingest_dead(self, letter: DeadLetter) -> None:
        """Keep a body that could not be read at all."""
        with self.sessions.begin() as session:
            new_dead = store_dead_letters(
                session, [letter], self.settings.dead_letter_raw_bytes, self.settings.dead_letter_batch_raw_bytes
            )
        self._count_dead(new_dead)

    def _count_dead(self, new_dead: list[tuple[str, str]]) -> None:
        """Counts the bad messages first recorded now (``store_dead_letters`` says which): a redelivered or
        replayed one is not counted again."""
        for reason, source in new_dead:
            self.metrics.dead_letters.labels(reason, source).inc()
