"""Stores received spans and log records and turns each touched conversation into a new revision.

Spans are keyed by ``gen_ai.conversation.id`` (from any span of the same trace) or else by their trace
id. A span already stored (same trace and span id) or a log record already stored (same content) is
ignored, so an exporter's retry changes nothing; every conversation touched by a request is reassembled
and processed, so a retry after a failed store still delivers it. ``otel_conversations`` keeps one row
per conversation: its counts, when it last grew and whether it is finished, so :meth:`finish_idle` can
finish conversations whose root never ends (one replica each, by a compare-and-set claim).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import chain
from typing import Any, TypeVar, cast

import orjson
from pydantic import ValidationError
from sqlalchemy import CursorResult, and_, case, delete, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from vigil.errors import without_frames
from vigil.ingest.otlp.assemble import assemble, conversation_id_of, is_relevant
from vigil.ingest.otlp.compact import Last, compact, expand, literal, referenced
from vigil.ingest.otlp.conventions import session_and_user
from vigil.ingest.otlp.models import OtelConversationRow, OtelConversationTraceRow, OtelEventRow, OtelSpanRow
from vigil.ingest.otlp.otlp import EXTENDS, STORED_NS, valid_ids, valid_times
from vigil.ingest.otlp.shared import SharedValues, purge_values, resolve
from vigil.runtime import Runtime
from vigil.schema import INCOMING, Conversation, LatestAllowed, conversation_in_future
from vigil.store.db import after_commit, among, aware, clock, retry_kind, retry_transient, write_clock
from vigil.store.writes import Checked, DeadLetter, copy_new_values

log = logging.getLogger(__name__)
T = TypeVar("T")

PURGE_EVERY_SECONDS = 60.0
RECENT_SPANS = 20_000
TRACE_KEYS = 100_000  # traces whose conversation key a process remembers
FINISH_BATCH = 100
STALE_RETRIES = 2  # times a conversation whose finished revision came too early is processed again at once
MAX_PROBLEMS = 100
RECENT_BYTES = 64 * 1024 * 1024  # string bytes of the spans kept in memory (see _recall)
_HEX = frozenset("0123456789abcdef")


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

    def problem(self, text: str) -> None:
        """Note a problem; only the first ``MAX_PROBLEMS`` are kept (a request of a million bad spans must
        not build a million messages)."""
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    @property
    def refused(self) -> int:
        """Spans or records not stored for good: rejected, or dropped over the per-conversation limit."""
        return self.rejected + self.dropped

    def message(self) -> str:
        return "; ".join(self.problems[:5])


def _matched(session: Session, stmt: Any) -> int:
    """Rows an UPDATE matched (executing DML yields a CursorResult; Result does not declare rowcount)."""
    return cast(CursorResult[Any], session.execute(stmt)).rowcount


def _string_bytes(spans: list[dict[str, Any]]) -> int:
    """About what a span's strings hold: the characters of its string attribute values, plus a little each.
    (A plain loop: generators per span cost half as much again, on every request of an interleaved trace.)"""
    n = 256 * len(spans)
    for s in spans:
        for v in s["attributes"].values():
            if isinstance(v, str):
                n += len(v)
    return n


def _refused_last(state: Any) -> bool:
    """Whether the last revision of the conversation in ``state`` (its ``otel_conversations`` row, or None)
    that went through the pipeline was refused as dated ahead: stamped ``processed_at`` without the
    ``conversation_id`` a stored one sets (:class:`TraceMarker`) and a refused one clears (``_refused``). Such
    a conversation refused again leaves no dead letter but when finished; one stored before and now refused
    leaves one (the first refusal), as a new one does."""
    return state is not None and state.processed_at is not None and state.conversation_id is None


def _valid_record_ids(r: dict[str, Any]) -> bool:
    """A log record's trace id is 32 hex digits, its span id (if any) 16, not all zeros: what a span's are."""
    trace, span = r["trace_id"], r.get("span_id")
    if not isinstance(trace, str) or len(trace) != 32 or not _HEX.issuperset(trace):
        return False
    return not span or (isinstance(span, str) and len(span) == 16 and _HEX.issuperset(span) and span != "0" * 16)


def trace_key(trace_id: str) -> str:
    return f"otel-{trace_id}"


def _dialect(session: Session) -> Any:
    return postgresql if session.get_bind().dialect.name == "postgresql" else sqlite


@dataclass
class _Touched:
    """One conversation a request added to: its spans in this request and what was stored before."""

    spans: list[dict[str, Any]] = field(default_factory=list)
    stored: int = 0
    total: int = 0  # spans + events stored for it after this request
    fresh: bool = False  # everything stored for it came in this request
    known: list[dict[str, Any]] | None = None  # every span stored for it, when this process has them all
    last: Last = field(default_factory=dict)  # see :func:`compact`
    idle_finished: bool = False
    has_root: bool = False  # a root span came in this request
    finished: bool = False  # already finished (roots ended, or idle)
    processed_at: datetime | None = None  # when a revision of it last went through the pipeline (or it began)
    revised: bool = False  # its last revision through the pipeline was refused as dated ahead
    moved_from: str | None = None  # the trace key its first spans waited under, moved to it in this request


@dataclass
class _Moves:
    """What a request moved from traces' own keys to their conversations (see ``TraceIngest._keys``).

    The caller counts the moved rows with the rows the request adds, in one upsert that locks every
    conversation row in key order (counted at the move, a conversation's row would be locked before the
    others, out of that order: two replicas could wait in a cycle), and only then links the moved traces
    to their conversations (the conversation's row before its links, as a purge takes them: linked
    first, a purge of the conversation meanwhile could remove the link after the move found it stored)."""

    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # (spans, events) by conversation
    traces: list[tuple[str, str, str]] = field(default_factory=list)  # trace id, its own key, its conversation

    def link(self, session: Session) -> None:
        for trace_id, old, key in self.traces:
            _trace_moved(session, trace_id, old, key)


class TraceIngest:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self._last_purge = 0.0
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, tuple[list[dict[str, Any]], Last, int]] = OrderedDict()
        self._recent_spans = 0
        self._recent_bytes = 0
        # trace id -> its conversation key, once known (it never changes): a trace sent over many requests
        # is not looked up in the span and event tables each time
        self._trace_keys: OrderedDict[str, str] = OrderedDict()
        # (conversation key, trace id) pairs this process linked, with the age (first_seen_at, as the count
        # upsert returns it) of the conversation row they were linked in: not linked again while that row
        # lasts (see _link)
        self._linked: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._shared = SharedValues()
        self._stale: set[str] = set()  # conversations whose finished revision came too early (see TraceMarker)
        # on SQLite a request's look-ups run before its write transaction begins: one request stores at a
        # time (on Postgres, advisory locks on the traces looked up: see _lock_traces)
        self._sqlite_turn = threading.Lock() if runtime.engine.dialect.name == "sqlite" else None

    def _turn(self) -> AbstractContextManager[Any]:
        return self._sqlite_turn if self._sqlite_turn is not None else nullcontext()

    def _transaction(self, store: Callable[[Session, IngestResult], T], res: IngestResult) -> T:
        """Run ``store`` in one transaction, tried again on a deadlock, a serialization failure or a lost
        connection, with the pipeline's retry policy and settings (``VIGIL_STORE_RETRY_*``): Postgres fails
        one of two transactions that wait for each other's rows in a cycle, and the request is then stored
        by its next try instead of answered 503. What a try counts goes to ``res`` only once it commits (a
        try rolled back leaves nothing, in the database or in this process: what the stores remember, they
        remember after commit). Raises :class:`~vigil.store.db.StoreUnavailable` when every try failed."""

        def once() -> tuple[T, IngestResult]:
            part = IngestResult()
            with self._turn(), self.rt.sessions.begin() as session:
                return store(session, part), part

        out, part = self._retrying(once)
        res.stored += part.stored
        res.dropped += part.dropped
        for problem in part.problems:
            res.problem(problem)
        return out

    def _retrying(self, transaction: Callable[[], T]) -> T:
        """``transaction`` (which opens, commits or rolls back its own), tried again as the pipeline's writes
        are (see :meth:`_transaction`)."""
        s = self.rt.settings
        return retry_transient(
            transaction,
            s.store_retry_attempts,
            s.store_retry_base_seconds,
            on_retry=lambda exc: self.rt.metrics.store_retries.labels(retry_kind(exc)).inc(),
            stopping=self.rt.pipeline.stopping.is_set,
        )

    # --- spans -----------------------------------------------------------------------------------

    def ingest(self, spans: list[dict[str, Any]]) -> IngestResult:
        """Store spans, then process the conversations they belong to. Raises on database errors."""
        res = IngestResult(received=len(spans))
        m = self.rt.metrics
        kept: list[dict[str, Any]] = []
        seen: set[tuple[str, str]] = set()
        duplicates = 0
        for s in spans:
            if not valid_ids(s):
                res.rejected += 1
                res.problem(f"span {s.get('span_id')!r} of trace {s.get('trace_id')!r}: invalid ids")
            elif not valid_times(s):
                res.rejected += 1
                res.problem(f"span {s['span_id']!r} of trace {s['trace_id']!r}: a time beyond the year 2262")
            elif not is_relevant(s):
                res.ignored += 1
            elif (ids := (s["trace_id"], s["span_id"])) in seen:
                duplicates += 1  # the same span twice in one request: the first is the one stored
            else:
                seen.add(ids)
                kept.append(s)
        touched: dict[str, _Touched] = {}
        if kept:
            touched, by_trace = self._transaction(lambda session, part: self._store(session, kept, part), res)
            self._remember_keys(by_trace)
            for key, t in touched.items():  # stored for good: this process may now build on them
                t.known = self._recall(key, t)
        self._process(touched, res)
        for outcome, n in (
            ("stored", res.stored),
            ("duplicate", duplicates + len(kept) - res.stored - res.dropped),
            ("rejected", res.rejected),
            ("ignored", res.ignored),
            ("dropped", res.dropped),
        ):
            if n:
                m.otlp_spans.labels(outcome).inc(n)
        self._maybe_purge()
        return res

    def _keys(
        self,
        session: Session,
        trace_ids: set[str],
        by_trace: dict[str, str],
        moves: _Moves,
        moved_to: dict[str, str] | None = None,
    ) -> dict[str, str]:
        """The conversation key of each trace; spans and events stored under the trace's own key before its
        conversation id was known move to the conversation. ``moves`` gets what moved, for the caller to
        count with the request's own rows and then link (see :class:`_Moves`).

        ``by_trace`` holds the traces whose conversation this request names. For those, all that matters
        is whether rows wait under the trace's own key, which its ``otel_conversations`` row says (one
        primary-key look-up for all of them); only the other traces are looked up in the span and event
        tables, for the conversation an earlier request named. ``moved_to`` gets each conversation key whose
        waiting rows moved, with the trace key they waited under."""
        waiting: set[str] = set()  # traces with rows stored under their own key
        with self._lock:
            for trace_id in trace_ids:
                key = self._trace_keys.get(trace_id)
                if key is not None:
                    by_trace.setdefault(trace_id, key)
            unknown = trace_ids.difference(self._trace_keys) if self._trace_keys else trace_ids
        _lock_traces(session, unknown)
        named = {trace_key(t): t for t in unknown if t in by_trace}
        unnamed = sorted(unknown.difference(by_trace))
        if named:
            c = OtelConversationRow
            own = session.scalars(select(c.conversation_key).where(among(session, c.conversation_key, sorted(named))))
            waiting.update(named[key] for key in own)
        for model in (OtelSpanRow, OtelEventRow):
            if not unnamed:
                break
            known = session.execute(
                select(model.trace_id, model.conversation_key).where(among(session, model.trace_id, unnamed)).distinct()
            ).all()
            for trace_id, key in known:
                if key != trace_key(trace_id):
                    by_trace.setdefault(trace_id, key)
                else:
                    waiting.add(trace_id)
        for trace_id in sorted(waiting & by_trace.keys()):
            key, old = by_trace[trace_id], trace_key(trace_id)
            # the row they waited under first, the conversation's row before its links: the order a purge
            # locks them in (rows, then their spans and links), so neither waits on the other in a cycle,
            # and a purge of the conversation meanwhile cannot take the link this move adds
            session.execute(delete(OtelConversationRow).where(OtelConversationRow.conversation_key == old))
            moved_spans = _matched(
                session,
                update(OtelSpanRow)
                .where(OtelSpanRow.trace_id == trace_id, OtelSpanRow.conversation_key == old)
                .values(conversation_key=key),
            )
            moved_events = _matched(
                session,
                update(OtelEventRow)
                .where(OtelEventRow.trace_id == trace_id, OtelEventRow.conversation_key == old)
                .values(conversation_key=key),
            )
            spans_before, events_before = moves.counts.get(key, (0, 0))
            moves.counts[key] = (spans_before + moved_spans, events_before + moved_events)
            if moved_spans:
                moves.traces.append((trace_id, old, key))
            if moved_to is not None:
                moved_to[key] = old
        return by_trace

    def _remember_keys(self, by_trace: dict[str, str]) -> None:
        with self._lock:
            _remember(self._trace_keys, by_trace)

    def _store(
        self, session: Session, spans: list[dict[str, Any]], res: IngestResult
    ) -> tuple[dict[str, _Touched], dict[str, str]]:
        """Store the spans; returns the conversations they touched and the conversation key of each trace
        whose conversation is known."""
        by_trace: dict[str, str] = {}
        named = [conversation_id_of(s) for s in spans]
        for s, cid in zip(spans, named, strict=True):
            if cid:
                by_trace.setdefault(s["trace_id"], cid)
        moved: dict[str, str] = {}
        moves = _Moves()
        by_trace = self._keys(session, {s["trace_id"] for s in spans}, by_trace, moves, moved)
        touched: dict[str, _Touched] = {}
        rows: list[tuple[str, dict[str, Any]]] = []
        now = write_clock(session)  # the database's clock, which the purge of stray spans cuts off by
        for s, cid in zip(spans, named, strict=True):
            key = cid or by_trace.get(s["trace_id"]) or trace_key(s["trace_id"])
            touched.setdefault(key, _Touched(moved_from=moved.get(key))).spans.append(s)
        c = OtelConversationRow
        states = {  # columns, not ORM objects: a busy exporter's request touches hundreds of conversations
            r.conversation_key: r
            for r in session.execute(
                select(
                    c.conversation_key,
                    c.span_count,
                    c.event_count,
                    c.idle_finished,
                    c.finished_at,
                    c.processed_at,
                    c.first_seen_at,
                    c.conversation_id,
                ).where(among(session, c.conversation_key, sorted(touched)))
            )
        }
        limit = self.rt.settings.otlp_max_spans_per_conversation
        for key, t in touched.items():
            state = states.get(key)
            moved_here = moves.counts.get(key, (0, 0))
            before = (state.span_count if state else 0) + moved_here[0]
            room = max(0, limit - before)
            if len(t.spans) > room:
                res.dropped += len(t.spans) - room
                t.spans = t.spans[:room]
            t.fresh = not any(moved_here) and (state is None or (state.span_count == 0 and state.event_count == 0))
            t.idle_finished = bool(state and state.idle_finished)
            t.has_root = any(not s.get("parent_span_id") for s in t.spans)
            t.finished = bool(state and state.finished_at is not None)
            t.processed_at = (state.processed_at or state.first_seen_at) if state else datetime.now(UTC)
            t.revised = _refused_last(state)
            # what this process holds of its spans, under the trace key they waited under if they moved
            compacted, t.last = compact(t.spans, self._last_of(key) or self._last_of(t.moved_from))
            rows.extend((key, s) for s in compacted)
        if res.dropped:
            res.problem(
                f"{res.dropped} spans dropped: a conversation holds at most {limit} spans"
                " (VIGIL_OTLP_MAX_SPANS_PER_CONVERSATION)"
            )
        if not rows:
            self._count(session, moves.counts, {})
            moves.link(session)
            return touched, by_trace
        rows = self._shared.share(session, rows, now)
        inserted = _insert_spans(session, rows, now)
        res.stored = len(inserted)
        if len(inserted) < len(rows):  # some were stored before: what refers to them must refer to that
            _unrefer(session, rows, inserted, touched)
        counts: dict[str, tuple[int, int]] = {}
        for key, _, _ in inserted:
            counts[key] = (counts.get(key, (0, 0))[0] + 1, 0)
        labels = {key: session_and_user(t.spans) for key, t in touched.items()}
        totals = self._count(session, _added(counts, moves.counts), labels)
        moves.link(session)
        for key, t in touched.items():
            t.stored = counts.get(key, (0, 0))[0]
            t.total = totals[key][0] if key in totals else 0
            if key in totals:
                # the row as the upsert found it once locked, not as read before: a revision that finished
                # it may have committed meanwhile, and these spans must then go through the pipeline at once
                _, first_seen, finished, idle_finished, processed_at = totals[key]
                t.finished, t.idle_finished = finished, idle_finished
                # never processed: it began when the upsert first counted it (Postgres: on the database's clock)
                began = first_seen if isinstance(first_seen, datetime) else None
                t.processed_at = processed_at or began or t.processed_at
                t.revised = t.revised and processed_at is not None  # not a row purged and begun again
            # another replica stored spans of it meanwhile, or this request resent some: read them all
            t.fresh = t.fresh and t.stored == len(t.spans) == t.total
        self._link(session, inserted, totals)
        return touched, by_trace

    def _link(self, session: Session, inserted: list[tuple[str, str, str]], counted: dict[str, _Counted]) -> None:
        """Link the conversation of each span inserted to its trace, but for pairs this process linked before
        in the very conversation row the counts were just added to (the same ``first_seen_at``, as the upsert
        returned it: that row is locked until this transaction ends, and a pair's link goes only with its
        row). A conversation purged meanwhile, by any replica, has a row of another age, and its pairs are
        linked again. Spans stored before (resent) are linked where they are stored: linking them under the
        key they were resent with would leave a link no conversation row holds, which no purge removes."""
        pairs = {(key, trace): counted[key][1] for key, trace, _ in inserted}
        with self._lock:
            known = self._linked
            new = {p: age for p, age in pairs.items() if known.get(p) != age}
        _link_traces(session, set(new))
        if new:
            after_commit(session, lambda: self._remember_links(new))

    def _remember_links(self, pairs: dict[tuple[str, str], Any]) -> None:
        with self._lock:
            _remember(self._linked, pairs)

    def _count(
        self,
        session: Session,
        counts: dict[str, tuple[int, int]],
        labels: dict[str, tuple[str | None, str | None]],
    ) -> dict[str, _Counted]:
        """Add (spans, events) to each conversation's row (created if new); returns spans + events stored,
        the row's ``first_seen_at`` as the driver returns it (which row the counts went to: see _link), and,
        as of the row's lock, whether it is finished, idle-finished and when it last went through the
        pipeline."""
        if not counts:
            return {}
        # when it last grew, to within a tenth of the idle timeout: the requests of a trace in flight then
        # change only its counts, which no index holds (Postgres updates the row in place, HOT, instead of
        # adding an entry to each of its four indexes on every request)
        stale_seconds = self.rt.settings.otlp_trace_idle_seconds / 10
        keys = sorted(counts)  # one lock order for every replica
        if session.get_bind().dialect.name == "postgresql":
            # one array per column: a statement of a few parameters, however many conversations a busy
            # exporter's request touches (a multi-row VALUES of thousands costs more to build than to run).
            # The times are the database's (now()), which the idle finisher compares them with: a replica
            # whose clock ran behind had its conversations finished while spans still came
            no_labels = (None, None)
            result = session.connection().exec_driver_sql(
                _COUNT_PG,
                {
                    "keys": keys,
                    "spans": [counts[k][0] for k in keys],
                    "events": [counts[k][1] for k in keys],
                    "sessions": [labels.get(k, no_labels)[0] for k in keys],
                    "users": [labels.get(k, no_labels)[1] for k in keys],
                    "stale": stale_seconds,
                },
            )
            return {key: _counted(*rest) for key, *rest in result}
        # SQLite: the same upsert as multi-row VALUES written out, its parameters passed to the driver as
        # they are (SQLAlchemy's insertmanyvalues builds and processes a parameter dict per row). Every
        # replica of a SQLite database runs on its host, so the host's clock is the database's
        now = datetime.now(UTC)
        stale = now - timedelta(seconds=stale_seconds)
        conn = session.connection()
        dialect = conn.dialect
        at_proc = OtelConversationRow.__table__.c.last_seen_at.type.dialect_impl(dialect).bind_processor(dialect)
        at, stale_at = (at_proc(now), at_proc(stale)) if at_proc else (now, stale)
        totals: dict[str, _Counted] = {}
        for i in range(0, len(keys), INSERT_CHUNK):
            chunk = keys[i : i + INSERT_CHUNK]
            params: list[Any] = []
            for key in chunk:
                session_id, user_id = labels.get(key, (None, None))
                params += (key, counts[key][0], counts[key][1], at, at, session_id, user_id)
            params.append(stale_at)
            sql = _COUNT_SQLITE.format(rows=", ".join(["(?, ?, ?, ?, ?, 0, ?, ?)"] * len(chunk)))
            totals.update((key, _counted(*rest)) for key, *rest in conn.exec_driver_sql(sql, tuple(params)))
        return totals

    # --- log records -------------------------------------------------------------------------------

    def ingest_logs(self, records: list[dict[str, Any]]) -> IngestResult:
        """Store GenAI log records (joined to their spans by trace and span id) and reprocess what they touch."""
        res = IngestResult(received=len(records))
        kept = []
        for r in records:
            if not r.get("trace_id") or r["trace_id"] == "0" * 32:
                res.ignored += 1  # not tied to a trace: nothing to join it to
            elif not _valid_record_ids(r):
                res.rejected += 1
                res.problem(f"log record of trace {str(r['trace_id'])[:64]!r}: invalid trace or span id")
            elif not 0 <= r["time_ns"] < STORED_NS:
                res.rejected += 1
                res.problem(f"log record of trace {r['trace_id']!r}: a time beyond the year 2262")
            elif not (r["name"].startswith("gen_ai.") or any(k.startswith("gen_ai.") for k in r["attributes"])):
                res.ignored += 1
            else:
                kept.append(r)
        touched: dict[str, _Touched] = {}
        if kept:
            touched = self._transaction(lambda session, part: self._store_logs(session, kept, part), res)
        self._process(touched, res)
        m = self.rt.metrics
        outcomes = (("stored", res.stored), ("duplicate", len(kept) - res.stored), ("ignored", res.ignored))
        for outcome, n in (*outcomes, ("rejected", res.rejected)):
            if n:
                m.otlp_log_records.labels(outcome).inc(n)
        return res

    def _store_logs(self, session: Session, records: list[dict[str, Any]], res: IngestResult) -> dict[str, _Touched]:
        moves = _Moves()
        by_trace = self._keys(session, {r["trace_id"] for r in records}, {}, moves)
        now = write_clock(session)
        rows = []
        for r in records:
            key = by_trace.get(r["trace_id"]) or trace_key(r["trace_id"])
            digest = hashlib.blake2b(orjson.dumps(r, option=orjson.OPT_SORT_KEYS), digest_size=16).hexdigest()
            rows.append(
                {
                    "conversation_key": key,
                    "trace_id": r["trace_id"],
                    "span_id": r.get("span_id"),
                    "digest": digest,
                    "time_ns": r["time_ns"],
                    "event": r,
                    "received_at": now,
                }
            )
        table = OtelEventRow.__table__
        stmt = (
            _dialect(session)
            .insert(table)
            .on_conflict_do_nothing(index_elements=["digest"])
            .returning(table.c.conversation_key)
        )
        inserted = session.execute(stmt, rows).scalars().all()
        res.stored = len(inserted)
        counts: dict[str, tuple[int, int]] = {}
        for key in inserted:
            counts[key] = (0, counts.get(key, (0, 0))[1] + 1)
        self._count(session, _added(counts, moves.counts), {})
        moves.link(session)
        states = session.scalars(
            select(OtelConversationRow).where(
                OtelConversationRow.conversation_key.in_({r["conversation_key"] for r in rows})
            )
        )
        return {
            s.conversation_key: _Touched(
                idle_finished=s.idle_finished,
                finished=s.finished_at is not None,
                processed_at=s.processed_at or s.first_seen_at,
                revised=_refused_last(s),
            )
            for s in states
            if s.span_count > 0
        }

    # --- assembling and processing ------------------------------------------------------------------

    def note_stale(self, keys: Sequence[str]) -> None:
        """TraceMarker, after its transaction committed: these finished revisions were assembled before spans
        another request stored meanwhile, so the conversations stay unfinished; processed again at once."""
        with self._lock:
            if len(self._stale) > TRACE_KEYS:  # a batch that never came back for its keys: the idle finisher has them
                self._stale.clear()
            self._stale.update(keys)

    def _clock(self) -> datetime:
        """Now on the clock a conversation's start and processing are stamped by: the database's on Postgres
        (``now()`` in the count upsert), the host's on SQLite (every replica of it runs on its host)."""
        with self.rt.sessions() as session:
            if session.get_bind().dialect.name == "postgresql":
                return clock(session)
        return datetime.now(UTC)

    def _take_stale(self, keys: Sequence[str]) -> list[str]:
        with self._lock:
            found = sorted(self._stale.intersection(keys))
            self._stale.difference_update(found)
        return found

    def _process(self, touched: dict[str, _Touched], res: IngestResult, idle: bool = False, again: int = 0) -> None:
        """Assemble and process the touched conversations.

        An unfinished conversation that began, or last went through the pipeline, less than
        ``VIGIL_OTLP_PROGRESS_INTERVAL_SECONDS`` ago waits (its next revision, at the latest the one its
        root or the idle timeout finishes, carries everything), so a trace sent in many requests costs
        one pipeline pass, and a long one shows its progress every interval.
        """
        s = self.rt.settings
        interval = timedelta(seconds=s.otlp_progress_interval_seconds)
        now: datetime | None = None  # read when a conversation may wait: the clock its times are stamped by
        convs: list[tuple[Conversation, str, None]] = []
        dead: list[DeadLetter] = []  # conversations dated ahead of now
        refused: list[str] = []  # their keys
        latest: LatestAllowed | None = None  # read once, at the first conversation assembled
        empty: list[str] = []
        ended: dict[str, int] = {}  # every trace's root came, no messages yet: spans and events assembled
        for key in sorted(touched):
            t = touched[key]
            may_wait = not idle and not t.has_root and not t.finished and not t.idle_finished
            if may_wait and t.processed_at is not None:
                now = now or self._clock()
                if now - aware(t.processed_at) < interval:
                    res.pending.append(key)
                    continue
            spans, events = (t.known, list[dict[str, Any]]()) if t.known is not None else self._load(key)
            try:
                doc = assemble(
                    key, spans, s.otlp_default_agent_version, events=events, idle_finished=idle or t.idle_finished
                )
            except Exception as exc:  # one conversation's spans must not hold up the others, nor be retried forever
                log.exception("assembling OTLP conversation %s failed", key)
                self.rt.metrics.ingest_errors.labels("otlp").inc()
                res.problem(f"conversation {key}: could not be assembled ({type(exc).__name__})")
                res.pending.append(key)
                empty.append(key)
                continue
            if doc is None:
                res.pending.append(key)
                empty.append(key)
                if not idle and not t.finished and _all_rooted(spans):
                    ended[key] = len(spans) + len(events)
                continue
            document = orjson.dumps(doc).decode()  # only JSON types get past this: the dict validates as its JSON would
            try:
                # from the dict, not the JSON: the schema takes the strings as they are instead of decoding a
                # second copy of the whole conversation (half the cost)
                conv = Conversation.model_validate(doc, context=INCOMING)
            except ValidationError as exc:
                res.problem(f"conversation {key}: {exc.errors()[0]['msg']}")
                log.warning("OTLP conversation %s does not validate: %s", key, exc)
                empty.append(key)  # idle: finished once, not claimed again and again
                continue
            # span times are the exporting host's clock: one running ahead would date the conversation ahead
            # of now, as a producer's clock would on the other ways in (its spans stay stored: a revision
            # assembled once the clock has passed them is taken)
            latest = latest or self.rt.future_bound.latest_allowed()
            future, found = conversation_in_future(conv, latest, doc, limit=5)
            if found:
                detail = "; ".join(e["message"] for e in future) + (f"; ... and {found - 5} more" if found > 5 else "")
                res.problem(f"conversation {key}: {detail}")
                log.warning("OTLP conversation %s is dated ahead: %s", key, detail)
                # a letter for the first revision refused and for the finished one, not one a progress interval
                # while the trace grows: the first says it began, the last holds the whole conversation
                if not t.revised or conv.status == "finished":
                    dead.append(
                        DeadLetter("otlp", "occurred_in_future", detail, document.encode(), key=conv.conversation_id)
                    )
                empty.append(key)
                refused.append(key)
                continue
            convs.append((conv, document, None))
            res.conversations.append(doc["conversation_id"])
        outgrown: list[str] = []  # processed or finished from fewer spans than another request stored meanwhile
        if convs or dead:
            self.rt.pipeline.process_documents(convs, dead, "otlp")
            self.rt.metrics.otlp_conversations.inc(len(convs))
            outgrown += self._take_stale([c.conversation_id for c, _, _ in convs if c.status == "finished"])
        if refused and not idle:  # idle: finished below, never assembled again
            self._refused(refused)
        if idle and empty:  # idle with nothing to judge: finished all the same, so it is not claimed again
            self._finish_empty(empty)
        if ended:
            outgrown += self._finish_ended(ended)
        if outgrown and again < STALE_RETRIES:  # read back with every span stored, and processed again
            more = IngestResult()
            self._process({key: _Touched(finished=True) for key in outgrown}, more, idle, again + 1)
            done = set(more.conversations)
            res.conversations += [cid for cid in more.conversations if cid not in res.conversations]
            res.pending = [key for key in res.pending if key not in done]
            for problem in more.problems:
                res.problem(problem)

    def _last_of(self, key: str | None) -> Last | None:
        if key is None:
            return None
        with self._lock:
            recent = self._recent.get(key)
            return recent[1] if recent else None

    def _forget(self, keys: Sequence[str]) -> None:
        """Drop what this process holds of conversations that are finished."""
        with self._lock:
            for key in keys:
                gone = self._recent.pop(key, None)
                if gone is not None:
                    self._recent_spans -= len(gone[0])
                    self._recent_bytes -= gone[2]

    def _recall(self, key: str, t: _Touched) -> list[dict[str, Any]] | None:
        """Every span of an unfinished conversation whose spans all came through this process (kept in memory,
        at most ``RECENT_SPANS`` spans and ``RECENT_BYTES`` of their strings in all), so a trace sent in many
        requests is not read back each time."""
        with self._lock:
            before = self._recent.pop(key, None)
            if before is None and t.moved_from is not None:  # they waited under the trace's key: now stored here
                before = self._recent.pop(t.moved_from, None)
            if before is not None:
                self._recent_spans -= len(before[0])
                self._recent_bytes -= before[2]
            if t.fresh:
                spans, size = list(t.spans), _string_bytes(t.spans)
            elif before is not None and t.stored == len(t.spans) and len(before[0]) + t.stored == t.total:
                spans, size = before[0] + t.spans, before[2] + _string_bytes(t.spans)
            else:
                return None  # another replica, a resent span or a log record: read them from the database
            if not t.has_root and size <= RECENT_BYTES // 4:  # a root usually ends it: keep what may still grow
                self._recent[key] = (spans, t.last, size)
                self._recent_spans += len(spans)
                self._recent_bytes += size
            while (self._recent_spans > RECENT_SPANS or self._recent_bytes > RECENT_BYTES) and self._recent:
                _, (dropped, _, dropped_size) = self._recent.popitem(last=False)
                self._recent_spans -= len(dropped)
                self._recent_bytes -= dropped_size
            return spans

    def _load(self, key: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        limit = self.rt.settings.otlp_max_spans_per_conversation
        with self.rt.sessions() as session:
            r, m = OtelSpanRow, OtelConversationTraceRow
            # through its traces: the span table's (trace_id, span_id) key is the only index it needs
            traces = sorted(session.scalars(select(m.trace_id).where(m.conversation_key == key)))
            rows = (
                session.execute(
                    select(r.span, r.trace_id, r.span_id, r.parent_span_id, r.name, r.start_ns, r.end_ns)
                    .where(among(session, r.trace_id, traces), r.conversation_key == key)
                    .order_by(r.start_ns, r.id)
                    .limit(limit)
                ).all()
                if traces
                else []
            )
            spans = expand(resolve(session, [_restored(*row) for row in rows]))
            events = list(
                session.scalars(
                    select(OtelEventRow.event)
                    .where(OtelEventRow.conversation_key == key)
                    .order_by(OtelEventRow.time_ns, OtelEventRow.id)
                    .limit(limit)
                )
            )
        return spans, events

    def _finish_ended(self, ended: dict[str, int]) -> list[str]:
        """Finish the conversations whose every root has come but no message yet (the root was exported before
        the spans under it, or the trace holds no GenAI content at all), so that spans still to come go through
        the pipeline as they arrive instead of waiting for the idle timeout. A conversation that grew since it
        was assembled (another request stored spans meanwhile, and left them for this revision) is not
        finished: returned, to be processed again. Each update counts the rows once they are locked, so the
        other request either saw the conversation finished or had its spans counted before. Tried again on a
        deadlock or a lost connection (see :meth:`_retrying`)."""
        return self._retrying(lambda: self._finish_ended_once(ended))

    def _finish_ended_once(self, ended: dict[str, int]) -> list[str]:
        t = OtelConversationRow
        grown: list[str] = []
        readable = _readable(t.span_count, t.event_count, self.rt.settings.otlp_max_spans_per_conversation)
        now = datetime.now(UTC)
        with self.rt.sessions.begin() as session:
            keys = sorted(ended)
            if session.get_bind().dialect.name == "postgresql":  # in key order, as every writer of these rows
                session.execute(
                    select(t.conversation_key)
                    .where(among(session, t.conversation_key, keys))
                    .order_by(t.conversation_key)
                    .with_for_update()
                ).all()
            by_count: dict[int, list[str]] = {}
            for key in keys:
                by_count.setdefault(ended[key], []).append(key)
            finished = 0
            for n, group in sorted(by_count.items()):  # most often one group: a root alone, or a root and its events
                for key, count, finished_at in session.execute(
                    update(t)
                    .where(among(session, t.conversation_key, group))
                    .values(finished_at=case((and_(t.finished_at.is_(None), readable <= n), now), else_=t.finished_at))
                    .returning(t.conversation_key, readable, t.finished_at)
                ):
                    if count > n:
                        grown.append(key)
                    elif finished_at is not None and aware(finished_at) == now:  # finished by this update
                        finished += 1
            if finished:  # counted once committed: a try rolled back and tried again counts once
                after_commit(session, lambda: self.rt.metrics.otlp_finished.labels("root").inc(finished))
        return sorted(grown)

    def _refused(self, keys: list[str]) -> None:
        """Stamp ``processed_at`` on conversations whose revision was refused (dated ahead), as
        :class:`TraceMarker` stamps a stored one: the next revision waits the progress interval instead of
        every request touching the conversation reading its spans back and keeping another dead letter."""
        t = OtelConversationRow

        def once() -> None:
            with self.rt.sessions.begin() as session:
                postgres = session.get_bind().dialect.name == "postgresql"
                now = clock(session) if postgres else datetime.now(UTC)
                if postgres:  # in key order, as every writer of these rows locks them
                    session.execute(
                        select(t.conversation_key)
                        .where(among(session, t.conversation_key, sorted(keys)))
                        .order_by(t.conversation_key)
                        .with_for_update()
                    ).all()
                # conversation_id cleared: the last revision was refused, not stored (see _refused_last)
                session.execute(
                    update(t)
                    .where(among(session, t.conversation_key, keys))
                    .values(processed_at=now, conversation_id=None)
                )

        self._retrying(once)

    def _finish_empty(self, keys: list[str]) -> None:
        t = OtelConversationRow

        def once() -> None:
            with self.rt.sessions.begin() as session:
                session.execute(
                    update(t)
                    .where(t.conversation_key.in_(keys), t.finished_at.is_(None))
                    .values(finished_at=datetime.now(UTC), claimed_by=None, claim_until=None)
                )

        self._retrying(once)

    # --- idle conversations ------------------------------------------------------------------------

    def finish_idle(self, owner: str, now: datetime | None = None) -> list[str]:
        """Finish the conversations nothing was added to for ``VIGIL_OTLP_TRACE_IDLE_SECONDS``.

        Each is claimed by one compare-and-set update (unfinished, still idle, not claimed by a live
        lease), so with several replicas each conversation is finished once; a claim that dies with its
        replica expires after ``VIGIL_OTLP_FINISH_LEASE_SECONDS``. Returns the conversation ids processed.
        """
        s = self.rt.settings
        t = OtelConversationRow
        claimed: list[str] = []
        with self.rt.sessions.begin() as session:
            # the database's clock, as the count upsert writes last_seen_at by (Postgres): a replica whose
            # clock ran ahead took live claims and finished conversations spans were still coming to
            now = now or clock(session)
            cutoff = now - timedelta(seconds=s.otlp_trace_idle_seconds)
            free = or_(t.claim_until.is_(None), t.claim_until < now)
            keys = session.scalars(
                select(t.conversation_key)
                .where(t.finished_at.is_(None), t.last_seen_at < cutoff, free)
                .order_by(t.last_seen_at)
                .limit(FINISH_BATCH)
            ).all()
            # claimed in key order, the order the count upsert of another replica's request locks them in
            # (claimed in idle order, a late span to two of them could make the two wait in a cycle)
            for key in sorted(keys):
                won = _matched(
                    session,
                    update(t)
                    .where(t.conversation_key == key, t.finished_at.is_(None), t.last_seen_at < cutoff, free)
                    .values(
                        claimed_by=owner[:64],
                        claim_until=now + timedelta(seconds=s.otlp_finish_lease_seconds),
                        idle_finished=True,
                    ),
                )
                if won:
                    claimed.append(key)
        if not claimed:
            return []
        res = IngestResult()
        self._process({k: _Touched(idle_finished=True) for k in claimed}, res, idle=True)
        self._forget(claimed)
        return res.conversations

    # --- housekeeping ------------------------------------------------------------------------------

    def _maybe_purge(self) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last_purge < PURGE_EVERY_SECONDS:
                return
            self._last_purge = now
        try:
            # the database's clock, as a conversation's last growth is stamped by (Postgres): on a replica whose
            # clock ran ahead by more than the retention, the conversations still growing were deleted
            with self.rt.sessions() as session:
                cutoff = clock(session) - timedelta(hours=self.rt.settings.otlp_span_retention_hours)
            purge_conversations(self.rt.sessions, cutoff)
            with self.rt.sessions.begin() as session:
                stray = cutoff - timedelta(hours=self.rt.settings.otlp_span_retention_hours)  # rows of no conversation
                session.execute(delete(OtelSpanRow).where(OtelSpanRow.received_at < stray))
                session.execute(delete(OtelEventRow).where(OtelEventRow.received_at < stray))
                purge_values(session, stray)
        except Exception:  # purging is housekeeping; the next request tries again
            log.warning("purging old OTLP spans failed", exc_info=True)

    def related(self, session: Session, conversation_id: str, limit: int = 20) -> dict[str, Any] | None:
        """Session and user of a traced conversation and the other conversations sharing them (newest first)."""
        t = OtelConversationRow
        row = session.scalars(
            select(t).where(or_(t.conversation_id == conversation_id, t.conversation_key == conversation_id)).limit(1)
        ).first()
        if row is None:
            return None
        out: dict[str, Any] = {"session_id": row.session_id, "user_id": row.user_id}
        for field_name, column in (("session", t.session_id), ("user", t.user_id)):
            value = getattr(row, f"{field_name}_id")
            if not value:
                out[field_name] = []
                continue
            others = session.execute(
                select(t.conversation_id, t.conversation_key, t.first_seen_at)
                .where(column == value, t.conversation_key != row.conversation_key)
                .order_by(t.first_seen_at.desc())
                .limit(limit)
            ).all()
            out[field_name] = [{"conversation_id": cid or key, "first_seen_at": at} for cid, key, at in others]
        return out


class TraceMarker:
    """Downstream stage: in the transaction that stores a traced conversation's revision, records that it
    went through the pipeline and, once it is ``finished``, that it is (so the idle finisher skips it)."""

    def __init__(self, metrics: Any, stale: Callable[[Sequence[str]], None] | None = None, limit: int = 10**9) -> None:
        self.metrics = metrics
        self.stale = stale
        self.limit = limit  # spans, and log records, a conversation is read back with at most (see _load)

    def on_stored(self, session: Session, stored: Sequence[Checked]) -> None:
        traced = [c.conversation for c in stored if c.conversation.metadata.get("source") == "otlp"]
        if not traced:
            return
        t = OtelConversationRow.__table__
        # processed_at on the clock the conversation's start is stamped by (Postgres: the database's), which the
        # progress interval compares them with
        postgres = session.get_bind().dialect.name == "postgresql"
        now = clock(session) if postgres else datetime.now(UTC)
        keys = {c.conversation_id for c in traced}
        revisions = {c.conversation_id: c.revision for c in traced if c.status == "finished"}
        # the rows locked in key order first (Postgres; SQLite's writer holds the whole database), as the count
        # upsert of another replica's request locks them: two UPDATEs (newly finished, then the rest) would hold
        # a later key while waiting for an earlier one, a cycle Postgres breaks by failing one transaction
        locks = postgres
        wanted = sorted(keys if locks else revisions)
        readable = _readable(t.c.span_count, t.c.event_count, self.limit)
        rows = select(t.c.conversation_key, readable, t.c.idle_finished).where(
            among(session, t.c.conversation_key, wanted)
        )
        if locks:
            rows = rows.order_by(t.c.conversation_key).with_for_update()
        # a finished revision assembled before spans another request stored meanwhile is not the last word:
        # that request, seeing the conversation unfinished, left it for its next revision, so the conversation
        # stays unfinished and is processed again with every span (see TraceIngest.note_stale; else the idle
        # finisher takes it); a revision the idle timeout finished is final
        finished: list[str] = []
        early: list[str] = []
        for key, total, idle in session.execute(rows).all() if wanted else []:
            if key in revisions:
                (finished if idle or total <= revisions[key] else early).append(key)
        if early and self.stale is not None:
            note, keys_early = self.stale, sorted(early)
            after_commit(session, lambda: note(keys_early))
        finished.sort()
        done: set[str] = set()
        if finished:
            # finished by this revision: rows not finished before (a row purged meanwhile is no row), their
            # lease released; one statement, which tells how each was finished
            for key, idle in session.execute(
                update(t)
                .where(among(session, t.c.conversation_key, finished), t.c.finished_at.is_(None))
                .values(
                    finished_at=now,
                    claimed_by=None,
                    claim_until=None,
                    processed_at=now,
                    conversation_id=t.c.conversation_key,
                )
                .returning(t.c.conversation_key, t.c.idle_finished)
            ):
                done.add(key)
                self.metrics.otlp_finished.labels("idle" if idle else "root").inc()
        progress = sorted(keys - done)
        if progress:
            session.execute(
                update(t)
                .where(among(session, t.c.conversation_key, progress))
                .values(processed_at=now, conversation_id=t.c.conversation_key)
            )


_COUNT_PG = """
INSERT INTO otel_conversations AS t
    (conversation_key, span_count, event_count, first_seen_at, last_seen_at, idle_finished, session_id, user_id)
SELECT k, s, e, now(), now(), false, si, ui
FROM unnest(%(keys)s::varchar[], %(spans)s::int[], %(events)s::int[], %(sessions)s::varchar[], %(users)s::varchar[])
    AS u(k, s, e, si, ui)
ON CONFLICT (conversation_key) DO UPDATE SET
    span_count = t.span_count + excluded.span_count,
    event_count = t.event_count + excluded.event_count,
    last_seen_at = CASE WHEN t.last_seen_at < now() - %(stale)s * interval '1 second'
        THEN excluded.last_seen_at ELSE t.last_seen_at END,
    session_id = coalesce(t.session_id, excluded.session_id),
    user_id = coalesce(t.user_id, excluded.user_id)
RETURNING conversation_key, t.span_count + t.event_count, t.first_seen_at,
    t.finished_at, t.idle_finished, t.processed_at
"""
_COUNT_SQLITE = """
INSERT INTO otel_conversations AS t
    (conversation_key, span_count, event_count, first_seen_at, last_seen_at, idle_finished, session_id, user_id)
VALUES {rows}
ON CONFLICT (conversation_key) DO UPDATE SET
    span_count = t.span_count + excluded.span_count,
    event_count = t.event_count + excluded.event_count,
    last_seen_at = CASE WHEN t.last_seen_at < ? THEN excluded.last_seen_at ELSE t.last_seen_at END,
    session_id = coalesce(t.session_id, excluded.session_id),
    user_id = coalesce(t.user_id, excluded.user_id)
RETURNING conversation_key, span_count + event_count, first_seen_at,
    finished_at, idle_finished, processed_at
"""
_LINK_PG = """
INSERT INTO otel_conversation_traces (conversation_key, trace_id)
SELECT * FROM unnest(%(keys)s::varchar[], %(traces)s::varchar[])
ON CONFLICT DO NOTHING
"""
_LINK_SQLITE = "INSERT INTO otel_conversation_traces (conversation_key, trace_id) VALUES {rows} ON CONFLICT DO NOTHING"
_SPAN_KEYS = ("conversation_key", "trace_id", "span_id", "parent_span_id", "name", "start_ns", "end_ns", "span")
_SPAN_COPY_COLUMNS = (*_SPAN_KEYS, "received_at")
_SPAN_COLUMNS = ", ".join(_SPAN_COPY_COLUMNS)
_SPANS = OtelSpanRow.__tablename__
INSERT_CHUNK = 500  # rows per statement: 4,500 parameters, under SQLite's and Postgres' limits


def _unrefer(
    session: Session,
    rows: list[tuple[str, dict[str, Any]]],
    inserted: list[tuple[str, str, str]],
    touched: dict[str, _Touched],
) -> None:
    """Spans of a request stored with a reference to a span of the same request that was not stored (it was
    stored before, perhaps with other content: an exporter resending a span id) are rewritten whole."""
    stored = {(trace, span) for _, trace, span in inserted}
    skipped = {(s["trace_id"], s["span_id"]) for _, s in rows} - stored
    originals = {(s["trace_id"], s["span_id"]): s for t in touched.values() for s in t.spans}
    for _, s in rows:
        ids = (s["trace_id"], s["span_id"])
        if ids in stored and referenced(s) & skipped:
            session.execute(
                update(OtelSpanRow)
                .where(OtelSpanRow.trace_id == ids[0], OtelSpanRow.span_id == ids[1])
                .values(span=_stored_part(literal(originals[ids])))
            )


_Counted = tuple[int, Any, bool, bool, Any]  # see TraceIngest._count


def _counted(total: Any, first_seen: Any, finished_at: Any, idle_finished: Any, processed_at: Any) -> _Counted:
    if isinstance(processed_at, str):  # SQLite returns the stored text
        processed_at = datetime.fromisoformat(processed_at)
    return (int(total), first_seen, finished_at is not None, bool(idle_finished), processed_at)


TRACE_LOCKS = 0x6F74  # the class of the advisory locks taken on traces (see _lock_traces)
MAX_TRACE_LOCKS = 64  # traces a request locks at most (see _lock_traces)


def _lock_traces(session: Session, trace_ids: set[str]) -> None:
    """On Postgres, lock the traces whose conversation this request looks up, until it commits (advisory
    locks, in one order). Two requests that look the same trace up then take turns: one naming the trace's
    conversation and one with a span that does not name it, looking up at once, would each find nothing of
    the other's (neither committed) and the unnamed span would stay under the trace's own key, apart from
    its conversation. Taken before any row lock, by requests alone, so no cycle can form with row locks.
    (SQLite: one process writes, and TraceIngest takes its turns by a lock of its own.)"""
    if not trace_ids or session.get_bind().dialect.name != "postgresql":
        return
    keys = sorted({int(t[-8:], 16) - (1 << 31) for t in trace_ids})  # ints of 32 bits, in one order
    if len(keys) > MAX_TRACE_LOCKS:
        # each advisory lock takes a slot of Postgres' shared lock table (max_locks_per_transaction, 64 by
        # default, times max_connections): a request looking up more traces than this takes none, and for
        # it the race above stays possible (see docs/opentelemetry.md)
        return
    session.connection().exec_driver_sql(
        "SELECT pg_advisory_xact_lock(%(class)s, k) FROM unnest(%(keys)s::int[]) AS k",
        {"class": TRACE_LOCKS, "keys": keys},
    )


def _readable(spans: Any, events: Any, limit: int) -> Any:
    """Of a conversation's counted spans and log records, how many a read-back holds (each at most ``limit``,
    see ``TraceIngest._load``): what a revision holding every stored one counts."""
    return case((spans > limit, limit), else_=spans) + case((events > limit, limit), else_=events)


def _all_rooted(spans: list[dict[str, Any]]) -> bool:
    """Whether the root span of every trace among ``spans`` is there."""
    traces = {s["trace_id"] for s in spans}
    return bool(traces) and traces <= {s["trace_id"] for s in spans if not s.get("parent_span_id")}


def _added(a: dict[str, tuple[int, int]], b: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """(spans, events) counts of both, added key by key."""
    out = dict(a)
    for key, (spans, events) in b.items():
        before = out.get(key, (0, 0))
        out[key] = (before[0] + spans, before[1] + events)
    return out


def _remember(known: OrderedDict[Any, Any], items: dict[Any, Any]) -> None:
    """Put ``items`` in the LRU ``known`` (at most ``TRACE_KEYS`` entries), most recent last."""
    for k, v in items.items():
        known[k] = v
        known.move_to_end(k)
    while len(known) > TRACE_KEYS:
        known.popitem(last=False)


def _link_traces(session: Session, pairs: set[tuple[str, str]]) -> None:
    """Record that each (conversation key, trace id) has spans stored (kept if known; in one order, so two
    replicas storing the same traces never wait on each other in a cycle). One statement of the driver's
    own, as ``_count`` writes the counts: SQLAlchemy's executemany costs more than the rows it inserts."""
    if not pairs:
        return
    ordered = sorted(pairs)
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(_LINK_PG, {"keys": [k for k, _ in ordered], "traces": [t for _, t in ordered]})
        return
    for i in range(0, len(ordered), INSERT_CHUNK):
        chunk = ordered[i : i + INSERT_CHUNK]
        sql = _LINK_SQLITE.format(rows=", ".join(["(?, ?)"] * len(chunk)))
        conn.exec_driver_sql(sql, tuple(p for pair in chunk for p in pair))


def _trace_moved(session: Session, trace_id: str, old: str, key: str) -> None:
    """The spans of ``trace_id`` that waited under ``old`` (the trace's own key) now belong to ``key``."""
    m = OtelConversationTraceRow
    session.execute(delete(m).where(m.conversation_key == old, m.trace_id == trace_id))
    _link_traces(session, {(key, trace_id)})


PURGE_BATCH = 1000  # conversations purged a transaction


def purge_conversations(sessions: sessionmaker[Session], cutoff: datetime) -> int:
    """Delete the conversations (their counts, spans, log records and traces) not seen since ``cutoff``, a
    batch a transaction; returns how many. A conversation's spans go together: a stored span may refer to
    an earlier one (see compact)."""
    t, m, r = OtelConversationRow, OtelConversationTraceRow, OtelSpanRow
    purged = 0
    while True:
        with sessions.begin() as session:
            found = sorted(
                session.scalars(select(t.conversation_key).where(t.last_seen_at < cutoff).limit(PURGE_BATCH))
            )
            if not found:
                return purged
            # still old once locked: one that grew meanwhile (another replica's request) stays, spans and all
            gone = session.scalars(
                delete(t)
                .where(among(session, t.conversation_key, found), t.last_seen_at < cutoff)
                .returning(t.conversation_key)
            )
            keys = sorted(gone)
            if keys:
                traces = sorted(
                    set(session.scalars(select(m.trace_id).where(among(session, m.conversation_key, keys))))
                )
                if traces:  # a conversation of log records alone has none
                    session.execute(
                        delete(r).where(among(session, r.trace_id, traces), among(session, r.conversation_key, keys))
                    )
                session.execute(delete(OtelEventRow).where(among(session, OtelEventRow.conversation_key, keys)))
                session.execute(delete(m).where(among(session, m.conversation_key, keys)))
        purged += len(keys)
        if len(found) < PURGE_BATCH:
            return purged


def _insert_spans(
    session: Session, rows: list[tuple[str, dict[str, Any]]], now: datetime
) -> list[tuple[str, str, str]]:
    """Insert (conversation key, compacted span) rows, skipping spans already stored (same trace and span
    id); returns the conversation key, trace id and span id of each row inserted.

    On Postgres the rows are first COPYed straight into the table (an exporter's request is nearly always
    new spans); a span stored before fails the COPY on its key, its savepoint is rolled back, and the
    rows go the other way: one multi-row ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` per chunk, its
    parameters passed to the driver as they are (SQLAlchemy's executemany would build and process a
    parameter dict per row, which costs as much as the insert itself)."""
    table = OtelSpanRow.__table__
    conn = session.connection()
    dialect = conn.dialect
    if dialect.name == "postgresql":
        # the JSON as the UTF-8 orjson wrote, not decoded here to be encoded again (see copy_new_values)
        copied = _span_values(rows, text=False, tail=(now,))
        if copy_new_values(session, table, _SPAN_COPY_COLUMNS, copied):
            return [(v[0], v[1], v[2]) for v in copied]
    # SQLite takes the JSON as the UTF-8 bytes orjson wrote (a BLOB in the text column; JsonText reads either):
    # as str it was decoded here and encoded again by sqlite3, about a tenth of what OTLP ingest costs
    # beyond native ingest. Postgres' text column needs text.
    on_sqlite = dialect.name == "sqlite"
    at_proc = table.c.received_at.type.dialect_impl(dialect).bind_processor(dialect)
    at = at_proc(now) if at_proc else now
    values = _span_values(rows, text=not on_sqlite, tail=(at,))
    # the two drivers Vigil runs on: sqlite3 (qmark) and psycopg (format)
    mark = "?" if dialect.paramstyle == "qmark" else "%s"
    one = f"({', '.join([mark] * 9)})"
    inserted: list[tuple[str, str, str]] = []
    # SQLite: spans that are all new (an exporter's request nearly always is) go in without ON CONFLICT ...
    # RETURNING, whose returned rows SQLite gathers one by one (about 2% of what OTLP ingest costs there,
    # measured). A chunk that fails on a key (a span stored before) is undone by SQLite alone and the
    # transaction goes on: it and the chunks after it take the upsert. (No savepoint: on SQLite the first
    # write opens the transaction, and a savepoint opened before it would be released as a commit of its own.)
    plain = on_sqlite
    for i in range(0, len(values), INSERT_CHUNK):
        chunk = values[i : i + INSERT_CHUNK]
        params = tuple(chain.from_iterable(chunk))  # each row's values end with its received_at (tail)
        sql = f"INSERT INTO {_SPANS} ({_SPAN_COLUMNS}) VALUES {', '.join([one] * len(chunk))}"
        if plain:
            try:
                conn.exec_driver_sql(sql, params)
            except IntegrityError as exc:
                # its frames reach this request's spans and values, in a cycle through SQLAlchemy's: freed
                # now rather than at the collector's next run
                without_frames(exc)
                plain = False
            else:
                inserted += [(v[0], v[1], v[2]) for v in chunk]
                continue
        upsert = f"{sql} ON CONFLICT (trace_id, span_id) DO NOTHING RETURNING conversation_key, trace_id, span_id"
        inserted += [(r[0], r[1], r[2]) for r in conn.exec_driver_sql(upsert, params)]
    return inserted


def _span_values(
    rows: list[tuple[str, dict[str, Any]]], text: bool, tail: tuple[Any, ...] = ()
) -> list[tuple[Any, ...]]:
    """Each (conversation key, span) as the values of ``_SPAN_KEYS`` (then ``tail``); the span column's JSON
    as ``str`` with ``text``, else as UTF-8 ``bytes``."""
    dumps = orjson.dumps
    return [
        (
            key,
            s["trace_id"],
            s["span_id"],
            s.get("parent_span_id"),
            s["name"][:512],
            s["start_ns"],
            s["end_ns"],
            dumps(_stored_part(s)).decode() if text else dumps(_stored_part(s)),
            *tail,
        )
        for key, s in rows
    ]


# what the span's columns hold, and the decoder's hint of what a value extends (a reference, never stored)
_IN_COLUMNS = frozenset(("trace_id", "span_id", "parent_span_id", "start_ns", "end_ns", EXTENDS))
_NO_STATUS = {"code": 0, "message": ""}


def _stored_part(span: dict[str, Any]) -> dict[str, Any]:
    """What the span's JSON holds: not what its columns hold, nor empty events or an unset status (about
    7% of a conversation's span bytes); :func:`_restored` puts them back."""
    out = span.copy()
    for k in _IN_COLUMNS:
        out.pop(k, None)
    if len(out.get("name", "")) <= 512:  # the column holds it whole
        out.pop("name", None)
    if not out.get("events", True):
        del out["events"]
    if out.get("status") == _NO_STATUS:
        del out["status"]
    return out


def _restored(
    stored: dict[str, Any], trace_id: str, span_id: str, parent: str | None, name: str, start: int, end: int
) -> dict[str, Any]:
    """A span as received from its row (rows stored before :func:`_stored_part` hold every field)."""
    return {
        "trace_id": trace_id,
        "span_id": span_id,
        "parent_span_id": parent,
        "name": name,
        "start_ns": start,
        "end_ns": end,
        "events": [],
        "status": {"code": 0, "message": ""},
        **stored,
    }
