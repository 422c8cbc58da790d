"""Folds newly stored data into hourly counts and per-series CUSUMs, opening and ending detections.

Conversation and judge signals are folded as their rows are stored. Outcome signals wait: an hour's
conversations are counted with their outcomes, once, when ``VIGIL_DETECTOR_OUTCOME_SETTLE_HOURS``
have passed after the hour (:meth:`Folder._settle`). Feeding conversations first and their
outcomes later would read as a run of successes and then a burst of failures: a false alarm.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vigil.detector import alerts
from vigil.detector.baselines import Baseline, baselines
from vigil.detector.counts import outcome_counts, range_counts
from vigil.detector.cusum import Cusum
from vigil.detector.hourly import (
    HOUR,
    Counts,
    add_counts,
    floor_hour,
    hours,
    series_rows,
    set_outcome_counts,
    store_recount,
)
from vigil.detector.models import DetectorSeriesRow
from vigil.metrics import Metrics
from vigil.settings import Settings
from vigil.store.db import aware
from vigil.store.models import ConversationRow, VerdictRow
from vigil.store.signals import RulesFor

log = logging.getLogger(__name__)


class Folder:
    """The leader's work in one pass: count what was stored since the cursor and feed the statistics."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        rules_for: RulesFor,
        bad_outcomes: list[str],
        ratios: list[float],
        threshold: float,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.rules_for = rules_for
        self.bad_outcomes = bad_outcomes
        self.ratios = ratios
        self.threshold = threshold
        self.outcome_settle = timedelta(hours=settings.detector_outcome_settle_hours)

    def advance(self, s: Session, cursor: datetime | None, until: datetime, now: datetime) -> bool:
        """Fold what was stored in ``[cursor, until)``; with no cursor yet, count the whole history.

        Returns whether the cursor moves to ``until`` (not when it is there already).
        """
        if cursor is None:
            self._backfill(s, until, now)
            return True
        if until <= cursor:
            return False
        for a, b in hours(cursor, until):
            self._fold(s, a, b, now)
        hour = floor_hour(cursor)
        while hour + HOUR <= until:
            self._reconcile(s, hour, now)
            hour += HOUR
        self._settle(s, cursor, until, now)
        return True

    def _backfill(self, s: Session, until: datetime, now: datetime) -> None:
        """First run: count the history into hourly buckets; statistics start from zero."""
        firsts = [s.scalar(select(func.min(c))) for c in (ConversationRow.received_at, VerdictRow.created_at)]
        known = [aware(f) for f in firsts if f is not None]
        if not known:
            return
        for a, b in hours(min(known), until):
            inc = range_counts(s, a, b, self.rules_for)
            add_counts(s, a, inc)
            for row in series_rows(s, inc, a).values():
                row.last_seen = max(aware(row.last_seen), b)
        self._settle(s, None, until, now, since=min(known))

    def _settle(
        self, s: Session, after: datetime | None, until: datetime, now: datetime, since: datetime | None = None
    ) -> None:
        """Count the outcome signals of each hour whose outcomes settled in ``(after, until]`` and feed them
        to the statistics, once: an outcome counts toward the hour its conversation was stored in, if it
        was joined before that hour's settle time. ``after=None`` (the backfill) counts from ``since``
        without feeding the statistics, as for the other signals.
        """
        if not self.bad_outcomes:
            return
        settle = self.outcome_settle
        hour = floor_hour(after - settle - HOUR) if after is not None else floor_hour(since or until)
        while hour + HOUR + settle <= until:
            settled_at = hour + HOUR + settle
            if after is None or settled_at > after:
                inc = outcome_counts(s, hour, hour + HOUR, self.bad_outcomes, settled_at)
                set_outcome_counts(s, hour, inc)
                if after is None:
                    for row in series_rows(s, inc, until).values():
                        row.last_seen = max(aware(row.last_seen), hour + HOUR)
                else:
                    self._apply(s, inc, hour, hour + HOUR, now, at=until)
            hour += HOUR

    def _fold(self, s: Session, a: datetime, b: datetime, now: datetime) -> None:
        inc = range_counts(s, a, b, self.rules_for)
        add_counts(s, a, inc)
        self._apply(s, inc, a, b, now)

    def _reconcile(self, s: Session, hour: datetime, now: datetime) -> None:
        """Recount an hour once it has closed and store the exact counts.

        A replica's transaction can commit rows stamped before the cursor had passed them; the
        recount finds them and feeds them to the statistics as a late batch.
        """
        late = store_recount(s, hour, range_counts(s, hour, hour + HOUR, self.rules_for))
        if late:
            log.info("detector: %d series had rows committed after their hour was folded", len(late))
            self._apply(s, late, hour, hour + HOUR, now)

    def _apply(
        self, s: Session, inc: Counts, a: datetime, b: datetime, now: datetime, at: datetime | None = None
    ) -> None:
        """Fold a batch of counts of ``[a, b)`` into each series' CUSUMs; start and end detections.

        ``at`` is when the batch became known (default ``b``): outcome signals are fed after their
        hour settled, and their series must not look older than the version's other series.
        """
        if not inc:
            return
        series = series_rows(s, inc, a if at is None else at)
        at = at or b
        bases = baselines(s, self.settings, now)
        opened = []
        for key, (n, x) in inc.items():
            if self._step(s, series[key], bases.get(key), n, x, at):
                opened.append(key)
        alerts.count_opened(s, self.metrics, opened)

    def _step(self, s: Session, row: DetectorSeriesRow, base: Baseline | None, n: int, x: int, at: datetime) -> bool:
        """Feed one series ``x`` failures in ``n`` observations; returns whether that opened a detection."""
        row.last_seen = max(aware(row.last_seen), at) if row.last_seen else at
        if base is None:
            row.statistics, row.baseline, row.baseline_rate = [], None, None
            if row.detection_id is None:
                row.state = "warming_up"
            return False
        cfg = self.settings
        cusum = Cusum.design(base.rate, self.ratios, cfg.detector_min_abs_shift, cfg.detector_arl0)
        previous = list(row.statistics or []) if row.baseline == base.label else []
        stats = cusum.update(previous, n, x)
        row.statistics, row.baseline, row.baseline_rate = stats, base.label, base.rate
        opened = False
        if cusum.alarmed(stats) and row.detection_id is None:
            row.detection_id = alerts.open_detection(s, row, max(stats), at, self.threshold)
            opened = True
        elif row.detection_id is not None and max(stats) == 0.0:
            alerts.end_detection(s, row.detection_id, at, "recovered")
            row.detection_id = None
        row.state = "regressed" if row.detection_id is not None else "monitoring"
        return opened
