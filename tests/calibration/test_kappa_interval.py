"""Cohen's kappa of a 2x2 table carries Donner & Eliasziw's (1992) goodness-of-fit interval.

The asymptotic interval Vigil gave before covered the true kappa in 91-94% of simulated datasets at
n >= 20 and far less at low prevalence, and gave no interval at all whenever every item agreed; coverage
lives in ``python -m bench.kappa_coverage`` and docs/benchmarks.md, never in a test.

The worked example is the 2x2 table of Fleiss, Levin & Paik (Statistical Methods for Rates and
Proportions, 3rd ed., 2003), as published with R's statpsych ``ci.kappa(.05, 31, 12, 4, 58)``: 58 items
both raters call positive, 31 both negative, 12 and 4 split. Published there: Cohen's kappa 0.6756757 with
the asymptotic interval [0.5317210, 0.8196303] (what statsmodels, and Vigil before, gave), and the
intraclass kappa 0.6736597, the estimate the goodness-of-fit interval is built around. Its limits,
[0.503239, 0.793946], are the roots of the paper's cubic (its closed-form trigonometric solution gives
the same to 1e-12); the test also checks them against the definition, where Pearson's chi-square of the
three counts equals chi-square's 95% point with one degree of freedom.
"""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.inter_rater import cohens_kappa as sm_kappa

from vigil.calibration.stats import (
    NO_SPREAD,
    agreement_from_counts,
    cohens_kappa,
    goodness_of_fit_interval,
    three_way_agreement,
)

CHI2_95 = 3.841458820694124  # chi-square, 1 degree of freedom, 95th percentile


def _pearson(both: int, one: int, neither: int, kappa: float) -> float:
    """The goodness-of-fit statistic at ``kappa``, written out from the paper's model."""
    n = both + one + neither
    p = (2 * both + one) / (2 * n)
    q = 1 - p
    expected = [n * (p * p + p * q * kappa), n * 2 * p * q * (1 - kappa), n * (q * q + p * q * kappa)]
    return sum((o - e) ** 2 / e for o, e in zip((both, one, neither), expected, strict=True))


def test_published_table_gets_the_goodness_of_fit_interval() -> None:
    k = agreement_from_counts(58, 4, 12, 31).kappa  # tp, fn, fp, tn
    assert k.value == pytest.approx(0.6756757, abs=1e-7)  # published Cohen's kappa
    assert (k.low, k.high) == pytest.approx((0.503239, 0.793946), abs=1e-6)
    # not the asymptotic interval published for the same table
    assert (k.low, k.high) != pytest.approx((0.5317210, 0.8196303), abs=1e-3)
    low, high = goodness_of_fit_interval(58, 16, 31)
    assert _pearson(58, 16, 31, low) == pytest.approx(CHI2_95, abs=1e-6)
    assert _pearson(58, 16, 31, high) == pytest.approx(CHI2_95, abs=1e-6)
    # the intraclass estimate it is built around, as published
    intraclass = 1 - 16 / (2 * 105 * (132 / 210) * (78 / 210))
    assert intraclass == pytest.approx(0.6736597, abs=1e-7)


def test_perfect_agreement_has_an_interval_up_to_one() -> None:
    """15 items both fail, 15 both pass: with p = 1/2 the statistic is n·(u/2)/(1 - u/2) for kappa = 1 - u,
    so the lower limit is 1 - 2·3.8415/(30 + 3.8415) = 0.772973; before, no interval ("zero variance")."""
    k = agreement_from_counts(15, 0, 0, 15).kappa
    assert k.value == pytest.approx(1.0) and k.note is None
    assert k.low == pytest.approx(1 - 2 * CHI2_95 / (30 + CHI2_95), abs=1e-9) and k.high == 1.0
    assert k.note != NO_SPREAD


def test_rare_failures_get_an_interval_that_stays_in_range() -> None:
    """2 failures in 40 by each rater, one the same: the asymptotic interval was [-0.148, 1.095], past 1."""
    k = agreement_from_counts(1, 1, 1, 37).kappa
    assert k.low is not None and k.high is not None
    assert -1 <= k.low < k.value < k.high <= 1
    assert _pearson(1, 2, 37, k.low) == pytest.approx(CHI2_95, abs=1e-6)


def test_raters_far_apart_fall_back_to_the_asymptotic_interval() -> None:
    """The judge says fail half as often as people on 10,000 items: Cohen's kappa (0.545) lies above the
    intraclass interval, whose model assumes one fail rate, so the asymptotic interval is given."""
    table = np.array([[2000.0, 2000.0], [0.0, 6000.0]])
    low, high = goodness_of_fit_interval(2000, 2000, 6000)
    k = cohens_kappa(table)
    assert k.value is not None and k.value > high
    r = sm_kappa(table, return_results=True)
    assert (k.low, k.high) == pytest.approx((r["kappa_low"], r["kappa_upp"]))


def test_three_way_tables_keep_the_asymptotic_interval() -> None:
    human = ["a"] * 20 + ["b"] * 20 + ["tie"] * 10
    judge = ["a"] * 16 + ["b"] * 4 + ["b"] * 17 + ["tie"] * 3 + ["tie"] * 6 + ["a"] * 4
    out = three_way_agreement(human, judge)["kappa"]
    table = np.zeros((3, 3))
    index = {"a": 0, "b": 1, "tie": 2}
    for h, j in zip(human, judge, strict=True):
        table[index[j], index[h]] += 1
    r = sm_kappa(table, return_results=True)
    assert (out["low"], out["high"]) == pytest.approx((r["kappa_low"], r["kappa_upp"]))


@pytest.mark.parametrize("counts", [(0, 0, 12), (12, 0, 0)])
def test_one_label_throughout_has_no_goodness_of_fit_interval(counts: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="rated both ways"):
        goodness_of_fit_interval(*counts)
    assert agreement_from_counts(counts[0], 0, 0, counts[2]).kappa.value is None
