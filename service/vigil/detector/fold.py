"""Folds newly stored data into hourly counts and per-series CUSUMs, opening and ending detections.

Conversation and judge signals are folded as their rows are stored; a conversation counts once however
many revisions of it are stored (:mod:`vigil.detector.feeds`). Outcome signals wait: an hour's
conversations are counted with their outcomes, once, when ``VIGIL_DETECTOR_OUTCOME_SETTLE_HOURS``
have passed after the hour (:meth:`Folder._settle`). Feeding conversations first and their
outcomes later would read as a run of successes and then a burst of failures: a false alarm.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vigil.detector import alerts
from vigil.detector.baselines import Baseline, baselines
from vigil.detector.counts import conversation_counts, judge_counts, outcome_counts, range_counts
from vigil.detector.cusum import Cusum
from vigil.detector.feeds import Fed, feed, mark_outcomes_fed, outcomes_unfed, prune
from vigil.detector.hourly import (
    HOUR,
    Counts,
    add_changes,
    add_counts,
    floor_hour,
    hours,
    series_rows,
    set_conversation_counts,
    set_outcome_counts,
    store_judge_recount,
)
from vigil.detector.models import DetectorSeriesRow
from vigil.metrics import Metrics
from vigil.settings import Settings
from vigil.store.db import aware
from vigil.store.models import ConversationRow, VerdictRow
from vigil.store.signals import Key, RulesFor

log = logging.getLogger(__name__)


def record_begins(until: datetime) -> datetime:
    """Where the record of what was fed begins when the first pass folds up to ``until``: the hour it is in."""
    return floor_hour(until)


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
        progress: Callable[[], None] = lambda: None,
    ) -> None:
        """``progress`` is called after each hour folded: a pass over a long backlog beats the worker's heartbeat."""
        self.settings = settings
        self.progress = progress
        self.metrics = metrics
        self.rules_for = rules_for
        self.bad_outcomes = bad_outcomes
        self.ratios = ratios
        self.threshold = threshold
        self.outcome_settle = timedelta(hours=settings.detector_outcome_settle_hours)

    def advance(
        self, s: Session, cursor: datetime | None, until: datetime, now: datetime, fed_since: datetime | None = None
    ) -> bool:
        """Fold what was stored in ``[cursor, until)``; with no cursor yet, count the whole history.

        ``fed_since``: where the record of what each conversation was fed as begins (default: the cursor);
        the conversations stored before it were counted without it.
        Returns whether the cursor moves to ``until`` (not when it is there already).
        """
        if cursor is None:
            self._backfill(s, until, now)
            return True
        if until <= cursor:
            return False
        for a, b in hours(cursor, until):
            self._fold(s, a, b, now)
            self.progress()
        hour = floor_hour(cursor)
        while hour + HOUR <= until:
            self._reconcile(s, hour, now, fed_since or cursor)
            hour += HOUR
        if floor_hour(cursor) + HOUR <= until and self.settings.retention_conversations_days > 0:
            # once an hour: the record of conversations past retention goes (a revision of one counts anew)
            prune(s, floor_hour(now - timedelta(days=self.settings.retention_conversations_days)))
        self._settle(s, cursor, until, now)
        return True

    def begin_record(self, s: Session, cursor: datetime) -> None:
        """The first pass that records what it feeds (after an upgrade): the hour the cursor is in was counted
        pass by pass, with each revision read; recount it up to the cursor, where the record begins."""
        hour = floor_hour(cursor)
        set_conversation_counts(s, hour, conversation_counts(s, hour, cursor, self.rules_for))

    def _backfill(self, s: Session, until: datetime, now: datetime) -> None:
        """First run: count the history into hourly buckets; statistics start from zero.

        The hour ``until`` is in is counted as a pass counts, with the record of what each conversation was
        fed as (the record begins at that hour, :func:`record_begins`): rows a writer commits later, stamped
        before ``until``, are found when the hour closes (:meth:`_reconcile`) instead of never counted.
        """
        firsts = [s.scalar(select(func.min(c))) for c in (ConversationRow.received_at, VerdictRow.created_at)]
        known = [aware(f) for f in firsts if f is not None]
        if not known:
            return
        current = record_begins(until)
        for a, b in hours(min(known), until):
            if a < current:
                inc = range_counts(s, a, b, self.rules_for)
                add_counts(s, a, inc)
            else:
                inc = judge_counts(s, a, b)
                add_counts(s, a, inc)
                fed = feed(s, a, b, self.rules_for)
                add_changes(s, fed.changes)
                inc = inc | fed.counts
            for row in series_rows(s, inc, a).values():
                row.last_seen = max(aware(row.last_seen), b)
            self.progress()
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
            if after is None:
                inc = outcome_counts(s, hour, hour + HOUR, self.bad_outcomes, settled_at)
                set_outcome_counts(s, hour, inc)
                for row in series_rows(s, inc, until).values():
                    row.last_seen = max(aware(row.last_seen), hour + HOUR)
            elif settled_at > after:
                # a conversation counts in the first hour that settled with it, not again when a newer revision
                # moved it to a later one
                mark_outcomes_fed(s, hour)
                inc = outcome_counts(s, hour, hour + HOUR, self.bad_outcomes, settled_at, outcomes_unfed(hour))
                set_outcome_counts(s, hour, inc)
                self._apply(s, inc, hour, hour + HOUR, now, at=until)
            hour += HOUR

    def _fold(self, s: Session, a: datetime, b: datetime, now: datetime) -> None:
        judged = judge_counts(s, a, b)
        add_counts(s, a, judged)
        fed = feed(s, a, b, self.rules_for)
        add_changes(s, fed.changes)
        self._apply(s, judged | fed.counts, a, b, now, fed.flips)

    def _reconcile(self, s: Session, hour: datetime, now: datetime, fed_since: datetime) -> None:
        """Once an hour has closed, store its exact judge counts and feed what its passes missed.

        A replica's transaction can commit rows stamped before the cursor had passed them: the recount
        finds such verdicts, the record of what was fed such conversations (and such newer revisions),
        and both reach the statistics as a late batch.
        """
        late = store_judge_recount(s, hour, judge_counts(s, hour, hour + HOUR))
        fed = feed(s, max(hour, fed_since), hour + HOUR, self.rules_for) if hour + HOUR > fed_since else Fed()
        add_changes(s, fed.changes)
        if late or fed:
            series = late.keys() | fed.counts.keys() | fed.flips.keys()
            log.info("detector: rows of %d series were committed after their hour was folded", len(series))
            self._apply(s, late | fed.counts, hour, hour + HOUR, now, fed.flips)

    def _apply(
        self,
        s: Session,
        inc: Counts,
        a: datetime,
        b: datetime,
        now: datetime,
        flips: dict[Key, int] | None = None,
        at: datetime | None = None,
    ) -> None:
        """Fold a batch of counts of ``[a, b)`` and corrections (``flips``) into each series' CUSUMs; start
        and end detections.

        ``at`` is when the batch became known (default ``b``): outcome signals are fed after their
        hour settled, and their series must not look older than the version's other series.
        """
        flips = flips or {}
        keys = inc.keys() | flips.keys()
        if not keys:
            return
        series = series_rows(s, keys, a if at is None else at)
        at = at or b
        bases = baselines(s, self.settings, now)
        opened = []
        for key in sorted(keys):
            n, x = inc.get(key, (0, 0))
            if self._step(s, series[key], bases.get(key), n, x, flips.get(key, 0), at):
                opened.append(key)
        alerts.count_opened(s, self.metrics, opened)

    def _step(
        self, s: Session, row: DetectorSeriesRow, base: Baseline | None, n: int, x: int, flips: int, at: datetime
    ) -> bool:
        """Feed one series ``x`` failures in ``n`` observations and ``flips`` corrected ones (see
        :meth:`Cusum.update`); returns whether that opened a detection."""
        row.last_seen = max(aware(row.last_seen), at) if row.last_seen else at
        if base is None:
            row.statistics, row.baseline, row.baseline_rate = [], None, None
            if row.detection_id is None:
                row.state = "warming_up"
            return False
        cfg = self.settings
        cusum = Cusum.design(base.rate, self.ratios, cfg.detector_min_abs_shift, cfg.detector_arl0)
        previous = list(row.statistics or []) if row.baseline == base.label else []
        # a correction needs the observation it corrects: statistics started afresh never had it
        stats = cusum.update(previous, n, x, flips if previous else 0)
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
