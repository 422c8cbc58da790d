"""Near-duplicate clusters of the open queue, and labelling a whole cluster in one action.

Two open items are near-duplicates when they were flagged for the same main reason (the rule of the
heaviest finding, or the heaviest other reason) and their first user messages share most of their words
(Jaccard similarity of word sets at least :data:`SIMILARITY`, digits folded, so order numbers and amounts
do not split a cluster). Clustering reads a bounded window: the :data:`WINDOW` highest-priority open items.

A reviewer reads a sample, labels it, and the label is applied to the members they kept checked; each
copy is a label row of its own, by that reviewer, whose ``propagated_from`` names the sample, and the audit
log says so too.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, insert, or_, select, update
from sqlalchemy.orm import Session, load_only

from vigil.metrics import Metrics
from vigil.review import queue
from vigil.review.errors import Invalid
from vigil.review.insights import snippet
from vigil.review.models import ReviewAuditRow, ReviewReasonRow
from vigil.review.policy import FlaggingPolicy
from vigil.store import reads
from vigil.store.db import among, aware, clock
from vigil.store.models import ConversationRow, ReviewItemRow, ReviewLabelRow

WINDOW = 1000
SIMILARITY = 0.5
MAX_MEMBERS = 500
SAMPLE = 3
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_DIGITS = re.compile(r"\d+")


@dataclass(slots=True)
class _Member:
    conversation_id: str
    priority: float
    agent_version: str | None
    created_at: datetime
    text: str
    words: frozenset[str]


@dataclass(slots=True)
class Cluster:
    reason: tuple[str, str]
    members: list[_Member] = field(default_factory=list)

    @property
    def ids(self) -> list[str]:
        return [m.conversation_id for m in self.members]

    @property
    def id(self) -> str:
        """Stable while the cluster's first (highest-priority) member stays in it."""
        return hashlib.sha256(self.members[0].conversation_id.encode()).hexdigest()[:12]

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "reason": {"kind": self.reason[0], "key": self.reason[1]},
            "size": len(self.members),
            "snippet": self.members[0].text,
            "sample": [m.conversation_id for m in self.members[:SAMPLE]],
            "members": [
                {
                    "conversation_id": m.conversation_id,
                    "priority": m.priority,
                    "agent_version": m.agent_version,
                    "flagged_at": aware(m.created_at),
                    "snippet": m.text,
                }
                for m in self.members
            ],
        }


def words_of(text: str) -> frozenset[str]:
    return frozenset(_DIGITS.sub("#", w) for w in _WORD.findall(text.lower()))


def similarity(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard similarity of two word sets; a text with no words (a run with no user turn, as τ²'s no-user
    mode records) is like nothing, not like every other empty one: one label must not cover them all."""
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


def _main_reasons(session: Session, ids: list[str]) -> dict[str, tuple[str, str]]:
    """Each item's heaviest reason, preferring a rule finding (what failed) over how it was found."""
    best: dict[str, tuple[tuple[int, float], tuple[str, str]]] = {}
    for i in range(0, len(ids), 500):
        rows = session.execute(
            select(ReviewReasonRow.conversation_id, ReviewReasonRow.kind, ReviewReasonRow.key, ReviewReasonRow.weight)
            .where(ReviewReasonRow.conversation_id.in_(ids[i : i + 500]))
            .order_by(ReviewReasonRow.id)
        ).all()
        for cid, kind, key, weight in rows:
            rank = (1 if kind == "finding" else 0, weight)
            if cid not in best or rank > best[cid][0]:
                best[cid] = (rank, (kind, key))
    return {cid: reason for cid, (_, reason) in best.items()}


def open_clusters(
    session: Session,
    min_size: int = 2,
    window: int = WINDOW,
    reviewer: str | None = None,
    held_by: str | None = None,
) -> list[Cluster]:
    """Near-duplicate clusters among the ``window`` highest-priority open items, largest first
    (with ``reviewer``: items they have labelled or skipped are left out, as claim-next leaves them;
    with ``held_by``: the items that reviewer holds count as open)."""
    now = clock(session)
    open_ = queue.claimable(now)
    if held_by is not None:
        open_ = or_(open_, and_(ReviewItemRow.status == "open", ReviewItemRow.claimed_by == held_by))
    items = session.execute(
        select(
            ReviewItemRow.conversation_id,
            ReviewItemRow.priority,
            ReviewItemRow.agent_version,
            ReviewItemRow.created_at,
        )
        .where(open_, *(queue.not_done_by(reviewer) if reviewer else []))
        .order_by(ReviewItemRow.priority.desc(), ReviewItemRow.created_at, ReviewItemRow.id)
        .limit(window)
    ).all()
    ids = [row.conversation_id for row in items]
    reasons = _main_reasons(session, ids)
    texts = _first_messages(session, ids)
    by_reason: dict[tuple[str, str], list[Cluster]] = {}
    for row in items:
        cid = row.conversation_id
        text = texts.get(cid, "")
        member = _Member(cid, row.priority, row.agent_version, row.created_at, text, words_of(text))
        reason = reasons.get(cid, ("", ""))
        groups = by_reason.setdefault(reason, [])
        home = next((c for c in groups if similarity(c.members[0].words, member.words) >= SIMILARITY), None)
        if home is None:
            groups.append(Cluster(reason, [member]))
        elif len(home.members) < MAX_MEMBERS:
            home.members.append(member)
    out = [c for groups in by_reason.values() for c in groups if len(c.members) >= min_size]
    out.sort(key=lambda c: (-len(c.members), -c.members[0].priority, c.members[0].conversation_id))
    return out


def _first_messages(session: Session, ids: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i in range(0, len(ids), 200):
        rows = session.scalars(
            select(ConversationRow)
            .options(load_only(ConversationRow.conversation_id, ConversationRow.intent, ConversationRow.document))
            .where(ConversationRow.conversation_id.in_(ids[i : i + 200]))
        )
        for c in rows:
            out[c.conversation_id] = snippet(c.document) or (c.intent or "")
    return out


def find(session: Session, cluster_id: str, reviewer: str | None = None) -> Cluster | None:
    return next((c for c in open_clusters(session, reviewer=reviewer) if c.id == cluster_id), None)


def label_cluster(
    session: Session,
    sample: str,
    members: list[str],
    reviewer: str,
    data: queue.LabelIn,
    policy: FlaggingPolicy,
    metrics: Metrics | None = None,
) -> dict[str, Any]:
    """Label ``sample`` and apply the same label to ``members`` (its near-duplicates) in one transaction.

    Each member gets its own label row by ``reviewer`` with ``propagated_from=sample``. A member another
    reviewer holds, one that is done, or one this reviewer labelled already is left alone and reported
    under ``skipped``; the sample itself must be labellable (else Conflict, nothing saved).
    """
    data = queue.validate_label(data, policy)
    rest = list(dict.fromkeys(m for m in members if m != sample))
    if len(rest) > MAX_MEMBERS:
        raise Invalid(f"at most {MAX_MEMBERS} members per cluster label, not {len(rest)}")
    # only the sample's near-duplicates get its label: a member list is the client's word, and a label
    # copied onto an unrelated conversation would count for calibration and export like a read one
    home = next((c for c in open_clusters(session, reviewer=reviewer, held_by=reviewer) if sample in c.ids), None)
    kin = set(home.ids) if home is not None else set()
    # every conversation read shared-locked, in id order, before any item is locked (as queue.label reads
    # the sample's): a newer revision of a member being stored is waited for and then seen, so no copy is
    # stamped with a revision that is replaced without superseding it (ingest locks conversations first too)
    session.execute(
        select(ConversationRow.conversation_id)
        .where(among(session, ConversationRow.conversation_id, sorted({sample, *rest})))
        .order_by(ConversationRow.conversation_id)
        .with_for_update(read=True)
    ).all()
    queue.label(session, sample, reviewer, data, policy, metrics=metrics)
    labelled, skipped = [sample], []
    mine = set(
        session.scalars(
            select(ReviewLabelRow.conversation_id).where(
                ReviewLabelRow.conversation_id.in_(rest),
                ReviewLabelRow.reviewer == reviewer,
                ReviewLabelRow.is_current.is_(True),
            )
        )
    )
    now = clock(session)
    items = {
        row.conversation_id: row
        for row in session.execute(
            select(
                ReviewItemRow.conversation_id,
                ReviewItemRow.status,
                ReviewItemRow.claimed_by,
                ReviewItemRow.lease_until,
            )
            .where(ReviewItemRow.conversation_id.in_(rest))
            .order_by(ReviewItemRow.id)
            .with_for_update()  # checked and labelled under one lock: a claim cannot slip in between
        )
    }
    for cid in rest:
        item = items.get(cid)
        lease = aware(item.lease_until) if item is not None else None
        why = None
        if item is None:
            why = "not in the review queue"
        elif item.status == "done":
            why = "already done"
        elif cid in mine:
            why = "you labelled it already"
        elif item.claimed_by not in (None, reviewer) and lease is not None and lease >= now:
            why = f"{item.claimed_by} holds it"
        elif cid not in kin:
            why = "not a near-duplicate of the sample among the open items"
        if why is None:
            labelled.append(cid)
        else:
            skipped.append({"conversation_id": cid, "why": why})
    _propagate(session, labelled[1:], sample, reviewer, data, now, metrics)
    return {"sample": sample, "labelled": labelled, "skipped": skipped, "label": data.label}


def _propagate(
    session: Session,
    ids: list[str],
    sample: str,
    reviewer: str,
    data: queue.LabelIn,
    now: datetime,
    metrics: Metrics | None,
) -> None:
    """:func:`queue.label` for many queue items at once (a few statements, not a few per item): each gets a new
    current label version by ``reviewer`` copied from ``sample``; counts, states and claims follow."""
    if not ids:
        return
    items = {
        i.conversation_id: i
        for i in session.scalars(
            select(ReviewItemRow)
            .where(ReviewItemRow.conversation_id.in_(ids))
            .order_by(ReviewItemRow.id)
            .with_for_update()
        )
    }
    revisions = dict(
        session.execute(
            select(ConversationRow.conversation_id, ConversationRow.revision).where(
                ConversationRow.conversation_id.in_(ids)
            )
        ).all()
    )
    mine = ReviewLabelRow.conversation_id.in_(ids), ReviewLabelRow.reviewer == reviewer
    last = dict(
        session.execute(
            select(ReviewLabelRow.conversation_id, func.max(ReviewLabelRow.version))
            .where(*mine)
            .group_by(ReviewLabelRow.conversation_id)
        ).all()
    )
    session.execute(
        update(ReviewLabelRow)
        .where(*mine, ReviewLabelRow.is_current.is_(True))
        .values(is_current=False)
        .execution_options(synchronize_session=False)
    )
    rows = [
        {
            "conversation_id": cid,
            "revision": revisions.get(cid),
            "reviewer": reviewer,
            "label": data.label,
            "category": data.category,
            "severity": data.severity,
            "notes": data.notes,
            "expected_behavior": data.expected_behavior,
            "propagated_from": sample,
            "version": (last.get(cid) or 0) + 1,
            "is_current": True,
            "created_at": now,
        }
        for cid in ids
    ]
    session.execute(insert(ReviewLabelRow), rows)
    counts = dict(
        session.execute(
            select(ReviewLabelRow.conversation_id, func.count())
            .where(ReviewLabelRow.conversation_id.in_(ids), ReviewLabelRow.is_current.is_(True))
            .group_by(ReviewLabelRow.conversation_id)
        ).all()
    )
    changes = []
    for cid in ids:
        item = items[cid]
        n = counts.get(cid, 0)
        change: dict[str, Any] = {
            "id": item.id,
            "review_count": n,
            "updated_at": now,
            "status": "done" if n >= item.required_reviews else "open",
        }
        if item.claimed_by == reviewer:
            change.update(claimed_by=None, claimed_at=None, lease_until=None)
            if metrics is not None and item.claimed_at is not None:
                metrics.review_label_seconds.observe(max(0.0, (now - aware(item.claimed_at)).total_seconds()))
        changes.append(change)
    session.execute(update(ReviewItemRow), changes)
    if metrics is not None:
        metrics.review_labels.labels(data.label).inc(len(ids))
    detail = {"label": data.label, "category": data.category, "severity": data.severity, "propagated_from": sample}
    session.execute(
        insert(ReviewAuditRow),
        [
            {
                "at": now,
                "actor": reviewer,
                "action": "label",
                "conversation_id": r["conversation_id"],
                "detail": {"version": r["version"], **detail},
            }
            for r in rows
        ],
    )


def sample_revision(session: Session, conversation_id: str) -> int | None:
    """The revision of the sample the cluster page shows: its form sends it back, and a label of a sample
    stored again since (a growing conversation) is refused as :func:`queue.label` refuses any other."""
    conv = session.get(ConversationRow, conversation_id)
    return conv.revision if conv else None


def sample_messages(session: Session, conversation_id: str, limit: int = 12) -> list[dict[str, str]]:
    """The sample's first messages as plain text (role, text), for reading it on the cluster page."""
    conv = session.get(ConversationRow, conversation_id)
    doc = reads.read_document(conv.document) if conv else None
    out: list[dict[str, str]] = []
    for m in (doc or {}).get("messages") or []:
        if not isinstance(m, dict) or m.get("role") == "system":
            continue
        content = m.get("content")
        if isinstance(content, list):
            content = "\n".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
        calls = [str((c.get("function") or {}).get("name") or "") for c in m.get("tool_calls") or []]
        text = str(content or "") + ("".join(f"\n→ {name}" for name in calls if name))
        out.append({"role": str(m.get("role")), "text": text.strip()[:2000]})
        if len(out) >= limit:
            break
    return out
