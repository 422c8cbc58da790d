"""Stores a long attribute value that several conversations send only once.

Every conversation of an agent version resends the same instructions (the system prompt, often most
of a span's bytes) and often the same long tool schemas or documents. :func:`~vigil.ingest.otlp.compact.compact`
stores a value once per conversation; this stores a value once per database when a second conversation
sends it: its span keeps ``{"$val": DIGEST}`` and the value lives in ``otel_values`` under its digest
(the first 128 bits of the SHA-256 of its UTF-8). A value only one conversation has sent stays in its span, so the
values table holds what repeats, not every long text.

Retention: each process upserts a value (setting ``touched_at``) whenever it refers to it and has not
done so for ``TOUCH_EVERY_SECONDS``. Spans never outlive twice the span retention from their receipt
(see ``TraceIngest._maybe_purge``), so a value untouched for that long plus two touch intervals is
referred to by no span left, and is deleted; the margin also covers replicas' clocks drifting apart by
up to one interval.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from vigil.ingest.otlp.models import OtelValueRow
from vigil.store.db import among

SHARE_MIN_CHARS = 1024  # shorter values cost less inline than a row and a look-up
TOUCH_EVERY_SECONDS = 3600.0
KNOWN_DIGESTS = 8192  # values a process remembers: distinct prompts and schemas, not conversations

Rows = list[tuple[str, dict[str, Any]]]


def digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def is_ref(v: Any) -> bool:
    return v.__class__ is dict and len(v) == 1 and v.get("$val").__class__ is str


class SharedValues:
    """What a process knows of long values: for each digest, the conversation that first sent it (while
    only one has) and when this process last upserted it (``None``: never)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: OrderedDict[str, tuple[str, float | None]] = OrderedDict()

    def share(self, rows: Rows) -> tuple[Rows, dict[str, str], dict[str, str]]:
        """``rows`` (conversation key, compacted span) with each long value that another conversation
        sent too replaced by its reference; the values to upsert with them (digest -> value); and the
        digests first seen here (digest -> conversation key). Call :meth:`stored` once they are committed."""
        out: Rows = []
        upsert: dict[str, str] = {}
        firsts: dict[str, str] = {}
        now = time.monotonic()
        with self._lock:
            known = self._known
            for key, span in rows:
                attrs = span["attributes"]
                refs: dict[str, Any] | None = None
                for k, v in attrs.items():
                    if v.__class__ is not str or len(v) < SHARE_MIN_CHARS or "\x00" in v:
                        continue  # short, or text Postgres cannot hold (NUL): escaped in the span's JSON
                    d = digest(v)
                    entry = known.get(d)
                    if entry is not None:
                        known.move_to_end(d)
                        first, touched = entry
                    else:
                        first, touched = firsts.setdefault(d, key), None
                    if touched is None and first == key:
                        continue  # only this conversation has sent it so far: it stays in the span
                    if touched is None or now - touched > TOUCH_EVERY_SECONDS:
                        upsert[d] = v
                    if refs is None:
                        refs = {}
                    refs[k] = {"$val": d}
                out.append((key, {**span, "attributes": {**attrs, **refs}}) if refs else (key, span))
        return out, upsert, firsts

    def stored(self, upserted: dict[str, str], firsts: dict[str, str]) -> None:
        """Remember what a committed transaction stored."""
        now = time.monotonic()
        with self._lock:
            known = self._known
            for d, key in firsts.items():
                if d not in known:
                    known[d] = (key, None)
            for d in upserted:
                known[d] = ("", now)
                known.move_to_end(d)
            while len(known) > KNOWN_DIGESTS:
                known.popitem(last=False)


def upsert_values(session: Session, values: dict[str, str], now: datetime) -> None:
    """Store each value (new) or mark it used now (stored before), in digest order: one lock order for
    every replica."""
    if not values:
        return
    from sqlalchemy.dialects import postgresql, sqlite

    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    table = OtelValueRow.__table__
    stmt = dialect.insert(table)
    session.execute(
        stmt.on_conflict_do_update(index_elements=["digest"], set_={"touched_at": stmt.excluded.touched_at}),
        [{"digest": d, "value": values[d], "touched_at": now} for d in sorted(values)],
    )


def resolve(session: Session, spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The spans with each ``$val`` reference replaced by its value (one read for all); a reference to a
    value that is gone drops its attribute, as an unresolvable ``$same`` does."""
    wanted = {v["$val"] for s in spans for v in s["attributes"].values() if is_ref(v)}
    if not wanted:
        return spans
    r = OtelValueRow
    found = dict(session.execute(select(r.digest, r.value).where(among(session, r.digest, sorted(wanted)))).all())
    out = []
    for s in spans:
        attrs = s["attributes"]
        if any(is_ref(v) for v in attrs.values()):
            full = {}
            for k, v in attrs.items():
                if not is_ref(v):
                    full[k] = v
                elif v["$val"] in found:
                    full[k] = found[v["$val"]]
            s = {**s, "attributes": full}
        out.append(s)
    return out


def purge_values(session: Session, spans_gone_before: datetime) -> None:
    """Delete the values no span left can refer to: see the module's docstring."""
    horizon = spans_gone_before - timedelta(seconds=2 * TOUCH_EVERY_SECONDS)
    session.execute(delete(OtelValueRow).where(OtelValueRow.touched_at < horizon))
