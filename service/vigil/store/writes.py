"""Idempotent batch writes. A redelivered revision changes nothing; a newer revision supersedes."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import Table, delete, func, insert, select
from sqlalchemy.orm import Session

from vigil.rules import Finding, max_severity
from vigil.schema import Conversation
from vigil.store.db import among, aware, json_text, storable_text, upsert, write_clock
from vigil.store.models import ConversationRow, DeadLetterRow, FindingRow, OutcomeRow


@dataclass(slots=True)
class Checked:
    """A decoded conversation with its rule findings, ready to store."""

    conversation: Conversation
    findings: list[Finding]
    document: str
    origin: Any = None  # the Envelope it came from, for dead-lettering it if the database rejects it
    replaced: bool = False  # set by the store: it superseded an older stored revision
    previous_findings: frozenset[tuple[str, str]] = frozenset()  # (rule_id, message) of that revision
    received_at: datetime | None = None  # set by the store: the stored row's received_at

    @property
    def conversation_id(self) -> str:
        return self.conversation.conversation_id

    @property
    def agent_id(self) -> str:
        return self.conversation.agent_id

    @property
    def agent_version(self) -> str:
        return self.conversation.agent_version

    @property
    def started_at(self) -> datetime | None:
        return aware(self.conversation.started_at)

    @property
    def ended_at(self) -> datetime | None:
        return aware(self.conversation.ended_at)

    @property
    def revision(self) -> int:
        return self.conversation.effective_revision

    @property
    def status(self) -> str | None:
        return self.conversation.status


_BATCH_KEY = "vigil.stored_batch"


def stored_in_batch(session: Session) -> dict[str, Checked]:
    """The conversations this session's batch stored, by id: what stages that run in the same
    transaction would otherwise read back from the rows just written."""
    found: dict[str, Checked] = session.info.get(_BATCH_KEY, {})
    return found


@dataclass(slots=True)
class DeadLetter:
    source: str
    reason: str
    detail: str
    raw: bytes
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    key: str | None = None
    messages: int = 1  # the bad messages (or items) the letter holds: what vigil_dead_letters_total counts
    last_offset: int | None = None  # of a group's messages (None: ``offset`` alone)
    size: int | None = None  # of what was refused when ``raw`` holds only its first bytes (None: ``len(raw)``)
    # the query parameters the intake read of the request ``raw`` is the body of (``?format=`` and those going
    # with it), which a replay reads it with again; None: none
    params: dict[str, str] | None = None

    @property
    def raw_size(self) -> int:
        """The size stored: the column is a 32-bit integer, so 2 GiB and more is stored as 2**31 - 1 (a
        letter of many large messages summed past it, its insert refused, held its consumer forever)."""
        return min(len(self.raw) if self.size is None else self.size, 2**31 - 1)


# A recorded query parameter's value is cut at this many characters: more than any value an intake takes (an
# agent id is at most 256), so a value cut is refused on replay as the whole one was, never read as another.
PARAM_VALUE_CHARS = 300
PARAM_COUNT = 8  # the parameters one letter keeps: the intakes read three


def query_text(params: dict[str, str] | None) -> str | None:
    """A letter's query parameters as the ``query`` column keeps them: URL-encoded, each value cut at
    :data:`PARAM_VALUE_CHARS`; None for none."""
    if not params:
        return None
    kept = list(params.items())[:PARAM_COUNT]
    return urlencode([(name[:PARAM_VALUE_CHARS], value[:PARAM_VALUE_CHARS]) for name, value in kept])


_TIMESTAMPTZ = 1184
_JSON_OIDS = frozenset({114, 3802})  # json, jsonb
_COLUMN_TYPES: dict[str, dict[str, tuple[int, str]]] = {}


def _column_oids(conn: psycopg.Connection[Any], table: str) -> dict[str, int]:
    """The type oid of each column of ``table`` (read once per process: the schema is the migrations')."""
    return {name: oid for name, (oid, _sql) in _column_types(conn, table).items()}


def _column_types(conn: psycopg.Connection[Any], table: str) -> dict[str, tuple[int, str]]:
    """(type oid, SQL type) of each column of ``table``, read once per process."""
    found = _COLUMN_TYPES.get(table)
    if found is None:
        rows = conn.execute(
            "SELECT attname, atttypid::int, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            (table,),
        ).fetchall()
        found = _COLUMN_TYPES[table] = {name: (oid, sql) for name, oid, sql in rows}
    return found


def insert_new(
    session: Session, table: Table, rows: Sequence[dict[str, Any]], conflict: Sequence[str], returning: Sequence[str]
) -> list[tuple[Any, ...]]:
    """``INSERT rows ON CONFLICT (conflict) DO NOTHING RETURNING returning``: the rows it inserted.

    On Postgres one statement whose every column is one array parameter (``unnest``), in the rows'
    order: SQLAlchemy's multi-row VALUES spends most of its time binding and rendering thousands of
    placeholders, and the driver as much again parsing the statement it renders. Columns the rows
    leave out take their NULL default, as they do through the ORM (one with another default is refused).
    """
    if not rows:
        return []
    ret = [table.c[c] for c in returning]
    if session.get_bind().dialect.name != "postgresql":
        stmt = upsert(session, table).on_conflict_do_nothing(index_elements=list(conflict)).returning(*ret)
        return [tuple(r) for r in session.execute(stmt, list(rows)).all()]
    cols = [c.name for c in table.columns if c.name in rows[0]]
    for col in table.columns:
        if col.name not in rows[0] and col.default is not None and getattr(col.default, "arg", None) is not None:
            raise ValueError(f"insert_new: {table.name}.{col.name} has a default the rows must give")
    conn = session.connection()
    arrays, params = _unnest(conn, table, cols, rows)
    names = ", ".join(f'"{c}"' for c in cols)
    keys = ", ".join(f'"{c}"' for c in conflict)
    out = ", ".join(f'"{c}"' for c in returning)
    sql = (
        f"INSERT INTO {table.name} ({names}) SELECT * FROM unnest({arrays}) "
        f"ON CONFLICT ({keys}) DO NOTHING RETURNING {out}"
    )
    return [tuple(r) for r in conn.exec_driver_sql(sql, params).all()]


def upsert_rows(session: Session, table: Table, rows: Sequence[dict[str, Any]], conflict: Sequence[str]) -> None:
    """``INSERT rows ON CONFLICT (conflict) DO UPDATE`` the other columns the rows give; on Postgres one
    statement of one array parameter per column, as :func:`insert_new` (an executemany sends one statement
    a row). Rows give the same columns and never the same key twice."""
    if not rows:
        return
    cols = [c.name for c in table.columns if c.name in rows[0]]
    changed = [c for c in cols if c not in conflict]
    if session.get_bind().dialect.name != "postgresql":
        ins = upsert(session, table)
        stmt = ins.on_conflict_do_update(index_elements=list(conflict), set_={c: ins.excluded[c] for c in changed})
        session.execute(stmt, list(rows))
        return
    conn = session.connection()
    arrays, params = _unnest(conn, table, cols, rows)
    names = ", ".join(f'"{c}"' for c in cols)
    keys = ", ".join(f'"{c}"' for c in conflict)
    sets = ", ".join(f'"{c}" = excluded."{c}"' for c in changed)
    conn.exec_driver_sql(
        f"INSERT INTO {table.name} ({names}) SELECT * FROM unnest({arrays}) ON CONFLICT ({keys}) DO UPDATE SET {sets}",
        params,
    )


def _unnest(conn: Any, table: Table, cols: list[str], rows: Sequence[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """``unnest``'s arguments for ``rows``' ``cols``: one typed array parameter per column."""
    types = _column_types(conn.connection.driver_connection, table.name)
    params: dict[str, list[Any]] = {}
    for i, c in enumerate(cols):
        values = [r[c] for r in rows]
        if types[c][0] in _JSON_OIDS:
            values = [None if v is None else Jsonb(v, json_text) for v in values]
        params[f"c{i}"] = values
    return ", ".join(f"%(c{i})s::{types[c][1]}[]" for i, c in enumerate(cols)), params


def copy_rows(session: Session, table: Table, rows: list[dict[str, Any]]) -> None:
    """Insert rows that cannot conflict (an append-only log): COPY on Postgres, executemany elsewhere."""
    if not rows:
        return
    if session.get_bind().dialect.name == "postgresql":
        _pg_copy(session, table, rows)
    else:
        session.execute(insert(table), rows)


def _pg_copy(session: Session, table: Table, rows: list[dict[str, Any]], into: str | None = None) -> None:
    """COPY rows into ``into`` (default: the table itself).

    Multi-row VALUES with thousands of placeholders spends most of its time in the driver's query
    parser, and text arrays in escaping; COPY streams rows through the driver's C encoder. The format
    is binary, as the hot-path benchmark's limit writes (measured at par with text: a long document
    costs its length either way); a batch holding a naive time keeps the text format, in which the
    server reads such a time in the session's zone.
    """
    cols = [c.name for c in table.columns if c.name in rows[0]]
    conn: psycopg.Connection[Any] = session.connection().connection.driver_connection  # type: ignore[assignment]
    oids = _column_oids(conn, table.name)
    types = [oids[c] for c in cols]
    json_at = [i for i, t in enumerate(types) if t in _JSON_OIDS]
    times = [c for c, t in zip(cols, types, strict=True) if t == _TIMESTAMPTZ]
    binary = not any(r[c] is not None and r[c].tzinfo is None for r in rows for c in times)
    names = ", ".join(f'"{c}"' for c in cols)
    sql = f"COPY {into or table.name} ({names}) FROM STDIN" + (" (FORMAT BINARY)" if binary else "")
    with conn.cursor() as cur, cur.copy(sql) as copy:
        if binary:
            copy.set_types(types)
        for r in rows:
            values = [r[c] for c in cols]
            for i in json_at:
                v = values[i]
                if v is not None:
                    values[i] = Jsonb(v, json_text) if binary else json_text(v)
            copy.write_row(values)


def _upsert_conversations_pg(session: Session, rows: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """Returns (applied ids, ids that replaced an older revision); xmax = 0 marks a fresh insert."""
    table = ConversationRow.__table__
    conn = session.connection()
    ids = [r["conversation_id"] for r in rows]
    if _copy_new_conversations(session, rows, ids):
        return set(ids), set()
    # the stage keeps the column's compression (Postgres 14+): a value moves to the table as it was compressed
    compression = (conn.dialect.server_version_info or (0,)) >= (14,)
    like = "INCLUDING DEFAULTS" + (" INCLUDING COMPRESSION" if compression else "")
    conn.exec_driver_sql(
        f"CREATE TEMP TABLE IF NOT EXISTS vigil_conversations_stage (LIKE conversations {like}) ON COMMIT DELETE ROWS"
    )
    _pg_copy(session, table, rows, into="vigil_conversations_stage")  # type: ignore[arg-type]
    names = ", ".join(f'"{k}"' for k in rows[0])
    updates = ", ".join(f'"{k}" = excluded."{k}"' for k in rows[0] if k != "conversation_id")
    result = conn.exec_driver_sql(
        f"INSERT INTO conversations ({names}) SELECT {names} FROM vigil_conversations_stage "
        f"ON CONFLICT (conversation_id) DO UPDATE SET {updates} "
        "WHERE conversations.revision < excluded.revision RETURNING conversation_id, xmax = 0"
    ).all()
    conn.exec_driver_sql("TRUNCATE vigil_conversations_stage")
    return {r[0] for r in result}, {r[0] for r in result if not r[1]}


def copy_new_rows(session: Session, table: Table, rows: list[dict[str, Any]]) -> bool:
    """COPY rows the caller found absent straight into ``table`` (Postgres), instead of a multi-row
    ``INSERT ... ON CONFLICT`` of thousands of placeholders. A row written meanwhile by another
    transaction fails the COPY on its key: the savepoint is rolled back and False says to upsert instead.
    """
    if not rows or session.get_bind().dialect.name != "postgresql":
        return False
    try:
        with session.begin_nested():
            _pg_copy(session, table, rows)
    except psycopg.errors.UniqueViolation:
        return False
    return True


_TEXT_OIDS = frozenset((25, 1043))  # text, varchar
_BYTEA = 17


def copy_new_values(session: Session, table: Table, columns: Sequence[str], values: Sequence[Sequence[Any]]) -> bool:
    """:func:`copy_new_rows` for rows given as tuples in ``columns`` order (no dict per row), in binary.

    Times must be aware. A text column's value may come as UTF-8 ``bytes`` (JSON as ``orjson`` writes
    it), in every row alike (the first row sets each column's format): binary COPY sends a text value as
    its bytes, so they go as they are instead of being decoded here and encoded again by the driver; the
    server still checks them as UTF-8."""
    if not values or session.get_bind().dialect.name != "postgresql":
        return False
    conn: psycopg.Connection[Any] = session.connection().connection.driver_connection  # type: ignore[assignment]
    oids = _column_oids(conn, table.name)
    first = values[0]
    types = [
        _BYTEA if oids[c] in _TEXT_OIDS and isinstance(v, bytes) else oids[c]
        for c, v in zip(columns, first, strict=True)
    ]
    names = ", ".join(f'"{c}"' for c in columns)
    try:
        with session.begin_nested():
            session.connection()  # emits the SAVEPOINT (the session does so when a connection is asked for)
            with conn.cursor() as cur, cur.copy(f"COPY {table.name} ({names}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(types)
                write = copy.write_row
                for v in values:
                    write(v)
    except psycopg.errors.UniqueViolation:
        return False
    return True


def _copy_new_conversations(session: Session, rows: list[dict[str, Any]], ids: list[str]) -> bool:
    """The usual batch is all new conversations: COPY it straight into the table, without the staging
    table and ``INSERT ... ON CONFLICT`` (which writes every document twice).

    A row stored meanwhile by another writer (an HTTP ingest of the same id) fails the COPY on the
    primary key; its savepoint is rolled back and the caller upserts instead. Returns whether it copied.
    """
    conn = session.connection()
    taken = conn.exec_driver_sql(
        "SELECT 1 FROM conversations WHERE conversation_id = ANY(%(ids)s) LIMIT 1", {"ids": ids}
    ).first()
    return taken is None and copy_new_rows(session, ConversationRow.__table__, rows)  # type: ignore[arg-type]


def _row(item: Checked, now: datetime) -> dict[str, object]:
    c = item.conversation
    errors = sum(1 for m in c.messages if m.role == "tool" and m.is_error)
    calls = sum(len(m.tool_calls) for m in c.messages if m.tool_calls)
    return {
        "conversation_id": c.conversation_id,
        "revision": c.effective_revision,
        "schema_version": c.schema_version,
        "agent_id": c.agent_id,
        "agent_version": c.agent_version,
        "task_id": c.task_id,
        "intent": c.intent,
        "status": c.status,
        "started_at": c.started_at,
        "ended_at": c.ended_at,
        "received_at": now,
        "message_count": len(c.messages),
        "tool_call_count": calls,
        "tool_error_count": errors,
        "tokens": c.usage.tokens if c.usage else None,
        "cost_usd": c.usage.cost_usd if c.usage else None,
        "latency_ms": c.usage.latency_ms if c.usage else None,
        "finding_count": len(item.findings),
        "max_severity": max_severity(item.findings),
        "document": item.document,
    }


def newest_per_conversation(items: Sequence[Checked]) -> list[Checked]:
    best: dict[str, Checked] = {}
    for item in items:
        cid = item.conversation.conversation_id
        cur = best.get(cid)
        if cur is None or item.conversation.effective_revision > cur.conversation.effective_revision:
            best[cid] = item
    return list(best.values())


def best_ids(items: Sequence[Checked]) -> set[str]:
    return {i.conversation.conversation_id for i in items}


def store_conversations(session: Session, items: Sequence[Checked]) -> list[Checked]:
    """Upsert conversations and replace their findings. Returns the items actually applied."""
    if not items:
        return []
    items = newest_per_conversation(items)
    now = write_clock(session)  # the database's clock, which the detector's cursor and the rollups run on
    # Every writer locks rows in one order (by key): two batches that overlap then queue, never deadlock.
    # (Only the writes are ordered; downstream stages see the batch in its own order.)
    rows = sorted((_row(i, now) for i in items), key=lambda r: str(r["conversation_id"]))
    postgres = session.get_bind().dialect.name == "postgresql"
    if postgres:
        applied_ids, replaced_ids = _upsert_conversations_pg(session, rows)
    else:
        table = ConversationRow.__table__
        existing = set(
            session.scalars(
                select(table.c.conversation_id).where(among(session, table.c.conversation_id, sorted(best_ids(items))))
            )
        )
        applied_ids = _upsert_conversations_generic(session, rows)
        replaced_ids = applied_ids & existing
    applied = [i for i in items if i.conversation.conversation_id in applied_ids]
    if not applied:
        return []
    for i in applied:
        i.received_at = now
    session.info.setdefault(_BATCH_KEY, {}).update((i.conversation.conversation_id, i) for i in applied)
    if replaced_ids:
        previous: dict[str, set[tuple[str, str]]] = {}
        replaced = sorted(replaced_ids)  # one parameter, not one per conversation (see ``among``)
        old = select(FindingRow.conversation_id, FindingRow.rule_id, FindingRow.message).where(
            among(session, FindingRow.conversation_id, replaced)
        )
        for cid, rule_id, message in session.execute(old):
            previous.setdefault(cid, set()).add((rule_id, message))
        for i in applied:
            cid = i.conversation.conversation_id
            if cid in replaced_ids:
                i.replaced = True
                i.previous_findings = frozenset(previous.get(cid, ()))
        session.execute(delete(FindingRow).where(among(session, FindingRow.conversation_id, replaced)))
    finding_rows = [
        {
            "conversation_id": i.conversation.conversation_id,
            "revision": i.conversation.effective_revision,
            "agent_id": i.conversation.agent_id,
            "agent_version": i.conversation.agent_version,
            "rule_id": f.rule_id,
            "rule_type": f.rule_type,
            "severity": f.severity,
            "message": f.message,
            "evidence": [e.as_dict() for e in f.evidence],
            "details": f.details,
            "created_at": now,
        }
        for i in applied
        for f in i.findings
    ]
    if finding_rows:
        if postgres:
            _pg_copy(session, FindingRow.__table__, finding_rows)
        else:
            session.execute(insert(FindingRow.__table__), finding_rows)
    _store_inline_outcomes(session, applied, now)
    return applied


def _upsert_conversations_generic(session: Session, rows: list[dict[str, Any]]) -> set[str]:
    stmt = upsert(session, ConversationRow.__table__)
    cols = {k: stmt.excluded[k] for k in rows[0] if k != "conversation_id"}
    stmt = stmt.on_conflict_do_update(
        index_elements=["conversation_id"],
        set_=cols,
        where=ConversationRow.__table__.c.revision < stmt.excluded.revision,
    ).returning(ConversationRow.__table__.c.conversation_id)
    return set(session.scalars(stmt, rows).all())


def _store_inline_outcomes(session: Session, applied: list[Checked], now: datetime) -> None:
    outcome_rows = [
        {
            "idempotency_key": o.idempotency_key or f"{i.conversation.conversation_id}:{o.type}",
            "conversation_id": i.conversation.conversation_id,
            "type": o.type,
            "value": o.value,
            "occurred_at": o.occurred_at or i.conversation.ended_at or now,
            "received_at": now,
            "source": "inline",
        }
        for i in applied
        for o in i.conversation.outcomes
    ]
    if not outcome_rows:
        return
    outcome_rows.sort(key=lambda r: str(r["idempotency_key"]))
    if session.get_bind().dialect.name == "postgresql":
        keys = [r["idempotency_key"] for r in outcome_rows]
        known = session.connection().exec_driver_sql(
            "SELECT 1 FROM outcomes WHERE idempotency_key = ANY(%(keys)s) LIMIT 1", {"keys": keys}
        )
        if known.first() is None and copy_new_rows(session, OutcomeRow.__table__, outcome_rows):  # type: ignore[arg-type]
            return
    ins = upsert(session, OutcomeRow.__table__)
    session.execute(ins.on_conflict_do_nothing(index_elements=["idempotency_key"]), outcome_rows)


def _spans(offsets: list[int]) -> str:
    """``3, 5-9, 12``: offsets as runs."""
    out: list[str] = []
    for o in sorted(set(offsets)):
        if out and out[-1].split("-")[-1] == str(o - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{o}"
        else:
            out.append(str(o))
    return ", ".join(out)


GROUP_SPAN = 10_000
"""Offsets one grouped row spans at most: what a batch looks back over to find the bad messages an earlier
reading of the topic recorded (a batch of ``VIGIL_KAFKA_BATCH_SIZE`` messages usually spans that many)."""


def _spanned(group: list[DeadLetter]) -> list[list[DeadLetter]]:
    """``group`` (sorted by offset) cut where it would span more than ``GROUP_SPAN`` offsets."""
    out: list[list[DeadLetter]] = []
    for d in group:
        start = out[-1][0].offset if out else None
        if start is None or d.offset is None or d.offset - start > GROUP_SPAN:
            out.append([d])
        else:
            out[-1].append(d)
    return out


def group_dead_letters(letters: Sequence[DeadLetter]) -> list[DeadLetter]:
    """One letter per (source, topic, partition, reason) of a batch, at the group's first position.

    A consumer batch of 1,000 bad messages becomes one row per reason, not 1,000: its raw bytes are the
    messages one per line, its detail names every offset (or key) and the distinct errors, and
    ``last_offset`` where it ends. Messages found recorded already are left out before (see
    :func:`store_dead_letters`).
    """
    groups: dict[tuple[str, str | None, int | None, str, str | None], list[DeadLetter]] = {}
    for d in letters:  # letters read with other query parameters are never one letter: a replay reads it with one
        groups.setdefault((d.source, d.topic, d.partition, d.reason, query_text(d.params)), []).append(d)
    out: list[DeadLetter] = []
    for key, whole in groups.items():
        whole.sort(key=lambda d: (d.offset is None, d.offset or 0))
        for group in _spanned(whole) if whole[0].offset is not None else [whole]:
            out.append(_grouped(key, group))
    return out


def _grouped(key: tuple[str, str | None, int | None, str, str | None], group: list[DeadLetter]) -> DeadLetter:
    source, topic, partition, reason, _query = key
    if len(group) == 1:
        return group[0]
    first = group[0]
    offsets = [d.offset for d in group if d.offset is not None]
    where = (
        f"offsets {_spans(offsets)}" if len(offsets) == len(group) else "keys " + ", ".join(str(d.key) for d in group)
    )
    errors = list(dict.fromkeys(d.detail for d in group))
    detail = f"{len(group)} message(s) at {where}: " + " | ".join(errors)
    raw = b"\n".join(d.raw for d in group)
    messages = sum(d.messages for d in group)
    last = max(offsets) if len(offsets) == len(group) else None
    size = None if all(d.size is None for d in group) else sum(d.raw_size for d in group) + len(group) - 1
    return DeadLetter(
        source, reason, detail, raw, topic, partition, first.offset, first.key, messages, last, size, first.params
    )


def _unrecorded(session: Session, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
    """``letters`` less the Kafka messages a row records already: one whose offset lies between the first
    and last offset of a row of the same reason on its partition was read in that row's batch, which stored
    every message it refused for that reason with it. So a topic read again, by another consumer group or in
    batches of another size, records (and counts) none of them twice.

    By reason, because one batch may write rows of several reasons whose spans overlap: a batch the
    database refuses a conversation of is split, the first half storing the batch's undecodable messages
    (offsets 0 and 5: one row spanning 0-5) and a later half the refused one (offset 4, ``store_rejected``),
    which by position alone would count as recorded and be lost."""
    placed: dict[tuple[str, str, int, str], list[int]] = {}
    for d in letters:
        if d.topic is not None and d.partition is not None and d.offset is not None:
            placed.setdefault((d.source, storable_text(d.topic), d.partition, d.reason), []).append(d.offset)
    if not placed:
        return list(letters)
    c = DeadLetterRow.__table__.c
    recorded: set[tuple[str, str, int, str, int]] = set()
    for (source, topic, partition, reason), offsets in placed.items():
        rows = session.execute(
            select(c.offset, func.coalesce(c.last_offset, c.offset))
            .where(c.source == source, c.topic == topic, c.partition == partition, c.reason == reason)
            .where(c.offset.between(min(offsets) - GROUP_SPAN, max(offsets)))
            .order_by(c.offset)
        ).all()
        starts, reach, furthest = [], [], -1
        for start, end in rows:
            furthest = max(furthest, end)
            starts.append(start)
            reach.append(furthest)  # the furthest offset any row starting here or before reaches
        for o in offsets:
            at = bisect_right(starts, o)
            if at and reach[at - 1] >= o:
                recorded.add((source, topic, partition, reason, o))
    return [
        d
        for d in letters
        if d.topic is None
        or d.partition is None
        or d.offset is None
        or (d.source, storable_text(d.topic), d.partition, d.reason, d.offset) not in recorded
    ]


def store_dead_letters(
    session: Session, letters: Sequence[DeadLetter], keep_bytes: int, batch_bytes: int | None = None
) -> list[tuple[str, str]]:
    """Insert one batch's dead letters, grouped; returns (reason, source) once per bad message (or item)
    in the rows written, so a counter of them counts messages, not rows.

    Each row keeps at most ``keep_bytes`` of its raw bytes and all rows of the batch together at most
    ``batch_bytes`` (``raw_size`` records the full size). A Kafka message recorded already (a redelivered
    batch, a topic read again) is left out. Two consumers storing the same batch at once (a rebalance)
    meet on the row's position: the larger group is kept.
    """
    letters = _unrecorded(session, letters)
    if not letters:
        return []
    budget = keep_bytes * len(letters) if batch_bytes is None else batch_bytes
    now = write_clock(session)
    rows = []
    messages: dict[tuple[Any, ...], list[int]] = {}
    for d in group_dead_letters(letters):
        messages.setdefault((d.source, d.topic, d.partition, d.offset, d.reason, d.raw_size), []).append(d.messages)
        raw = d.raw[: max(0, min(keep_bytes, budget))]
        budget -= len(raw)
        rows.append(
            {
                "source": d.source,
                "topic": storable_text(d.topic) if d.topic else d.topic,
                "partition": d.partition,
                "offset": d.offset,
                "last_offset": d.last_offset if d.last_offset is not None else d.offset,
                "key": storable_text(d.key[:512]) if d.key else d.key,
                "reason": d.reason,
                "detail": storable_text(d.detail[:4000]),
                "raw": raw,
                "raw_size": d.raw_size,
                "query": query_text(d.params),
                "created_at": now,
            }
        )
    rows.sort(key=lambda r: (str(r["source"]), str(r["topic"] or ""), str(r["partition"]), str(r["offset"])))
    table = DeadLetterRow.__table__
    ins = upsert(session, table)
    grown = ins.on_conflict_do_update(
        index_elements=["source", "topic", "partition", "offset"],
        set_={c: ins.excluded[c] for c in ("reason", "detail", "raw", "raw_size", "key", "last_offset")},
        where=ins.excluded.raw_size > table.c.raw_size,
    )
    c = table.c
    written = session.execute(grown.returning(c.source, c.topic, c.partition, c.offset, c.reason, c.raw_size), rows)
    out: list[tuple[str, str]] = []
    for r in written:
        counts = messages.get((r.source, r.topic, r.partition, r.offset, r.reason, r.raw_size))
        out += [(r.reason, r.source)] * (counts.pop() if counts else 1)
    return out


def count_conversations(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(ConversationRow)) or 0


@dataclass(slots=True)
class BatchResult:
    received: int = 0
    stored: list[Checked] = field(default_factory=list)
    duplicates: int = 0
    dead_letters: list[DeadLetter] = field(default_factory=list)
    new_dead_letters: list[tuple[str, str]] = field(default_factory=list)  # (reason, source) first stored now
    erased: int = 0  # conversations dropped as erased (a tombstone holds their id): not stored, not dead letters
