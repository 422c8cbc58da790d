"""Corrected failure rates: a judge of known sensitivity and specificity, simulated many times."""

from __future__ import annotations

import numpy as np
import pytest

from vigil.calibration.corrected import corrected_rate, rogan_gladen
from vigil.calibration.stats import agreement_from_counts

CASES = [
    # true rate, sensitivity, specificity, judged sample, labelled set
    (0.10, 0.85, 0.90, 2000, 300),
    (0.05, 0.80, 0.95, 3000, 400),
    (0.25, 0.90, 0.80, 1000, 200),
]


@pytest.mark.parametrize(("p", "se", "sp", "n_sample", "n_labels"), CASES)
def test_corrected_interval_covers_true_rate(p: float, se: float, sp: float, n_sample: int, n_labels: int) -> None:
    runs = 4000
    rng = np.random.default_rng(20240601)
    # production sample: only the judge's verdicts are seen
    truth = rng.random((runs, n_sample)) < p
    judged = np.where(truth, rng.random((runs, n_sample)) < se, rng.random((runs, n_sample)) < 1 - sp)
    q = judged.mean(axis=1)
    # an independent human-labelled set, judged too: measures the judge's errors
    h = rng.random((runs, n_labels)) < p
    j = np.where(h, rng.random((runs, n_labels)) < se, rng.random((runs, n_labels)) < 1 - sp)
    n_pos, n_neg = h.sum(axis=1), (~h).sum(axis=1)
    se_hat = (h & j).sum(axis=1) / n_pos
    sp_hat = (~h & ~j).sum(axis=1) / n_neg
    est, low, high = rogan_gladen(q, n_sample, se_hat, n_pos, sp_hat, n_neg)

    assert np.isfinite(est).all()
    coverage = float(((low <= p) & (p <= high)).mean())
    assert coverage >= 0.93, coverage
    # the raw judge rate is visibly biased; the corrected one is not
    raw_expected = se * p + (1 - sp) * (1 - p)
    assert abs(q.mean() - raw_expected) < 0.002
    assert abs(q.mean() - p) > 0.03
    assert abs(est.mean() - p) < 0.01
    # and the raw rate's own interval almost never covers the truth
    z = 1.96
    raw_half = z * np.sqrt(q * (1 - q) / n_sample)
    assert float(((q - raw_half <= p) & (p <= q + raw_half)).mean()) < 0.2


def test_corrected_interval_covers_when_few_labels_show_no_error() -> None:
    # 100 randomly labelled conversations at a 5% failure rate: about 5 failures, often all caught, so the
    # measured Se is 1 and its plain variance 0 (the interval then covered the truth in 82% of runs)
    p, se, sp, n_sample, n_labels, runs = 0.05, 0.95, 0.99, 5000, 100, 4000
    rng = np.random.default_rng(20240602)
    q = rng.binomial(n_sample, se * p + (1 - sp) * (1 - p), runs) / n_sample
    n_pos = rng.binomial(n_labels, p, runs)
    n_neg = n_labels - n_pos
    caught, cleared = rng.binomial(n_pos, se), rng.binomial(n_neg, sp)
    usable = n_pos > 0
    est, low, high = rogan_gladen(
        q[usable],
        n_sample,
        (caught / np.maximum(n_pos, 1))[usable],
        n_pos[usable],
        (cleared / n_neg)[usable],
        n_neg[usable],
    )
    corrected = np.isfinite(est)  # a lone labelled failure, missed, leaves no judge better than chance
    assert corrected.mean() > 0.95
    coverage = float(((low <= p) & (p <= high))[corrected].mean())
    assert coverage >= 0.93, coverage


def test_corrected_rate_from_measured_agreement() -> None:
    # judge fails 350 of 2000 sampled; on 300 labels: 40 of 50 failures caught, 225 of 250 passes right
    measured = agreement_from_counts(tp=40, fn=10, fp=25, tn=225)
    out = corrected_rate(350, 2000, measured)
    se, sp, q = 0.8, 0.9, 350 / 2000
    assert out.raw.value == pytest.approx(q)
    assert out.corrected is not None
    assert out.corrected.value == pytest.approx((q + sp - 1) / (se + sp - 1))
    assert out.corrected.low < out.corrected.value < out.corrected.high
    est = (q + sp - 1) / (se + sp - 1)
    z = 1.959963984540054

    def var_of(x: int, n: int) -> float:  # Agresti and Coull's
        r = (x + z * z / 2) / (n + z * z)
        return r * (1 - r) / (n + z * z)

    var = var_of(350, 2000) + est**2 * var_of(40, 50) + (1 - est) ** 2 * var_of(225, 250)
    var /= (se + sp - 1) ** 2
    assert out.corrected.high - out.corrected.value == pytest.approx(z * var**0.5)
    assert out.corrected.value < out.raw.low  # the judge over-reports here


@pytest.mark.parametrize(
    ("counts", "reason"),
    [
        ((0, 0, 0, 0), "no human labels"),
        ((10, 0, 0, 0), "both failures and non-failures"),
        ((5, 5, 6, 4), "no better than chance"),
    ],
)
def test_no_correction_without_a_usable_measurement(counts: tuple[int, int, int, int], reason: str) -> None:
    out = corrected_rate(20, 100, agreement_from_counts(*counts))
    assert out.corrected is None
    assert reason in (out.reason or "")
    assert out.raw.value == pytest.approx(0.2)
