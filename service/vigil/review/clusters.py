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

from sqlalchemy import select
from sqlalchemy.orm import Session, load_only

from vigil.metrics import Metrics
from vigil.review import queue
from vigil.review.errors import Invalid
from vigil.review.insights import snippet
from vigil.review.models import ReviewReasonRow
from vigil.review.policy import FlaggingPolicy
from vigil.store import reads
from vigil.store.db import aware, utcnow
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
    if not a and not b:
        return 1.0
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
    session: Session, min_size: int = 2, window: int = WINDOW, reviewer: str | None = None
) -> list[Cluster]:
    """Near-duplicate clusters among the ``window`` highest-priority open items, largest first
    (with ``reviewer``: items they have labelled or skipped are left out, as claim-next leaves them)."""
    now = utcnow()
    items = session.execute(
        select(
            ReviewItemRow.conversation_id,
            ReviewItemRow.priority,
            ReviewItemRow.agent_version,
            ReviewItemRow.created_at,
        )
        .where(queue.claimable(now), *(queue.not_done_by(reviewer) if reviewer else []))
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
    now = utcnow()
    items = {
        row.conversation_id: row
        for row in session.execute(
            select(
                ReviewItemRow.conversation_id,
                ReviewItemRow.status,
                ReviewItemRow.claimed_by,
                ReviewItemRow.lease_until,
            ).where(ReviewItemRow.conversation_id.in_(rest))
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
        if why is None:
            queue.label(session, cid, reviewer, data, policy, now=now, metrics=metrics, propagated_from=sample)
            labelled.append(cid)
        else:
            skipped.append({"conversation_id": cid, "why": why})
    return {"sample": sample, "labelled": labelled, "skipped": skipped, "label": data.label}


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
