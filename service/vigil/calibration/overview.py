"""What the API, the UI and the CLI show per judge: state, agreement per version, raw and corrected rates.

A judge version is calibrated when either of its measurements qualifies (see :func:`report.state_of`): the
live review queue, or the latest labelled-set run (``vigil calibrate``). Corrected rates use the judge's
errors measured on review labels (random-sample items only, unless
``VIGIL_CALIBRATION_CORRECTION_LABELS=all``),
else on the latest labelled-set run; rates of an uncalibrated version carry ``calibrated: false``.

The offline judge (no provider key) shares its name and version with the model it stands in for, so every
figure is of the judge's current *mode* only: with the model live, verdicts of the model and runs of
``vigil calibrate`` that called it (or measured a verdicts file); with the offline judge, its own
verdicts and runs. An offline run never makes the model's judge calibrated.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from vigil.calibration import live
from vigil.calibration.corrected import corrected_rate
from vigil.calibration.models import CalibrationRunRow
from vigil.calibration.report import (
    CALIBRATED,
    UNCALIBRATED,
    Pair,
    Thresholds,
    by_version,
    measure,
    state_of,
    version_key,
    version_report,
)
from vigil.calibration.stats import Agreement, agreement_from_counts, position_bias
from vigil.schema import host_now
from vigil.settings import Settings
from vigil.store.models import PairwiseRow, VerdictRow
from vigil.store.reads import LabelWindow
from vigil.store.rollups import default_since

LIVE, OFFLINE = "live", "offline"
# calibration_runs.mode values that measure each judge mode ("verdicts": a file of the model's verdicts)
RUN_MODES = {LIVE: ("live", "verdicts"), OFFLINE: ("offline",)}


@dataclass
class Calibration:
    """Per-process view over the stored labels, verdicts and runs.

    ``current`` maps judge → its version, ``modes`` judge → ``live`` or ``offline`` (a judge this process
    does not define counts as live).
    """

    settings: Settings
    current: dict[str, str]
    modes: dict[str, str] = field(default_factory=dict)
    now: Callable[[], datetime] = host_now  # the database's clock, without a query (Runtime.now)

    def mode_of(self, judge: str) -> str:
        return self.modes.get(judge, LIVE)

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(self.settings.calibration_min_labels, self.settings.calibration_min_kappa)

    @property
    def max_pairs(self) -> int:
        return self.settings.calibration_max_pairs

    def judge_names(self, session: Session) -> list[str]:
        seen = set(self.current)
        # one index look-up per judge (the judge-led index, in order), not a scan of every verdict
        name = session.scalar(select(func.min(VerdictRow.judge)))
        while name is not None:
            seen.add(name)
            name = session.scalar(select(func.min(VerdictRow.judge)).where(VerdictRow.judge > name))
        seen.update(session.scalars(select(CalibrationRunRow.judge).distinct()).all())
        return sorted(seen)

    def latest_runs(self, session: Session, judge: str) -> dict[str, CalibrationRunRow]:
        rows = session.scalars(
            select(CalibrationRunRow)
            .where(
                CalibrationRunRow.judge == judge,
                CalibrationRunRow.mode.in_(RUN_MODES[self.mode_of(judge)]),
            )
            .order_by(CalibrationRunRow.id)
        ).all()
        return {r.judge_version: r for r in rows}  # the last run of each version wins

    @property
    def rates_since(self) -> datetime | None:
        """Raw and corrected production rates cover the verdicts of the read window (``VIGIL_READ_WINDOW_DAYS``)."""
        return default_since(self.settings.read_window_days, self.now())

    def judge(self, session: Session, name: str) -> dict[str, Any]:
        """The full calibration report of one judge."""
        return self._report(session, name, with_rates=True)[0]

    def state(self, session: Session, name: str) -> tuple[dict[str, Any], Agreement | None]:
        """The report without production rates and position bias (the state, agreement per version, what
        the current version's errors were measured on), and the current version's measured errors: what
        other stages' answers carry, which bring their own counts to correct. For a judge this process does
        not define, the head is its newest version with labels or a labelled-set run."""
        return self._report(session, name, with_rates=False)

    def _report(self, session: Session, name: str, with_rates: bool) -> tuple[dict[str, Any], Agreement | None]:
        t = self.thresholds
        mode = self.mode_of(name)
        offline = mode == OFFLINE
        pairs, window = live.live_pairs_window(session, name, offline=offline, max_pairs=self.max_pairs)
        queue = by_version(pairs.get(name, []))
        only_sampled = self.settings.calibration_correction_labels == "sampled"
        measuring = (
            by_version(live.live_pairs(session, name, True, offline, self.max_pairs).get(name, []))
            if only_sampled
            else queue
        )
        runs = self.latest_runs(session, name)
        rates: dict[str, list[dict[str, Any]]] = defaultdict(list)
        bias: dict[str, dict[str, Any]] = {}
        if with_rates:
            for r in live.sampled_rates(session, name, offline, self.rates_since):
                rates[r["judge_version"]].append(r)
            bias = self.position_bias(session, name, offline)
        versions = set(queue) | set(runs) | set(rates) | set(bias)
        if name in self.current:
            versions.add(self.current[name])
        out = [
            self._version(v, queue.get(v, []), measuring.get(v, []), runs.get(v), rates.get(v, []), bias.get(v))
            for v in sorted(versions, key=version_key)
        ]
        cur = self.current.get(name)
        head = next((v for v in out if v[0]["judge_version"] == cur), out[-1] if out else None)
        report = {
            "judge": name,
            "current_version": cur,
            "defined": name in self.current,
            "mode": mode,
            "state": head[0]["state"] if head else UNCALIBRATED,
            "state_reason": head[0]["state_reason"] if head else "no labels yet",
            "thresholds": {"min_labels": t.min_labels, "min_kappa": t.min_kappa},
            "correction_labels": self.settings.calibration_correction_labels,
            "rates_since": self.rates_since if with_rates else None,
            # the review-queue measurements read the newest VIGIL_CALIBRATION_MAX_PAIRS labels only
            **(window or LabelWindow(0, False, self.max_pairs)).as_dict("max_pairs"),
            "versions": [v for v, _ in out],
        }
        return report, head[1] if head else None

    def _version(
        self,
        version: str,
        queue: list[Pair],
        measuring: list[Pair],
        run: CalibrationRunRow | None,
        rates: list[dict[str, Any]],
        bias: dict[str, Any] | None,
    ) -> tuple[dict[str, Any], Agreement | None]:
        t = self.thresholds
        from_queue = version_report(version, queue, t) if queue else None
        from_set = None
        if run is not None:
            from_set = {
                **run.report,
                "source": run.source,
                "mode": run.mode,
                "run_id": run.id,
                "created_at": run.created_at,
            }
        states = [r for r in (from_queue, from_set) if r]
        good = next((r for r in states if r["state"] == CALIBRATED), None)
        if good is not None:
            state, reason = (
                CALIBRATED,
                f"{good['state_reason']} ({'review queue' if good is from_queue else 'labelled set'})",
            )
        elif states:
            state, reason = (
                UNCALIBRATED,
                "; ".join(
                    f"{'review queue' if r is from_queue else 'labelled set'}: {r['state_reason']}" for r in states
                ),
            )
        else:
            state, reason = state_of(None, t)
        measured, measured_on = self._measurement(measuring, run)
        report = {
            "judge_version": version,
            "state": state,
            "state_reason": reason,
            "review_queue": from_queue,
            "labelled_set": from_set,
            "position_bias": bias,
            "measured_on": measured_on,
            "rates": [
                {
                    "agent_id": r["agent_id"],
                    "agent_version": r["agent_version"],
                    "calibrated": state == CALIBRATED,
                    **corrected_rate(r["fail"], r["judged"], measured).as_dict(),
                }
                for r in rates
            ],
        }
        return report, measured

    def measured(self, session: Session, name: str) -> Agreement | None:
        """The current version's measured errors, which correct its rates (None until labels measure them)."""
        offline = self.mode_of(name) == OFFLINE
        only_sampled = self.settings.calibration_correction_labels == "sampled"
        pairs = by_version(live.live_pairs(session, name, only_sampled, offline, self.max_pairs).get(name, []))
        versions = set(pairs) | set(self.latest_runs(session, name))
        current = self.current.get(name) or max(versions, key=version_key, default=None)
        if current is None:
            return None
        return self._measurement(pairs.get(current, []), self.latest_runs(session, name).get(current))[0]

    def _measurement(self, measuring: list[Pair], run: CalibrationRunRow | None) -> tuple[Agreement | None, str | None]:
        if measuring:
            m = measure(measuring)
            if m.tp + m.fn > 0 and m.tn + m.fp > 0:
                return m, f"review queue ({self.settings.calibration_correction_labels} labels)"
        if run is not None:
            c = run.report.get("agreement", {}).get("confusion")
            if c:
                return agreement_from_counts(c["tp"], c["fn"], c["fp"], c["tn"]), f"labelled set {run.source}"
        return None, None

    @staticmethod
    def position_bias(session: Session, judge: str, offline: bool = False) -> dict[str, dict[str, Any]]:
        rows = session.execute(
            select(PairwiseRow.judge_version, PairwiseRow.first_choice, PairwiseRow.second_choice).where(
                PairwiseRow.judge == judge, PairwiseRow.offline.is_(offline)
            )
        ).all()
        grouped: dict[str, tuple[list[str | None], list[str | None]]] = defaultdict(lambda: ([], []))
        for version, first, second in rows:
            grouped[version][0].append(first)
            grouped[version][1].append(second)
        return {v: position_bias(f, s) for v, (f, s) in grouped.items()}

    def overview(self, session: Session) -> dict[str, Any]:
        """Every judge's current state and rates, plus agreement between reviewers."""
        judges = []
        for name in self.judge_names(session):
            full = self.judge(session, name)
            head = next(
                (v for v in full["versions"] if v["judge_version"] == full["current_version"]),
                full["versions"][-1] if full["versions"] else None,
            )
            judges.append(
                {k: full[k] for k in ("judge", "current_version", "defined", "mode", "state", "state_reason")}
                | {k: full[k] for k in ("labels_considered", "bounded", "max_pairs")}
                | {"version": head}
            )
        return {
            "judges": judges,
            "inter_reviewer": live.inter_reviewer(session, self.settings.agreement_max_labels),
            "thresholds": {"min_labels": self.thresholds.min_labels, "min_kappa": self.thresholds.min_kappa},
        }


def save_run(session: Session, judge: str, source: str, mode: str, result: dict[str, Any]) -> list[int]:
    """Store each version's part of a ``vigil calibrate`` report; returns the run ids.

    ``mode`` is the report's: ``offline`` runs count only while the judge runs offline (see the module).
    """
    ids = []
    for v in result["versions"]:
        row = CalibrationRunRow(
            judge=judge,
            judge_version=v["judge_version"],
            source=source,
            mode=mode,
            labels=v["agreement"]["n"],
            kappa=v["agreement"]["kappa"]["value"],
            state=v["state"],
            report=v,
        )
        session.add(row)
        session.flush()
        ids.append(row.id)
    return ids
