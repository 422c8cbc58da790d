"""Confirmed failures grouped into clusters by (category, rule, tool), for reviewers and agent owners."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Collection
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased

from vigil.rules import SEVERITY_RANK
from vigil.store import reads
from vigil.store.models import FindingRow, ReviewItemRow, ReviewLabelRow

# (category, rule id, tool); rule and tool are None for failures no rule finding explains
_ClusterKey = tuple[str, str | None, str | None]


def clusters(
    session: Session, rule_descriptions: dict[str, str] | None = None, hidden: Collection[str] = ()
) -> dict[str, Any]:
    """Confirmed failures grouped by (category, rule, tool), largest first; the conversations of ``hidden``
    left out (see :func:`hidden_from`).

    Each conversation counts once, in the cluster of its most severe finding (the earliest among equals),
    so the counts add up to the total and the shares to 100%; ``also`` names the other rules that fired
    on a cluster's conversations.
    """
    confirmed = reads.confirmed_failures(session)
    if hidden:
        confirmed = {cid: category for cid, category in confirmed.items() if cid not in hidden}
    total = len(confirmed)
    ids = sorted(confirmed)
    primary, fired = _primary_findings(session, ids)
    groups: dict[_ClusterKey, set[str]] = defaultdict(set)
    messages: dict[_ClusterKey, Counter[str]] = defaultdict(Counter)
    also: dict[_ClusterKey, Counter[str]] = defaultdict(Counter)
    for cid in ids:
        f = primary.get(cid)
        if f is None:
            groups[(confirmed[cid], None, None)].add(cid)
            continue
        key: _ClusterKey = (confirmed[cid], f.rule_id, (f.details or {}).get("tool"))
        groups[key].add(cid)
        messages[key][f.message] += 1
        also[key].update(fired[cid] - {f.rule_id})
    descriptions = rule_descriptions or {}
    out = [_cluster(key, members, total, messages[key], also[key], descriptions) for key, members in groups.items()]
    out.sort(key=lambda c: (-c["count"], c["category"], c["rule_id"] or "~", c["tool"] or ""))
    by_category = Counter(confirmed.values())
    return {
        "total": total,
        "clusters": out,
        "by_category": [{"category": c, "count": n} for c, n in by_category.most_common()],
    }


def hidden_from(session: Session, viewer: str) -> frozenset[str]:
    """Conversations someone labelled ``confirmed_failure`` on a double review still blind to ``viewer``
    (several reviewers needed, not done, ``viewer`` has no label on it): listing one in a failure cluster
    would tell them another reviewer's verdict and category before they give theirs. Runs on every clusters
    request: it reads the open items (an index range of ``ix_review_items_claimable``, not the done ones)
    and, for the few of them reviewed several times, their labels by key, never every label the viewer
    ever gave (``NOT IN`` that list read it all: 160-210 ms at 200k labels by one reviewer)."""
    mine, confirming = aliased(ReviewLabelRow), aliased(ReviewLabelRow)
    labelled_by_viewer = (
        select(mine.id)
        .where(
            mine.conversation_id == ReviewItemRow.conversation_id,
            mine.reviewer == viewer,
            mine.is_current.is_(True),
        )
        .correlate(ReviewItemRow)
        .exists()
    )
    confirmed = (
        select(confirming.id)
        .where(
            confirming.conversation_id == ReviewItemRow.conversation_id,
            confirming.is_current.is_(True),
            confirming.label == "confirmed_failure",
        )
        .correlate(ReviewItemRow)
        .exists()
    )
    q = select(ReviewItemRow.conversation_id).where(
        ReviewItemRow.status == "open",  # open | done
        ReviewItemRow.required_reviews > 1,
        ~labelled_by_viewer,
        confirmed,
    )
    return frozenset(session.scalars(q))


# A labelled conversation's newer revision (findings replaced) shows this late at most.
CLUSTERS_TTL_SECONDS = 30.0
# answers kept per newest label: one per distinct set of conversations hidden from a viewer
MAX_KEPT_VIEWS = 64


class ClusterCache:
    """:func:`clusters` kept per newest label id, for at most ``ttl`` seconds.

    The clusters are the confirmed failures and their findings. Every label given (a first label, a
    change, an undo) takes a new id, so they are recomputed as soon as one arrives; one max-id look-up
    on a primary key replaces a read of every confirmed failure and its findings on each request.
    Findings are not part of the key: under traffic every batch writes some, nearly all on conversations
    nobody labelled, which would recompute on every request; those of a labelled conversation change
    only with a newer revision of it, which shows within the TTL. The answer is shared between
    requests: callers do not change it.

    With a ``viewer``, the conversations of a double review still blind to them are left out
    (:func:`hidden_from`); answers are kept per set of hidden conversations, so reviewers who see the
    same share one, and most see the whole.
    """

    def __init__(self, ttl: float = CLUSTERS_TTL_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._entry: tuple[int | None, float, dict[frozenset[str], dict[str, Any]]] | None = None

    def clusters(
        self, session: Session, rule_descriptions: dict[str, str] | None = None, viewer: str | None = None
    ) -> dict[str, Any]:
        """The clusters as ``viewer`` may see them (None: everything, for admins' API calls and commands)."""
        key = session.scalar(select(func.max(ReviewLabelRow.id)))
        hidden = hidden_from(session, viewer) if viewer is not None else frozenset()
        now = self.clock()
        with self._lock:
            entry = self._entry
        if entry is not None and entry[0] == key and now < entry[1] and hidden in entry[2]:
            return entry[2][hidden]
        value = clusters(session, rule_descriptions, hidden)
        with self._lock:
            if self._entry is None or self._entry[0] != key or now >= self._entry[1]:
                self._entry = (key, now + self.ttl, {})
            kept = self._entry[2]
            if len(kept) >= MAX_KEPT_VIEWS:
                kept.clear()
            kept[hidden] = value
        return value


def _primary_findings(session: Session, ids: list[str]) -> tuple[dict[str, FindingRow], dict[str, set[str]]]:
    """Each conversation's most severe finding (the earliest among equals), and the rules that fired on it."""
    primary: dict[str, tuple[tuple[int, int], FindingRow]] = {}
    fired: dict[str, set[str]] = defaultdict(set)
    for i in range(0, len(ids), 500):
        for f in session.scalars(select(FindingRow).where(FindingRow.conversation_id.in_(ids[i : i + 500]))).all():
            if (f.details or {}).get("rule_error"):
                continue
            fired[f.conversation_id].add(f.rule_id)
            rank = (-SEVERITY_RANK.get(f.severity, 0), f.id)
            best = primary.get(f.conversation_id)
            if best is None or rank < best[0]:
                primary[f.conversation_id] = (rank, f)
    return {cid: f for cid, (_, f) in primary.items()}, fired


def _cluster(
    key: _ClusterKey,
    members: set[str],
    total: int,
    messages: Counter[str],
    also: Counter[str],
    descriptions: dict[str, str],
) -> dict[str, Any]:
    category, rule, tool = key
    if rule is None:
        text = "no rule fired (found by the judge, an outcome or a reviewer)"
    else:
        text = messages.most_common(1)[0][0] if messages else descriptions.get(rule, rule)
    return {
        "category": category,
        "rule_id": rule,
        "tool": tool,
        "count": len(members),
        "total": total,
        "share": len(members) / total if total else 0.0,
        "description": text,
        "rule_description": descriptions.get(rule or "", ""),
        "summary": f"{len(members)} of {total} failures: {text}",
        "examples": sorted(members)[:5],
        "also": [{"rule_id": r, "count": n} for r, n in sorted(also.items(), key=lambda x: (-x[1], x[0]))],
    }
