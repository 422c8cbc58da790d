"""Calibration from the live review queue, and the production failure rates it corrects.

Human side: reviewers' current labels (``review_labels.is_current``); ``confirmed_failure`` is fail,
``not_a_failure`` pass, ``unsure`` is left out; several reviewers on one conversation give its majority
(a tie is left out as disputed). Judge side: each judge version's latest verdict on that conversation.
Raw production rates come from verdicts the judge gave on its random sample (``reason = "sampled"``),
never from flagged or outcome-driven requests, which over-represent failures. ``offline`` keeps only the
verdicts of the offline judge (True) or of the model (False): the two are different judges that share a
name and version, and neither's errors say anything about the other's.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vigil.calibration.report import Pair
from vigil.store import reads
from vigil.store.models import ReviewItemRow, ReviewLabelRow, VerdictRow

HUMAN = {"confirmed_failure": True, "not_a_failure": False}
_CHUNK = 500


def consensus(labels: list[ReviewLabelRow]) -> tuple[bool, str | None] | None:
    """The majority human verdict and category of one conversation; None if unsure or tied."""
    votes = [HUMAN[r.label] for r in labels if r.label in HUMAN]
    fails = sum(votes)
    if not votes or fails * 2 == len(votes):
        return None
    fail = fails * 2 > len(votes)
    cats = Counter(r.category for r in labels if r.category and HUMAN.get(r.label) == fail)
    return fail, cats.most_common(1)[0][0] if cats else None


def sampled_items(session: Session, ids: list[str]) -> set[str]:
    out: set[str] = set()
    for i in range(0, len(ids), _CHUNK):
        out.update(
            session.scalars(
                select(ReviewItemRow.conversation_id).where(
                    ReviewItemRow.conversation_id.in_(ids[i : i + _CHUNK]), ReviewItemRow.sampled.is_(True)
                )
            ).all()
        )
    return out


def live_pairs(
    session: Session, judge: str | None = None, only_sampled: bool = False, offline: bool | None = None
) -> dict[str, list[Pair]]:
    """Judge name → human/judge pairs, one per (conversation, judge version)."""
    humans = {cid: c for cid, labs in reads.current_labels(session).items() if (c := consensus(labs)) is not None}
    ids = sorted(humans)
    if only_sampled:
        keep = sampled_items(session, ids)
        ids = [i for i in ids if i in keep]
    latest: dict[tuple[str, str, str], VerdictRow] = {}
    for i in range(0, len(ids), _CHUNK):
        q = select(VerdictRow).where(VerdictRow.conversation_id.in_(ids[i : i + _CHUNK]))
        if judge is not None:
            q = q.where(VerdictRow.judge == judge)
        if offline is not None:
            q = q.where(VerdictRow.offline.is_(offline))
        for v in session.scalars(q).all():
            key = (v.judge, v.judge_version, v.conversation_id)
            old = latest.get(key)
            if old is None or (v.revision, v.id) > (old.revision, old.id):
                latest[key] = v
    out: dict[str, list[Pair]] = defaultdict(list)
    for (name, version, cid), v in sorted(latest.items()):
        fail, category = humans[cid]
        out[name].append(Pair(cid, fail, v.verdict, version, category, list(v.categories or [])))
    return dict(out)


def sampled_rates(session: Session, judge: str | None = None, offline: bool | None = None) -> list[dict[str, Any]]:
    """Per judge, judge version, agent and agent version: pass and fail verdicts on the random sample."""
    q = (
        select(
            VerdictRow.judge,
            VerdictRow.judge_version,
            VerdictRow.agent_id,
            VerdictRow.agent_version,
            VerdictRow.verdict,
            func.count(),
        )
        .where(VerdictRow.reason == "sampled", VerdictRow.verdict.in_(("pass", "fail")))
        .group_by(
            VerdictRow.judge,
            VerdictRow.judge_version,
            VerdictRow.agent_id,
            VerdictRow.agent_version,
            VerdictRow.verdict,
        )
    )
    if judge is not None:
        q = q.where(VerdictRow.judge == judge)
    if offline is not None:
        q = q.where(VerdictRow.offline.is_(offline))
    counts: dict[tuple[str, str, str, str], Counter[str]] = defaultdict(Counter)
    for name, version, agent, agent_version, verdict, n in session.execute(q).all():
        counts[(name, version, agent, agent_version)][verdict] += int(n)
    return [
        {
            "judge": k[0],
            "judge_version": k[1],
            "agent_id": k[2],
            "agent_version": k[3],
            "fail": c["fail"],
            "judged": c["fail"] + c["pass"],
        }
        for k, c in sorted(counts.items())
    ]


def reviewer_labels(session: Session) -> dict[str, list[tuple[str, str]]]:
    """Conversation → (reviewer, label) of its current labels, for agreement between reviewers."""
    return {cid: [(r.reviewer, r.label) for r in labs] for cid, labs in reads.current_labels(session).items()}
