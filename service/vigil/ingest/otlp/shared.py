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
referred to by no span left, and is deleted. ``touched_at`` and the spans' receipt are both the database's
clock (the storing transaction's), whatever the replicas' host clocks say.
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
from vigil.store.db import after_commit, among, upsert

SHARE_MIN_CHARS = 1024  # shorter values cost less inline than a row and a look-up
TOUCH_EVERY_SECONDS = 3600.0
STORED_DIGESTS = 8192  # values a process stored: distinct prompts and schemas, not conversations
FIRST_DIGESTS = 65536  # values one conversation sent so far: every long output is one, so these churn
DIGESTS_CHARS = 4_000_000  # text whose digest a process remembers, in all (a value over an eighth is not)

Rows = list[tuple[str, dict[str, Any]]]


def digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def is_ref(v: Any) -> bool:
    return v.__class__ is dict and len(v) == 1 and v.get("$val").__class__ is str


class SharedValues:
    """What a process knows of long values: those it stored, with when it last upserted each, and apart
    from them (so their churn never pushes a prompt out) those only one conversation has sent so far, with
    that conversation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stored: OrderedDict[str, float] = OrderedDict()
        self._firsts: OrderedDict[str, str] = OrderedDict()
        # recent long values -> their digest: each conversation resends its agent's instructions as a new
        # string, and looking one up (hashing the string) costs about a quarter of encoding and hashing it
        self._digests: OrderedDict[str, str] = OrderedDict()
        self._digest_chars = 0

    def share(self, session: Session, rows: Rows, now: datetime) -> Rows:
        """``rows`` (conversation key, compacted span) with each long value that another conversation sent
        too replaced by its reference, the values upserted in ``session``; what was stored is remembered
        once it commits."""
        out: Rows = []
        values: dict[str, str] = {}
        firsts: dict[str, str] = {}
        clock = time.monotonic()
        with self._lock:
            for key, span in rows:
                attrs = span["attributes"]
                refs: dict[str, Any] | None = None
                for k, v in attrs.items():
                    if v.__class__ is not str or len(v) < SHARE_MIN_CHARS or "\x00" in v:
                        continue  # short, or text Postgres cannot hold (NUL): escaped in the span's JSON
                    d = self._digest(v)
                    touched = self._stored.get(d)
                    if touched is None:
                        if (self._firsts.get(d) or firsts.setdefault(d, key)) == key:
                            continue  # only this conversation has sent it so far: it stays in the span
                    else:
                        self._stored.move_to_end(d)
                    if touched is None or clock - touched > TOUCH_EVERY_SECONDS:
                        values[d] = v
                    if refs is None:
                        refs = {}
                    refs[k] = {"$val": d}
                out.append((key, {**span, "attributes": {**attrs, **refs}}) if refs else (key, span))
        if values:  # in digest order: one lock order for every replica
            stmt = upsert(session, OtelValueRow.__table__)
            session.execute(
                stmt.on_conflict_do_update(index_elements=["digest"], set_={"touched_at": stmt.excluded.touched_at}),
                [{"digest": d, "value": values[d], "touched_at": now} for d in sorted(values)],
            )
        if values or firsts:
            after_commit(session, lambda: self._remember(values, firsts))
        return out

    def _digest(self, value: str) -> str:
        """:func:`digest` of ``value``, remembered for the latest values (``DIGESTS_CHARS`` in all); called
        with ``_lock`` held."""
        known = self._digests
        d = known.get(value)
        if d is not None:
            known.move_to_end(value)
            return d
        d = digest(value)
        if len(value) <= DIGESTS_CHARS // 8:
            known[value] = d
            self._digest_chars += len(value)
            while self._digest_chars > DIGESTS_CHARS:
                gone, _ = known.popitem(last=False)
                self._digest_chars -= len(gone)
        return d

    def _remember(self, stored: dict[str, str], firsts: dict[str, str]) -> None:
        clock = time.monotonic()
        with self._lock:
            for d, key in firsts.items():
                if d not in stored:
                    self._firsts.setdefault(d, key)
            for d in stored:
                self._stored[d] = clock
                self._stored.move_to_end(d)
                self._firsts.pop(d, None)
            for known, bound in ((self._stored, STORED_DIGESTS), (self._firsts, FIRST_DIGESTS)):
                while len(known) > bound:
                    known.popitem(last=False)


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
