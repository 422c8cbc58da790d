"""Server-rendered SVG charts of rates over time: a line with its interval band, points, alert markers.

Only geometry lives here (numbers and path strings); the template writes the SVG, escaping every label.
No script draws anything, so the pages keep their strict Content-Security-Policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 10, 26


@dataclass(frozen=True, slots=True)
class Point:
    """A bucket's rate with its interval (None when it holds no observations)."""

    at: datetime
    n: int
    x: int
    rate: float | None
    low: float | None
    high: float | None


@dataclass(frozen=True, slots=True)
class Span:
    """A detection drawn on the chart: from its start to its end (or the chart's right edge)."""

    start: datetime
    end: datetime | None
    label: str


@dataclass
class Drawn:
    """What the template needs to draw one chart."""

    line: str  # SVG path data of the rate (breaks over empty buckets)
    band: list[str]  # SVG polygon point lists of the interval, one per unbroken run
    dots: list[tuple[float, float, Point]]
    marks: list[tuple[float, float, Span]]  # x of start, width, the detection
    yticks: list[tuple[float, str]]
    xticks: list[tuple[float, str]]
    ymax: float
    width: int = WIDTH
    height: int = HEIGHT
    plot: tuple[int, int, int, int] = (LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM)
    empty: bool = field(default=False)


def nice_max(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10^k at or above ``value`` (at least 1%, at most 100%)."""
    if value <= 0.01:
        return 0.01
    step = 0.001
    while step < 1:
        for m in (1, 2, 2.5, 5):
            if m * step >= value:
                return min(1.0, m * step)
        step *= 10
    return 1.0


def pct(v: float) -> str:
    return f"{100 * v:.1f}%" if v < 0.1 else f"{100 * v:.0f}%"


def _xticks(since: datetime, until: datetime, x_of: object) -> list[tuple[float, str]]:
    span = until - since
    step = next((s for s in (timedelta(hours=h) for h in (1, 3, 6, 12, 24, 48, 96, 168)) if span / s <= 7), span)
    t = since.replace(minute=0, second=0, microsecond=0)
    if step >= timedelta(days=1):
        t = t.replace(hour=0)
    fmt = "%H:%M" if span <= timedelta(days=1) else "%b %d"
    out = []
    while t <= until:
        if t >= since:
            out.append((x_of(t), t.strftime(fmt)))  # type: ignore[operator]
        t += step
    return out


def draw(points: list[Point], spans: list[Span], since: datetime, until: datetime) -> Drawn:
    """Lay out ``points`` (ordered by time) and ``spans`` on a chart of ``[since, until)``."""
    x0, y0, x1, y1 = LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM
    total = max((until - since).total_seconds(), 1.0)
    top = nice_max(max((p.high or p.rate or 0.0 for p in points if p.rate is not None), default=0.0))

    def x_of(t: datetime) -> float:
        return round(x0 + (x1 - x0) * min(max((t - since).total_seconds() / total, 0.0), 1.0), 1)

    def y_of(v: float) -> float:
        return round(y1 - (y1 - y0) * min(v / top, 1.0), 1)

    runs: list[list[Point]] = [[]]
    for p in points:
        if p.rate is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append(p)
    runs = [r for r in runs if r]
    line = " ".join("M" + " L".join(f"{x_of(p.at)},{y_of(p.rate or 0.0)}" for p in run) for run in runs if len(run) > 0)
    band = [
        " ".join(
            [f"{x_of(p.at)},{y_of(p.high if p.high is not None else p.rate or 0.0)}" for p in run]
            + [f"{x_of(p.at)},{y_of(p.low if p.low is not None else p.rate or 0.0)}" for p in reversed(run)]
        )
        for run in runs
    ]
    dots = [(x_of(p.at), y_of(p.rate), p) for p in points if p.rate is not None]
    marks = []
    for s in spans:
        a = x_of(max(s.start, since))
        b = x_of(min(s.end, until)) if s.end else x1
        marks.append((a, max(b - a, 2.0), s))
    yticks = [(y_of(v), pct(v)) for v in (0.0, top / 2, top)]
    return Drawn(line, band, dots, marks, yticks, _xticks(since, until, x_of), top, empty=not dots)
