"""The flagger: puts conversations in the review queue, from findings, judge verdicts and outcomes.

Runs inside the transaction that stores the signal (a pipeline batch, a batch of verdicts or of
outcomes), so a conversation is flagged exactly when its signal is stored. Writes are idempotent:
an item is unique per conversation and a reason per (conversation, kind, key); the priority is
recomputed as the sum of the item's reason weights.

The random sample is drawn from all traffic, independently of flags (a hash of the conversation id):
a flagged conversation that is also drawn gets a ``sample`` reason and ``sampled = true`` too, so the
sampled items are a uniform random sample and labels on them measure a judge's errors without bias.
An outcome flags its conversation only within the attribution window
(``VIGIL_OUTCOME_ATTRIBUTION_WINDOW_HOURS``); one that arrives before its conversation flags a waiting
item, whose outcome reasons are checked against the window when the conversation is stored.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, delete, func, insert, select, update
from sqlalchemy.orm import Session, load_only

from vigil.metrics import Metrics
from vigil.review.models import ReviewAuditRow, ReviewReasonRow
from vigil.review.policy import FlaggingPolicy, Reason
from vigil.store.db import among, write_clock
from vigil.store.models import ConversationRow, OutcomeRow, ReviewItemRow, ReviewLabelRow
from vigil.store.signals import attributed
from vigil.store.writes import Checked, copy_rows, insert_new, stored_in_batch

SYSTEM_ACTOR = "vigil"


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
    C = ConversationRow
    if session.get_bind().dialect.name == "postgresql":
        # Retention deletes a conversation nothing keeps: a key-share lock on it makes that DELETE wait for
        # this item to commit and then find it (store.retention). One not stored (yet, or any more) waits.
        stored = session.execute(
            select(C.conversation_id, C.agent_id, C.agent_version)
            .where(among(session, C.conversation_id, sorted(flagged)))
            .order_by(C.conversation_id)
            .with_for_update(key_share=True)
        ).all()
        agents = {cid: agents.get(cid, (a, v)) for cid, a, v in stored}
    elif missing := [cid for cid in flagged if cid not in agents]:
        rows = session.execute(
            select(C.conversation_id, C.agent_id, C.agent_version).where(C.conversation_id.in_(missing))
        ).all()
        agents = {**agents, **{r[0]: (r[1], r[2]) for r in rows}}
    now = write_clock(session)
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
    new = insert_new(session, ReviewItemRow.__table__, items, ["conversation_id"], ["conversation_id"])
    new_ids = [r[0] for r in new]
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
    added = insert_new(
        session,
        ReviewReasonRow.__table__,
        reason_rows,
        ["conversation_id", "kind", "key"],
        ["conversation_id", "kind", "key", "weight"],
    )
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
    # an item created by an earlier signal becomes sampled when its conversation is drawn
    drawn = [cid for cid, reasons in flagged.items() if cid not in fresh and any(r.kind == "sample" for r in reasons)]
    if drawn:
        session.execute(
            update(ReviewItemRow)
            .where(ReviewItemRow.conversation_id.in_(sorted(drawn)), ReviewItemRow.sampled.is_(False))
            .values(sampled=True)
            .execution_options(synchronize_session=False)
        )
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
    copy_rows(session, ReviewAuditRow.__table__, audit)
    if metrics is not None:
        for cid in fresh:
            metrics.review_enqueued.labels(_first_kind(flagged[cid])).inc()
        for _cid, kind, _key, _weight in added:
            metrics.review_reasons.labels(kind).inc()
    return sorted(fresh)


def supersede_labels(session: Session, revisions: dict[str, int]) -> list[str]:
    """Labels given on an older revision of a conversation stop being current once ``revisions`` (conversation
    id → its newly stored revision) replaces it, and its item goes back to the queue; returns those items.

    A label judges the content its reviewer read: a newer revision (a longer run, a corrected transcript)
    is content nobody reviewed, so export, calibration, failure clusters and agreement, which read current
    labels only, must not carry an old verdict over to it (a confirmed failure exported with the new
    revision's messages). The labels stay in the history, each with the revision it was given on, and the
    audit log says ``reopened``. One look-up of the batch's current labels, few of which are stale."""
    L = ReviewLabelRow
    rows = session.execute(
        select(L.id, L.conversation_id, L.revision).where(
            among(session, L.conversation_id, sorted(revisions)), L.is_current.is_(True)
        )
    ).all()
    stale = [r for r in rows if r.revision is None or r.revision < revisions[r.conversation_id]]
    if not stale:
        return []
    session.execute(
        update(L)
        .where(among(session, L.id, [r.id for r in stale]))
        .values(is_current=False)
        .execution_options(synchronize_session=False)
    )
    superseded = Counter(r.conversation_id for r in stale)
    kept = Counter(r.conversation_id for r in rows) - superseded
    now = write_clock(session)
    items = session.execute(
        select(ReviewItemRow.conversation_id, ReviewItemRow.required_reviews).where(
            among(session, ReviewItemRow.conversation_id, sorted(superseded))
        )
    ).all()
    for cid, required in items:
        session.execute(
            update(ReviewItemRow)
            .where(ReviewItemRow.conversation_id == cid)
            .values(
                review_count=kept[cid],
                status="done" if kept[cid] >= required else "open",
                updated_at=now,
            )
            .execution_options(synchronize_session=False)
        )
    copy_rows(
        session,
        ReviewAuditRow.__table__,
        [
            {
                "at": now,
                "actor": SYSTEM_ACTOR,
                "action": "reopened",
                "conversation_id": cid,
                "detail": {"revision": revisions[cid], "labels_superseded": superseded[cid]},
            }
            for cid in sorted(superseded)
        ],
    )
    return sorted(superseded)


def _first_kind(reasons: Sequence[Reason]) -> str:
    return max(reasons, key=lambda r: r.weight).kind


class Flagger:
    """Downstream stage of the pipeline and listener of verdicts and outcomes."""

    def __init__(self, policy: FlaggingPolicy, metrics: Metrics | None = None, window_hours: float = 168.0) -> None:
        self.policy = policy
        self.metrics = metrics
        self.window_hours = window_hours

    def on_stored(self, session: Session, stored: Sequence[Checked]) -> None:
        flagged: dict[str, list[Reason]] = {}
        agents: dict[str, tuple[str, str]] = {}
        s = self.policy.sample
        for item in stored:
            c = item.conversation
            agents[c.conversation_id] = (c.agent_id, c.agent_version)
            reasons = self.policy.finding_reasons(item.findings)
            if self.policy.sampled(c.conversation_id):
                reasons.append(Reason("sample", s.salt, s.weight, f"random sample ({s.rate:.1%} of all traffic)"))
            if reasons:
                flagged[c.conversation_id] = reasons
        enqueue(session, self.policy, flagged, agents, self.metrics)
        waited = self._fill_agents(session, agents)
        if waited:
            self._drop_unattributed(session, waited)
        replaced = {item.conversation_id: item.revision for item in stored if item.replaced}
        if replaced:
            supersede_labels(session, replaced)

    @staticmethod
    def _fill_agents(session: Session, agents: dict[str, tuple[str, str]]) -> list[str]:
        """Items flagged by an outcome before their conversation arrived become claimable now; returns them.

        One statement whatever the number of distinct agents and versions in the batch: the stored
        conversation row (written earlier in this transaction) supplies each item's agent and version.
        """
        if not agents:
            return []
        items = ReviewItemRow.__table__
        conv = ConversationRow.__table__
        of = conv.c.conversation_id == items.c.conversation_id
        return list(
            session.scalars(
                update(items)
                .where(among(session, items.c.conversation_id, list(agents)), items.c.agent_id.is_(None))
                .values(
                    agent_id=select(conv.c.agent_id).where(of).scalar_subquery(),
                    agent_version=select(conv.c.agent_version).where(of).scalar_subquery(),
                )
                .returning(items.c.conversation_id)
            ).all()
        )

    def _convs(self, session: Session, ids: Iterable[str]) -> dict[str, Any]:
        """The stored conversations of ``ids`` (those the batch just stored are not read back)."""
        wanted = set(ids)
        batch = stored_in_batch(session)
        found: dict[str, Any] = {cid: batch[cid] for cid in wanted if cid in batch}
        if len(found) < len(wanted):
            found.update(self._read_convs(session, wanted - found.keys()))
        return found

    def _read_convs(self, session: Session, ids: Iterable[str]) -> dict[str, ConversationRow]:
        cols = load_only(
            ConversationRow.conversation_id,
            ConversationRow.agent_id,
            ConversationRow.agent_version,
            ConversationRow.started_at,
            ConversationRow.ended_at,
            ConversationRow.received_at,
        )
        rows = session.scalars(
            select(ConversationRow).options(cols).where(ConversationRow.conversation_id.in_(sorted(set(ids))))
        )
        return {c.conversation_id: c for c in rows}

    def _drop_unattributed(self, session: Session, ids: list[str]) -> None:
        """Outcome reasons of items that waited for their conversation, whose outcomes fall outside the window."""
        reasons = session.scalars(
            select(ReviewReasonRow).where(ReviewReasonRow.conversation_id.in_(ids), ReviewReasonRow.kind == "outcome")
        ).all()
        if not reasons:
            return
        convs = self._convs(session, ids)
        kept = {
            (o.conversation_id, o.type[:128])
            for o in session.scalars(select(OutcomeRow).where(OutcomeRow.conversation_id.in_(ids)))
            if o.conversation_id in convs
            and attributed(o, convs[o.conversation_id], self.window_hours)
            and self.policy.outcome_reasons(o.type, float(o.value))
        }
        dropped = [r for r in reasons if (r.conversation_id, r.key) not in kept]
        if not dropped:
            return
        now = write_clock(session)
        by_cid: dict[str, list[ReviewReasonRow]] = defaultdict(list)
        for r in dropped:
            by_cid[r.conversation_id].append(r)
        session.execute(delete(ReviewReasonRow).where(ReviewReasonRow.id.in_([r.id for r in dropped])))
        left = dict(
            session.execute(
                select(ReviewReasonRow.conversation_id, func.count())
                .where(ReviewReasonRow.conversation_id.in_(sorted(by_cid)))
                .group_by(ReviewReasonRow.conversation_id)
            ).all()
        )
        audit = []
        for cid, rs in sorted(by_cid.items()):
            detail = {"reasons": [[r.kind, r.key] for r in rs], "why": "outside the attribution window"}
            if left.get(cid):
                session.execute(
                    update(ReviewItemRow)
                    .where(ReviewItemRow.conversation_id == cid)
                    .values(priority=ReviewItemRow.priority - sum(r.weight for r in rs), updated_at=now)
                    .execution_options(synchronize_session=False)
                )
                audit.append(
                    {
                        "at": now,
                        "actor": SYSTEM_ACTOR,
                        "action": "reason_dropped",
                        "conversation_id": cid,
                        "detail": detail,
                    }
                )
            else:
                session.execute(delete(ReviewItemRow).where(ReviewItemRow.conversation_id == cid))
                audit.append(
                    {"at": now, "actor": SYSTEM_ACTOR, "action": "dropped", "conversation_id": cid, "detail": detail}
                )
        session.execute(insert(ReviewAuditRow), audit)

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
        """``outcome_listeners`` hook: rows of ``outcomes`` (conversation_id, type, value, occurred_at).

        An outcome of a stored conversation counts only inside the attribution window; one whose
        conversation is not stored yet flags a waiting item (checked again when the conversation arrives).
        """
        outcomes = list(outcomes)
        convs = self._convs(session, (o.conversation_id for o in outcomes)) if outcomes else {}
        flagged: dict[str, list[Reason]] = defaultdict(list)
        for o in outcomes:
            conv = convs.get(o.conversation_id)
            if conv is not None and not attributed(o, conv, self.window_hours):
                continue
            flagged[o.conversation_id].extend(self.policy.outcome_reasons(o.type, float(o.value)))
        agents = {cid: (c.agent_id, c.agent_version) for cid, c in convs.items()}
        enqueue(session, self.policy, dict(flagged), agents, self.metrics)
