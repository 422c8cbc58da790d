"""Engine and session factory, the dialect-aware upsert, commit hooks, UTC times; Alembic migrations."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, overload

import orjson
import psycopg
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    DateTime,
    Engine,
    String,
    any_,
    bindparam,
    create_engine,
    event,
    func,
    select,
    text,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.functions import FunctionElement

from vigil.errors import VigilError, without_frames
from vigil.schema import dumps_exact

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
log = logging.getLogger(__name__)
T = TypeVar("T")


PERMANENT_DB_ERRORS: tuple[type[BaseException], ...] = (
    sa_exc.DataError,
    sa_exc.IntegrityError,
    psycopg.DataError,
    psycopg.IntegrityError,
    OverflowError,
    ValueError,
)
"""The database (or its driver) refusing what a row holds: writing the same rows again fails again."""


def db_detail(exc: BaseException) -> str:
    """The first line of a database error, for a dead letter or a log line."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:500] if str(exc) else ''}"


def storable_text(text: str) -> str:
    """``text`` as every database stores it: what came from outside (a Kafka key, a model's reply, an
    error message quoting the input) may hold NUL, which Postgres refuses in text, or a lone surrogate,
    which is no UTF-8; both become U+FFFD, so the row is written instead of failing its whole batch."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def json_text(value: object) -> str:
    """A JSON column's value as text. Rules see integers beyond 64 bits exactly (``schema.loads_exact``)
    and may put them in a finding's details, which orjson alone cannot write."""
    return dumps_exact(value)


# libpq's connection parameters Vigil sets unless the database URL does (``?connect_timeout=30``, say),
# or the environment (``PGCONNECT_TIMEOUT``), or a connection service (``?service=`` or ``PGSERVICE``: then
# none, as Vigil cannot see what the service file sets): without them a database that stops answering
# (a network partition, a host gone without a reset, a server that accepts connections and never
# answers) holds every request, consumer batch and pool ping waiting on it for minutes: psycopg gives up
# connecting after 130 s, a query whose peer is gone waits for the kernel's TCP retransmissions (about
# 15 minutes). With them a new connection fails after ``connect_timeout`` seconds, an idle one after a
# minute of unanswered keepalive probes, and one whose sent data stays unacknowledged (or which the
# server does not read from) for ``tcp_user_timeout`` ms: the write's retries then run, and the request
# is answered 503 (a consumer keeps its batch) instead of waiting. The last is two minutes, not less: the
# kernel also counts a server that stops reading a ``COPY`` while it waits on a lock (measured: a COPY
# of 80 MB held up 45 s by another transaction's row failed after 30.5 s under a limit of 30 s, and went
# through at 45.6 s under this one).
PG_CONNECT_DEFAULTS: dict[str, object] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "tcp_user_timeout": 120_000,
}
PG_ENVIRONMENT = {"connect_timeout": "PGCONNECT_TIMEOUT"}  # the defaults libpq reads from the environment


def pg_connect_args(url: str) -> dict[str, object]:
    """The defaults of ``PG_CONNECT_DEFAULTS`` that neither ``url``'s query, the environment nor a
    connection service sets."""
    given = make_url(url).query
    if "service" in given or os.environ.get("PGSERVICE"):
        return {}
    return {
        k: v
        for k, v in PG_CONNECT_DEFAULTS.items()
        if k not in given and not os.environ.get(PG_ENVIRONMENT.get(k, ""), "")
    }


def make_engine(url: str) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    # An error's message leaves out the statement's parameters: they are what clients sent (documents,
    # keys), and a batch's run to thousands, written again at every retry of a consumer's batch.
    kwargs: dict[str, object] = {
        "json_serializer": json_text,
        "json_deserializer": orjson.loads,
        "hide_parameters": True,
    }
    if url.startswith("sqlite"):
        # Reviewers, the judge worker and ingest share one file: WAL lets readers run beside the writer,
        # and a busy timeout rides out the writer's short transactions instead of failing.
        kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
    else:
        kwargs.update(pool_size=10, max_overflow=20, pool_pre_ping=True, connect_args=pg_connect_args(url))
    engine = create_engine(url, **kwargs)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA temp_store=MEMORY")
            cur.close()

    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


MIGRATION_LOCK = 0x76696769  # the advisory lock every Vigil process takes to migrate a Postgres database


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database schema to ``revision`` (``vigil db upgrade``; also run on start).

    Replicas starting together migrate one at a time: on Postgres under an advisory lock, on SQLite
    under a lock on a file beside the database. The others wait, then find the schema at ``revision``
    and change nothing (without the lock two of three replicas died on Alembic's version table, or on
    ``table ... already exists``)."""
    _migrate(url, revision, up=True)


def downgrade(url: str, revision: str) -> None:
    """Take the database schema back to ``revision`` (``vigil db downgrade``) before running an older
    release on it, under the same lock as :func:`upgrade`."""
    _migrate(url, revision, up=False)


class _AlembicChatter(logging.Filter):
    """Drops what Alembic logs at INFO on every start whether or not it migrates (its plugins set up, the
    dialect's DDL mode): nine lines ahead of every ``vigil`` command's output. What it migrates
    (``Running upgrade ...``) and its warnings still show."""

    CHATTER = ("setup plugin ", "Context impl ", "Will assume ")

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not str(record.msg).startswith(self.CHATTER)


_CHATTER = _AlembicChatter()


def _migrate(url: str, revision: str, up: bool) -> None:
    for name in ("alembic.runtime.plugins", "alembic.runtime.migration"):  # before the import: it logs too
        if _CHATTER not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_CHATTER)
    from alembic import command
    from alembic.util import CommandError

    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    try:
        with _migration_lock(url):
            (command.upgrade if up else command.downgrade)(alembic_config(url), revision)
    except UNREACHABLE as exc:
        raise DatabaseUnreachable(url, exc) from exc
    except CommandError as exc:  # an unknown revision, or one on the other side of the current one
        raise MigrationError(f"cannot {'upgrade' if up else 'downgrade'} to {revision!r}: {exc}") from exc


class MigrationError(VigilError):
    """A migration Alembic refuses to make."""


class DatabaseUnreachable(VigilError):
    """The database of ``VIGIL_DATABASE_URL`` cannot be opened: a one-line error at start, not a traceback."""

    def __init__(self, url: str, exc: BaseException) -> None:
        first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        why = first[0][:300] if first else type(exc).__name__
        super().__init__(f"cannot open the database at {hidden_password(url)} (VIGIL_DATABASE_URL): {why}")


UNREACHABLE: tuple[type[BaseException], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.ArgumentError,
    sa_exc.NoSuchModuleError,
    ModuleNotFoundError,
)
"""What opening a database raises when the URL names no usable database (down, missing, read-only, an
unknown scheme or driver)."""


def hidden_password(url: str) -> str:
    """``url`` with its password masked, for messages and logs."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not even a URL: say so without echoing what may hold a secret
        return "(an address that is not a database URL)"


@contextmanager
def _migration_lock(url: str) -> Iterator[None]:
    if url.startswith("postgresql"):
        engine = make_engine(url)
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK})")
                conn.commit()  # a session lock: held until unlocked or the connection closes
                try:
                    yield
                finally:
                    conn.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK})")
                    conn.commit()
        finally:
            engine.dispose()
        return
    path = sqlite_path(url)
    if path is None:  # in memory: one process
        yield
        return
    import fcntl

    try:
        lock = open(f"{path}.migrate-lock", "a+b")  # noqa: SIM115 (held across the yield)
    except OSError as exc:  # a read-only directory: migrate unguarded, as before
        log.warning("cannot take the migration lock beside %s (%s); migrating without it", path, exc)
        yield
        return
    with lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def sqlite_path(url: str) -> str | None:
    """The file of a SQLite URL, or None for an in-memory database."""
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if not u.drivername.startswith("sqlite"):
        return None
    db = u.database or ""
    if db in ("", ":memory:") or db.startswith("file::memory:") or u.query.get("mode") == "memory":
        return None
    return db


def upsert(session: Session, table: Any) -> Any:
    """An INSERT with ``on_conflict_do_*`` for the session's database (Postgres or SQLite)."""
    name = session.get_bind().dialect.name
    return (postgresql.insert if name == "postgresql" else sqlite.insert)(table)


def among(session: Session, col: Any, values: Sequence[str] | Sequence[int]) -> ColumnElement[bool]:
    """``col`` is one of ``values``: on Postgres ``= ANY(array)``, one parameter however many values (an
    ``IN`` list of thousands of parameters costs more to build and send than the look-ups it asks for).
    Values are strings, or integers for an integer column."""
    if session.get_bind().dialect.name == "postgresql":
        item = BigInteger if values and isinstance(values[0], int) else String
        return col == any_(bindparam(None, list(values), type_=postgresql.ARRAY(item)))
    if len(values) > SQLITE_INLINE_VALUES:
        # SQLite allows 32,766 parameters a statement: more ids go as one JSON array it unpacks itself
        each = func.json_each(bindparam(None, orjson.dumps(list(values)).decode())).table_valued("value")
        return col.in_(select(each.c.value))
    return col.in_(list(values))


SQLITE_INLINE_VALUES = 10_000


def after_commit(session: Session, fn: Callable[[], None]) -> None:
    """Run ``fn`` once the session's transaction commits (metrics must not count rolled-back work)."""
    event.listen(session, "after_commit", lambda _s: fn(), once=True)


def utcnow() -> datetime:
    return datetime.now(UTC)


def clock(session: Session) -> datetime:
    """The database's clock, in UTC: one clock for every replica whatever its host's says. On Postgres the
    time the session's transaction began (``now()``); on SQLite the host's, read by SQLite, in ms."""
    if session.get_bind().dialect.name == "sqlite":
        stamp = session.execute(text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")).scalar_one()
        return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
    return aware(session.execute(select(func.now())).scalar_one())


_STAMP = "vigil.write_clock"


def write_clock(session: Session) -> datetime:
    """The time a write stamps its rows with (``received_at``, ``linked_at``): the database's clock (see
    :func:`clock`), read once per transaction, whatever the rows and statements. Those times are compared
    with other replicas' (the detector's cursor, the rollup watermark, retention's cutoffs), so an ingest
    host's clock running behind must not store rows behind them, nor one running ahead rows in the future."""
    held = session.info.get(_STAMP)
    if held is not None and held[0] is session.get_transaction():
        return held[1]
    now = clock(session)
    session.info[_STAMP] = (session.get_transaction(), now)
    return now


class db_now(FunctionElement[datetime]):  # noqa: N801 (a SQL function, named as one)
    """The database's clock as a column default (a row the ORM writes without the time): ``now()`` on
    Postgres, the time SQLite reads in the format SQLAlchemy stores times in there (so they compare as text)."""

    type = DateTime(timezone=True)
    inherit_cache = True


@compiles(db_now)
def _db_now(element: db_now, compiler: Any, **kw: Any) -> str:
    return "now()"


@compiles(db_now, "sqlite")
def _db_now_sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    return "strftime('%Y-%m-%d %H:%M:%f000', 'now')"


@overload
def aware(ts: datetime) -> datetime: ...
@overload
def aware(ts: None) -> None: ...
def aware(ts: datetime | None) -> datetime | None:
    """Every stored time is UTC; SQLite hands it back naive, so name the zone before comparing or showing it."""
    if ts is None:
        return None
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


class StoreUnavailable(VigilError):
    """A write still failed after its retries (deadlocks, serialization failures, a lost database).

    Nothing of it was committed: the caller answers 503 (HTTP) or keeps the batch uncommitted (Kafka).
    """


def transient(exc: BaseException) -> bool:
    """Errors that trying the same transaction again can cure: deadlocks, serialization failures,
    lock timeouts, a database that is busy, restarting or unreachable. Bad data is never transient.

    psycopg's own errors count as SQLAlchemy's wrapping of them does: a ``COPY`` runs on the driver's
    connection (see ``store.writes``), so what fails in it (a deadlock on a key another transaction is
    inserting) comes unwrapped."""
    if isinstance(exc, sa_exc.DBAPIError):
        return isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError) or exc.connection_invalidated
    if isinstance(exc, psycopg.Error):
        return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    return False


def retry_kind(exc: BaseException) -> str:
    """What a retried write ran into, as the ``store_retries_total`` metric names it."""
    code = getattr(getattr(exc, "orig", exc), "sqlstate", None)
    return {"40P01": "deadlock", "40001": "serialization"}.get(code or "", "other")


def retry_transient(
    fn: Callable[[], T],
    attempts: int = 5,
    base_seconds: float = 0.05,
    max_seconds: float = 2.0,
    on_retry: Callable[[BaseException], None] | None = None,
    stopping: Callable[[], bool] | None = None,
) -> T:
    """Run the transaction ``fn``; on a transient error roll back (``fn`` does) and run it again.

    The one retry policy of every write: exponential backoff from ``base_seconds`` with full jitter
    (two writers that deadlocked must not collide again in step), capped at ``max_seconds``. After
    ``attempts`` tries it raises :class:`StoreUnavailable` from the last error, and at once when
    ``stopping()`` says the process is shutting down (nothing was committed: the caller keeps the batch,
    a consumer leaves its offsets, so a SIGTERM is not held up by every retry's wait).
    """
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except (sa_exc.DBAPIError, psycopg.Error) as exc:
            if not transient(exc):
                raise
            if on_retry is not None:
                on_retry(exc)
            if attempt == attempts or (stopping is not None and stopping()):
                why = "shutting down" if attempt < attempts else f"giving up after {attempts} attempts"
                raise StoreUnavailable(f"{why}: {str(exc).splitlines()[0][:300]}") from exc
            delay = min(max_seconds, base_seconds * 2 ** (attempt - 1))
            cause = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
            log.info("transient database error (attempt %d of %d), retrying: %s", attempt, attempts, cause)
            # its frames hold the transaction's batch (and ``fn``, which names it), in a cycle through
            # SQLAlchemy's: freed now rather than at the collector's next run, which a busy writer rarely reaches
            without_frames(exc)
            time.sleep(random.uniform(0, delay))
    raise AssertionError("unreachable")
