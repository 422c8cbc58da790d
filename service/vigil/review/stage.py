"""What the review stage's API, UI and commands share: policy, flagger, lease time, metrics."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from vigil.metrics import Metrics
from vigil.review.failures import ClusterCache
from vigil.review.flagger import Flagger
from vigil.review.policy import FlaggingPolicy
from vigil.runtime import Runtime
from vigil.schema import outcome_types
from vigil.store.models import ReviewItemRow

log = logging.getLogger(__name__)

# the open-items gauge runs a COUNT at scrape time; at most once per this many seconds
GAUGE_TTL_SECONDS = 10.0
# how long a scrape waits for that COUNT before it reports the last one: a database that stops answering
# held scrapes (and the workers' liveness probe) for the connect timeout, 10 s, past both their timeouts
GAUGE_WAIT_SECONDS = 1.0


@dataclass
class ReviewStage:
    policy: FlaggingPolicy
    flagger: Flagger
    sessions: sessionmaker[Session]
    metrics: Metrics
    lease_seconds: int
    rule_descriptions: dict[str, str] = field(default_factory=dict)
    assignment_hours: float = 0.0  # 0: an assignment never lapses
    failure_clusters: ClusterCache = field(default_factory=ClusterCache)
    _gauge: tuple[float, float] = (0.0, 0.0)
    _counting: threading.Thread | None = field(default=None, repr=False, compare=False)
    _gauge_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def from_runtime(cls, rt: Runtime) -> ReviewStage:
        policy = FlaggingPolicy.load(rt.settings.review_policy or None)
        source = rt.settings.review_policy or "flagging policy"
        policy.check_outcome_types(outcome_types(rt.settings.outcome_types), source)
        unknown = policy.unknown_rules(r.id for r in rt.rules.rules)
        if unknown:
            log.warning(
                "%s: findings.rules names no enabled rule of the loaded packs: %s; its weight applies to nothing",
                source,
                ", ".join(unknown),
            )
        descriptions = {r.id: r.description for r in rt.rules.rules}
        return cls(
            policy,
            Flagger(policy, rt.metrics, rt.settings.outcome_attribution_window_hours),
            rt.sessions,
            rt.metrics,
            rt.settings.review_lease_seconds,
            descriptions,
            assignment_hours=rt.settings.review_assignment_hours,
        )

    def open_items(self) -> float:
        """Open items, counted at most every ``GAUGE_TTL_SECONDS`` in a thread of its own: a scrape waits
        ``GAUGE_WAIT_SECONDS`` for the count and otherwise reports the last one."""
        with self._gauge_lock:
            stale = time.monotonic() - self._gauge[0] > GAUGE_TTL_SECONDS
            if stale and (self._counting is None or not self._counting.is_alive()):
                self._counting = threading.Thread(target=self._count_open, name="review-queue-gauge", daemon=True)
                self._counting.start()
            counting = self._counting
        if stale and counting is not None:
            counting.join(GAUGE_WAIT_SECONDS)
        return self._gauge[1]

    def _count_open(self) -> None:
        value = self._gauge[1]
        try:
            with self.sessions() as s:
                value = float(
                    s.scalar(
                        select(func.count())
                        .select_from(ReviewItemRow)
                        .where(ReviewItemRow.status == "open", ReviewItemRow.agent_id.is_not(None))
                    )
                    or 0
                )
        except SQLAlchemyError:
            log.warning("review queue gauge: database unavailable; keeping the last value")
        self._gauge = (time.monotonic(), value)
