"""Failure rates corrected for the judge's measured errors (Rogan–Gladen, delta-method interval).

A judge with sensitivity ``Se`` and specificity ``Sp`` reports failures at the rate
``q = Se·p + (1 − Sp)·(1 − p)`` when the true failure rate is ``p``; so ``p = (q + Sp − 1) / (Se + Sp − 1)``
(Rogan & Gladen, 1978). ``q`` comes from the judge's verdicts on the random sample of production traffic;
``Se`` and ``Sp`` from the human-labelled conversations. The interval is the delta-method (Greenland, 1996)
one, which accounts for the sampling error of all three estimates:

    Var(p) ≈ [Var(q) + p²·Var(Se) + (1 − p)²·Var(Sp)] / (Se + Sp − 1)²

clipped to [0, 1]. Each variance is Agresti and Coull's, ``r̃(1 − r̃)/(n + z²)`` with ``r̃ = (x + z²/2)/(n + z²)``:
the plain ``r(1 − r)/n`` is 0 when a few labels show no miss or no false alarm (5 failures labelled, all
caught: Se = 1 "exactly"), and with 100 labelled conversations, 5% failing, Se 0.95 and Sp 0.99 the
interval then covered the true rate in 82% of 4,000 runs. It needs a judge better than chance
(``Se + Sp > 1``); otherwise no correction is possible and the report says so. The functions take NumPy
arrays as well as scalars, so a simulation can check the interval's coverage over many repetitions at
once (tests/calibration/test_calibration_corrected.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from vigil.calibration.stats import CONFIDENCE, Agreement, Estimate, proportion

METHOD = "rogan-gladen with delta-method interval"


def rogan_gladen(
    q: Any, n_q: Any, se: Any, n_pos: Any, sp: Any, n_neg: Any, confidence: float = CONFIDENCE
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Corrected rate, low and high bound (vectorised over the rates and counts; ``confidence`` is one level).
    NaN where ``Se + Sp <= 1`` or a count is zero."""
    q, se, sp = (np.asarray(x, dtype=float) for x in (q, se, sp))
    n_q, n_pos, n_neg = (np.asarray(x, dtype=float) for x in (n_q, n_pos, n_neg))
    with np.errstate(divide="ignore", invalid="ignore"):
        youden = se + sp - 1
        valid = (youden > 0) & (n_q > 0) & (n_pos > 0) & (n_neg > 0)
        p = np.clip((q + sp - 1) / youden, 0.0, 1.0)
        z = NormalDist().inv_cdf(0.5 + confidence / 2)
        var = _variance(q, n_q, z) + p**2 * _variance(se, n_pos, z) + (1 - p) ** 2 * _variance(sp, n_neg, z)
        var = var / youden**2
        half = z * np.sqrt(var)
        low = np.clip(p - half, 0.0, 1.0)
        high = np.clip(p + half, 0.0, 1.0)
    nan = np.nan
    return np.where(valid, p, nan), np.where(valid, low, nan), np.where(valid, high, nan)


def _variance(rate: np.ndarray, n: np.ndarray, z: float) -> np.ndarray:
    """Agresti and Coull's variance of a proportion: never 0 for a rate of 0 or 1 measured on few items."""
    adjusted = (rate * n + z * z / 2) / (n + z * z)
    return adjusted * (1 - adjusted) / (n + z * z)


@dataclass(frozen=True, slots=True)
class CorrectedRate:
    raw: Estimate  # the judge's failure share on the sample, Wilson interval
    corrected: Estimate | None
    reason: str | None  # why there is no corrected figure

    def as_dict(self) -> dict[str, Any]:
        return {
            "raw": self.raw.as_dict(),
            "corrected": self.corrected.as_dict() if self.corrected else None,
            "method": METHOD,
            "reason": self.reason,
        }


def corrected_rate(judge_fails: int, judged: int, measured: Agreement | None) -> CorrectedRate:
    """The raw judge failure rate on ``judged`` sampled conversations and its corrected counterpart."""
    raw = proportion(judge_fails, judged)
    if judged == 0:
        return CorrectedRate(raw, None, "no sampled verdicts")
    if measured is None or measured.n == 0:
        return CorrectedRate(raw, None, "no human labels to measure the judge's errors")
    n_pos, n_neg = measured.tp + measured.fn, measured.tn + measured.fp
    if n_pos == 0 or n_neg == 0:
        return CorrectedRate(raw, None, "human labels need both failures and non-failures")
    se, sp = measured.tp / n_pos, measured.tn / n_neg
    if se + sp <= 1:
        return CorrectedRate(raw, None, "the judge does no better than chance on the labels (TPR + TNR ≤ 1)")
    p, low, high = rogan_gladen(judge_fails / judged, judged, se, n_pos, sp, n_neg)
    return CorrectedRate(raw, Estimate(float(p), float(low), float(high), None, judged), None)
