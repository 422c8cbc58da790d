"""Agreement statistics between a judge and people, and between reviewers.

Every figure comes with a 95% interval from a maintained library rather than a hand-written formula:

- proportions (true-positive and true-negative rates, precision, percent agreement, position-bias rate):
  Wilson score intervals, ``statsmodels.stats.proportion.proportion_confint(method="wilson")``;
- Cohen's kappa: ``statsmodels.stats.inter_rater.cohens_kappa``; its interval on a 2x2 table (a judge
  or a reviewer against people, fail or pass) is Donner & Eliasziw's goodness-of-fit interval
  (:func:`goodness_of_fit_interval`, no library has it), on larger tables statsmodels' asymptotic one;
- Fleiss' kappa: ``statsmodels.stats.inter_rater.fleiss_kappa``; its interval on fail or pass (every item
  rated by the same number of reviewers) is the likelihood-ratio interval of the beta-binomial's intraclass
  correlation (:func:`beta_binomial_interval`, Donner & Eliasziw's approach carried to m raters), on three
  categories or more a percentile bootstrap over items (``scipy.stats.bootstrap``).

No kappa interval is valid on a handful of items (the asymptotic one assumes a large sample, a bootstrap
over three items has almost nothing to resample), and the asymptotic and bootstrap ones (left on three
categories or more) collapse to a single point when every item agrees: below :data:`MIN_KAPPA_INTERVAL_N`
items, or when the interval would have zero width, a kappa keeps its value but has no interval (``low``
and ``high`` None) and a ``note`` saying why.

The positive class is "fail": a true positive is a conversation both the judge and the human call a failure.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

CONFIDENCE = 0.95
MIN_KAPPA_INTERVAL_N = 10  # fewer items than this: a kappa has no interval
TOO_SMALL = "n too small"
NO_SPREAD = "no interval: zero variance"


@dataclass(frozen=True, slots=True)
class Estimate:
    """A point estimate with its 95% interval; ``value`` is None when the denominator is empty."""

    value: float | None
    low: float | None
    high: float | None
    count: int | None = None
    n: int = 0
    note: str | None = None  # why a value has no interval (only then in :meth:`as_dict`)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if out["note"] is None:
            del out["note"]
        return out


NONE = Estimate(None, None, None, 0, 0)


def proportion(count: int, n: int) -> Estimate:
    """``count / n`` with a Wilson score interval."""
    if n <= 0:
        return Estimate(None, None, None, count, 0)
    from statsmodels.stats.proportion import proportion_confint

    low, high = proportion_confint(count, n, alpha=1 - CONFIDENCE, method="wilson")
    return Estimate(count / n, float(low), float(high), count, n)


def cohens_kappa(table: np.ndarray) -> Estimate:
    """Cohen's kappa of a square contingency table (rows: one rater, columns: the other)."""
    n = int(table.sum())
    if n == 0:
        return Estimate(None, None, None, None, 0)
    expected = float((table.sum(0) * table.sum(1)).sum()) / n**2
    if expected >= 1.0:
        # both raters used one and the same category throughout: agreement beyond chance is undefined
        return Estimate(None, None, None, None, n)
    from statsmodels.stats.inter_rater import cohens_kappa as sm_kappa

    with np.errstate(divide="ignore", invalid="ignore"):  # its z statistic divides by zero at the extremes
        r = sm_kappa(table, return_results=True)
    kappa = float(r["kappa"])
    if n < MIN_KAPPA_INTERVAL_N:
        return Estimate(kappa, None, None, None, n, TOO_SMALL)
    if table.shape == (2, 2):
        low, high = goodness_of_fit_interval(int(table[0, 0]), int(table[0, 1] + table[1, 0]), int(table[1, 1]))
        if low - 1e-9 <= kappa <= high + 1e-9:
            return _interval(kappa, low, high, n)
        # the raters' "fail" rates differ too much for the common-correlation model: the large-sample
        # interval of Cohen's kappa itself (only on many items, where the difference can show)
    std = float(r["std_kappa"])
    if not np.isfinite(std):
        return Estimate(kappa, None, None, None, n)
    return _interval(kappa, float(r["kappa_low"]), float(r["kappa_upp"]), n)


CHI2_CRITICAL = NormalDist().inv_cdf((1 + CONFIDENCE) / 2) ** 2  # chi-square's 95% point, 1 df: 3.841


def goodness_of_fit_interval(both: int, one: int, neither: int) -> tuple[float, float]:
    """95% interval of a 2x2 kappa by Donner & Eliasziw's goodness-of-fit method.

    A. Donner and M. Eliasziw, "A goodness-of-fit approach to inference procedures for the kappa
    statistic: confidence interval construction, significance-testing and sample size estimation",
    Statistics in Medicine 11 (1992) 1511-1519. Under the common-correlation model (both raters say "fail"
    with probability p, their verdicts correlate by kappa) an item is rated fail by both, by one, or by
    neither with probabilities p² + p(1-p)κ, 2p(1-p)(1-κ) and (1-p)² + p(1-p)κ. With p at its estimate
    (2·both + one) / 2n, the interval is every κ that Pearson's chi-square test of the three counts
    against those probabilities does not reject at 5% (one degree of freedom): the two roots of
    chi-square(κ) = 3.841 around the estimate 1 - one / (2n·p(1-p)), which the paper writes as a
    cubic's roots; a limit is the end of κ's range when even that end fits (the upper one is 1 when no
    item is disagreed on). Unlike the asymptotic interval it has its nominal coverage on few items and
    at high agreement (bench/kappa_coverage.py), and it never collapses to a point.

    ``both``, ``one`` and ``neither``: the items both raters, exactly one, and neither called a failure;
    at least one item must be rated each way (p strictly between 0 and 1).
    """
    n = both + one + neither
    p = (2 * both + one) / (2 * n)
    if not 0 < p < 1:
        raise ValueError("a goodness-of-fit interval needs items rated both ways")
    s = p * (1 - p)
    estimate = 1 - one / (2 * n * s)

    def misfit(k: float) -> float:
        stat = float(-n)
        for count, prob in ((both, p * p + s * k), (one, 2 * s * (1 - k)), (neither, (1 - p) ** 2 + s * k)):
            if count:
                stat += count * count / (n * prob) if prob > 0 else math.inf
        return stat - CHI2_CRITICAL

    def limit(end: float) -> float:
        # the statistic is convex in κ, zero at the estimate and infinite where an observed cell's
        # probability reaches 0: one root between the estimate and each end, or none if the end fits
        if misfit(end) <= 0:
            return end
        return float(brentq(misfit, estimate, end, xtol=1e-12))

    from scipy.optimize import brentq

    lowest = max(-p / (1 - p), -(1 - p) / p) + 1e-12  # below it a concordant probability is negative
    return limit(lowest) if estimate > lowest else estimate, limit(1.0) if estimate < 1 else 1.0


def _interval(value: float, low: float, high: float, n: int) -> Estimate:
    """A kappa with its interval, or without one when the interval is a single point (or not a number)."""
    if not (np.isfinite(low) and np.isfinite(high)) or high - low <= 1e-12:
        return Estimate(value, None, None, None, n, NO_SPREAD)
    return Estimate(value, low, high, None, n)


@dataclass(frozen=True, slots=True)
class Agreement:
    """Judge against human on the same conversations; "fail" is the positive class."""

    tp: int
    fn: int
    fp: int
    tn: int
    tpr: Estimate  # sensitivity: judge says fail when the human does
    tnr: Estimate  # specificity: judge says pass when the human does
    precision: Estimate  # of the judge's fails, the share people confirm
    percent_agreement: Estimate
    kappa: Estimate

    @property
    def n(self) -> int:
        return self.tp + self.fn + self.fp + self.tn

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "confusion": {"tp": self.tp, "fn": self.fn, "fp": self.fp, "tn": self.tn},
            "tpr": self.tpr.as_dict(),
            "tnr": self.tnr.as_dict(),
            "precision": self.precision.as_dict(),
            "percent_agreement": self.percent_agreement.as_dict(),
            "kappa": self.kappa.as_dict(),
        }


def agreement_from_counts(tp: int, fn: int, fp: int, tn: int) -> Agreement:
    table = np.array([[tp, fn], [fp, tn]], dtype=float)  # rows: human fail/pass; columns: judge fail/pass
    return Agreement(
        tp,
        fn,
        fp,
        tn,
        proportion(tp, tp + fn),
        proportion(tn, tn + fp),
        proportion(tp, tp + fp),
        proportion(tp + tn, tp + fn + fp + tn),
        cohens_kappa(table),
    )


def agreement(human_fail: Sequence[bool], judge_fail: Sequence[bool]) -> Agreement:
    """Confusion matrix and agreement figures of paired binary verdicts."""
    if len(human_fail) != len(judge_fail):
        raise ValueError("human and judge verdicts must pair up")
    h = np.asarray(human_fail, dtype=bool)
    j = np.asarray(judge_fail, dtype=bool)
    return agreement_from_counts(int((h & j).sum()), int((h & ~j).sum()), int((~h & j).sum()), int((~h & ~j).sum()))


def fleiss(table: np.ndarray, resamples: int = 1000, seed: int = 0) -> Estimate:
    """Fleiss' kappa of an items × categories count table (every row the same number of ratings).

    Its interval on two categories (fail or pass, every item rated by the same number of reviewers) is
    :func:`goodness_of_fit_interval` with two ratings an item (Fleiss' kappa is then the intraclass kappa
    it is built around), :func:`beta_binomial_interval` with three or more; on three categories or more a
    percentile bootstrap over items (``resamples`` resamples, ``seed`` for reproducibility).
    """
    from scipy.stats import bootstrap
    from statsmodels.stats.inter_rater import fleiss_kappa

    n = table.shape[0]
    if n == 0:
        return Estimate(None, None, None, None, 0)
    totals = table.sum(0)
    if (totals > 0).sum() < 2:
        return Estimate(None, None, None, None, n)  # everyone always gave the same label
    value = float(fleiss_kappa(table))
    if n < MIN_KAPPA_INTERVAL_N:
        return Estimate(value, None, None, None, n, TOO_SMALL)
    raters = table.sum(1)
    if (totals > 0).sum() == 2 and (raters == raters[0]).all():
        first = table[:, np.flatnonzero(totals > 0)[0]].astype(int)
        counts = np.bincount(first, minlength=int(raters[0]) + 1)
        if len(counts) == 3:  # two ratings an item: Donner and Eliasziw's own interval
            low, high = goodness_of_fit_interval(int(counts[2]), int(counts[1]), int(counts[0]))
        else:
            low, high = beta_binomial_interval(counts)
        return _interval(value, min(low, value), max(high, value), n)  # the interval always holds kappa

    def stat(idx: np.ndarray) -> float:
        sub = table[idx.astype(int)]
        if (sub.sum(0) > 0).sum() < 2:
            return 1.0  # a resample where every rating fell in one category agrees perfectly
        return float(fleiss_kappa(sub))

    res = bootstrap(
        (np.arange(n),),
        stat,
        n_resamples=resamples,
        method="percentile",
        vectorized=False,
        confidence_level=CONFIDENCE,
        rng=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return _interval(value, float(ci.low), float(ci.high), n)


def beta_binomial_log_likelihood(counts: np.ndarray, p: float, rho: np.ndarray) -> np.ndarray:
    """Log-likelihood of ``counts[x]`` items rated "fail" by x of m raters, at each intraclass correlation in
    ``rho``, under the (extended) beta-binomial of mean ``p``: P(x) = C(m, x) · Π_{r<x} (p + rθ) ·
    Π_{r<m-x} (1 - p + rθ) / Π_{r<m} (1 + rθ), θ = ρ / (1 - ρ) (Prentice 1986; a beta-binomial for ρ > 0,
    defined down to θ = -min(p, 1 - p) / (m - 1)). -inf where an observed count has probability 0."""
    m = len(counts) - 1
    theta = np.asarray(rho, dtype=float)[..., None] / (1 - np.asarray(rho, dtype=float)[..., None])
    r = np.arange(m)
    with np.errstate(divide="ignore", invalid="ignore"):
        up = np.log(np.clip(p + r * theta, 0, None))  # log(p + rθ) for r < m
        down = np.log(np.clip(1 - p + r * theta, 0, None))
        norm = np.log1p(r * theta).sum(-1)
    out = np.zeros(theta.shape[:-1])
    for x in np.flatnonzero(counts):
        logp = math.log(math.comb(m, int(x))) + up[..., :x].sum(-1) + down[..., : m - x].sum(-1) - norm
        out = out + counts[x] * logp
    return np.where(np.isnan(out), -np.inf, out)


def beta_binomial_interval(counts: np.ndarray) -> tuple[float, float]:
    """95% likelihood-ratio interval of the intraclass kappa of binary ratings, m raters per item.

    ``counts[x]``: the items on which x of m raters said "fail" (m ≥ 2). Donner and Eliasziw's
    goodness-of-fit approach (:func:`goodness_of_fit_interval`) carried to m raters: under the
    common-correlation model an item's number of "fail" ratings is beta-binomial with mean p and intraclass
    correlation ρ (Fleiss' kappa estimates ρ); with p at its estimate, the interval is every ρ whose
    log-likelihood is within 3.841 / 2 of the highest (the likelihood-ratio test does not reject it at 5%,
    one degree of freedom), found by a grid and a root search on each side of the best ρ. A limit is the
    end of ρ's range when even that end fits (the upper one is 1 when every item is agreed on). In
    simulation (bench/kappa_coverage.py) it covers 90% or more in every cell from 20 items, where the
    percentile bootstrap covered 81%, and never collapses to a point.
    """
    from scipy.optimize import brentq

    counts = np.asarray(counts, dtype=float)
    m = len(counts) - 1
    n = counts.sum()
    p = float((counts * np.arange(m + 1)).sum() / (n * m))
    if m < 2 or not 0 < p < 1:
        raise ValueError("a beta-binomial interval needs two or more raters and items rated both ways")
    theta = -min(p, 1 - p) / (m - 1)
    lowest, highest = theta / (1 + theta) + 1e-12, 1 - 1e-12
    grid = np.linspace(lowest, highest, 401)
    ll = beta_binomial_log_likelihood(counts, p, grid)
    best = int(np.argmax(ll))
    top = float(ll[best])
    # refine the best ρ between its grid neighbours (the log-likelihood is smooth and single-peaked there)
    a, b = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    for _ in range(60):
        c, d = a + (b - a) / 3, b - (b - a) / 3
        if beta_binomial_log_likelihood(counts, p, np.array(c)) < beta_binomial_log_likelihood(counts, p, np.array(d)):
            a = c
        else:
            b = d
    mle = (a + b) / 2
    top = max(top, float(beta_binomial_log_likelihood(counts, p, np.array(mle))))

    def misfit(rho: float) -> float:
        return 2 * (top - float(beta_binomial_log_likelihood(counts, p, np.array(rho)))) - CHI2_CRITICAL

    def limit(end: float) -> float:
        if misfit(end) <= 0:
            return end
        return float(brentq(lambda r: min(misfit(r), 1e300), mle, end, xtol=1e-12))

    low, high = limit(lowest), limit(highest)
    return max(low, -1.0), 1.0 if high >= highest else high


def inter_rater(items: dict[str, list[tuple[str, str]]]) -> dict[str, Any]:
    """Agreement between reviewers on items with two or more labels.

    ``items`` maps an item to its ``(reviewer, label)`` pairs. With exactly two reviewers, who labelled
    the same items, this is Cohen's kappa between them; otherwise Fleiss' kappa, on the first ``k`` labels
    of every item, ``k`` the smallest number of labels any multi-labelled item has.
    """
    multi = {k: v for k, v in items.items() if len(v) >= 2}
    if not multi:
        return {
            "method": None,
            "items": 0,
            "reviewers": 0,
            "percent_agreement": NONE.as_dict(),
            "kappa": NONE.as_dict(),
        }
    reviewers = sorted({r for v in multi.values() for r, _ in v})
    categories = sorted({lab for v in multi.values() for _, lab in v})
    agreed = sum(1 for v in multi.values() if len({lab for _, lab in v}) == 1)
    out: dict[str, Any] = {
        "items": len(multi),
        "reviewers": len(reviewers),
        "categories": categories,
        "percent_agreement": proportion(agreed, len(multi)).as_dict(),
    }
    if len(reviewers) == 2 and all(len(v) == 2 and len({r for r, _ in v}) == 2 for v in multi.values()):
        index = {c: i for i, c in enumerate(categories)}
        table = np.zeros((len(categories), len(categories)))
        for v in multi.values():
            by = dict(v)
            table[index[by[reviewers[0]]], index[by[reviewers[1]]]] += 1
        out.update(method="cohen", kappa=cohens_kappa(table).as_dict())
        return out
    k = min(len(v) for v in multi.values())
    index = {c: i for i, c in enumerate(categories)}
    table = np.zeros((len(multi), len(categories)))
    for row, v in enumerate(multi.values()):
        for _, lab in v[:k]:
            table[row, index[lab]] += 1
    out.update(method="fleiss", raters_per_item=k, kappa=fleiss(table).as_dict())
    return out


def position_bias(first: Sequence[str | None], second: Sequence[str | None]) -> dict[str, Any]:
    """How often swapping the order of two answers changes a pairwise judge's choice.

    ``first`` and ``second`` are the choices (``a``, ``b`` or ``tie``, mapped back to the original
    labels) with the answers in their original and in swapped order; pairs with a missing choice
    (unscored) are left out.
    """
    pairs = [(a, b) for a, b in zip(first, second, strict=True) if a is not None and b is not None]
    flips = sum(1 for a, b in pairs if a != b)
    towards: Counter[str] = Counter()
    for a, b in pairs:
        if a != b:
            # in swapped order the answer shown first is b: preferring it in both orders means "first"
            towards["first" if (a, b) == ("a", "b") else "second" if (a, b) == ("b", "a") else "tie"] += 1
    return {
        "comparisons": len(pairs),
        "unscored": len(first) - len(pairs),
        "flips": flips,
        "rate": proportion(flips, len(pairs)).as_dict(),
        "favoured_position": dict(towards),
    }


THREE_WAY = ("a", "b", "tie")


def both_orders(first: Sequence[str | None], second: Sequence[str | None]) -> list[str | None]:
    """One choice from both orders: the answer chosen in both, a tie where the orders disagree."""
    return [None if a is None or b is None else a if a == b else "tie" for a, b in zip(first, second, strict=True)]


def three_way_agreement(human: Sequence[str | None], judge: Sequence[str | None]) -> dict[str, Any]:
    """A pairwise judge against human choices with ties: A / B / tie agreement and Cohen's kappa.

    Pairs where either side has no choice (unlabelled, unscored) are left out. The confusion table's rows
    are the judge's choices, its columns the human's.
    """
    pairs = [(h, j) for h, j in zip(human, judge, strict=True) if h in THREE_WAY and j in THREE_WAY]
    index = {c: i for i, c in enumerate(THREE_WAY)}
    table = np.zeros((3, 3))
    for h, j in pairs:
        table[index[j], index[h]] += 1
    n = len(pairs)
    return {
        "n": n,
        "left_out": len(human) - n,
        "confusion": {j: {h: int(table[index[j], index[h]]) for h in THREE_WAY} for j in THREE_WAY},
        "percent_agreement": proportion(int(np.trace(table)), n).as_dict(),
        "kappa": cohens_kappa(table).as_dict(),
        "ties": {"human": sum(1 for h, _ in pairs if h == "tie"), "judge": sum(1 for _, j in pairs if j == "tie")},
    }
