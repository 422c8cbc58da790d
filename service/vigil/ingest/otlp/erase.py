"""The tracing stage's part of an erasure: the spans, log records and trace links a conversation was built from."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from vigil.ingest.otlp.models import OtelConversationRow, OtelConversationTraceRow, OtelEventRow, OtelSpanRow
from vigil.store.db import among
from vigil.store.erasure import removed


def erase_traces(session: Session, conversation_ids: Sequence[str]) -> dict[str, int]:
    """``Hooks.erasers`` entry. A traced conversation is buffered under its key (the id it was stored as, or
    the key it was assembled under before): its spans are those of its traces stored under that key. Values
    several conversations share (``otel_values``, instructions most often) are not one conversation's and
    stay until their own expiry."""
    C, T, S, E = OtelConversationRow, OtelConversationTraceRow, OtelSpanRow, OtelEventRow  # noqa: E741
    # a traced conversation's key is its id: the tracing stage stores a conversation assembled under key K as
    # conversation K, and sets ``conversation_id`` to its key or to NULL, never to another id; so the rows
    # are found by the primary key (a look-up by ``conversation_id`` had no index and scanned the table)
    keyed = sorted(set(conversation_ids))
    traces = sorted(set(session.scalars(select(T.trace_id).where(among(session, T.conversation_key, keyed)))))
    spans = 0
    if traces:
        spans = removed(
            session, delete(S).where(among(session, S.trace_id, traces), among(session, S.conversation_key, keyed))
        )
    return {
        S.__tablename__: spans,
        E.__tablename__: removed(session, delete(E).where(among(session, E.conversation_key, keyed))),
        T.__tablename__: removed(session, delete(T).where(among(session, T.conversation_key, keyed))),
        C.__tablename__: removed(session, delete(C).where(among(session, C.conversation_key, keyed))),
    }
