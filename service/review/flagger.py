"""The flagger: puts conversations in the review queue, from findings, judge verdicts and outcomes.

Runs inside the transaction that stores the signal (a pipeline batch, a batch of verdicts or of
outcomes), so a conversation is flagged exactly when its signal is stored. Writes are idempotent:
an item is unique per conversation and a reason per (conversation, kind, key); the priority is
recomputed as the sum of the item's reason weights.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from ..metrics import Metrics
from ..store.models import ConversationRow, utcnow
from ..store.writes import Checked
from .models import ReviewAuditRow, ReviewItemRow, ReviewReasonRow
from .policy import FlaggingPolicy, Reason

SYSTEM_ACTOR = "vigil"


def _insert(session: Session, model: Any) -> Any:
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(model)


def enqueue(
    session: Session,
    policy: FlaggingPolicy,
    flagged: dict[str, list[Reason]],
    agents: dict[str, tuple[str, str]] | None = None,
    metrics: Metrics | None = None,
    actor: str = SYSTEM_ACTOR,
) -> list[str]:
    """Add ``flagged`` (conversation id → reasons) to the queue; returns the ids that were new.

    ``agents`` gives (agent_id, agent_version) of conversations already known; other items wait
    (unclaimable) until their conversation is stored.
    """
    flagged = {cid: reasons for cid, reasons in flagged.items() if reasons}
    if not flagged:
        return []
    agents = agents or {}
    missing = [cid for cid in flagged if cid not in agents]
    if missing:
        rows = session.execute(
            select(
                ConversationRow.conversation_id, ConversationRow.agent_id, ConversationRow.agent_version
            ).where(ConversationRow.conversation_id.in_(missing))
        ).all()
        agents = {**agents, **{r[0]: (r[1], r[2]) for r in rows}}
    now = utcnow()
    items = [
        {
            "conversation_id": cid,
            "agent_id": agents.get(cid, (None, None))[0],
            "agent_version": agents.get(cid, (None, None))[1],
            "priority": 0.0,
            "status": "open",
            "required_reviews": policy.reviewers_for(cid),
            "review_count": 0,
            "sampled": any(r.kind == "sample" for r in reasons),
            "created_at": now,
            "updated_at": now,
        }
        for cid, reasons in sorted(flagged.items())
    ]
    # executemany of one cached statement (SQLAlchemy batches it into multi-row INSERTs with RETURNING)
    new_ids = list(
        session.scalars(
            _insert(session, ReviewItemRow.__table__)
            .on_conflict_do_nothing(index_elements=["conversation_id"])
            .returning(ReviewItemRow.__table__.c.conversation_id),
            items,
        )
    )
    reason_rows = [
        {
            "conversation_id": cid,
            "kind": r.kind,
            "key": r.key[:128],
            "weight": r.weight,
            "detail": r.detail,
            "created_at": now,
        }
        for cid, reasons in sorted(flagged.items())
        for r in reasons
    ]
    t = ReviewReasonRow.__table__
    added = session.execute(
        _insert(session, t)
        .on_conflict_do_nothing(index_elements=["conversation_id", "kind", "key"])
        .returning(t.c.conversation_id, t.c.kind, t.c.key, t.c.weight),
        reason_rows,
    ).all()
    # add only the weights this transaction inserted: an increment stays right when two transactions
    # flag one conversation at once (Postgres re-reads the row's priority after waiting for its lock)
    deltas: dict[str, float] = defaultdict(float)
    for cid, _kind, _key, weight in added:
        deltas[cid] += weight
    if deltas:
        items_t = ReviewItemRow.__table__
        session.execute(
            update(items_t)
            .where(items_t.c.conversation_id == bindparam("cid"))
            .values(priority=items_t.c.priority + bindparam("delta"), updated_at=now),
            [{"cid": cid, "delta": d} for cid, d in sorted(deltas.items())],
        )
    fresh = set(new_ids)
    audit = [
        {
            "at": now,
            "actor": actor,
            "action": "enqueued",
            "conversation_id": cid,
            "detail": {"reasons": [[r.kind, r.key, r.weight] for r in flagged[cid]]},
        }
        for cid in sorted(fresh)
    ]
    by_cid: dict[str, list[list[str]]] = defaultdict(list)
    for cid, kind, key, _weight in added:
        if cid not in fresh:
            by_cid[cid].append([kind, key])
    audit += [
        {
            "at": now,
            "actor": actor,
            "action": "reason_added",
            "conversation_id": cid,
            "detail": {"reasons": reasons},
        }
        for cid, reasons in sorted(by_cid.items())
    ]
    if audit:
        session.execute(insert(ReviewAuditRow), audit)
    if metrics is not None:
        for cid in fresh:
            metrics.review_enqueued.labels(_first_kind(flagged[cid])).inc()
        for _cid, kind, _key, _weight in added:
            metrics.review_reasons.labels(kind).inc()
    return sorted(fresh)


def _first_kind(reasons: Sequence[Reason]) -> str:
    return max(reasons, key=lambda r: r.weight).kind


class Flagger:
    """Downstream stage of the pipeline and listener of verdicts and outcomes."""

    def __init__(self, policy: FlaggingPolicy, metrics: Metrics | None = None) -> None:
        self.policy = policy
        self.metrics = metrics

    def on_stored(self, session: Session, stored: Sequence[Checked]) -> None:
        flagged: dict[str, list[Reason]] = {}
        agents: dict[str, tuple[str, str]] = {}
        for item in stored:
            c = item.conversation
            agents[c.conversation_id] = (c.agent_id, c.agent_version)
            reasons = self.policy.finding_reasons(item.findings)
            if not reasons and self.policy.sampled(c.conversation_id):
                s = self.policy.sample
                reasons = [Reason("sample", s.salt, s.weight, f"random sample ({s.rate:.1%} of unflagged)")]
            if reasons:
                flagged[c.conversation_id] = reasons
        enqueue(session, self.policy, flagged, agents, self.metrics)
        self._fill_agents(session, agents)

    @staticmethod
    def _fill_agents(session: Session, agents: dict[str, tuple[str, str]]) -> None:
        """Items flagged by an outcome before their conversation arrived become claimable now."""
        groups: dict[tuple[str, str], list[str]] = defaultdict(list)
        for cid, agent_version in agents.items():
            groups[agent_version].append(cid)
        for (agent, version), cids in groups.items():
            session.execute(
                update(ReviewItemRow)
                .where(ReviewItemRow.conversation_id.in_(cids), ReviewItemRow.agent_id.is_(None))
                .values(agent_id=agent, agent_version=version)
                .execution_options(synchronize_session=False)
            )

    def on_verdicts(self, session: Session, verdicts: Iterable[Any]) -> None:
        """``verdict_listeners`` hook: rows of ``verdicts`` (judge, verdict, score, offline, rationale)."""
        flagged: dict[str, list[Reason]] = defaultdict(list)
        agents: dict[str, tuple[str, str]] = {}
        for v in verdicts:
            reasons = self.policy.verdict_reasons(v.judge, v.verdict, v.score, bool(v.offline), v.rationale)
            if reasons:
                flagged[v.conversation_id].extend(reasons)
                agents[v.conversation_id] = (v.agent_id, v.agent_version)
        enqueue(session, self.policy, dict(flagged), agents, self.metrics)

    def on_outcomes(self, session: Session, outcomes: Iterable[Any]) -> None:
        """``outcome_listeners`` hook: rows of ``outcomes`` (conversation_id, type, value)."""
        flagged: dict[str, list[Reason]] = defaultdict(list)
        for o in outcomes:
            flagged[o.conversation_id].extend(self.policy.outcome_reasons(o.type, float(o.value)))
        enqueue(session, self.policy, dict(flagged), None, self.metrics)
