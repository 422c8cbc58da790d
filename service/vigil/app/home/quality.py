"""Quality over time for one agent version: every signal's rate per time bucket, with intervals and alerts.

Reads the detector's hourly counts (one row per signal and hour, so a week is a few thousand rows at any
traffic volume) and the detections that overlap the range. A judge's failure rate comes twice: raw, on
its random sample, and corrected for the judge's measured errors (Rogan–Gladen) once reviewers' labels
measure them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from vigil.app.home.charts import Point, Span
from vigil.calibration.corrected import corrected_rate, rogan_gladen
from vigil.calibration.overview import Calibration
from vigil.calibration.stats import CONFIDENCE, Agreement, proportion
from vigil.detector.models import DetectionRow, DetectorSeriesRow, QualityCountRow
from vigil.runtime import Runtime
from vigil.store.db import aware
from vigil.store.models import VerdictRow
from vigil.store.signals import FORBIDDEN, OUTCOME, TOOL_ERROR, version_key

HOUR = timedelta(hours=1)
MAX_RANGE = timedelta(days=92)
MAX_POINTS = 100
RANGES = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
DEFAULT_RANGE = "7d"


class RangeError(ValueError):
    """A since/until the page cannot show (unreadable, reversed, or too long)."""


@dataclass
class Series:
    signal: str
    title: str
    kind: str  # rule | judge | judge_corrected | outcome
    points: list[Point]
    spans: list[Span] = field(default_factory=list)
    total: dict[str, Any] = field(default_factory=dict)  # rate, low, high, x, n over the range
    note: str | None = None


def parse_time(value: str | None, name: str) -> datetime | None:
    if not value:
        return None
    try:
        t = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise RangeError(f"{name} {value!r} is not a date and time (use 2026-11-24T00:00 or 2026-11-24)") from exc
    try:
        return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    except OverflowError:
        raise RangeError(f"{name} {value!r} falls outside the years 1 to 9999 in UTC") from None


def time_range(
    since: str | None, until: str | None, last: str | None, now: datetime
) -> tuple[datetime, datetime, str | None]:
    """``[since, until)`` from the page's parameters: explicit times win over a ``last`` preset (24h, 7d, 30d)."""
    end = parse_time(until, "until") or now
    start = parse_time(since, "since")
    preset = None
    if start is None:
        preset = last if last in RANGES else DEFAULT_RANGE
        if end - datetime.min.replace(tzinfo=UTC) < RANGES[preset]:  # the subtraction would overflow
            raise RangeError(f"until ({end:%Y-%m-%d %H:%M}) leaves no {preset} before it; give since too")
        start = end - RANGES[preset]
    if start >= end:
        raise RangeError(f"since ({start:%Y-%m-%d %H:%M}) must be before until ({end:%Y-%m-%d %H:%M})")
    if end - start > MAX_RANGE:
        raise RangeError(f"a chart covers at most {MAX_RANGE.days} days; narrow since/until")
    return start, end, preset if since is None and until is None else None


def bucket_for(span: timedelta) -> timedelta:
    """Hours per point: the smallest of 1, 2, 3, 6, 12, 24 that keeps a chart within MAX_POINTS points."""
    for h in (1, 2, 3, 6, 12, 24):
        if span / timedelta(hours=h) <= MAX_POINTS:
            return timedelta(hours=h)
    return timedelta(days=1)


def versions(s: Session) -> dict[str, list[str]]:
    """Agent → versions the detector counts, newest first."""
    out: dict[str, list[str]] = defaultdict(list)
    for agent, version in s.execute(select(DetectorSeriesRow.agent_id, DetectorSeriesRow.agent_version).distinct()):
        out[agent].append(version)
    return {a: sorted(vs, key=version_key, reverse=True) for a, vs in sorted(out.items())}


def kind_of(signal: str) -> str:
    if signal.startswith("judge:"):
        return "judge"
    if signal.startswith(OUTCOME):
        return "outcome"
    return "rule"


def title_of(signal: str, offline: set[bool] | None = None) -> str:
    """A chart's title; ``offline``: whether the judge's verdicts in the range were the offline judge's."""
    if signal == FORBIDDEN:
        return "Forbidden tool calls (any rule)"
    if signal == TOOL_ERROR:
        return "Tool errors"
    kind, _, name = signal.partition(":")
    if kind == "judge" and offline == {True}:
        return f"Offline judge {name}: failure rate"
    if kind == "judge" and offline == {True, False}:
        return f"Judge {name} (offline and model verdicts pooled): failure rate"
    return {"rule": f"Rule {name}", "judge": f"Judge {name}: failure rate", "outcome": f"Outcome {name}"}.get(
        kind, signal
    )


def judge_modes(s: Session, agent: str, version: str, judge: str, since: datetime, until: datetime) -> set[bool]:
    """Whether the judge's verdicts in the range came from the offline judge (True), the model (False) or both.

    The detector counts a judge's verdicts as one signal, so the chart must say which judge produced
    them. A judge changes mode only with its configuration, so the range's first and last verdicts
    (two index lookups) tell, without reading the verdicts between them.
    """
    base = select(VerdictRow.offline).where(
        VerdictRow.judge == judge,
        VerdictRow.agent_id == agent,
        VerdictRow.agent_version == version,
        VerdictRow.created_at >= since,
        VerdictRow.created_at < until,
    )
    ends = [s.scalar(base.order_by(col).limit(1)) for col in (VerdictRow.created_at, VerdictRow.created_at.desc())]
    return {bool(v) for v in ends if v is not None}


def total_of(x: int, n: int) -> dict[str, Any]:
    e = proportion(x, n)
    return {"rate": e.value, "low": e.low, "high": e.high, "x": x, "n": n}


def _points(counts: dict[datetime, tuple[int, int]], start: datetime, end: datetime, bucket: timedelta) -> list[Point]:
    """A point per bucket of ``[start, end)`` with its 95% Wilson interval (one vectorised call per series)."""
    times = []
    t = start
    while t < end:
        times.append(t)
        t += bucket
    n = np.array([counts.get(t, (0, 0))[0] for t in times], dtype=float)
    x = np.minimum(np.array([counts.get(t, (0, 0))[1] for t in times], dtype=float), n)
    seen = n > 0
    low, high = np.full(len(times), np.nan), np.full(len(times), np.nan)
    if seen.any():
        from statsmodels.stats.proportion import proportion_confint  # a second to import: when drawn

        low[seen], high[seen] = proportion_confint(x[seen], n[seen], alpha=1 - CONFIDENCE, method="wilson")
    return [
        Point(at, int(n[i]), int(x[i]), x[i] / n[i], float(low[i]), float(high[i]))
        if seen[i]
        else Point(at, 0, 0, None, None, None)
        for i, at in enumerate(times)
    ]


def _corrected(points: list[Point], measured: Agreement) -> list[Point]:
    """Each bucket's rate corrected for the judge's measured errors (vectorised Rogan–Gladen)."""
    n_pos, n_neg = measured.tp + measured.fn, measured.tn + measured.fp
    n = np.array([p.n for p in points], dtype=float)
    q = np.divide(np.array([min(p.x, p.n) for p in points], dtype=float), n, out=np.zeros(len(points)), where=n > 0)
    rate, low, high = rogan_gladen(q, n, measured.tp / n_pos, n_pos, measured.tn / n_neg, n_neg)
    return [
        Point(p.at, p.n, p.x, float(rate[i]), float(low[i]), float(high[i]))
        if p.n and not np.isnan(rate[i])
        else Point(p.at, p.n, p.x, None, None, None)
        for i, p in enumerate(points)
    ]


def spans(s: Session, agent: str, version: str, since: datetime, until: datetime) -> dict[str, list[Span]]:
    """Detections of this version overlapping the range, by signal."""
    q = select(DetectionRow).where(
        DetectionRow.agent_id == agent,
        DetectionRow.agent_version == version,
        DetectionRow.started_at < until,
        or_(DetectionRow.ended_at.is_(None), DetectionRow.ended_at >= since),
    )
    out: dict[str, list[Span]] = defaultdict(list)
    for d in s.scalars(q):
        label = f"alert #{d.id} from {aware(d.started_at):%Y-%m-%d %H:%M} UTC" + (
            f" to {aware(d.ended_at):%Y-%m-%d %H:%M} UTC" if d.ended_at else " (active)"
        )
        out[d.signal].append(Span(aware(d.started_at), aware(d.ended_at), label))
    return out


def quality(rt: Runtime, agent: str, version: str, since: datetime, until: datetime) -> list[Series]:
    """Every signal of ``agent``/``version`` over ``[since, until)`` (rules, then judges, then outcomes)."""
    bucket = bucket_for(until - since)
    start = since.replace(minute=0, second=0, microsecond=0)
    if bucket >= timedelta(days=1):
        start = start.replace(hour=0)
    q = select(QualityCountRow.signal, QualityCountRow.hour, QualityCountRow.n, QualityCountRow.x).where(
        QualityCountRow.agent_id == agent,
        QualityCountRow.agent_version == version,
        QualityCountRow.hour >= start,
        QualityCountRow.hour < until,
    )
    cal = rt.find(Calibration)
    with rt.sessions() as s:
        by_signal: dict[str, dict[datetime, tuple[int, int]]] = defaultdict(dict)
        for signal, hour, n, x in s.execute(q):
            at = start + bucket * ((aware(hour) - start) // bucket)
            cn, cx = by_signal[signal].get(at, (0, 0))
            by_signal[signal][at] = (cn + int(n), cx + int(x))
        alerts = spans(s, agent, version, since, until)
        judges = [sig for sig in by_signal if kind_of(sig) == "judge"]
        measured = {sig: cal.measured(s, sig.split(":", 1)[1]) if cal else None for sig in judges}
        modes = {sig: judge_modes(s, agent, version, sig.split(":", 1)[1], since, until) for sig in judges}
    out = []
    order = {"rule": 0, "judge": 1, "outcome": 2}
    for signal in sorted(by_signal, key=lambda sg: (order[kind_of(sg)], sg)):
        counts = by_signal[signal]
        n = sum(v[0] for v in counts.values())
        x = sum(v[1] for v in counts.values())
        points = _points(counts, start, until, bucket)
        kind = kind_of(signal)
        title = title_of(signal, modes.get(signal, set()))
        out.append(Series(signal, title, kind, points, alerts.get(signal, []), total_of(min(x, n), n)))
        if kind == "judge":
            m = measured.get(signal)
            corrected = corrected_rate(min(x, n), n, m) if n else None
            if m is None or corrected is None or corrected.corrected is None:
                reason = corrected.reason if corrected else "no sampled verdicts in this range"
                out[-1].note = f"No corrected rate: {reason or 'the judge is not measured yet'}."
                continue
            c = corrected.corrected
            out.append(
                Series(
                    signal,
                    title.replace("failure rate", "failure rate, corrected"),
                    "judge_corrected",
                    _corrected(points, m),
                    alerts.get(signal, []),
                    {"rate": c.value, "low": c.low, "high": c.high, "x": x, "n": n},
                    "Corrected for the judge's measured errors (Rogan–Gladen, delta-method interval).",
                )
            )
    return out


def as_json(series: list[Series]) -> list[dict[str, Any]]:
    return [
        {
            "signal": s.signal,
            "title": s.title,
            "kind": s.kind,
            "total": s.total,
            "note": s.note,
            "points": [
                {"at": p.at, "n": p.n, "x": p.x, "rate": p.rate, "low": p.low, "high": p.high} for p in s.points
            ],
            "alerts": [{"start": a.start, "end": a.end, "label": a.label} for a in s.spans],
        }
        for s in series
    ]
