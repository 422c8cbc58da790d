"""Races and odd orders around ``otel_conversation_traces``: whatever happens between reading a
conversation's row and adding to its counts, every span stored under a conversation is read back with it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy import event, text

from tests.ingest.test_otel_conversation_traces import _read_after_restart, _traces
from tests.ingest.test_otel_shared_values import _conversation, _copy, _runtime
from vigil.ingest.otlp.ingest import TraceIngest, TraceMarker, purge_conversations
from vigil.runtime import Runtime
from vigil.store import db


def _in_conversation(spans: list[dict[str, Any]], cid: str, prefix: str) -> list[dict[str, Any]]:
    return [
        {**s, "span_id": prefix + s["span_id"][1:], "attributes": {**s["attributes"], "gen_ai.conversation.id": cid}}
        for s in spans
    ]


def test_a_conversation_purged_and_grown_as_much_by_another_replica_meanwhile_links_the_trace_again(
    db_url: str,
) -> None:
    """A replica reads the conversation's row; meanwhile the conversation is purged and another replica
    stores as many spans of it (in another trace) as the purged row counted. The counts then look as if
    only this request added to the row this replica linked the trace in before: it must link it again."""
    spans = _conversation(1)
    other = _in_conversation(_conversation(2)[:2], "conv-1", "e")  # conv-1's spans in trace 2
    a, b = _runtime(db_url), _runtime(db_url)
    armed = [True]

    def meanwhile(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if armed[0] and statement.lstrip().upper().startswith("SELECT") and "first_seen_at" in statement:
            armed[0] = False
            assert purge_conversations(b.sessions, datetime.now(UTC) + timedelta(hours=1)) == 1
            b.get(TraceIngest).ingest(_copy(other))  # two spans: what the purged row counted

    try:
        ingest = a.get(TraceIngest)
        ingest.ingest(_copy(spans[:1]))
        ingest.ingest(_copy(spans[1:2]))  # the pair is linked in the row found: remembered with its age
        event.listen(a.engine, "after_cursor_execute", meanwhile)
        ingest.ingest(_copy(spans[2:]))
        assert not armed[0]
    finally:
        event.remove(a.engine, "after_cursor_execute", meanwhile)
        a.close()
        b.close()
    assert _traces(db_url) == {("conv-1", f"{1:032x}"), ("conv-1", f"{2:032x}")}
    read = {s["span_id"] for s in _read_after_restart(db_url, "conv-1")}
    assert read == {s["span_id"] for s in spans[2:] + other}


def _unnamed(s: dict[str, Any]) -> dict[str, Any]:
    return {**s, "attributes": {k: v for k, v in s["attributes"].items() if k != "gen_ai.conversation.id"}}


def test_a_span_resent_while_another_replica_moves_it_to_its_conversation_leaves_no_trace_behind(
    db_url: str,
) -> None:
    """A replica looks up where a resent span's trace waits (under its own key); meanwhile another replica
    names the conversation and moves the span there. The resent span is stored already: nothing is stored,
    counted or linked under the trace's key, which no purge would ever remove."""
    spans = _conversation(3)
    a, b = _runtime(db_url), _runtime(db_url)
    lookup = lambda st: "DISTINCT" in st.upper() and "otel_spans" in st  # noqa: E731
    names = lambda: b.get(TraceIngest).ingest(_copy(spans[1:2]))  # noqa: E731  (the waiting span moves)
    try:
        a.get(TraceIngest).ingest(_copy([_unnamed(spans[0])]))
        assert _traces(db_url) == {(f"otel-{3:032x}", f"{3:032x}")}
        # on Postgres the other replica waits for this one's lock on the trace; on SQLite it goes ahead
        with _other_replica_after(a, db_url, lookup, names) as failed:
            a.get(TraceIngest).ingest(_copy([_unnamed(spans[0])]))  # an exporter's retry
        assert not failed, failed
        assert _traces(db_url) == {("conv-3", f"{3:032x}")}
        assert [s["span_id"] for s in _read_after_restart(db_url, "conv-3")] == [s["span_id"] for s in spans[:2]]
        assert purge_conversations(a.sessions, datetime.now(UTC) + timedelta(hours=1)) == 1
    finally:
        a.close()
        b.close()
    assert _traces(db_url) == set()


def _blocked_on_a_lock(url: str) -> bool:
    """Whether a session of the test's Postgres database waits on a lock (never, on SQLite)."""
    if not url.startswith("postgresql"):
        return False
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            name = conn.execute(text("SELECT current_database()")).scalar_one()
            return bool(
                conn.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d AND wait_event_type = 'Lock'"),
                    {"d": name},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def test_a_purge_of_a_trace_key_while_its_spans_move_to_their_conversation_waits_for_the_move(pg_url: str) -> None:
    """The purge locks the conversation rows it deletes, then their spans. A move from a trace's own key
    locks the row it empties before the spans it moves: the two wait for each other in one order, not in
    a cycle Postgres breaks by failing one of them."""
    spans = _conversation(8)
    a = _runtime(pg_url)
    purged: list[int] = []
    failed: list[BaseException] = []
    armed = [True]

    def purge() -> None:
        try:
            purged.append(purge_conversations(a.sessions, datetime.now(UTC) + timedelta(hours=1)))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)

    purger = threading.Thread(target=purge)

    def meanwhile(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if armed[0] and statement.lstrip().upper().startswith("UPDATE OTEL_SPANS SET CONVERSATION_KEY"):
            armed[0] = False
            purger.start()  # the trace's own key is old: the purge takes it, unless the move holds it
            deadline = time.monotonic() + 60
            while not _blocked_on_a_lock(pg_url) and purger.is_alive():
                assert time.monotonic() < deadline, "the purge neither waited nor finished"
                time.sleep(0.01)

    try:
        ingest = a.get(TraceIngest)
        ingest.ingest(_copy([_unnamed(spans[0])]))
        event.listen(a.engine, "after_cursor_execute", meanwhile)
        ingest.ingest(_copy(spans[1:2]))  # names the conversation: the waiting span moves
        event.remove(a.engine, "after_cursor_execute", meanwhile)
        purger.join(timeout=60)
        assert not purger.is_alive()
    finally:
        a.close()
    assert not failed, failed
    assert not armed[0]
    assert _traces(pg_url) == {("conv-8", f"{8:032x}")}
    assert [s["span_id"] for s in _read_after_restart(pg_url, "conv-8")] == [s["span_id"] for s in spans[:2]]


def _revision(cid: str, status: str, revision: int) -> Any:
    """What :class:`TraceMarker` reads of a stored revision."""
    conv = SimpleNamespace(conversation_id=cid, status=status, revision=revision, metadata={"source": "otlp"})
    return SimpleNamespace(conversation=conv)


@contextmanager
def _other_replica_after(
    a: Runtime, url: str, starts: Callable[[str], bool], work: Callable[[], Any]
) -> Iterator[list[BaseException]]:
    """Once replica ``a`` has run the first statement ``starts`` matches (its transaction holding what that
    statement locked), ``work`` (another replica's) runs in a thread until it waits on a lock or ends;
    then ``a`` goes on. Yields the errors of both (a deadlock fails one of them)."""
    failed: list[BaseException] = []
    armed = [True]

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)

    other = threading.Thread(target=run)

    def meanwhile(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if armed[0] and starts(statement):
            armed[0] = False
            other.start()
            deadline = time.monotonic() + 60
            while not _blocked_on_a_lock(url) and other.is_alive():
                assert time.monotonic() < deadline, "the other replica neither waited nor finished"
                time.sleep(0.01)

    event.listen(a.engine, "after_cursor_execute", meanwhile)
    try:
        yield failed
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        failed.append(exc)
    finally:
        event.remove(a.engine, "after_cursor_execute", meanwhile)
    assert not armed[0], "the statement to pause after never ran"
    other.join(timeout=60)
    assert not other.is_alive()


def _conversation_rows(url: str, columns: str) -> list[tuple[Any, ...]]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(f"SELECT {columns} FROM otel_conversations ORDER BY 1"))]
    finally:
        engine.dispose()


def test_marking_revisions_and_counting_spans_of_the_same_conversations_never_deadlock(pg_url: str) -> None:
    """A replica marks conv-2 finished and conv-1 processed (one pipeline batch) while another replica adds
    spans to both (its count upsert locks conv-1, then conv-2). Both lock the rows in key order, so one
    waits for the other; locking the finished group first would hold conv-2 while waiting for conv-1, a
    cycle Postgres breaks by failing one of the two."""
    a, b = _runtime(pg_url), _runtime(pg_url)
    one, two = _conversation(1), _conversation(2)
    try:
        a.get(TraceIngest).ingest(_copy([one[0], two[0]]))  # no roots: both unfinished
        grow = lambda: b.get(TraceIngest).ingest(_copy([one[1], two[1]]))  # noqa: E731
        with (
            _other_replica_after(a, pg_url, lambda st: "otel_conversations" in st, grow) as failed,
            a.sessions.begin() as session,
        ):
            TraceMarker(a.metrics).on_stored(
                session, [_revision("conv-2", "finished", 1), _revision("conv-1", "in_progress", 1)]
            )
    finally:
        a.close()
        b.close()
    assert not failed, failed
    assert _conversation_rows(pg_url, "conversation_key, span_count, finished_at IS NOT NULL") == [
        ("conv-1", 2, False),
        ("conv-2", 2, True),
    ]


def test_claiming_idle_conversations_while_another_replica_adds_spans_to_them_never_deadlocks(pg_url: str) -> None:
    """The idle finisher takes the longest idle conversations first (conv-2, then conv-1) and claims each by
    its own UPDATE in one transaction; meanwhile another replica adds late spans to both (its count upsert
    locks conv-1, then conv-2). Claiming in key order makes one wait for the other; claiming in idle order
    would hold conv-2 while waiting for conv-1, a cycle Postgres breaks by failing one of the two."""
    a, b = _runtime(pg_url), _runtime(pg_url)
    one, two = _conversation(1), _conversation(2)
    finished: list[str] = []
    try:
        a.get(TraceIngest).ingest(_copy([one[0], two[0]]))  # no roots: both unfinished
        raw = a.engine.raw_connection()  # conv-2 idle longest
        try:
            now = datetime.now(UTC)
            for key, idle in (("conv-1", 2), ("conv-2", 3)):
                raw.cursor().execute(
                    "UPDATE otel_conversations SET last_seen_at = %s WHERE conversation_key = %s",
                    (now - timedelta(hours=idle), key),
                )
            raw.commit()
        finally:
            raw.close()
        grow = lambda: b.get(TraceIngest).ingest(_copy([one[1], two[1]]))  # noqa: E731
        first_claim = lambda st: st.lstrip().upper().startswith("UPDATE OTEL_CONVERSATIONS")  # noqa: E731
        with _other_replica_after(a, pg_url, first_claim, grow) as failed:
            finished = a.get(TraceIngest).finish_idle("replica-a")
    finally:
        a.close()
        b.close()
    assert not failed, failed
    assert sorted(finished) == ["conv-1", "conv-2"]


def test_moving_a_named_trace_while_another_replica_counts_the_same_conversations_never_deadlocks(
    pg_url: str,
) -> None:
    """A replica's request names conv-2's trace, whose first span waited under the trace's own key, and
    adds to conv-1; meanwhile another replica adds spans to conv-1 and conv-2 (its count upsert locks
    conv-1, then conv-2). The moved spans are counted with the request's own, in key order: counting them
    at the move would hold conv-2 while waiting for conv-1, a cycle Postgres breaks by failing one."""
    a, b = _runtime(pg_url), _runtime(pg_url)
    one, two = _conversation(1), _conversation(2)
    later = _in_conversation(_conversation(3)[:1], "conv-2", "e")  # conv-2's spans in trace 3
    try:
        ingest = a.get(TraceIngest)
        ingest.ingest(_copy([_unnamed(two[0])]))  # waits under trace 2's own key
        # b has seen both of its traces before: it looks neither up (no lock on them), so it meets a only at
        # the conversations' rows
        b.get(TraceIngest)._remember_keys({f"{1:032x}": "conv-1", f"{3:032x}": "conv-2"})
        grow = lambda: b.get(TraceIngest).ingest(_copy([one[1], *later]))  # noqa: E731
        first_count = lambda st: st.lstrip().upper().startswith("INSERT INTO OTEL_CONVERSATIONS")  # noqa: E731
        with _other_replica_after(a, pg_url, first_count, grow) as failed:
            ingest.ingest(_copy([two[1], one[0]]))  # names trace 2: its first span moves to conv-2
    finally:
        a.close()
        b.close()
    assert not failed, failed
    assert _conversation_rows(pg_url, "conversation_key, span_count") == [("conv-1", 2), ("conv-2", 3)]


def test_what_waited_under_a_trace_key_is_counted_in_its_conversation_and_within_its_limit(db_url: str) -> None:
    """A span and a log record of conv-5's trace wait under the trace's own key; a request then names the
    trace with two more spans while conversations hold at most two spans: the conversation counts the moved
    span and record with the one span it has room for, and the trace's own row is gone."""
    from tests.support.app import make_settings
    from vigil.app.runtime import build_runtime
    from vigil.app.wiring import wire

    settings = make_settings(db_url, otlp_progress_interval_seconds=0, otlp_max_spans_per_conversation=2)
    rt = wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})
    spans = _conversation(5)
    trace = f"{5:032x}"
    try:
        ingest = rt.get(TraceIngest)
        ingest.ingest(_copy([_unnamed(spans[0])]))
        record = {
            "trace_id": trace,
            "span_id": spans[0]["span_id"],
            "time_ns": spans[0]["start_ns"] + 1,
            "name": "gen_ai.user.message",
            "body": {"content": "hello"},
            "attributes": {"gen_ai.system": "openai"},
        }
        assert ingest.ingest_logs([record]).stored == 1
        res = ingest.ingest(_copy(spans[1:]))  # names the trace: a chat span and the root, room for one
        assert (res.stored, res.dropped) == (1, 1)
    finally:
        rt.close()
    assert _conversation_rows(db_url, "conversation_key, span_count, event_count") == [("conv-5", 2, 1)]


def _unnamed_span_beside_its_naming_request(pg_url: str, unnamed_first: bool) -> None:
    """conv-9's first span names no conversation, its other spans do; two replicas receive them at once,
    each looking trace 9 up before the other commits. Wherever the race stops, every span ends in conv-9,
    nothing stays under the trace's own key."""
    a, b = _runtime(pg_url), _runtime(pg_url)
    spans = _conversation(9)
    first, rest = [_unnamed(spans[0])], spans[1:]
    mine, theirs = (first, rest) if unnamed_first else (rest, first)
    if unnamed_first:  # paused after looking the trace up in the span table (nothing there yet)
        at = lambda st: "DISTINCT" in st.upper() and "otel_spans" in st  # noqa: E731
    else:  # paused after reading the conversations' state (the trace's own key held nothing)
        at = lambda st: st.lstrip().startswith("SELECT") and "otel_conversations.span_count" in st  # noqa: E731
    try:
        other = lambda: b.get(TraceIngest).ingest(_copy(theirs))  # noqa: E731
        with _other_replica_after(a, pg_url, at, other) as failed:
            a.get(TraceIngest).ingest(_copy(mine))
    finally:
        a.close()
        b.close()
    assert not failed, failed
    assert _conversation_rows(pg_url, "conversation_key, span_count") == [("conv-9", 3)]
    assert _traces(pg_url) == {("conv-9", f"{9:032x}")}
    assert sorted(s["span_id"] for s in _read_after_restart(pg_url, "conv-9")) == sorted(s["span_id"] for s in spans)


def test_a_span_naming_no_conversation_stored_while_another_replica_names_its_trace_joins_the_conversation(
    pg_url: str,
) -> None:
    _unnamed_span_beside_its_naming_request(pg_url, unnamed_first=True)


def test_a_trace_named_while_another_replica_stores_its_span_that_names_no_conversation_keeps_that_span(
    pg_url: str,
) -> None:
    _unnamed_span_beside_its_naming_request(pg_url, unnamed_first=False)


def test_a_request_of_many_traces_takes_a_bounded_number_of_trace_locks(pg_url: str) -> None:
    """Each advisory lock takes a slot of Postgres' shared lock table (64 a connection by default): a request
    looking up 300 traces its process has not seen takes none, one looking up 10 takes one lock each. Traces
    of a root span alone (no GenAI content) are finished at once, nothing to judge."""
    from vigil.ingest.otlp.ingest import MAX_TRACE_LOCKS

    a = _runtime(pg_url)
    locked: list[int] = []

    def record(_c: Any, _cur: Any, statement: str, params: Any, *_: Any) -> None:
        if "pg_advisory_xact_lock" in statement:
            locked.append(len(params["keys"]))

    roots = [
        {**_conversation(n)[2], "attributes": {"http.route": "/orders"}, "span_id": f"{n:016x}"}
        for n in range(1000, 1310)
    ]
    try:
        event.listen(a.engine, "before_cursor_execute", record)
        a.get(TraceIngest).ingest(_copy(roots[:300]))
        assert locked == []
        a.get(TraceIngest).ingest(_copy(roots[300:]))
        assert locked == [10]
    finally:
        event.remove(a.engine, "before_cursor_execute", record)
        a.close()
    assert 10 < MAX_TRACE_LOCKS < 300
    rows = _conversation_rows(pg_url, "conversation_key, finished_at IS NOT NULL")
    assert len(rows) == 310 and all(finished for _, finished in rows)


def _deadlocked_once(
    rt: Runtime,
    pg_url: str,
    request: Callable[[], Any],
    holds: str,
    first: Callable[[Any], None],
    then: Callable[[Any], None],
) -> list[Any]:
    """Run ``request`` (an ingest of ``rt``'s) in a thread while another transaction closes a lock cycle with it: that
    transaction does ``first``; when the request has run a statement starting with ``holds`` (so it holds
    what it locks), the request waits until the other transaction, doing ``then``, waits on it. The request
    then waits on ``first``'s lock: the cycle exists before Postgres looks for one (a second after the
    request began waiting; the other transaction waits a minute before it looks), so the request's try is
    the one failed. Returns the request's outcome (its result, or what it raised)."""
    engine = db.make_engine(pg_url)
    outcome: list[Any] = []
    held = threading.Event()
    armed = [True]

    def then_waits(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if armed[0] and statement.lstrip().upper().startswith(holds):
            armed[0] = False
            held.set()
            deadline = time.monotonic() + 60
            while not _blocked_on_a_lock(pg_url):  # the other transaction waits on what this try holds
                assert time.monotonic() < deadline, "the other transaction never waited"
                time.sleep(0.01)

    def run() -> None:
        try:
            outcome.append(request())
        except BaseException as exc:  # noqa: BLE001  (the test reports it)
            outcome.append(exc)

    event.listen(rt.engine, "after_cursor_execute", then_waits)
    try:
        with engine.connect() as other:
            other.execute(text("SET LOCAL deadlock_timeout = '1min'"))
            first(other)
            thread = threading.Thread(target=run)
            thread.start()
            assert held.wait(60), outcome
            then(other)  # waits until Postgres fails the request's try
            other.rollback()
            thread.join(60)
            assert not thread.is_alive()
    finally:
        event.remove(rt.engine, "after_cursor_execute", then_waits)
        engine.dispose()
    return outcome


def test_a_request_postgres_fails_to_break_a_deadlock_is_stored_by_its_next_try(pg_url: str) -> None:
    """The one lock order left open (docs/opentelemetry.md): a move from a trace's own key holds that key's
    row while the request's count upsert waits for the conversation's. Another transaction holding conv-4's
    row and wanting trace 4's closes a cycle; Postgres fails the request's transaction, and the request is
    stored by its next try instead of failing (a 503 to the exporter)."""
    a = _runtime(pg_url)
    spans = _conversation(4)
    earlier = _in_conversation(_conversation(6)[:1], "conv-4", "e")  # conv-4's row exists: trace 6 named it
    trace_row = f"otel-{4:032x}"
    lock = "SELECT 1 FROM otel_conversations WHERE conversation_key = :k FOR UPDATE"
    try:
        ingest = a.get(TraceIngest)
        ingest.ingest(_copy(earlier))
        ingest.ingest(_copy([_unnamed(spans[0])]))  # waits under trace 4's own key
        assert {k for (k,) in _conversation_rows(pg_url, "conversation_key")} == {"conv-4", trace_row}
        outcome = _deadlocked_once(
            a,
            pg_url,
            lambda: ingest.ingest(_copy(spans[1:])),  # names the trace: its first span moves to conv-4
            "DELETE FROM OTEL_CONVERSATIONS",  # the move empties the trace's own row first
            lambda other: other.execute(text(lock), {"k": "conv-4"}),
            lambda other: other.execute(text(lock), {"k": trace_row}),
        )
        retries = a.metrics.registry.get_sample_value("vigil_store_retries_total", {"kind": "deadlock"})
    finally:
        a.close()
    assert len(outcome) == 1 and not isinstance(outcome[0], BaseException), outcome
    assert (outcome[0].stored, retries) == (len(spans) - 1, 1)
    assert _conversation_rows(pg_url, "conversation_key, span_count") == [("conv-4", 1 + len(spans))]
    read = {s["span_id"] for s in _read_after_restart(pg_url, "conv-4")}
    assert read == {s["span_id"] for s in spans + earlier}


def test_a_request_whose_span_copy_deadlocks_is_stored_by_its_next_try(pg_url: str) -> None:
    """Spans are COPYed on the driver's own connection, so what fails there is psycopg's error, not
    SQLAlchemy's wrapping of it. Another transaction inserting one of the request's spans (uncommitted),
    then asking for the lock the request holds on the trace, deadlocks with the request's COPY: that is
    retried like any deadlock, and the request is stored by its next try."""
    from vigil.ingest.otlp.ingest import TRACE_LOCKS

    a = _runtime(pg_url)
    spans = _conversation(5)
    trace = f"{5:032x}"
    span = (
        "INSERT INTO otel_spans (conversation_key, trace_id, span_id, parent_span_id, name, start_ns, end_ns, span,"
        " received_at) VALUES ('conv-5', :t, :s, NULL, 'chat', 1, 2, '{}', now())"
    )
    trace_lock = "SELECT pg_advisory_xact_lock(:c, :k)"  # as _lock_traces takes it: the id's last 8 hex digits
    try:
        outcome = _deadlocked_once(
            a,
            pg_url,
            lambda: a.get(TraceIngest).ingest(_copy(spans)),
            "SELECT PG_ADVISORY_XACT_LOCK",
            lambda other: other.execute(text(span), {"t": trace, "s": spans[0]["span_id"]}),
            lambda other: other.execute(text(trace_lock), {"c": TRACE_LOCKS, "k": int(trace[-8:], 16) - (1 << 31)}),
        )
        retries = a.metrics.registry.get_sample_value("vigil_store_retries_total", {"kind": "deadlock"})
    finally:
        a.close()
    assert len(outcome) == 1 and not isinstance(outcome[0], BaseException), outcome
    assert (outcome[0].stored, retries) == (len(spans), 1)
    assert _conversation_rows(pg_url, "conversation_key, span_count") == [("conv-5", len(spans))]


def test_a_try_rolled_back_counts_nothing_of_what_the_request_stores(db_url: str) -> None:
    """The request's first try fails at its last statement (a lost connection, say) after dropping a span
    over the conversation's limit; its second try stores it. The answer counts that try alone: one span
    dropped, said once, and every span stored once."""
    from sqlalchemy.exc import OperationalError

    from tests.support.app import make_settings
    from vigil.app.runtime import build_runtime
    from vigil.app.wiring import wire

    settings = make_settings(db_url, otlp_progress_interval_seconds=0, otlp_max_spans_per_conversation=2)
    rt = wire(build_runtime(settings, registry=CollectorRegistry()), {"api"})
    spans = _conversation(7)  # two chat spans and the root: one over the limit
    armed = [True]

    def fails_once(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if armed[0] and "INSERT INTO otel_conversation_traces" in statement:
            armed[0] = False
            raise OperationalError(statement, {}, Exception("server closed the connection unexpectedly"))

    event.listen(rt.engine, "before_cursor_execute", fails_once)
    try:
        res = rt.get(TraceIngest).ingest(_copy(spans))
        retries = rt.metrics.registry.get_sample_value("vigil_store_retries_total", {"kind": "other"})
    finally:
        event.remove(rt.engine, "before_cursor_execute", fails_once)
        rt.close()
    assert not armed[0]
    assert (res.stored, res.dropped, retries) == (2, 1, 1)
    assert len([p for p in res.problems if "dropped" in p]) == 1, res.problems
    assert _conversation_rows(db_url, "conversation_key, span_count") == [("conv-7", 2)]


def test_a_root_exported_alone_is_finished_by_a_second_try_when_the_first_fails(db_url: str) -> None:
    """A trace's root comes before any span with messages: the conversation is finished at once, so the
    spans still to come go through the pipeline as they arrive. That update failing once (a deadlock, a
    lost connection) is tried again, not answered 503 after the spans were stored."""
    from sqlalchemy.exc import OperationalError

    rt = _runtime(db_url)
    spans = _conversation(9)
    armed = [True]

    def fails_once(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        if armed[0] and statement.lstrip().upper().startswith("UPDATE OTEL_CONVERSATIONS") and "CASE" in statement:
            armed[0] = False
            raise OperationalError(statement, {}, Exception("deadlock detected"))

    event.listen(rt.engine, "before_cursor_execute", fails_once)
    try:
        ingest = rt.get(TraceIngest)
        res = ingest.ingest(_copy(spans[-1:]))  # the root alone
        retries = rt.metrics.registry.get_sample_value("vigil_store_retries_total", {"kind": "other"})
        assert not armed[0]
        assert (res.stored, res.conversations, retries) == (1, [], 1)
        later = ingest.ingest(_copy(spans[:-1]))  # the chat spans: the conversation is finished already
        finished = rt.metrics.registry.get_sample_value("vigil_otlp_conversations_finished_total", {"how": "root"})
    finally:
        event.remove(rt.engine, "before_cursor_execute", fails_once)
        rt.close()
    assert later.conversations == ["conv-9"]
    assert finished == 1  # by the root alone, once, though its first try failed
    rows = _conversation_rows(db_url, "conversation_key, span_count, finished_at IS NOT NULL")
    assert rows == [("conv-9", len(spans), True)]
