"""Erasing a conversation on request: every row that holds its content or names it, gone in one transaction.

Retention deletes by age and keeps what review and export still need; an erasure deletes one conversation
now, whatever its state (labelled, queued, exported). The tables every stage reads (:mod:`vigil.store.models`)
are erased here; a stage's own tables by the eraser it registers (``Hooks.erasers``), each deleting what it
owns and saying how many rows per table. The hourly rollup counts stay: they are anonymous aggregates.

What an erasure keeps is its record (``erasures``: who, when, the SHA-256 of the id, the counts, never the
content) and, unless asked not to, a tombstone (``erased_conversations``: the id's hash) by which ingest
drops the conversation if it comes again (a Kafka redelivery, an exporter's retry, an import run twice):
:func:`erased_among` is one indexed look-up per batch.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, cast

import orjson
from sqlalchemy import Boolean, CursorResult, Index, String, delete, exists, select
from sqlalchemy.orm import Mapped, Session, mapped_column, sessionmaker

from vigil.store.db import among, upsert, utcnow
from vigil.store.models import (
    ID,
    Base,
    ConversationRow,
    DeadLetterRow,
    FindingRow,
    OutcomeLinkRow,
    OutcomeRow,
    ReviewItemRow,
    ReviewLabelRow,
    VerdictRow,
)
from vigil.store.rollups import RollupMemberRow

log = logging.getLogger(__name__)

# (session, conversation ids) -> rows deleted per table: a stage's part of an erasure, in its transaction
Eraser = Callable[[Session, Sequence[str]], dict[str, int]]

MAX_MATCHES = 1000
"""At most this many conversations are found (and erased) by one metadata value: a wider value is a
mistake more often than a user's history, and the caller can erase again once the first ones are gone."""


class ErasureRow(Base):
    """One erasure of one conversation: by whom, when, the id's SHA-256 and the rows removed per table."""

    __tablename__ = "erasures"

    id: Mapped[int] = mapped_column(ID, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    actor: Mapped[str] = mapped_column(String(128))
    conversation_hash: Mapped[str] = mapped_column(String(64))
    counts: Mapped[dict[str, Any]]
    tombstone: Mapped[bool] = mapped_column(Boolean, default=True)

    __table_args__ = (Index("ix_erasures_hash", "conversation_hash"),)


class ErasedRow(Base):
    """The tombstone of an erased conversation: ingest drops a conversation whose id hashes to one of these."""

    __tablename__ = "erased_conversations"

    conversation_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    erased_at: Mapped[datetime] = mapped_column(default=utcnow)


def id_hash(conversation_id: str) -> str:
    return hashlib.sha256(conversation_id.encode("utf-8", "surrogatepass")).hexdigest()


class Tombstones:
    """Whether this database holds any tombstone, as one process learns it: until the first erasure with a
    tombstone, a batch asks only whether the table has a row (one tiny query), not for its ids' hashes
    (hashing and sending a batch's 1,000 hashes cost 1.6 ms on SQLite and 3.1 ms on Postgres on a quiet
    machine, the question 0.08 and 0.34 ms). Once
    one is seen, every batch looks its ids up; tombstones are never lifted, so the answer cannot go back."""

    def __init__(self) -> None:
        self.seen = False

    def erased_among(self, session: Session, conversation_ids: Sequence[str]) -> set[str]:
        if not conversation_ids:
            return set()
        if not self.seen:
            self.seen = bool(session.scalar(select(exists().where(ErasedRow.conversation_hash.is_not(None)))))
            if not self.seen:
                return set()
        return erased_among(session, conversation_ids)


def erased_among(session: Session, conversation_ids: Sequence[str]) -> set[str]:
    """The ids of ``conversation_ids`` that were erased with a tombstone: one primary-key look-up for all."""
    if not conversation_ids:
        return set()
    by_hash = {id_hash(cid): cid for cid in set(conversation_ids)}
    col = ErasedRow.conversation_hash
    return {by_hash[h] for h in session.scalars(select(col).where(among(session, col, list(by_hash))))}


def removed(session: Session, stmt: Any) -> int:
    """Rows a DELETE removed (executing DML yields a CursorResult; Result does not declare rowcount)."""
    return int(cast(CursorResult[Any], session.execute(stmt)).rowcount)


def _delete(session: Session, model: Any, col: Any, ids: Sequence[str]) -> int:
    return removed(session, delete(model).where(among(session, col, ids)))


def erase_record(session: Session, ids: Sequence[str]) -> dict[str, int]:
    """Delete the shared record's rows of ``ids``: every revision (one row holds the newest), findings,
    verdicts, outcomes and their links, review items and labels, rollup membership, and the dead letters
    keyed by the id (replay and OTLP key theirs so; a Kafka message by the producer's key, the id by
    convention)."""
    counts: dict[str, int] = {}
    for model in (
        ConversationRow,
        FindingRow,
        VerdictRow,
        OutcomeRow,
        OutcomeLinkRow,
        ReviewItemRow,
        ReviewLabelRow,
        RollupMemberRow,
    ):
        counts[model.__tablename__] = _delete(session, model, model.conversation_id, ids)
    counts[DeadLetterRow.__tablename__] = _delete(session, DeadLetterRow, DeadLetterRow.key, ids)
    return counts


def erase(
    session: Session,
    conversation_id: str,
    erasers: Sequence[Eraser],
    actor: str,
    tombstone: bool = True,
) -> dict[str, int] | None:
    """Erase one conversation in ``session``'s transaction: the shared record, then each stage's tables.
    Returns the rows removed per table, or None when nothing of that id was stored anywhere (then nothing is
    recorded). The record of the erasure and the tombstone are written in the same transaction."""
    ids = [conversation_id]
    counts = erase_record(session, ids)
    for eraser in erasers:
        for table, n in eraser(session, ids).items():
            counts[str(table)] = counts.get(str(table), 0) + n
    if not any(counts.values()):
        return None
    digest = id_hash(conversation_id)
    session.add(ErasureRow(actor=actor, conversation_hash=digest, counts=counts, tombstone=tombstone))
    if tombstone:
        stmt = upsert(session, ErasedRow.__table__).on_conflict_do_nothing(index_elements=["conversation_hash"])
        session.execute(stmt, [{"conversation_hash": digest, "erased_at": utcnow()}])
    return counts


def _like_escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def matching_metadata(session: Session, key: str, value: Any, limit: int = MAX_MATCHES) -> list[str]:
    """Ids of stored conversations whose ``metadata[key]`` equals ``value``, at most ``limit`` (oldest first).
    The stored document is text: a ``LIKE`` on the value as JSON writes it picks the candidates, and each is
    read to check that the value is that key's in ``metadata`` (not a message's words)."""
    needle = orjson.dumps(value).decode()
    C = ConversationRow
    pick = (
        select(C.conversation_id, C.document)
        .where(C.document.like(f"%{_like_escaped(needle)}%", escape="\\"))
        .order_by(C.received_at, C.conversation_id)
        .execution_options(yield_per=200)
    )
    found: list[str] = []
    for cid, document in _rows(session, pick):
        try:
            meta = orjson.loads(document).get("metadata")
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(meta, dict) and key in meta and meta[key] == value:
            found.append(cid)
            if len(found) >= limit:
                break
    return found


def _rows(session: Session, pick: Any) -> Iterator[tuple[str, str]]:
    for row in session.execute(pick):
        yield row[0], row[1]


def deleting(*columns: Any) -> Eraser:
    """An eraser deleting the rows whose ``column`` is one of the ids, for each column given (a stage's tables
    that name a conversation by id); counted under each column's table."""

    def erase_rows(session: Session, ids: Sequence[str]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for col in columns:
            name = str(col.table.name)  # a quoted_name: orjson takes only str itself as a key
            counts[name] = counts.get(name, 0) + _delete(session, col.table, col, ids)
        return counts

    return erase_rows


def erase_each(
    sessions: sessionmaker[Session],
    conversation_ids: Sequence[str],
    erasers: Sequence[Eraser],
    actor: str,
    tombstone: bool = True,
) -> list[dict[str, Any]]:
    """Erase each id in a transaction of its own (one failing leaves the others erased): per id, ``erased``
    with its counts or ``not_found``."""
    out: list[dict[str, Any]] = []
    for cid in dict.fromkeys(conversation_ids):
        with sessions.begin() as s:
            counts = erase(s, cid, erasers, actor, tombstone)
        if counts is None:
            out.append({"conversation_id": cid, "status": "not_found"})
        else:
            removed_rows = dict(sorted(counts.items()))
            out.append({"conversation_id": cid, "status": "erased", "tombstone": tombstone, "removed": removed_rows})
            log.info("erased conversation %s by %s: %s", id_hash(cid)[:12], actor, removed_rows)
    return out
