"""Joining outcomes to conversations, whichever arrives first, within the attribution window."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, load_only

from vigil.metrics import Metrics
from vigil.schema import OutcomeType
from vigil.store.db import after_commit, among, upsert, write_clock
from vigil.store.models import ConversationRow, OutcomeLinkRow, OutcomeRow
from vigil.store.signals import STORED_FIELDS, StoredConversation, attributed
from vigil.store.writes import Checked, copy_new_rows


def link_outcomes(
    session: Session,
    outcomes: Sequence[OutcomeRow],
    types: dict[str, OutcomeType],
    window_hours: float,
    metrics: Metrics,
    conversations: Mapping[str, StoredConversation] | None = None,
) -> list[OutcomeRow]:
    """Write or refresh the links of ``outcomes`` whose conversation is stored; returns newly linked ones."""
    if not outcomes:
        return []
    if conversations is None:
        ids = sorted({o.conversation_id for o in outcomes})
        conversations = {
            c.conversation_id: c
            for c in session.scalars(
                select(ConversationRow)
                .options(load_only(*(getattr(ConversationRow, f) for f in STORED_FIELDS)))
                .where(among(session, ConversationRow.conversation_id, ids))
            )
        }
    rows: list[dict[str, Any]] = []
    by_id: dict[int, OutcomeRow] = {}
    for o in outcomes:
        conv = conversations.get(o.conversation_id)
        if conv is None:
            continue
        kind = types.get(o.type)
        by_id[o.id] = o
        rows.append(
            {
                "outcome_id": o.id,
                "conversation_id": o.conversation_id,
                "agent_id": conv.agent_id,
                "agent_version": conv.agent_version,
                "type": o.type,
                "value": o.value,
                "happened": kind.happened(o.value) if kind else o.value > 0,
                "attributed": attributed(o, conv, window_hours),
                "conversation_received_at": conv.received_at,
            }
        )
    if not rows:
        return []
    now = write_clock(session)  # the database's clock, which the rollup watermark runs on
    for r in rows:
        r["linked_at"] = now
    linked = among(session, OutcomeLinkRow.outcome_id, list(by_id))
    existing = dict(session.execute(select(OutcomeLinkRow.outcome_id, OutcomeLinkRow.attributed).where(linked)).all())
    rows.sort(key=lambda r: r["outcome_id"])  # one lock order for every writer
    fresh = [r for r in rows if r["outcome_id"] not in existing]
    stale = [r for r in rows if r["outcome_id"] in existing]
    # a newer revision that ends later can bring an outcome into the window: it counts then, once
    entering = [r for r in stale if r["attributed"] and not existing[r["outcome_id"]]]
    if fresh and not copy_new_rows(session, OutcomeLinkRow.__table__, fresh):  # type: ignore[arg-type]
        ins = upsert(session, OutcomeLinkRow)
        inserted = set(
            session.scalars(
                ins.on_conflict_do_nothing(index_elements=["outcome_id"]).returning(OutcomeLinkRow.outcome_id),
                fresh,
            ).all()
        )
        fresh = [r for r in fresh if r["outcome_id"] in inserted]
    if stale:
        session.execute(update(OutcomeLinkRow), stale)
    counts = [(r["type"], r["agent_id"], r["agent_version"], r["attributed"]) for r in fresh + entering]

    def count() -> None:
        for t, agent, version, inside in counts:
            if inside:
                metrics.outcomes.labels(metrics.label(t), metrics.agent(agent), metrics.version(version)).inc()
            else:
                metrics.outcomes_outside_window.labels(metrics.label(t)).inc()

    after_commit(session, count)
    return [by_id[r["outcome_id"]] for r in fresh]


class OutcomeJoin:
    """Downstream stage: joins waiting (and inline) outcomes when their conversation is stored.

    Inline outcomes (carried in the conversation, e.g. a benchmark's reward) are first stored by the
    pipeline in this same transaction; they reach the outcome listeners here, once.
    """

    def __init__(self, store: Any) -> None:
        self.store = store

    def on_stored(self, session: Session, stored: Sequence[Checked]) -> None:
        if not stored:
            return
        ids = [s.conversation.conversation_id for s in stored]
        of_batch = among(session, OutcomeRow.conversation_id, ids)
        outcomes = list(session.scalars(select(OutcomeRow).where(of_batch)).all())
        if not outcomes:
            return
        # the batch holds what the join needs of each stored row: no need to read the documents back
        convs = {s.conversation_id: s for s in stored}
        linked = link_outcomes(
            session,
            outcomes,
            self.store.types,
            self.store.settings.outcome_attribution_window_hours,
            self.store.metrics,
            convs,
        )
        inline = [o for o in linked if o.source == "inline"]
        if inline:
            for listener in self.store.listeners:
                listener(session, inline)
            m = self.store.metrics
            kinds = [o.type for o in inline]

            def count() -> None:
                for t in kinds:
                    m.outcomes_received.labels(m.label(t), "inline").inc()

            after_commit(session, count)
