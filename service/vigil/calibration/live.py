"""Calibration from the live review queue, and the production failure rates it corrects.

Human side: reviewers' current labels (``review_labels.is_current``); ``confirmed_failure`` is fail,
``not_a_failure`` pass, ``unsure`` is left out; several reviewers on one conversation give its majority
(a tie is left out as disputed); a conversation whose double review is still open gives none yet (its
verdict is not settled, and counting its first label would show that reviewer's category to the second
while the review is blind). Judge side: each judge version's latest verdict on the revision the labels
were given on: a verdict on another revision judged other text (an older run, a corrected transcript), and
a label whose revision the judge has not judged yet makes no pair.
Raw production rates come from verdicts the judge gave on its random sample (``reason = "sampled"``),
never from flagged or outcome-driven requests, which over-represent failures. ``offline`` keeps only the
verdicts of the offline judge (True) or of the model (False): the two are different judges that share a
name and version, and neither's errors say anything about the other's. ``max_pairs`` bounds the pairs to
the conversations of the newest labels (by label id) the judge gave a verdict on, so the cost of a
judge's calibration stops growing with the labels ever stored (``VIGIL_CALIBRATION_MAX_PAIRS``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from vigil.calibration.report import Pair
from vigil.calibration.stats import inter_rater
from vigil.store import reads
from vigil.store.db import among
from vigil.store.models import ReviewItemRow, ReviewLabelRow, VerdictRow

HUMAN = {"confirmed_failure": True, "not_a_failure": False}


def consensus(labels: list[Any]) -> tuple[bool, str | None] | None:
    """The majority human verdict and category of one conversation; None if unsure or tied."""
    votes = [HUMAN[r.label] for r in labels if r.label in HUMAN]
    fails = sum(votes)
    if not votes or fails * 2 == len(votes):
        return None
    fail = fails * 2 > len(votes)
    cats = Counter(r.category for r in labels if r.category and HUMAN.get(r.label) == fail)
    return fail, cats.most_common(1)[0][0] if cats else None


def settled() -> Any:
    """Labels whose conversation is not waiting for more reviewers (a double review still open)."""
    L, R = ReviewLabelRow, ReviewItemRow
    return ~(
        select(R.id).where(R.conversation_id == L.conversation_id, R.required_reviews > 1, R.status != "done").exists()
    )


def newest_labelled(judge: str | None, only_sampled: bool, offline: bool | None) -> Select[Any]:
    """Conversations of the current labels, newest (by label id) first, whose labelled revision the judge
    has a verdict on: a backward walk of the labels' primary key, which the caller's limit stops."""
    V, L = VerdictRow, ReviewLabelRow
    judged = select(V.id).where(V.conversation_id == L.conversation_id, V.revision == L.revision)
    if judge is not None:
        judged = judged.where(V.judge == judge)
    if offline is not None:
        judged = judged.where(V.offline.is_(offline))
    q = select(L.conversation_id).where(L.is_current.is_(True), judged.exists(), settled())
    if only_sampled:
        q = q.where(
            select(ReviewItemRow.id)
            .where(ReviewItemRow.conversation_id == L.conversation_id, ReviewItemRow.sampled.is_(True))
            .exists()
        )
    return q.order_by(L.id.desc())


def live_pairs(
    session: Session,
    judge: str | None = None,
    only_sampled: bool = False,
    offline: bool | None = None,
    max_pairs: int | None = None,
) -> dict[str, list[Pair]]:
    """:func:`live_pairs_window` without its window."""
    return live_pairs_window(session, judge, only_sampled, offline, max_pairs)[0]


def live_pairs_window(
    session: Session,
    judge: str | None = None,
    only_sampled: bool = False,
    offline: bool | None = None,
    max_pairs: int | None = None,
) -> tuple[dict[str, list[Pair]], reads.LabelWindow | None]:
    """Judge name → human/judge pairs, one per (conversation, judge version): the labels' consensus and the
    version's latest verdict on the revision they were given on.

    Reads only labelled revisions the judge gave a verdict on (a join along the conversation id), with
    the columns it needs: the cost follows the pairs, not every label or verdict ever stored. With
    ``max_pairs``, only the conversations of the judge's newest ``max_pairs`` labels (see
    :func:`newest_labelled`), and the window saying whether the bound left older labels out (None without
    a bound)."""
    V, L = VerdictRow, ReviewLabelRow
    vq = select(V.judge, V.judge_version, V.conversation_id, V.revision, V.id, V.verdict, V.categories)
    if judge is not None:
        vq = vq.where(V.judge == judge)
    if offline is not None:
        vq = vq.where(V.offline.is_(offline))
    judged = select(V.id).where(V.conversation_id == L.conversation_id, V.revision == L.revision)
    if judge is not None:
        judged = judged.where(V.judge == judge)
    lq = select(L.conversation_id, L.revision, L.label, L.category).where(
        L.is_current.is_(True), judged.exists(), settled()
    )
    if max_pairs is not None:
        # the ids themselves: given the subquery, Postgres hashes the 5,000 ids and reads every verdict and
        # label stored; looked up by id, the cost follows the pairs
        ids, window = reads.newest_ids(session, newest_labelled(judge, only_sampled, offline), max_pairs)
        verdict_rows = list(session.execute(vq.where(among(session, V.conversation_id, ids))))
        # every one of these conversations has a verdict of the judge: no look-up per label to check it
        mine = select(L.conversation_id, L.revision, L.label, L.category).where(L.is_current.is_(True), settled())
        label_rows = list(session.execute(mine.where(among(session, L.conversation_id, ids)).order_by(L.id)))
    else:
        window = None
        vq = vq.where(
            select(L.id)
            .where(L.conversation_id == V.conversation_id, L.revision == V.revision, L.is_current.is_(True))
            .exists()
        )  # the labels read below are the settled ones; a verdict without one makes no pair
        if only_sampled:
            vq = vq.where(
                select(ReviewItemRow.id)
                .where(ReviewItemRow.conversation_id == V.conversation_id, ReviewItemRow.sampled.is_(True))
                .exists()
            )
        verdict_rows = list(session.execute(vq))
        label_rows = list(session.execute(lq.order_by(L.id)))
    # the labels and the verdict of one revision: current labels share their conversation's stored revision
    labels: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for r in label_rows:
        if r.revision is not None:
            labels[(r.conversation_id, r.revision)].append(r)
    humans = {key: c for key, labs in labels.items() if (c := consensus(labs)) is not None}
    latest: dict[tuple[str, str, str], Any] = {}
    for v in verdict_rows:
        if (v.conversation_id, v.revision) not in humans:
            continue
        key = (v.judge, v.judge_version, v.conversation_id)
        old = latest.get(key)
        if old is None or (v.revision, v.id) > (old.revision, old.id):
            latest[key] = v
    out: dict[str, list[Pair]] = defaultdict(list)
    for (name, version, cid), v in sorted(latest.items()):
        fail, category = humans[(cid, v.revision)]
        out[name].append(Pair(cid, fail, v.verdict, version, category, list(v.categories or [])))
    return dict(out), window


def sampled_rates(
    session: Session, judge: str | None = None, offline: bool | None = None, since: datetime | None = None
) -> list[dict[str, Any]]:
    """Per judge, judge version, agent and agent version: pass and fail verdicts on the random sample (given
    since ``since``: a read window keeps the read flat as verdicts accumulate)."""
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
    if since is not None:
        q = q.where(VerdictRow.created_at >= since)
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


def reviewer_labels(session: Session, max_labels: int) -> tuple[dict[str, list[tuple[str, str]]], reads.LabelWindow]:
    """Conversation → (reviewer, label) of its current labels, for agreement between reviewers: the
    conversations of the newest ``max_labels`` current labels (``VIGIL_AGREEMENT_MAX_LABELS``), with the
    window saying whether older labels were left out."""
    return reads.newest_labels(session, max_labels)


def inter_reviewer(session: Session, max_labels: int) -> dict[str, Any]:
    """Agreement between reviewers (:func:`stats.inter_rater`) with ``labels_considered``, ``bounded``
    and ``max_labels``."""
    labels, window = reviewer_labels(session, max_labels)
    return inter_rater(labels) | window.as_dict("max_labels")
