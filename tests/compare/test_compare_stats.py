"""The statistics behind `vigil compare`: published figures, exact counts, known intervals."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from vigil.compare import stats
from vigil.compare.signals import VersionData
from vigil.compare.table import BETTER, UNSURE, WORSE, Row, build_rows, mark_red_flags, verdict
from vigil.schema import outcome_types


def brute_pass_hat(trials: list[bool], k: int) -> float:
    """pass^k by enumerating every k-subset of the trials (independent of the closed form)."""
    subsets = list(itertools.combinations(trials, k))
    return sum(all(s) for s in subsets) / len(subsets)


def brute_pass_at(trials: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(trials, k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_issue_example_n8() -> None:
    table = stats.pass_k_table({f"t{i}": (8, c) for i, c in enumerate([8, 7, 6, 4, 5])}, ks=[1, 4])
    assert round(table["pass_at_k"][1], 2) == 0.75
    assert round(table["pass_at_k"][4], 2) == 1.00
    assert round(table["pass_hat_k"][4], 2) == 0.36
    assert table["pass_hat_k"][4] == pytest.approx(1.8 / 5)


# τ-bench (Yao et al., 2024), gpt-4o on airline, 50 tasks × 4 trials: published pass^1..4.
TAU_BENCH_GPT4O_AIRLINE = [0.420, 0.273, 0.220, 0.200]


def histograms_matching(published: list[float], tasks: int, trials: int) -> list[tuple[int, ...]]:
    """Every split of ``tasks`` into a_c tasks solved c of ``trials`` times whose pass^k, computed by
    enumerating trial subsets (not the closed form under test), rounds to ``published``."""
    per_task = {
        c: [brute_pass_hat([True] * c + [False] * (trials - c), k) for k in range(1, trials + 1)]
        for c in range(trials + 1)
    }

    found: list[tuple[int, ...]] = []

    def choose(c: int, left: int, chosen: dict[int, int]) -> None:
        # pass^k depends only on the tasks solved at least k times: fix a_trials first, then prune
        if c == 0:
            found.append(tuple([left] + [chosen[j] for j in range(1, trials + 1)]))
            return
        for a in range(left + 1):
            now = {**chosen, c: a}
            hat = sum(n * per_task[j][c - 1] for j, n in now.items()) / tasks
            if round(hat, 3) == published[c - 1]:
                choose(c - 1, left - a, now)

    choose(trials, tasks, {})
    return found


def test_estimator_gives_tau_bench_published_figures_from_the_histogram_they_imply() -> None:
    """Not a replay of τ-bench's trajectories (not in the shared data): the published pass^1..4 admit
    exactly one histogram of per-task success counts, and the estimator, given those counts per
    task, must give the published figures back. A biased estimator such as (c/n)^k does not."""
    found = histograms_matching(TAU_BENCH_GPT4O_AIRLINE, tasks=50, trials=4)
    assert found == [(14, 12, 10, 4, 10)]  # a_0..a_4: tasks solved 0..4 times of 4
    tasks = {f"airline:{i}": (4, c) for i, c in enumerate(c for c, a in enumerate(found[0]) for _ in range(a))}
    table = stats.pass_k_table(tasks)
    assert table["tasks"] == 50 and table["ks"] == [1, 2, 3, 4]
    assert [round(table["pass_hat_k"][k], 3) for k in (1, 2, 3, 4)] == TAU_BENCH_GPT4O_AIRLINE
    biased = [sum((c / n) ** k for n, c in tasks.values()) / 50 for k in (1, 2, 3, 4)]
    assert [round(b, 3) for b in biased] != TAU_BENCH_GPT4O_AIRLINE


@pytest.mark.parametrize("n", [1, 3, 5, 8])
def test_closed_forms_match_enumeration(n: int) -> None:
    for c in range(n + 1):
        trials = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert stats.pass_hat_k(n, c, k) == pytest.approx(brute_pass_hat(trials, k))
            assert stats.pass_at_k(n, c, k) == pytest.approx(brute_pass_at(trials, k))


def test_pass_k_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError):
        stats.pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        stats.pass_hat_k(4, 2, 5)


def test_pass_k_uses_tasks_with_enough_trials() -> None:
    table = stats.pass_k_table({"a": (2, 1), "b": (4, 4)}, ks=[1, 3])
    assert table["pass_at_k"][1] == pytest.approx((0.5 + 1.0) / 2)
    assert table["pass_hat_k"][3] == 1.0  # only task b has 3 trials
    assert stats.pass_k_table({})["tasks"] == 0


def test_wilson_and_newcombe_against_published_values() -> None:
    # Newcombe (1998), Statistics in Medicine 17:873, table II example: 56/70 vs 48/80, method 10
    diff = stats.rate_difference(stats.rate(56, 70), stats.rate(48, 80))
    assert diff.value == pytest.approx(0.2)
    assert (round(diff.low, 4), round(diff.high, 4)) == (0.0524, 0.3339)
    # Wilson (1927) interval of 0/10: [0, 0.2775]
    zero = stats.rate(0, 10)
    assert zero.low == pytest.approx(0.0, abs=1e-12) and round(zero.high, 4) == 0.2775
    assert stats.rate(0, 0).value is None


def test_bootstrap_intervals_cover_and_are_reproducible() -> None:
    rng = np.random.default_rng(1)
    base = rng.exponential(1000, 3000)
    cand = rng.exponential(1300, 3000)
    d1 = stats.difference(cand, base, stats.p95, 500)
    d2 = stats.difference(cand, base, stats.p95, 500)
    assert d1 == d2
    true_diff = 1300 * np.log(20) - 1000 * np.log(20)
    assert d1.low < true_diff < d1.high and d1.low > 0
    m = stats.estimate(base, stats.mean, 500)
    assert m.low < 1000 < m.high
    same = stats.estimate([3.0, 3.0, 3.0], stats.mean, 100)
    assert (same.value, same.low, same.high) == (3.0, 3.0, 3.0)
    assert stats.difference([], [1.0], stats.mean, 100).value is None


def test_means_use_student_and_welch_intervals() -> None:
    from scipy.stats import sem, ttest_ind
    from scipy.stats import t as student

    rng = np.random.default_rng(2)
    base = rng.exponential(5.0, 400)
    cand = rng.exponential(6.0, 250)
    m = stats.estimate(base, stats.mean, 100)
    low, high = student.interval(0.95, base.size - 1, loc=base.mean(), scale=sem(base))
    assert (m.low, m.high) == (pytest.approx(low), pytest.approx(high))
    d = stats.difference(cand, base, stats.mean, 100)
    welch = ttest_ind(cand, base, equal_var=False)
    ci = welch.confidence_interval(0.95)
    assert d.value == pytest.approx(cand.mean() - base.mean())
    assert (d.low, d.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert d.p_value == pytest.approx(welch.pvalue)
    # both samples constant: no t test; the exact permutation test puts this split alone at the extreme of
    # C(5, 2) = 10 (sides of unequal size: the swapped split moves the means less)
    exact = stats.difference([2.0, 2.0], [1.0, 1.0, 1.0], stats.mean, 100)
    assert (exact.value, exact.low, exact.high, exact.p_value) == (1.0, 1.0, 1.0, pytest.approx(0.1))
    p95 = stats.difference([2.0, 2.0], [1.0, 1.0, 1.0], stats.p95, 100)
    assert (p95.value, p95.p_value) == (1.0, pytest.approx(0.1))
    # sides as large: the swapped split is as extreme, 2 of C(4, 2) = 6
    assert stats.spread_free_p_value(1.0, 2, 2) == pytest.approx(2 / 6)
    assert stats.spread_free_p_value(1.0, 3) == pytest.approx(2 / 8)  # paired: the flips of 3 differences


def test_verdicts_and_red_flags() -> None:
    e = stats.Estimate
    assert verdict(e(0.01, 0.002, 0.02, 10), "lower_is_better") == WORSE
    assert verdict(e(0.01, 0.002, 0.02, 10), "higher_is_better") == BETTER
    assert verdict(e(0.01, -0.002, 0.02, 10), "lower_is_better") == UNSURE
    rows = [
        Row("steps", "steps", "mean", "lower_is_better", e(12, 0, 0, 1), e(10, 0, 0, 1), e(-2, -3, -1, 2)),
        Row(
            "cost_usd",
            "cost",
            "mean",
            "lower_is_better",
            e(1, 0, 0, 1),
            e(0.8, 0, 0, 1),
            e(-0.2, -0.3, -0.1, 2),
        ),
        Row(
            "forbidden_tool",
            "forbidden",
            "rate",
            "lower_is_better",
            e(0, 0, 0, 1),
            e(0.015, 0, 0, 1),
            e(0.015, 0.008, 0.02, 2),
        ),
        Row(
            "tool_error",
            "tool errors",
            "rate",
            "lower_is_better",
            e(0, 0, 0, 1),
            e(0, 0, 0, 1),
            e(0.0, -0.01, 0.01, 2),
        ),
    ]
    for r in rows:
        r.verdict = verdict(r.difference, r.direction)
    flagged = [r.signal for r in mark_red_flags(rows) if r.red_flag]
    assert flagged == ["forbidden_tool"]
    only_worse = [Row("x", "x", "rate", "lower_is_better", e(0, 0, 0, 1), e(0, 0, 0, 1), e(1, 0.5, 2, 1), WORSE)]
    assert not any(r.red_flag for r in mark_red_flags(only_worse))


RULE_RATES = [0.02, 0.04, 0.05, 0.08, 0.1, 0.12, 0.15, 0.2, 0.25, 0.3]


def identical_version(rng: np.random.Generator, name: str, n: int = 400) -> VersionData:
    """One draw of a version from fixed rates and distributions: two draws are the same agent quality."""
    d = VersionData("bot", name, conversations=n)
    d.rule_conversations = {f"r{i}": int(rng.binomial(n, p)) for i, p in enumerate(RULE_RATES)}
    d.forbidden_conversations = int(rng.binomial(n, 0.03))
    d.tool_error_conversations = int(rng.binomial(n, 0.1))
    d.outcome_conversations = {
        "escalation": int(rng.binomial(n, 0.06)),
        "refund_reversal": int(rng.binomial(n, 0.02)),
    }
    d.judge = {"helpful": (200, int(rng.binomial(200, 0.15)))}
    d.steps = list(rng.poisson(8, n).astype(float))
    d.cost = list(rng.gamma(2.0, 0.01, n))
    d.latency = list(rng.lognormal(7.5, 0.6, n))
    return d


@pytest.mark.slow
def test_identical_versions_rarely_get_a_spurious_worse_verdict() -> None:
    """18 signals tested at 5% each would call some signal of identical versions worse ~30% of the time."""
    types = outcome_types("")
    seeds, rules = 200, [f"r{i}" for i in range(len(RULE_RATES))]
    spurious = raw_spurious = signals = 0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        rows = build_rows(identical_version(rng, "a"), identical_version(rng, "b"), types, rules, 200)
        signals = sum(1 for r in rows if r.p_adjusted is not None)
        spurious += any(r.verdict == WORSE for r in rows)
        raw_spurious += any(verdict(r.difference, r.direction) == WORSE for r in rows)
    assert signals >= 15
    assert raw_spurious / seeds > 0.15  # the uncorrected intervals alone: the problem is real here
    assert spurious / seeds <= 0.06


def test_a_clear_regression_survives_the_correction() -> None:
    rng = np.random.default_rng(1)
    base, cand = identical_version(rng, "a"), identical_version(rng, "b")
    cand.forbidden_conversations = 40  # 3% -> 10%
    rows = {r.signal: r for r in build_rows(base, cand, outcome_types(""), [f"r{i}" for i in range(10)], 200)}
    assert rows["forbidden_tool"].verdict == WORSE and rows["forbidden_tool"].p_adjusted < 0.05
    assert rows["forbidden_tool"].p_adjusted >= rows["forbidden_tool"].difference.p_value


def test_holm_matches_statsmodels() -> None:
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(3)
    for size in (1, 2, 5, 18):
        p = list(rng.uniform(0, 0.2, size)) + [0.01, 0.01]  # ties included
        assert stats.holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))
    assert stats.holm([]) == []


def test_the_normal_p_value_keeps_its_far_tail() -> None:
    """The two-sided normal p-value, computed without scipy: as small as the tail really is, never a 0 a
    subtraction or the lower tail's cdf would round it to (at z = 10 it is 1.5e-23)."""
    import math

    from vigil.compare.stats import _normal_p_value

    assert math.isclose(_normal_p_value(1.959963984540054, 1.0, 100, 100), 0.05, rel_tol=1e-12)
    assert math.isclose(_normal_p_value(-5.0, 1.0, 100, 100), 5.733031437583878e-07, rel_tol=1e-12)
    assert math.isclose(_normal_p_value(10.0, 1.0, 100, 100), 1.5239706048320995e-23, rel_tol=1e-9)
    assert _normal_p_value(0.0, 0.0, 2, 3) == 1.0 and _normal_p_value(1.0, 0.0, 2, 3) == pytest.approx(0.1)


def test_rows_at_zero_on_both_sides_do_not_dilute_the_holm_family() -> None:
    """One real difference among 21 rows, 14 of them 0 of 100 on both sides: those can never differ (p = 1
    whatever happened), and counting them took the real one's adjusted p from 0.024 to 0.071: the headline
    said no signal got worse while the gate, on the same data, said REGRESSION."""
    from vigil.compare.table import adjust_for_multiplicity

    def row(signal: str, xb: int, xc: int, p: float, v: str) -> Row:
        b, c = stats.Estimate(xb / 100, None, None, 100, xb), stats.Estimate(xc / 100, None, None, 100, xc)
        d = stats.Estimate((xc - xb) / 100, 0.01 if v == WORSE else -0.1, 0.2, 200, p_value=p)
        return Row(signal, signal, "rate", "lower_is_better", b, c, d, verdict=v)

    real = row("rule:a", 2, 10, 0.0034, WORSE)
    zeros = [row(f"rule:z{i}", 0, 0, 1.0, UNSURE) for i in range(14)]
    others = [row(f"rule:o{i}", 5, 6, 0.5, UNSURE) for i in range(6)]
    adjust_for_multiplicity([real, *zeros, *others])
    assert real.p_adjusted == pytest.approx(0.0034 * 7) and real.verdict == WORSE
    assert all(z.p_adjusted == 1.0 for z in zeros)
    # all events on both sides cannot differ either; one event anywhere can
    full, one = row("rule:f", 100, 100, 1.0, UNSURE), row("rule:g", 0, 1, 1.0, UNSURE)
    real.verdict = WORSE
    adjust_for_multiplicity([real, full, one])
    assert real.p_adjusted == pytest.approx(0.0034 * 2) and full.p_adjusted == 1.0


@pytest.mark.parametrize(
    ("n", "c", "k"), [(2001, 1000, 700), (30_000, 29_990, 16), (40_000, 20_000, 20_000), (5000, 3, 4)]
)
def test_pass_k_of_many_trials_agrees_with_exact_integers(n: int, c: int, k: int) -> None:
    """Beyond EXACT_UP_TO trials the figures come from log-gamma (exact integers of C(40000, 20000) cost
    5.7 s of CPU for a table of 100 tasks); they agree with the exact fractions to 1e-9."""
    import math
    from fractions import Fraction

    exact_hat = float(Fraction(math.comb(c, k), math.comb(n, k)))
    exact_at = 1 - float(Fraction(math.comb(n - c, k), math.comb(n, k)))
    assert stats.pass_hat_k(n, c, k) == pytest.approx(exact_hat, abs=1e-9)
    assert stats.pass_at_k(n, c, k) == pytest.approx(exact_at, abs=1e-9)
    assert 0.0 <= stats.pass_hat_k(n, c, k) <= 1.0
