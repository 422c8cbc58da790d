"""Interval estimates and pass@k: the statistics behind the compare table, free of I/O.

Rates use Wilson score intervals and their differences Newcombe's hybrid score interval
(statsmodels). Means use Student's t interval and their differences Welch's (unequal variances,
Welch-Satterthwaite degrees of freedom): closed forms, exact for normal data and close to a
bootstrap's at the compare sample sizes, at a fraction of its cost. The 95th percentile has no
such form: it uses a percentile bootstrap (vectorised numpy) with a fixed seed so the same data
always gives the same table. Each difference also carries a two-sided p-value (the score test for
rates, Welch's t test for means, a normal approximation with the bootstrap standard error for the
95th percentile) so the compare table can correct its verdicts for testing many signals at once.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05
SEED = 20240611


@dataclass(frozen=True, slots=True)
class Estimate:
    value: float | None
    low: float | None
    high: float | None
    n: int
    x: int | None = None
    p_value: float | None = None  # of a difference: two-sided, against "no difference"
    se: float | None = None  # standard error, where the interval comes from one (paired, task-clustered)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"value": self.value, "low": self.low, "high": self.high, "n": self.n}
        if self.x is not None:
            out["x"] = self.x
        if self.se is not None:
            out["se"] = self.se
        if self.p_value is not None:
            out["p_value"] = self.p_value
        return out


def rate(x: int, n: int) -> Estimate:
    """A proportion with its 95% Wilson interval."""
    if n <= 0:
        return Estimate(None, None, None, 0, 0)
    from statsmodels.stats.proportion import proportion_confint  # scipy and statsmodels: imported when used

    low, high = proportion_confint(x, n, alpha=ALPHA, method="wilson")
    return Estimate(x / n, float(low), float(high), n, x)


def rate_difference(candidate: Estimate, baseline: Estimate) -> Estimate:
    """Candidate minus baseline with Newcombe's hybrid score (Wilson) interval."""
    if not candidate.n or not baseline.n:
        return Estimate(None, None, None, 0)
    assert candidate.x is not None and baseline.x is not None
    from statsmodels.stats.proportion import confint_proportions_2indep

    low, high = confint_proportions_2indep(
        candidate.x, candidate.n, baseline.x, baseline.n, method="newcomb", compare="diff", alpha=ALPHA
    )
    return Estimate(
        candidate.x / candidate.n - baseline.x / baseline.n,
        float(low),
        float(high),
        candidate.n + baseline.n,
        p_value=_rate_p_value(candidate.x, candidate.n, baseline.x, baseline.n),
    )


def _rate_p_value(x1: int, n1: int, x0: int, n0: int) -> float:
    """Two-sided score test of equal proportions (statsmodels)."""
    if x1 * n0 == x0 * n1 and x1 in (0, n1):  # both none or both all: no evidence of a difference
        return 1.0
    with warnings.catch_warnings():  # ratio and odds ratio of a zero rate, which the test does not use
        warnings.simplefilter("ignore", RuntimeWarning)
        from statsmodels.stats.proportion import test_proportions_2indep

        p = float(test_proportions_2indep(x1, n1, x0, n0, method="score", compare="diff").pvalue)
    return 1.0 if math.isnan(p) else p


def spread_free_p_value(point: float, n1: int, n2: int | None = None) -> float:
    """Two-sided p-value of a difference whose samples have no spread: each side constant, or (``n2`` None)
    ``n1`` paired differences all equal.

    A t or normal test has no standard error to divide by, and the difference is not exact: two tasks
    that both went from pass to fail are two coin flips, not proof. The exact permutation test is: of the
    ``2^n1`` sign flips (paired) the observed one and its mirror are the most extreme, ``p = 2 / 2^n1``; of
    the ``C(n1 + n2, n1)`` relabellings of two sides, the observed split alone reaches its difference, and
    so does the swapped one only when the sides are as large, ``p = 1 / C`` (``2 / C`` when ``n1 == n2``).
    """
    if point == 0:
        return 1.0
    if n2 is None:
        return min(1.0, 2 / 2**n1)
    return min(1.0, (2 if n1 == n2 else 1) / math.comb(n1 + n2, n1))


def _normal_p_value(point: float, standard_error: float, n1: int, n2: int | None = None) -> float:
    if not standard_error or math.isnan(standard_error):
        return spread_free_p_value(point, n1, n2)
    return math.erfc(abs(point) / standard_error / math.sqrt(2))  # 2 * the upper tail, exact where it is tiny


def p95(values: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.percentile(values, 95, axis=axis)


def mean(values: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(values, axis=axis)


Statistic = Callable[..., np.ndarray]


def _as_array(values: Iterable[float]) -> np.ndarray:
    return np.asarray(list(values), dtype=float)


def _resampled(data: np.ndarray, stat: Statistic, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """``stat`` of ``resamples`` bootstrap resamples of ``data``, drawn in one (resamples, n) array."""
    return stat(data[rng.integers(0, data.size, size=(resamples, data.size))], axis=-1)


def _percentiles(values: np.ndarray) -> tuple[float, float]:
    low, high = np.percentile(values, [100 * ALPHA / 2, 100 * (1 - ALPHA / 2)])
    return float(low), float(high)


def _t_mean(data: np.ndarray) -> tuple[float, float]:
    """Student's t interval of a mean (``data`` of at least two values, not all equal)."""
    point = float(data.mean())
    from scipy.stats import t

    half = float(t.ppf(1 - ALPHA / 2, data.size - 1)) * float(data.std(ddof=1)) / math.sqrt(data.size)
    return point - half, point + half


def estimate(values: Iterable[float], stat: Statistic, resamples: int) -> Estimate:
    """A statistic of one sample with a 95% interval: Student's t for a mean, else a percentile bootstrap."""
    data = _as_array(values)
    if data.size == 0:
        return Estimate(None, None, None, 0)
    point = float(stat(data))
    if data.size < 2 or np.all(data == data[0]):
        return Estimate(point, point, point, int(data.size))
    if stat is mean:
        low, high = _t_mean(data)
    else:
        low, high = _percentiles(_resampled(data, stat, resamples, np.random.default_rng(SEED)))
    return Estimate(point, low, high, int(data.size))


def _welch(c: np.ndarray, b: np.ndarray, point: float) -> tuple[float, float, float]:
    """Welch's interval and two-sided p-value of a difference of means."""
    vc, vb = float(c.var(ddof=1)) / c.size, float(b.var(ddof=1)) / b.size
    se = math.sqrt(vc + vb)
    if se == 0:  # both samples constant
        return point, point, spread_free_p_value(point, c.size, b.size)
    df = (vc + vb) ** 2 / (vc**2 / (c.size - 1) + vb**2 / (b.size - 1))
    from scipy.stats import t

    half = float(t.ppf(1 - ALPHA / 2, df)) * se
    return point - half, point + half, float(2 * t.sf(abs(point) / se, df))


def difference(candidate: Iterable[float], baseline: Iterable[float], stat: Statistic, resamples: int) -> Estimate:
    """``stat(candidate) - stat(baseline)`` with a 95% interval (independent samples).

    Welch's interval for means; otherwise a percentile bootstrap resampling each side on its own."""
    c, b = _as_array(candidate), _as_array(baseline)
    if c.size == 0 or b.size == 0:
        return Estimate(None, None, None, 0)
    point = float(stat(c) - stat(b))
    if c.size < 2 or b.size < 2:
        return Estimate(point, None, None, int(c.size + b.size))
    if stat is mean:
        low, high, p_value = _welch(c, b, point)
        return Estimate(point, low, high, int(c.size + b.size), p_value=p_value)
    rng = np.random.default_rng(SEED)
    diffs = _resampled(c, stat, resamples, rng) - _resampled(b, stat, resamples, rng)
    low, high = _percentiles(diffs)
    if math.isnan(low) or math.isnan(high):  # every resample equal: the difference is exact
        low = high = point
    p_value = _normal_p_value(point, float(np.std(diffs, ddof=1)), int(c.size), int(b.size))
    return Estimate(point, low, high, int(c.size + b.size), p_value=p_value)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's (1979) step-down adjusted p-values: valid for any dependence between the tests.

    The same figures as statsmodels' ``multipletests(method="holm")`` (a test checks), which also
    runs a full ``gc.collect()`` on every call: tens of milliseconds of a server's time per table.
    """
    p = np.asarray(p_values, dtype=float)
    if p.size == 0:
        return []
    order = np.argsort(p, kind="stable")
    steps = np.maximum.accumulate((p.size - np.arange(p.size)) * p[order])
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(1.0, steps)
    return [float(a) for a in adjusted]


# --- pass@k and pass^k ------------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that at least one of ``k`` trials drawn without replacement from ``n`` (``c`` correct) passes.

    The unbiased estimator ``1 - C(n-c, k) / C(n, k)`` (Chen et al., 2021).
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - _comb_ratio(n - c, n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Chance that all ``k`` trials pass: ``C(c, k) / C(n, k)`` (pass^k, Yao et al., 2024)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return _comb_ratio(c, n, k)


EXACT_UP_TO = 2000  # trials below which C(a, k) / C(n, k) is computed in exact integers


def _comb_ratio(a: int, n: int, k: int) -> float:
    """``C(a, k) / C(n, k)`` for ``a <= n``: exact integers up to :data:`EXACT_UP_TO` trials, log-gamma beyond
    (the integers of C(40000, 20000) have 12,000 digits: 100 tasks of 20k-40k trials took 5.7 s of CPU per
    side; log-gamma is within 1e-10 of the exact figure there)."""
    if a < k:
        return 0.0
    if n <= EXACT_UP_TO:
        return math.comb(a, k) / math.comb(n, k)
    lg = math.lgamma
    return min(1.0, math.exp(lg(a + 1) - lg(a - k + 1) - lg(n + 1) + lg(n - k + 1)))


EVERY_K_UP_TO = 16


def default_ks(most: int) -> list[int]:
    """Every ``k`` up to 16, then powers of two, then ``most``: the per-task table stays a few dozen
    columns when a month of traffic gives each task hundreds of trials (every ``k`` up to 83 made the
    compare answer 45 MB at 10M conversations)."""
    ks = list(range(1, min(most, EVERY_K_UP_TO) + 1))
    k = EVERY_K_UP_TO * 2
    while k < most:
        ks.append(k)
        k *= 2
    if most > EVERY_K_UP_TO:
        ks.append(most)
    return ks


def pass_k_table(
    tasks: Mapping[str, tuple[int, int]], ks: Sequence[int] | None = None, per_task: bool = True
) -> dict[str, object]:
    """Averaged and (with ``per_task``) per-task pass@k and pass^k from ``{task: (trials n, successes c)}``.

    Averages over ``k`` use the tasks with at least ``k`` trials; unless ``ks`` is given, ``k`` runs to the
    largest trial count that every task reaches (:func:`default_ks`).
    """
    usable = {t: nc for t, nc in tasks.items() if nc[0] >= 1}
    if not usable:
        return {"tasks": 0, "ks": [], "pass_at_k": {}, "pass_hat_k": {}} | ({"per_task": []} if per_task else {})
    if ks is None:
        ks = default_ks(min(n for n, _ in usable.values()))
    # tasks share few (trials, successes) pairs: each pair's figures are computed once, not once per task
    counts = Counter(usable.values())
    figures = {
        (n, c): ({k: pass_at_k(n, c, k) for k in ks if k <= n}, {k: pass_hat_k(n, c, k) for k in ks if k <= n})
        for n, c in counts
    }
    at: dict[int, float] = {}
    hat: dict[int, float] = {}
    for k in ks:
        eligible = [(nc, m) for nc, m in counts.items() if nc[0] >= k]
        if eligible:
            tasks_k = sum(m for _, m in eligible)
            at[k] = sum(figures[nc][0][k] * m for nc, m in eligible) / tasks_k
            hat[k] = sum(figures[nc][1][k] * m for nc, m in eligible) / tasks_k
    if not per_task:
        return {"tasks": len(usable), "ks": list(ks), "pass_at_k": at, "pass_hat_k": hat}
    rows = [
        {
            "task_id": t,
            "trials": n,
            "successes": c,
            "pass_at_k": dict(figures[(n, c)][0]),
            "pass_hat_k": dict(figures[(n, c)][1]),
        }
        for t, (n, c) in sorted(usable.items())
    ]
    return {"tasks": len(usable), "ks": list(ks), "pass_at_k": at, "pass_hat_k": hat, "per_task": rows}
