"""The detector: folds newly stored data into hourly counts and per-series CUSUMs, raises detections.

Every replica may run it; the lease lets one fold data at a time, and every replica refreshes its
gauges from the shared tables, so any replica's ``/metrics`` shows the same state.

Conversation and judge signals are folded as their rows are stored. Outcome signals wait: an hour's
conversations are counted with their outcomes, once, when ``VIGIL_DETECTOR_OUTCOME_SETTLE_HOURS``
have passed after the hour (:meth:`Detector._settle`). Feeding conversations first and their
outcomes later would read as a run of successes and then a burst of failures: a false alarm.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from statsmodels.stats.proportion import proportion_confint

from vigil.detector import lease
from vigil.detector.counts import outcome_counts, range_counts
from vigil.detector.cusum import Cusum, threshold, upper_bound
from vigil.detector.models import DetectionRow, DetectorSeriesRow, QualityCountRow
from vigil.metrics import Metrics
from vigil.settings import Settings
from vigil.store.db import after_commit, aware, upsert
from vigil.store.models import ConversationRow, VerdictRow
from vigil.store.signals import OUTCOME, Key, RulesFor, version_key

log = logging.getLogger(__name__)

HOUR = timedelta(hours=1)


@dataclass(slots=True)
class Baseline:
    label: str  # "version:<v>" or "self"
    rate: float  # the cautious rate the CUSUM uses


def _hours(start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
    a = start
    while a < end:
        b = min(end, a.replace(minute=0, second=0, microsecond=0) + HOUR)
        yield a, b
        a = b


def _floor(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def parse_ratios(spec: str) -> list[float]:
    ratios = sorted({float(r) for r in spec.split(",") if r.strip()})
    if not ratios or min(ratios) <= 1.0:
        from vigil.errors import ConfigError

        raise ConfigError(f"VIGIL_DETECTOR_SHIFTS must list ratios above 1, not {spec!r}")
    return ratios


class Detector:
    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        metrics: Metrics,
        rules_for: RulesFor,
        bad_outcomes: list[str],
        holder: str | None = None,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics
        self.rules_for = rules_for
        self.bad_outcomes = bad_outcomes
        self.holder = holder or lease.holder_id()
        self.ratios = parse_ratios(settings.detector_shifts)
        self.outcome_settle = timedelta(hours=settings.detector_outcome_settle_hours)
        self.h = threshold(settings.detector_arl0, len(self.ratios))
        self.is_leader = self.led_last_pass = False
        self._exported: set[Key] = set()
        self._stopping = threading.Event()
        self._task: asyncio.Task[None] | None = None

    # --- one pass -------------------------------------------------------------------------------

    def tick(self, now: datetime | None = None) -> bool:
        """Fold new data if this process holds the lease, then refresh gauges. Returns leadership."""
        now = now or datetime.now(UTC)
        with self.sessions.begin() as s:
            held = lease.acquire(s, self.holder, self.settings.detector_lease_seconds, now)
            if held is not None:
                until = now - timedelta(seconds=self.settings.detector_settle_seconds)
                cursor = aware(held.cursor) if held.cursor else None
                if cursor is None:
                    self._backfill(s, until, now)
                    held.cursor = until
                elif until > cursor:
                    for a, b in _hours(cursor, until):
                        self._fold(s, a, b, now)
                    hour = _floor(cursor)
                    while hour + HOUR <= until:
                        self._reconcile(s, hour, now)
                        hour += HOUR
                    self._settle(s, cursor, until, now)
                    held.cursor = until
                self._retire(s, now)
        self.is_leader = self.led_last_pass = held is not None
        self.metrics.detector_leader.set(1 if self.is_leader else 0)
        self.metrics.detector_ticks.labels("leader" if self.is_leader else "follower").inc()
        self.refresh(now)
        return self.is_leader

    def _backfill(self, s: Session, until: datetime, now: datetime) -> None:
        """First run: count the history into hourly buckets; statistics start from zero."""
        firsts = [s.scalar(select(func.min(c))) for c in (ConversationRow.received_at, VerdictRow.created_at)]
        known = [aware(f) for f in firsts if f is not None]
        if not known:
            return
        for a, b in _hours(min(known), until):
            inc = range_counts(s, a, b, self.rules_for)
            self._add_counts(s, a, inc)
            for row in self._series(s, inc, a).values():
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
        hour = _floor(after - settle - HOUR) if after is not None else _floor(since or until)
        while hour + HOUR + settle <= until:
            settled_at = hour + HOUR + settle
            if after is None or settled_at > after:
                inc = outcome_counts(s, hour, hour + HOUR, self.bad_outcomes, settled_at)
                self._set_outcome_counts(s, hour, inc)
                if after is None:
                    for row in self._series(s, inc, until).values():
                        row.last_seen = max(aware(row.last_seen), hour + HOUR)
                else:
                    self._apply(s, inc, hour, hour + HOUR, now, at=until)
            hour += HOUR

    @staticmethod
    def _set_outcome_counts(s: Session, hour: datetime, inc: dict[Key, tuple[int, int]]) -> None:
        stored = {
            (r.agent_id, r.agent_version, r.signal): r
            for r in s.scalars(
                select(QualityCountRow).where(QualityCountRow.hour == hour, QualityCountRow.signal.like(f"{OUTCOME}%"))
            )
        }
        for key, (n, x) in inc.items():
            row = stored.pop(key, None)
            if row is None:
                s.add(QualityCountRow(agent_id=key[0], agent_version=key[1], signal=key[2], hour=hour, n=n, x=x))
            else:
                row.n, row.x = n, x
        for row in stored.values():
            row.n, row.x = 0, 0

    def _series(
        self, s: Session, inc: dict[Key, tuple[int, int]], start: datetime
    ) -> dict[Key, DetectorSeriesRow]:
        """The series rows of ``inc``'s keys, created (first seen at ``start``) where missing."""
        agents = {k[0] for k in inc}
        series = {
            (r.agent_id, r.agent_version, r.signal): r
            for r in s.scalars(select(DetectorSeriesRow).where(DetectorSeriesRow.agent_id.in_(agents)))
        }
        for key in inc:
            if key not in series:
                row = DetectorSeriesRow(
                    agent_id=key[0],
                    agent_version=key[1],
                    signal=key[2],
                    statistics=[],
                    state="warming_up",
                    first_seen=start,
                    last_seen=start,
                )
                s.add(row)
                series[key] = row
        return series

    def _add_counts(self, s: Session, start: datetime, inc: dict[Key, tuple[int, int]]) -> None:
        hour = start.replace(minute=0, second=0, microsecond=0)
        rows = [
            {"agent_id": a, "agent_version": v, "signal": sig, "hour": hour, "n": n, "x": x}
            for (a, v, sig), (n, x) in inc.items()
            if n or x
        ]
        if not rows:
            return
        ins = upsert(s, QualityCountRow)
        s.execute(
            ins.on_conflict_do_update(
                index_elements=["agent_id", "agent_version", "signal", "hour"],
                set_={"n": QualityCountRow.n + ins.excluded.n, "x": QualityCountRow.x + ins.excluded.x},
            ),
            rows,
        )

    def _fold(self, s: Session, a: datetime, b: datetime, now: datetime) -> None:
        inc = range_counts(s, a, b, self.rules_for)
        self._add_counts(s, a, inc)
        self._apply(s, inc, a, b, now)

    def _reconcile(self, s: Session, hour: datetime, now: datetime) -> None:
        """Recount an hour once it has closed and store the exact counts.

        A replica's transaction can commit rows stamped before the cursor had passed them; the
        recount finds them and feeds them to the statistics as a late batch. Rows moved to a later
        hour by a newer revision drop out of this one, so each conversation counts once.
        """
        recount = range_counts(s, hour, hour + HOUR, self.rules_for)
        stored = {
            (r.agent_id, r.agent_version, r.signal): r
            for r in s.scalars(
                select(QualityCountRow).where(
                    QualityCountRow.hour == hour, QualityCountRow.signal.not_like(f"{OUTCOME}%")
                )
            )
        }
        late: dict[Key, tuple[int, int]] = {}
        for key, (n, x) in recount.items():
            row = stored.pop(key, None)
            if row is None:
                s.add(
                    QualityCountRow(agent_id=key[0], agent_version=key[1], signal=key[2], hour=hour, n=n, x=x)
                )
                late[key] = (n, x)
                continue
            if n > row.n or x > row.x:
                # a newer revision can turn a conversation already fed as a success into a failure;
                # the statistics only take the new conversations' failures (the stored count is exact)
                more = max(0, n - row.n)
                late[key] = (more, min(more, max(0, x - row.x)))
            row.n, row.x = n, x
        for row in stored.values():
            row.n, row.x = 0, 0
        if late:
            log.info("detector: %d series had rows committed after their hour was folded", len(late))
            self._apply(s, late, hour, hour + HOUR, now)

    def _apply(
        self,
        s: Session,
        inc: dict[Key, tuple[int, int]],
        a: datetime,
        b: datetime,
        now: datetime,
        at: datetime | None = None,
    ) -> None:
        """Fold a batch of counts of ``[a, b)`` into each series' CUSUMs; start and end detections.

        ``at`` is when the batch became known (default ``b``): outcome signals are fed after their
        hour settled, and their series must not look older than the version's other series.
        """
        if not inc:
            return
        series = self._series(s, inc, a if at is None else at)
        at = at or b
        baselines = self.baselines(s, now)
        started: list[Key] = []
        for key, (n, x) in inc.items():
            row = series[key]
            row.last_seen = max(aware(row.last_seen), at) if row.last_seen else at
            base = baselines.get(key)
            if base is None:
                row.statistics, row.baseline, row.baseline_rate = [], None, None
                if row.detection_id is None:
                    row.state = "warming_up"
                continue
            cusum = Cusum.design(
                base.rate, self.ratios, self.settings.detector_min_abs_shift, self.settings.detector_arl0
            )
            previous = list(row.statistics or []) if row.baseline == base.label else []
            stats = cusum.update(previous, n, x)
            row.statistics, row.baseline, row.baseline_rate = stats, base.label, base.rate
            if cusum.alarmed(stats) and row.detection_id is None:
                row.detection_id = self._start(s, row, max(stats), at)
                started.append(key)
            elif row.detection_id is not None and max(stats) == 0.0:
                self._end(s, row.detection_id, at, "recovered")
                row.detection_id = None
            row.state = "regressed" if row.detection_id is not None else "monitoring"
        m = self.metrics

        def count() -> None:
            for agent, version, signal in started:
                m.detections.labels(m.signal(signal), m.agent(agent), m.version(version)).inc()

        after_commit(s, count)

    def _start(self, s: Session, row: DetectorSeriesRow, statistic: float, at: datetime) -> int:
        n, x = self._totals(s, row.agent_id, row.agent_version, row.signal)
        det = DetectionRow(
            agent_id=row.agent_id,
            agent_version=row.agent_version,
            signal=row.signal,
            baseline=row.baseline or "",
            baseline_rate=row.baseline_rate or 0.0,
            rate=x / n if n else 0.0,
            observations=n,
            statistic=statistic,
            threshold=self.h,
            started_at=at,
        )
        s.add(det)
        s.flush()
        log.warning(
            "regression detected: %s %s %s rate %.4f vs baseline %.4f (%s)",
            row.agent_id,
            row.agent_version,
            row.signal,
            det.rate,
            det.baseline_rate,
            det.baseline,
        )
        return det.id

    @staticmethod
    def _end(s: Session, detection_id: int, at: datetime, reason: str) -> None:
        det = s.get(DetectionRow, detection_id)
        if det is not None and det.ended_at is None:
            det.ended_at, det.end_reason = at, reason

    def _retire(self, s: Session, now: datetime) -> None:
        cutoff = now - timedelta(hours=self.settings.detector_retire_hours)
        for row in s.scalars(
            select(DetectorSeriesRow).where(
                DetectorSeriesRow.detection_id.is_not(None), DetectorSeriesRow.last_seen < cutoff
            )
        ).all():
            self._end(s, row.detection_id, now, "retired")  # type: ignore[arg-type]
            row.detection_id, row.state = None, "monitoring"

    @staticmethod
    def _totals(s: Session, agent: str, version: str, signal: str) -> tuple[int, int]:
        n, x = s.execute(
            select(
                func.coalesce(func.sum(QualityCountRow.n), 0), func.coalesce(func.sum(QualityCountRow.x), 0)
            ).where(
                QualityCountRow.agent_id == agent,
                QualityCountRow.agent_version == version,
                QualityCountRow.signal == signal,
            )
        ).one()
        return int(n), int(x)

    # --- baselines ------------------------------------------------------------------------------

    def baselines(self, s: Session, now: datetime) -> dict[Key, Baseline]:
        """Each series' baseline: the agent's previous version, else the version's own older traffic.

        Versions are ordered by when the detector first saw them, then by name (versions that
        appear together, as in a canary that starts with the detector, compare in name order).
        """
        s_cfg = self.settings
        totals: dict[Key, tuple[int, int]] = {}
        first: dict[tuple[str, str], datetime] = {}
        q = select(
            QualityCountRow.agent_id,
            QualityCountRow.agent_version,
            QualityCountRow.signal,
            func.sum(QualityCountRow.n),
            func.sum(QualityCountRow.x),
            func.min(QualityCountRow.hour),
        ).group_by(QualityCountRow.agent_id, QualityCountRow.agent_version, QualityCountRow.signal)
        for agent, version, signal, n, x, _ in s.execute(q):
            totals[(agent, version, signal)] = (int(n), int(x))
        seen = select(
            DetectorSeriesRow.agent_id,
            DetectorSeriesRow.agent_version,
            func.min(DetectorSeriesRow.first_seen),
        ).group_by(DetectorSeriesRow.agent_id, DetectorSeriesRow.agent_version)
        for agent, version, when in s.execute(seen):
            first[(agent, version)] = aware(when)
        cutoff = now - timedelta(hours=s_cfg.detector_self_baseline_hours)
        own: dict[Key, tuple[int, int]] = {}
        q_old = q.where(QualityCountRow.hour < cutoff.replace(minute=0, second=0, microsecond=0))
        for agent, version, signal, n, x, _ in s.execute(q_old):
            own[(agent, version, signal)] = (int(n), int(x))
        order: dict[str, list[str]] = {}
        for agent, version in sorted(first, key=lambda av: (first[av], version_key(av[1]))):
            order.setdefault(agent, []).append(version)
        out: dict[Key, Baseline] = {}
        minimum = s_cfg.detector_min_baseline
        for agent, version, signal in totals:
            if (agent, version) not in first:
                continue
            position = order[agent].index(version)
            base: Baseline | None = None
            if position > 0:
                prev = order[agent][position - 1]
                n, x = totals.get((agent, prev, signal), (0, 0))
                if n >= minimum:
                    base = Baseline(
                        f"version:{prev}", upper_bound(min(x, n), n, s_cfg.detector_baseline_confidence)
                    )
            if base is None:
                n, x = own.get((agent, version, signal), (0, 0))
                if n >= minimum:
                    base = Baseline("self", upper_bound(min(x, n), n, s_cfg.detector_baseline_confidence))
            if base is not None:
                out[(agent, version, signal)] = base
        return out

    # --- export ---------------------------------------------------------------------------------

    def refresh(self, now: datetime | None = None) -> None:
        """Set the quality and detector gauges from the shared tables."""
        now = now or datetime.now(UTC)
        cutoff = now - timedelta(hours=self.settings.detector_retire_hours)
        m = self.metrics
        m.detector_threshold.set(self.h)
        with self.sessions() as s:
            live = {
                (r.agent_id, r.agent_version, r.signal): r
                for r in s.scalars(select(DetectorSeriesRow).where(DetectorSeriesRow.last_seen >= cutoff))
            }
            totals = {
                (a, v, sig): (int(n), int(x))
                for a, v, sig, n, x in s.execute(
                    select(
                        QualityCountRow.agent_id,
                        QualityCountRow.agent_version,
                        QualityCountRow.signal,
                        func.sum(QualityCountRow.n),
                        func.sum(QualityCountRow.x),
                    ).group_by(
                        QualityCountRow.agent_id, QualityCountRow.agent_version, QualityCountRow.signal
                    )
                )
            }
        # series whose labels fold into "other" share one set of gauges: their summed counts, the
        # largest statistic, and detected if any of them is (never one overwriting another)
        groups: dict[Key, list[Key]] = {}
        for key in live:
            groups.setdefault((m.signal(key[2]), m.agent(key[0]), m.version(key[1])), []).append(key)
        exported: set[Key] = set()
        for labels, keys in groups.items():
            exported.add(labels)
            counts = [totals.get(k, (0, 0)) for k in keys]
            n, x = sum(c[0] for c in counts), sum(min(c[1], c[0]) for c in counts)
            rows = [live[k] for k in keys]
            if n:
                low, high = proportion_confint(x, n, alpha=0.05, method="wilson")
                m.quality_rate.labels(*labels).set(x / n)
                m.quality_rate_lower.labels(*labels).set(float(low))
                m.quality_rate_upper.labels(*labels).set(float(high))
            m.quality_observations.labels(*labels).set(n)
            if len(rows) == 1 and rows[0].baseline_rate is not None:
                m.quality_baseline_rate.labels(*labels).set(rows[0].baseline_rate)
            else:
                with contextlib.suppress(KeyError):
                    m.quality_baseline_rate.remove(*labels)
            m.regression_detected.labels(*labels).set(1 if any(r.detection_id is not None for r in rows) else 0)
            m.detector_statistic.labels(*labels).set(max(max(r.statistics or [0.0]) for r in rows))
        for gone in self._exported - exported:
            for gauge in (
                m.quality_rate,
                m.quality_rate_lower,
                m.quality_rate_upper,
                m.quality_observations,
                m.quality_baseline_rate,
                m.regression_detected,
                m.detector_statistic,
            ):
                with contextlib.suppress(KeyError):
                    gauge.remove(*gone)
        self._exported = exported
        m.detector_last_run.set(now.timestamp())

    # --- running ----------------------------------------------------------------------------------

    def release(self) -> None:
        with self.sessions.begin() as s:
            lease.release(s, self.holder, datetime.now(UTC))
        self.is_leader = False
        self.metrics.detector_leader.set(0)

    def run(self, stop: threading.Event | None = None, once: bool = False) -> None:
        """Standalone loop (``vigil detector``) until ``stop`` is set."""
        stop = stop or self._stopping
        try:
            while True:
                self._safe_tick()
                if once or stop.wait(self.settings.detector_interval_seconds):
                    return
        finally:
            self.release()

    def _safe_tick(self) -> None:
        try:
            self.tick()
        except Exception:  # a failed pass (database away) is retried on the next one
            self.metrics.detector_ticks.labels("error").inc()
            log.exception("detector pass failed")

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.to_thread(self._safe_tick)
            await asyncio.sleep(self.settings.detector_interval_seconds)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        try:
            await asyncio.to_thread(self.release)
        except Exception:  # the lease simply expires if the database is gone
            log.debug("detector lease release failed", exc_info=True)
