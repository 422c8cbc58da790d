"""Counts the verdicts behind a judge's failure rate as the judge worker stores them.

Only the first scored verdict of a randomly sampled request per conversation and judge version
counts (:func:`~vigil.detector.counts.sampled_verdict`), so ``vigil_judge_sampled_verdicts_total``
and the JudgeFailRateHigh alert read the same rate as the detector and ``vigil compare``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from vigil.metrics import Metrics
from vigil.store.db import after_commit
from vigil.store.models import VerdictRow
from vigil.store.signals import SCORED, sampled_verdict

VerdictListener = Callable[[Session, Sequence[VerdictRow]], None]


def sampled_verdict_counter(metrics: Metrics) -> VerdictListener:
    """A ``verdict_listeners`` entry; counts once the verdicts' transaction commits."""

    def listen(session: Session, rows: Sequence[VerdictRow]) -> None:
        candidates = [v for v in rows if v.reason == "sampled" and v.verdict in SCORED and v.id is not None]
        if not candidates:
            return
        first = set(
            session.scalars(
                select(VerdictRow.id).where(VerdictRow.id.in_([v.id for v in candidates]), sampled_verdict())
            )
        )
        counted = [
            (v.judge, v.judge_version, v.verdict, v.agent_id, v.agent_version, v.offline)
            for v in candidates
            if v.id in first
        ]
        m = metrics

        def count() -> None:
            for judge, version, verdict, agent, agent_version, offline in counted:
                m.judge_sampled_verdicts.labels(
                    judge, version, verdict, m.agent(agent), m.version(agent_version), "true" if offline else "false"
                ).inc()

        after_commit(session, count)

    return listen
