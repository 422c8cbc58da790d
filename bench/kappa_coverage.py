"""Coverage of kappa's 95% intervals, simulated: Cohen's kappa of a judge against people (a 2x2 table) and
Fleiss' kappa between reviewers.

Every dataset is a table of counts drawn from a model whose kappa is known; an interval covers when it
contains that kappa. A dataset where kappa is undefined (both raters used one and the same label
throughout) gets no interval in Vigil and is counted apart ("undef."), as is a dataset where a method
gives no interval (a zero-width or not-a-number one: "none"); coverage is over the datasets that got an
interval.

    python -m bench.kappa_coverage                  # the full grid, 2,000 datasets a cell
    python -m bench.kappa_coverage --runs 500 --quick
    python -m bench.kappa_coverage --runs 1000 --skip cohen biased --raters 3 2 5   # Fleiss' kappa only
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np
from scipy.special import ndtr, ndtri
from scipy.stats import betabinom

Z = float(ndtri(0.975))
CHI2 = Z * Z  # the 95% point of chi-square with one degree of freedom
NS = (10, 20, 30, 50, 100, 200, 500)
FLEISS_NS = (10, 20, 50, 100, 200)
PREVALENCES = (0.1, 0.3, 0.5)
KAPPAS = (0.2, 0.4, 0.6, 0.8, 0.9)
Interval = tuple[np.ndarray, np.ndarray]


def tables(rng: np.random.Generator, n: int, p_human: float, p_judge: float, kappa: float, runs: int) -> np.ndarray:
    """``runs`` 2x2 tables (columns tp, fn, fp, tn: rows human fail/pass, columns judge fail/pass)."""
    pe = p_human * p_judge + (1 - p_human) * (1 - p_judge)
    both = p_human * p_judge + kappa * (1 - pe) / 2  # kappa = (po - pe) / (1 - pe), po = both fail + both pass
    probs = np.array([both, p_human - both, p_judge - both, 1 - p_human - p_judge + both])
    if probs.min() < -1e-12:
        raise ValueError(f"kappa {kappa} impossible with margins {p_human}, {p_judge}")
    return rng.multinomial(n, np.clip(probs, 0, None) / np.clip(probs, 0, None).sum(), size=runs)


def cohen(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cohen's kappa and Fleiss, Cohen & Everitt's (1969) non-null variance: statsmodels' formula, vectorised."""
    n = t.sum(-1).astype(float)
    a, b, c, d = (t[..., i] / n for i in range(4))
    r1, c1 = a + b, a + c
    r2, c2 = 1 - r1, 1 - c1
    pe = r1 * c1 + r2 * c2
    with np.errstate(divide="ignore", invalid="ignore"):
        k = (a + d - pe) / (1 - pe)
        term_a = a * (1 - (r1 + c1) * (1 - k)) ** 2 + d * (1 - (r2 + c2) * (1 - k)) ** 2
        term_b = (1 - k) ** 2 * (b * (c1 + r2) ** 2 + c * (c2 + r1) ** 2)
        var = (term_a + term_b - (k - pe * (1 - k)) ** 2) / (1 - pe) ** 2 / n
    return k, var


def defined(t: np.ndarray) -> np.ndarray:
    """Vigil's rule: kappa is undefined when chance agreement is 1 (every item in one diagonal cell)."""
    n = t.sum(-1)
    return (t[..., 0] < n) & (t[..., 3] < n)


def wald(t: np.ndarray) -> Interval:
    """Vigil before: statsmodels' cohens_kappa, kappa ± 1.96 · the FCE standard error."""
    k, var = cohen(t)
    se = np.sqrt(np.clip(var, 0, None))
    return k - Z * se, k + Z * se


def fisher_z(t: np.ndarray) -> Interval:
    """The same standard error on atanh's scale (delta method), mapped back."""
    k, var = cohen(t)
    with np.errstate(divide="ignore", invalid="ignore"):
        z, se = np.arctanh(k), np.sqrt(np.clip(var, 0, None)) / (1 - k * k)
        return np.tanh(z - Z * se), np.tanh(z + Z * se)


def goodness_of_fit(t: np.ndarray) -> Interval:
    """Donner & Eliasziw (1992): the kappas a chi-square goodness-of-fit test of (both fail, one fails,
    both pass) under the common-correlation model does not reject, found by bisection on each side."""
    n = t.sum(-1).astype(float)
    n1, n2, n3 = t[..., 0].astype(float), (t[..., 1] + t[..., 2]).astype(float), t[..., 3].astype(float)
    p = (2 * n1 + n2) / (2 * n)
    s = p * (1 - p)
    with np.errstate(divide="ignore", invalid="ignore"):
        k_hat = 1 - n2 / (2 * n * s)
        k_min = np.maximum(-p / (1 - p), -(1 - p) / p)

    def chi2(k: np.ndarray) -> np.ndarray:
        out = -n
        for count, prob in ((n1, p * p + s * k), (n2, 2 * s * (1 - k)), (n3, (1 - p) ** 2 + s * k)):
            with np.errstate(divide="ignore", invalid="ignore"):
                out = out + np.where(count > 0, count * count / (n * prob), 0.0)
        return np.where(np.isnan(out), np.inf, out)

    def root(inside: np.ndarray, outside: np.ndarray) -> np.ndarray:
        edge = chi2(outside) <= CHI2
        for _ in range(60):
            mid = (inside + outside) / 2
            far = chi2(mid) > CHI2
            outside = np.where(far, mid, outside)
            inside = np.where(far, inside, mid)
        return np.where(edge, outside, (inside + outside) / 2)

    with np.errstate(invalid="ignore"):
        return root(k_hat, k_min + 1e-12), root(k_hat, np.ones_like(k_hat))


def vigil_after(t: np.ndarray) -> Interval:
    """Vigil now: the goodness-of-fit interval, or the Wald one where Cohen's kappa falls outside it (the
    raters' fail rates differ too much for the common-correlation model the former assumes)."""
    low, high = goodness_of_fit(t)
    k, _ = cohen(t)
    outside = (k < low - 1e-9) | (k > high + 1e-9)
    w_low, w_high = wald(t)
    return np.where(outside, w_low, low), np.where(outside, w_high, high)


def bootstrap(t: np.ndarray, rng: np.random.Generator, resamples: int = 1000) -> tuple[Interval, Interval]:
    """Percentile and BCa intervals over items: a resample of a 2x2 table is a multinomial draw of its four
    cells, so this is scipy.stats.bootstrap's computation without a per-dataset call. A resample with every
    item in one diagonal cell agrees perfectly (kappa 1), as Fleiss' bootstrap in Vigil counts it."""
    n = t.sum(-1)
    probs = t / n[:, None]
    boot = np.stack([rng.multinomial(n, probs) for _ in range(resamples)], axis=1)  # runs × resamples × 4
    kb, _ = cohen(boot)
    kb = np.where(defined(boot), kb, 1.0)
    percentile = np.quantile(kb, 0.025, axis=1), np.quantile(kb, 0.975, axis=1)
    k, _ = cohen(t)
    # BCa: bias from the share of resamples below kappa, acceleration from the jackknife (four distinct
    # leave-one-out tables, each weighted by its cell's count)
    z0 = ndtri(((kb < k[:, None]).sum(1) + (kb <= k[:, None]).sum(1)) / (2 * resamples))
    jack = np.stack([cohen(t - np.eye(4, dtype=t.dtype)[i])[0] for i in range(4)], axis=1)
    w = t.astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.nansum(w * jack, 1) / w.sum(1)
        dev = np.where(w > 0, mean[:, None] - jack, 0.0)
        acc = (w * dev**3).sum(1) / (6 * ((w * dev**2).sum(1)) ** 1.5)
        low, high = (quantiles(kb, ndtr(z0 + (z0 + zq) / (1 - acc * (z0 + zq)))) for zq in (-Z, Z))
    return percentile, (low, high)


def quantiles(values: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Row i's q[i] quantile (linear interpolation, as numpy's default); not a number where q[i] is not."""
    ordered = np.sort(values, axis=1)
    pos = np.clip(np.nan_to_num(q, nan=0.0), 0, 1) * (values.shape[1] - 1)
    below = np.floor(pos).astype(int)
    above = np.minimum(below + 1, values.shape[1] - 1)
    rows = np.arange(values.shape[0])
    out = ordered[rows, below] + (pos - below) * (ordered[rows, above] - ordered[rows, below])
    return np.where(np.isfinite(q), out, np.nan)


def tally(truth: float, ok: np.ndarray, interval: Interval) -> tuple[float, float, int]:
    low, high = interval
    given = ok & np.isfinite(low) & np.isfinite(high) & (high - low > 1e-12)
    covered = (low <= truth) & (truth <= high)
    cov = float(covered[given].mean()) if given.any() else float("nan")
    width = float((np.minimum(high, 1) - np.maximum(low, -1))[given].mean()) if given.any() else float("nan")
    return cov, width, int((ok & ~given).sum())


METHODS = ("wald (before)", "fisher-z", "goodness-of-fit", "bootstrap pct", "bootstrap BCa", "Vigil after")


def cohen_grid(runs: int, seed: int, ns: tuple[int, ...], biased: bool) -> dict[str, list[tuple[int, float]]]:
    rng = np.random.default_rng(seed)
    rows: dict[str, list[tuple[int, float]]] = {m: [] for m in METHODS}
    header = ["n", "prevalence", "κ", "undef."] + [f"{m} cov / width / none" for m in METHODS]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    cells = [(ph, ph, k) for ph in PREVALENCES for k in KAPPAS]
    if biased:  # the judge says "fail" more (or less) often than people do: Cohen's and the intraclass kappa part
        cells = [(0.3, 0.4, k) for k in (0.4, 0.6, 0.7)] + [(0.3, 0.2, k) for k in (0.4, 0.6)] + [(0.4, 0.2, 0.4)]
        cells += [(0.1, 0.15, k) for k in (0.4, 0.6, 0.7)] + [(0.5, 0.6, k) for k in (0.4, 0.6, 0.75)]
    for n in ns:
        for ph, pj, kappa in cells:
            t = tables(rng, n, ph, pj, kappa, runs)
            ok = defined(t)
            pct, bca = bootstrap(t, rng)
            found = [wald(t), fisher_z(t), goodness_of_fit(t), pct, bca, vigil_after(t)]
            cols = [str(n), f"{ph:.1f}" + ("" if pj == ph else f"/{pj:.2f}"), f"{kappa:.1f}", str(int((~ok).sum()))]
            for m, interval in zip(METHODS, found, strict=True):
                cov, width, none = tally(kappa, ok, interval)
                rows[m].append((n, cov))
                cols.append(f"{cov:.1%} / {width:.2f} / {none}")
            print("| " + " | ".join(cols) + " |", flush=True)
    return rows


def summary(rows: dict[str, list[tuple[int, float]]]) -> None:
    print("\n| method | n ≥ 20: min | mean | cells < 94% | cells < 93% | n = 10: min | mean |")
    print("|---|---|---|---|---|---|---|")
    for m, cells in rows.items():
        big = np.array([c for n, c in cells if n >= 20])
        small = np.array([c for n, c in cells if n < 20])
        big, small = big[np.isfinite(big)], small[np.isfinite(small)]
        tail = f"{small.min():.1%} | {small.mean():.1%}" if small.size else "– | –"
        print(
            f"| {m} | {big.min():.1%} | {big.mean():.1%} | {(big < 0.94).sum()} of {big.size} | "
            f"{(big < 0.93).sum()} | {tail} |"
        )


def fleiss_hist(h: np.ndarray, m: int) -> np.ndarray:
    """Fleiss' kappa from histograms: ``h[..., x]`` items on which x of m raters said fail."""
    x = np.arange(m + 1)
    items = h.sum(-1)
    p = (h * x).sum(-1) / (items * m)
    agree = (h * (x * x + (m - x) ** 2 - m)).sum(-1) / (items * m * (m - 1))
    pe = p * p + (1 - p) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(pe < 1, (agree - pe) / (1 - pe), 1.0)  # one category throughout: 1, as in Vigil


def _p_hat(h: np.ndarray, m: int) -> np.ndarray:
    x = np.arange(m + 1)
    return (h * x).sum(-1) / (h.sum(-1) * m)


def _bisect(f: Callable[[np.ndarray], np.ndarray], inside: np.ndarray, outside: np.ndarray) -> np.ndarray:
    """Where ``f`` (> 0 means rejected) crosses 0 between ``inside`` (accepted) and ``outside``; ``outside``
    itself where it is accepted too."""
    edge = f(outside) <= 0
    for _ in range(50):
        mid = (inside + outside) / 2
        far = f(mid) > 0
        outside = np.where(far, mid, outside)
        inside = np.where(far, inside, mid)
    return np.where(edge, outside, (inside + outside) / 2)


def zou_donner_var(rho: np.ndarray, p: np.ndarray, n: int, m: int) -> np.ndarray:
    """Large-sample variance of the Fleiss-Cuzick estimator (Fleiss' kappa for two categories) under the
    common-correlation model, n items of m ratings (Zou & Donner 2004)."""
    big = n * m
    s = p * (1 - p)
    with np.errstate(divide="ignore", invalid="ignore"):
        t1 = (
            (1 / s - 6) * (n / m) / (big - n) ** 2
            + (2 * big + 4 * n - n / s) * n / (big * (big - n) ** 2)
            + (
                n * m * m / (big * big * s)
                - (3 * big - 2 * n) * (big - 2 * n) * n * m * m / (big * big * (big - n) ** 2)
                - (2 * big - n) / (big - n) ** 2
            )
            * rho
        )
        t2 = (4 - 1 / s) * (n * m * m / big**2) * rho * rho
    return (1 - rho) * (t1 + t2)


def fleiss_wald(h: np.ndarray, m: int) -> Interval:
    n = int(h[0].sum())
    k = fleiss_hist(h, m)
    se = np.sqrt(np.clip(zou_donner_var(k, _p_hat(h, m), n, m), 0, None))
    return np.clip(k - Z * se, -1, 1), np.clip(k + Z * se, -1, 1)


def fleiss_score(h: np.ndarray, m: int) -> Interval:
    """Every rho with (kappa - rho)^2 <= z^2 V(rho): the Zou-Donner variance at the tested rho, not at kappa."""
    n = int(h[0].sum())
    k = fleiss_hist(h, m)
    p = _p_hat(h, m)

    def f(r: np.ndarray) -> np.ndarray:
        v = zou_donner_var(r, p, n, m)
        return np.where(np.isfinite(v), (k - r) ** 2 - CHI2 * v, np.inf)

    floor = np.full_like(k, -1 / (m - 1) + 1e-9)
    return _bisect(f, k, np.minimum(floor, k)), _bisect(f, k, np.ones_like(k))


def _bb_loglik(h: np.ndarray, m: int, p: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """Log-likelihood of the histograms under an (extended) beta-binomial of mean p, intraclass correlation rho."""
    theta = rho / (1 - rho)
    out = np.zeros_like(p)
    for x in range(m + 1):
        lp = np.zeros_like(p)
        for r in range(x):
            lp = lp + np.log(np.clip(p + r * theta, 1e-300, None))
        for r in range(m - x):
            lp = lp + np.log(np.clip(1 - p + r * theta, 1e-300, None))
        for r in range(m):
            lp = lp - np.log(1 + r * theta)
        out = out + np.where(h[..., x] > 0, h[..., x] * lp, 0.0)
    return out


def fleiss_profile(h: np.ndarray, m: int) -> Interval:
    """Likelihood-ratio interval of the beta-binomial's rho with p at its estimate; widened to hold kappa."""
    k = fleiss_hist(h, m)
    p = _p_hat(h, m)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = -np.minimum(p, 1 - p) / (m - 1) + 1e-9
        lo = t / (1 + t)
        grid = np.linspace(0, 1, 201)[None, :]
        rhos = lo[:, None] + grid * (1 - 1e-9 - lo[:, None])
        ll = np.stack([_bb_loglik(h, m, p, rhos[:, j]) for j in range(rhos.shape[1])], 1)
        best = ll.max(1)
        mle = rhos[np.arange(len(k)), ll.argmax(1)]

        def f(r: np.ndarray) -> np.ndarray:
            return 2 * (best - _bb_loglik(h, m, p, r)) - CHI2

        low = _bisect(f, mle, lo)
        high = _bisect(f, mle, np.ones_like(k) - 1e-9)
    return np.minimum(low, k), np.maximum(np.where(high > 1 - 1e-6, 1.0, high), k)


def _bb_probs(m: int, p: np.ndarray, rho: np.ndarray) -> list[np.ndarray]:
    theta = rho / (1 - rho)
    out = []
    for x in range(m + 1):
        pr = np.full_like(p, float(math.comb(m, x)))
        for r in range(x):
            pr = pr * (p + r * theta)
        for r in range(m - x):
            pr = pr * (1 - p + r * theta)
        for r in range(m):
            pr = pr / (1 + r * theta)
        out.append(pr)
    return out


def fleiss_gof(h: np.ndarray, m: int) -> Interval:
    """Donner & Eliasziw's goodness of fit for m raters: Pearson's chi-square of the m + 1 counts against the
    beta-binomial with p at its estimate; every rho within 3.84 of the best fit. Widened to hold kappa."""
    k = fleiss_hist(h, m)
    p = _p_hat(h, m)
    n = h.sum(-1)

    def chi2(r: np.ndarray) -> np.ndarray:
        out = -n.astype(float)
        for x, pr in enumerate(_bb_probs(m, p, r)):
            out = out + np.where(h[..., x] > 0, h[..., x] ** 2 / (n * np.clip(pr, 1e-300, None)), 0.0)
        return out

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = -np.minimum(p, 1 - p) / (m - 1) + 1e-9
        lo = t / (1 + t)
        grid = np.linspace(0, 1, 201)[None, :]
        rhos = lo[:, None] + grid * (1 - 1e-9 - lo[:, None])
        c = np.stack([chi2(rhos[:, j]) for j in range(rhos.shape[1])], 1)
        best = c.min(1)
        at = rhos[np.arange(len(k)), c.argmin(1)]

        def f(r: np.ndarray) -> np.ndarray:
            return chi2(r) - best - CHI2

        low = _bisect(f, at, lo)
        high = _bisect(f, at, np.ones_like(k) - 1e-9)
    return np.minimum(low, k), np.maximum(np.where(high > 1 - 1e-6, 1.0, high), k)


def fleiss_jack(h: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Kappa and its jackknife standard error over items (m + 1 distinct leave-one-out tables)."""
    n = h.sum(-1)
    k = fleiss_hist(h, m)
    jack = np.stack([fleiss_hist(h - np.eye(m + 1, dtype=h.dtype)[i], m) for i in range(m + 1)], 1)
    w = h.astype(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        jack = np.where(w > 0, jack, 0.0)
        mean = (w * jack).sum(1) / n
        var = (n - 1) / n * (w * (jack - mean[:, None]) ** 2).sum(1)
    return k, np.sqrt(var)


def fleiss_jack_z(h: np.ndarray, m: int) -> Interval:
    """Fisher's z of the intraclass correlation, 0.5 log((1 + (m-1) rho) / (1 - rho)), jackknife error."""
    k, se = fleiss_jack(h, m)
    with np.errstate(divide="ignore", invalid="ignore"):
        kk = np.clip(k, -1 / (m - 1) + 1e-9, 1 - 1e-9)
        z = 0.5 * np.log((1 + (m - 1) * kk) / (1 - kk))
        dz = 0.5 * ((m - 1) / (1 + (m - 1) * kk) + 1 / (1 - kk))
        back = lambda t: (np.exp(2 * t) - 1) / (np.exp(2 * t) + m - 1)  # noqa: E731
        return back(z - Z * se * dz), back(z + Z * se * dz)


def fleiss_anova_f(h: np.ndarray, m: int) -> Interval:
    """One-way ANOVA on the 0/1 ratings, the exact F interval of ICC(1) (Searle; Shrout & Fleiss)."""
    from scipy.stats import f as fdist

    x = np.arange(m + 1)
    n = h.sum(-1)
    total = (h * x).sum(-1)
    ss_between = (h * x * x).sum(-1) / m - total**2 / (n * m)
    ss_within = total - (h * x * x).sum(-1) / m
    with np.errstate(divide="ignore", invalid="ignore"):
        f = (ss_between / (n - 1)) / (ss_within / (n * (m - 1)))
        fl = f / fdist.ppf(0.975, n - 1, n * (m - 1))
        fu = f * fdist.ppf(0.975, n * (m - 1), n - 1)
        return (fl - 1) / (fl + m - 1), np.where(np.isfinite(fu), (fu - 1) / (fu + m - 1), 1.0)


def fleiss_vigil_after(h: np.ndarray, m: int) -> Interval:
    """Vigil now: Donner and Eliasziw's interval with two raters an item, the likelihood-ratio one with more."""
    if m == 2:
        return goodness_of_fit(np.stack([h[..., 2], h[..., 1], np.zeros_like(h[..., 1]), h[..., 0]], -1))
    return fleiss_profile(h, m)


FLEISS_METHODS: dict[str, Callable[[np.ndarray, int], Interval]] = {
    "likelihood ratio": fleiss_profile,
    "Pearson goodness of fit": fleiss_gof,
    "score (Zou-Donner variance)": fleiss_score,
    "Wald (Zou-Donner)": fleiss_wald,
    "jackknife Fisher-z": fleiss_jack_z,
    "ANOVA F": fleiss_anova_f,
}


def fleiss_grid(runs: int, seed: int, m: int = 3, resamples: int = 1000, ns: tuple[int, ...] = FLEISS_NS) -> None:
    """Vigil's percentile bootstrap over items for Fleiss' kappa (before), BCa, and closed-form candidates; m
    raters per item, items drawn from a beta-binomial whose intraclass correlation is the kappa."""
    rng = np.random.default_rng(seed)
    names = ["percentile (before)", "BCa", *FLEISS_METHODS, "Vigil after"]
    print(f"\nFleiss' kappa, {m} raters per item, {runs} datasets a cell, {resamples} resamples each")
    header = ["items", "prevalence", "κ", "undef."] + [f"{name} cov / width / none" for name in names]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    x = np.arange(m + 1)
    rows: dict[str, list[tuple[int, float, float, int]]] = {name: [] for name in names}
    took: dict[str, float] = dict.fromkeys(names, 0.0)
    for n in ns:
        for prev in (0.1, 0.3, 0.5):
            for kappa in (0.2, 0.4, 0.6, 0.8):
                shape = 1 / kappa - 1
                h = rng.multinomial(n, betabinom.pmf(x, m, prev * shape, (1 - prev) * shape), size=runs)
                ok = ((h * x).sum(-1) > 0) & ((h * x).sum(-1) < n * m)
                k = fleiss_hist(h, m)
                t0 = time.perf_counter()
                boot = np.stack([rng.multinomial(n, h / n) for _ in range(resamples)], axis=1)
                kb = fleiss_hist(boot, m)
                found = {"percentile (before)": (np.quantile(kb, 0.025, axis=1), np.quantile(kb, 0.975, axis=1))}
                z0 = ndtri(((kb < k[:, None]).sum(1) + (kb <= k[:, None]).sum(1)) / (2 * resamples))
                jack = np.stack([fleiss_hist(h - np.eye(m + 1, dtype=h.dtype)[i], m) for i in range(m + 1)], 1)
                w = h.astype(float)
                with np.errstate(divide="ignore", invalid="ignore"):
                    dev = np.where(w > 0, ((w * jack).sum(1) / n)[:, None] - jack, 0.0)
                    acc = (w * dev**3).sum(1) / (6 * ((w * dev**2).sum(1)) ** 1.5)
                    low, high = (quantiles(kb, ndtr(z0 + (z0 + zq) / (1 - acc * (z0 + zq)))) for zq in (-Z, Z))
                found["BCa"] = low, high
                took["percentile (before)"] += time.perf_counter() - t0
                for name, fn in [*FLEISS_METHODS.items(), ("Vigil after", fleiss_vigil_after)]:
                    t0 = time.perf_counter()
                    found[name] = fn(h, m)
                    took[name] += time.perf_counter() - t0
                cols = [str(n), f"{prev:.1f}", f"{kappa:.1f}", str(int((~ok).sum()))]
                for name in names:
                    cov, width, none = tally(kappa, ok, found[name])
                    rows[name].append((n, cov, width, none))
                    cols.append(f"{cov:.1%} / {width:.2f} / {none}")
                print("| " + " | ".join(cols) + " |", flush=True)
    print(f"\nFleiss' kappa, {m} raters: lowest / mean coverage, mean width, datasets with no interval, per n")
    print("| method | " + " | ".join(f"{n} items" for n in ns) + " |")
    print("|---|" + "---|" * len(ns))
    for name in names:
        cells = []
        for n in ns:
            got = [(c, w, z) for nn, c, w, z in rows[name] if nn == n and np.isfinite(c)]
            cov = np.array([c for c, _, _ in got])
            cells.append(
                f"{cov.min():.1%} / {cov.mean():.1%}, {np.mean([w for _, w, _ in got]):.2f}, {sum(z for *_, z in got)}"
            )
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("Seconds for the whole grid, all datasets: " + ", ".join(f"{k} {v:.1f}" for k, v in took.items()))


def clock(fn: Callable[[], object], reps: int) -> float:
    """The median time of ``reps`` calls of ``fn``, in seconds."""
    took = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        took.append(time.perf_counter() - t0)
    return float(np.median(took))


def timing() -> None:
    """Time per interval of one table, the way a calibration report computes it."""
    from scipy.stats import bootstrap as sp_bootstrap
    from statsmodels.stats.inter_rater import cohens_kappa

    from vigil.calibration import stats

    print("\nTime per interval (one 2x2 table, median of repeated calls)")
    print("| n | statsmodels wald | Vigil cohens_kappa | scipy bootstrap percentile | scipy bootstrap BCa |")
    print("|---|---|---|---|---|")
    rng = np.random.default_rng(3)
    for n in (50, 200, 2000):
        t = tables(rng, n, 0.3, 0.3, 0.6, 1)[0]
        table = t.reshape(2, 2).astype(float)
        h = np.repeat([0, 1, 2, 3], t)  # one item per row: its cell

        def kappa_of(idx: np.ndarray, axis: int = -1) -> np.ndarray:
            counts = np.stack([(idx == i).sum(axis) for i in range(4)], -1)
            k, _ = cohen(counts)
            return np.where(defined(counts), k, 1.0)

        sm = clock(lambda x=table: cohens_kappa(x, return_results=True), 50)
        vigil = clock(lambda x=table: stats.cohens_kappa(x), 50)
        pct = clock(lambda x=h: sp_bootstrap((x,), kappa_of, n_resamples=1000, method="percentile", rng=1), 5)
        bca = clock(lambda x=h: sp_bootstrap((x,), kappa_of, n_resamples=1000, method="BCa", rng=1), 5)
        print(f"| {n} | {sm * 1e3:.2f} ms | {vigil * 1e3:.2f} ms | {pct * 1e3:.1f} ms | {bca * 1e3:.1f} ms |")


def fleiss_timing() -> None:
    """Time per Fleiss interval of one table (three raters per item), the way Vigil computes it."""
    from scipy.stats import bootstrap as sp_bootstrap
    from statsmodels.stats.inter_rater import fleiss_kappa

    from vigil.calibration import stats

    print("\nTime per Fleiss' kappa with its interval (one table, 3 raters, median of repeated calls)")
    print("| items | before: percentile bootstrap | Vigil's `fleiss` now |")
    print("|---|---|---|")
    rng = np.random.default_rng(4)
    for n in (20, 50, 200, 2000):
        h = rng.multinomial(n, betabinom.pmf(np.arange(4), 3, 0.3 * 1.5, 0.7 * 1.5))
        fails = np.repeat(np.arange(4), h)
        table = np.stack([fails, 3 - fails], 1).astype(float)

        def stat(idx: np.ndarray, t: np.ndarray = table) -> float:
            sub = t[idx.astype(int)]
            return 1.0 if (sub.sum(0) > 0).sum() < 2 else float(fleiss_kappa(sub))

        def before(t: np.ndarray = table) -> object:
            fleiss_kappa(t)
            return sp_bootstrap((np.arange(len(t)),), stat, n_resamples=1000, method="percentile", vectorized=False)

        old = clock(before, 3)
        now = clock(lambda t=table: stats.fleiss(t), 20)
        print(f"| {n} | {old * 1e3:.0f} ms | {now * 1e3:.1f} ms |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000, help="datasets per cell")
    ap.add_argument("--seed", type=int, default=20261206)
    ap.add_argument("--quick", action="store_true", help="n of 20, 50 and 200 only")
    ap.add_argument("--raters", type=int, nargs="*", default=[3], help="Fleiss' kappa: raters per item")
    ap.add_argument("--skip", nargs="*", default=[], choices=["cohen", "biased", "fleiss", "timing"])
    args = ap.parse_args()
    ns = (20, 50, 200) if args.quick else NS
    if "cohen" not in args.skip:
        print(f"Cohen's kappa, equal margins (human and judge fail at the same rate), {args.runs} datasets a cell")
        summary(cohen_grid(args.runs, args.seed, ns, biased=False))
    if "biased" not in args.skip:
        print(f"\nCohen's kappa, the judge's fail rate off the human one (prevalence human/judge), {args.runs} a cell")
        summary(cohen_grid(args.runs, args.seed + 1, tuple(n for n in ns if n >= 20), biased=True))
    if "fleiss" not in args.skip:
        for m in args.raters:
            fleiss_grid(min(args.runs, 1000), args.seed + 2 + m, m)
    if "timing" not in args.skip:
        fleiss_timing()
    if "timing" not in args.skip:
        timing()


if __name__ == "__main__":
    main()
