"""Fleiss' kappa of fail/pass labels carries a likelihood-ratio interval, not a percentile bootstrap.

The percentile bootstrap over items Vigil gave before covered the true kappa in as few as 81% of
simulated datasets at 20 items (mean 91%), worst when failures are rare, and gave no interval at all when
every item was agreed on; coverage lives in ``python -m bench.kappa_coverage`` and docs/benchmarks.md,
never in a test.

With two ratings an item Fleiss' kappa is Donner and Eliasziw's intraclass kappa and gets their
goodness-of-fit interval, checked on the published table of test_kappa_interval.py. With three or more,
the reference computation below is written independently of Vigil's: scipy's beta-binomial
(``scipy.stats.betabinom``, shape parameters a = p(1/ρ - 1), b = (1 - p)(1/ρ - 1)) for the likelihood, a
bounded scalar optimiser for its peak and Brent's method for where twice the log-likelihood has dropped by
chi-square's 95% point with one degree of freedom.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import brentq, minimize_scalar
from scipy.stats import betabinom

from vigil.calibration.stats import NO_SPREAD, beta_binomial_interval, fleiss, inter_rater

CHI2_95 = 3.841458820694124


def _table(counts: list[int]) -> np.ndarray:
    """Items × (fail, pass): ``counts[x]`` items on which x of m raters said fail."""
    m = len(counts) - 1
    fails = np.repeat(np.arange(m + 1), counts)
    return np.stack([fails, m - fails], 1).astype(float)


def _reference(counts: list[int]) -> tuple[float, float]:
    """The likelihood-ratio interval for rho > 0 from scipy's beta-binomial (p at its estimate)."""
    m = len(counts) - 1
    x = np.arange(m + 1)
    c = np.array(counts, dtype=float)
    p = float((c * x).sum() / (c.sum() * m))

    def loglik(rho: float) -> float:
        s = 1 / rho - 1
        return float((c * betabinom.logpmf(x, m, p * s, (1 - p) * s)).sum())

    peak = minimize_scalar(lambda r: -loglik(r), bounds=(1e-6, 1 - 1e-9), method="bounded", options={"xatol": 1e-12})
    top = max(-float(peak.fun), loglik(1 - 1e-12))

    def drop(rho: float) -> float:
        return 2 * (top - loglik(rho)) - CHI2_95

    low = brentq(drop, 1e-6, float(peak.x), xtol=1e-13)
    high = 1.0 if drop(1 - 1e-12) <= 0 else brentq(drop, float(peak.x), 1 - 1e-12, xtol=1e-13)
    return low, high


def test_three_raters_get_the_likelihood_ratio_interval() -> None:
    # 20 items, three reviewers each: 10 all pass, 4 one fail, 3 two fails, 3 all fail
    counts = [10, 4, 3, 3]
    k = fleiss(_table(counts))
    assert k.value == pytest.approx(1 - (7 * 2) / (20 * 3 * 2 * (19 / 60) * (41 / 60)))  # Fleiss' kappa by hand
    assert (k.low, k.high) == pytest.approx(_reference(counts), abs=1e-6)
    assert (k.low, k.high) == pytest.approx((0.157854, 0.734145), abs=1e-6)


def test_rare_failures_four_raters() -> None:
    counts = [30, 3, 1, 0, 2]  # 36 items, four reviewers: failures are 6% of the labels
    k = fleiss(_table(counts))
    assert k.low is not None and k.high is not None
    assert (k.low, k.high) == pytest.approx(_reference(counts), abs=1e-6)


def test_two_raters_an_item_get_donner_and_eliasziw() -> None:
    """The published table of Fleiss, Levin & Paik as pairs of ratings: 58 both fail, 16 split, 31 both
    pass; the intraclass kappa 0.6736597 and its goodness-of-fit interval [0.503239, 0.793946]."""
    k = fleiss(_table([31, 16, 58]))
    assert k.value == pytest.approx(0.6736597, abs=1e-7)
    assert (k.low, k.high) == pytest.approx((0.503239, 0.793946), abs=1e-6)


def test_every_item_agreed_on_has_an_interval_up_to_one() -> None:
    """17 items all pass, 3 all fail: before, no interval ("zero variance"), now [0.771558, 1]."""
    k = fleiss(_table([17, 0, 0, 3]))
    assert k.value == pytest.approx(1.0)
    assert k.high == 1.0 and k.note is None
    assert k.low == pytest.approx(_reference([17, 0, 0, 3])[0], abs=1e-6)
    assert k.low == pytest.approx(0.771558, abs=1e-6)
    items = {f"i{n}": [("ann", "fail"), ("bob", "fail"), ("cy", "fail")] for n in range(3)}
    items |= {f"j{n}": [("ann", "pass"), ("bob", "pass"), ("cy", "pass")] for n in range(17)}
    out = inter_rater(items)
    assert out["method"] == "fleiss" and out["kappa"]["low"] == pytest.approx(k.low)


def test_one_label_throughout_still_has_no_kappa() -> None:
    k = fleiss(_table([20, 0, 0, 0]))
    assert k.value is None and k.low is None and k.high is None


def test_three_categories_keep_the_bootstrap() -> None:
    rng = np.random.default_rng(7)
    table = rng.multinomial(3, [0.5, 0.3, 0.2], size=25).astype(float)
    k = fleiss(table)
    assert k.low is not None and k.high is not None and k.low <= k.value <= k.high
    assert fleiss(table) == k
    agreed = np.repeat(np.eye(3) * 3, [10, 8, 7], axis=0)  # every item agreed on, three categories
    assert fleiss(agreed).note == NO_SPREAD


def test_interval_properties_on_random_tables() -> None:
    rng = np.random.default_rng(11)
    for _ in range(150):
        m = int(rng.integers(2, 7))
        n = int(rng.integers(10, 80))
        counts = rng.multinomial(n, rng.dirichlet(np.ones(m + 1) * 0.7))
        if counts[0] == n or counts[m] == n:
            continue  # one label throughout
        k = fleiss(_table(list(counts)))
        assert k.value is not None and k.low is not None and k.high is not None, counts
        assert -1.0 <= k.low <= k.value <= k.high <= 1.0, counts
        assert k.low < k.high, counts
        assert fleiss(_table(list(counts))) == k  # deterministic


def _extended_loglik(counts: list[int], rho: float) -> float:
    """Prentice's extended beta-binomial (negative correlation allowed), p at its estimate, from its
    product formula."""
    m = len(counts) - 1
    p = sum(x * c for x, c in enumerate(counts)) / (sum(counts) * m)
    t = rho / (1 - rho)
    out = 0.0
    for x, c in enumerate(counts):
        if c:
            prob = math.comb(m, x) * math.prod(p + r * t for r in range(x))
            prob *= math.prod(1 - p + r * t for r in range(m - x)) / math.prod(1 + r * t for r in range(m))
            out += c * math.log(prob)
    return out


def test_negative_agreement_limits_are_where_the_likelihood_ratio_reaches_the_critical_value() -> None:
    counts = [2, 8, 8, 2]  # three raters split on most items: kappa below 0
    low, high = beta_binomial_interval(np.array(counts))
    k = fleiss(_table(counts))
    assert (k.low, k.high) == pytest.approx((low, high))
    assert -1 / 2 < low < k.value < 0 < high < 1
    peak = minimize_scalar(
        lambda r: -_extended_loglik(counts, r), bounds=(-0.3, 0.9), method="bounded", options={"xatol": 1e-12}
    )
    for limit in (low, high):
        assert 2 * (-float(peak.fun) - _extended_loglik(counts, limit)) == pytest.approx(CHI2_95, abs=1e-6)
