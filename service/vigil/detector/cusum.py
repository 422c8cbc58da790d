"""Bernoulli CUSUM on aggregated counts: the detector's statistics, free of I/O.

For a baseline failure rate ``p0`` and a shifted rate ``p1 > p0``, each conversation adds its
log-likelihood ratio: ``log(p1/p0)`` for a failure, ``log((1-p1)/(1-p0))`` otherwise. A batch of
``n`` conversations with ``x`` failures adds the sum. The statistic restarts at zero when the
evidence points to ``p0`` and alarms at ``h = log(ARL0 * m)``: Wald's bound keeps the mean run
between false alarms of each of the ``m`` CUSUMs (one per tuned shift) at least ``ARL0 * m``,
so together at least ``ARL0``. Page (1954); Lorden (1971) for the optimality of the delay
``≈ h / KL(p1 || p0)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

P_MAX = 0.999


def kl_bernoulli(p: float, q: float) -> float:
    """KL(Bernoulli(p) || Bernoulli(q)) in nats."""
    out = 0.0
    if p > 0:
        out += p * math.log(p / q)
    if p < 1:
        out += (1 - p) * math.log((1 - p) / (1 - q))
    return out


def threshold(arl0: float, cusums: int) -> float:
    return math.log(arl0 * cusums)


def upper_bound(x: int, n: int, confidence: float) -> float:
    """One-sided Wilson upper bound of a rate: a cautious baseline (never 0, so log ratios stay finite)."""
    z = NormalDist().inv_cdf(confidence)
    p = x / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return min(P_MAX, (centre + half) / (1 + z * z / n))


def shifted(p0: float, ratio: float, min_abs: float) -> float:
    return min(P_MAX, max(p0 * ratio, p0 + min_abs))


@dataclass(frozen=True, slots=True)
class Cusum:
    """CUSUMs for several shifts of one baseline; ``update`` folds in a batch's counts."""

    p0: float
    p1s: tuple[float, ...]
    h: float
    cap: float

    @classmethod
    def design(cls, p0: float, ratios: Sequence[float], min_abs: float, arl0: float, cap_factor: float = 1.5) -> Cusum:
        h = threshold(arl0, len(ratios))
        return cls(p0, tuple(shifted(p0, r, min_abs) for r in ratios), h, cap_factor * h)

    def weights(self) -> list[tuple[float, float]]:
        return [(math.log(p1 / self.p0), math.log((1 - p1) / (1 - self.p0))) for p1 in self.p1s]

    def update(self, stats: Sequence[float], n: int, x: int, flips: int = 0) -> list[float]:
        """New statistics after ``n`` observations with ``x`` failures (one per tuned shift).

        Failures always come with their observations: a batch of failures alone would read as a
        run of certain failures (the detector credits late outcomes to their conversations' hour
        instead). ``flips`` corrects observations fed before: that many successes turned failures
        (negative: failures turned successes), each adding the difference of the two ratios, so the
        sum is the one of the corrected outcomes. The cap bounds how long a fixed version takes to
        clear its alarm.
        """
        if not 0 <= x <= n:
            raise ValueError(f"a batch needs 0 <= failures <= observations, got {x} of {n}")
        if len(stats) != len(self.p1s):
            stats = [0.0] * len(self.p1s)
        return [
            min(self.cap, max(0.0, s + x * a + (n - x) * b + flips * (a - b)))
            for s, (a, b) in zip(stats, self.weights(), strict=True)
        ]

    def alarmed(self, stats: Sequence[float]) -> bool:
        return max(stats, default=0.0) >= self.h
