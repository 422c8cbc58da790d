"""Reviewers' progress: each reviewer's labels and held items, and how often reviewers agree."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vigil.store import reads
from vigil.store.db import clock
from vigil.store.models import ReviewItemRow, ReviewLabelRow


def progress(session: Session, max_labels: int, now: datetime | None = None) -> dict[str, Any]:
    """Per reviewer: current labels by kind, labels in the last day and week, items held; agreement (on
    the conversations of the newest ``max_labels`` current labels)."""
    now = now or clock(session)
    people: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"labels": 0, "by_label": {}, "last_24h": 0, "last_7d": 0, "changed": 0, "holding": 0}
    )
    lab = ReviewLabelRow
    for reviewer, label, n in session.execute(
        select(lab.reviewer, lab.label, func.count()).where(lab.is_current.is_(True)).group_by(lab.reviewer, lab.label)
    ):
        people[reviewer]["by_label"][label] = n
        people[reviewer]["labels"] += n
    for reviewer, n in session.execute(
        select(lab.reviewer, func.count()).where(lab.is_current.is_(False)).group_by(lab.reviewer)
    ):
        people[reviewer]["changed"] = n
    day, week = now - timedelta(days=1), now - timedelta(days=7)
    recent = select(lab.reviewer, func.count(), func.count().filter(lab.created_at >= day))
    recent = recent.where(lab.created_at >= week)
    for reviewer, n_week, n_day in session.execute(recent.group_by(lab.reviewer)):  # one pass for both windows
        people[reviewer]["last_7d"], people[reviewer]["last_24h"] = n_week, n_day
    for holder, n in session.execute(
        select(ReviewItemRow.claimed_by, func.count())
        .where(ReviewItemRow.claimed_by.is_not(None), ReviewItemRow.lease_until >= now)
        .group_by(ReviewItemRow.claimed_by)
    ):
        people[cast(str, holder)]["holding"] = n  # the query keeps only claimed items
    reviewers = [
        {"reviewer": name, **p} for name, p in sorted(people.items(), key=lambda kv: (-kv[1]["labels"], kv[0]))
    ]
    return {"reviewers": reviewers, "agreement": agreement(session, max_labels)}


def agreement(session: Session, max_labels: int) -> dict[str, Any]:
    """On items labelled by two or more reviewers: the share where every current label is the same.

    Measured on the conversations of the newest ``max_labels`` current labels
    (``VIGIL_AGREEMENT_MAX_LABELS``), so the read stays flat as labels accumulate; ``labels_considered``,
    ``bounded`` and ``max_labels`` say whether older labels were left out."""
    labels, window = reads.newest_labels(session, max_labels)
    multi = [item for item in labels.values() if len(item) >= 2]
    agreed = sum(1 for item in multi if len({label for _, label in item}) == 1)
    rate = agreed / len(multi) if multi else None
    return {"items": len(multi), "agreed": agreed, "rate": rate, **window.as_dict("max_labels")}
