"""Paired and task-clustered statistics: the issue's worked example and the multi-rollout cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vigil.compare import paired


def _runs(successes: set[int], tasks: int = 200) -> dict[str, list[float]]:
    return {f"t{i}": [1.0 if i in successes else 0.0] for i in range(tasks)}


def test_80_to_90_of_200_by_fixing_ten_and_breaking_none() -> None:
    baseline = _runs(set(range(80)))
    candidate = _runs(set(range(90)))
    diff = paired.paired_difference(candidate, baseline)
    assert diff.tasks == 200
    assert diff.value == pytest.approx(0.05)
    assert diff.se == pytest.approx(0.015, abs=0.001)
    assert diff.low == pytest.approx(0.02, abs=0.002) and diff.high == pytest.approx(0.08, abs=0.002)
    assert diff.significant
    # each side's own interval is wider than the improvement, so an unpaired comparison cannot tell
    for side in (baseline, candidate):
        own = paired.clustered_mean(side)
        assert own.high - own.low > 0.05
    unpaired = paired.unpaired_difference(candidate, baseline)
    assert unpaired.value == pytest.approx(0.05) and not unpaired.significant


def test_paired_uses_only_shared_tasks() -> None:
    baseline = {"a": [1.0], "b": [0.0], "c": [1.0], "only-base": [0.0]}
    candidate = {"a": [1.0], "b": [1.0], "c": [0.0], "only-cand": [1.0]}
    diff, is_paired = paired.difference(candidate, baseline)
    assert is_paired and diff.tasks == 3 and diff.value == pytest.approx(0.0)
    diff, is_paired = paired.difference({"x": [1.0], "y": [1.0]}, {"z": [0.0], "w": [1.0]})
    assert not is_paired and diff.value == pytest.approx(0.5)


def test_clustered_se_treats_tasks_not_rollouts_as_the_sample() -> None:
    # 10 tasks, 8 rollouts each, every task either always passes or always fails: 10 independent draws
    rollouts = {f"t{i}": [float(i < 5)] * 8 for i in range(10)}
    clustered = paired.clustered_mean(rollouts)
    naive_se = math.sqrt(0.5 * 0.5 / 80)
    assert clustered.value == pytest.approx(0.5)
    assert clustered.se == pytest.approx(np.std([float(i < 5) for i in range(10)], ddof=1) / math.sqrt(10))
    assert clustered.se > 2.5 * naive_se
    parts = paired.variance_components(rollouts)
    assert parts["within"] == pytest.approx(0.0) and parts["between"] == pytest.approx(0.25 * 10 / 9)
    # pure within-task noise: the between part vanishes
    noisy = {f"t{i}": [1.0, 0.0, 1.0, 0.0] for i in range(10)}
    parts = paired.variance_components(noisy)
    assert parts["between"] == pytest.approx(0.0) and parts["within"] == pytest.approx(1 / 3)


def test_clustered_mean_weights_rollouts_with_unequal_counts() -> None:
    rollouts = {"a": [1.0, 1.0, 1.0], "b": [0.0], "c": [1.0, 0.0]}
    est = paired.clustered_mean(rollouts)
    assert est.value == pytest.approx(4 / 6)
    scores = [3 - 3 * 4 / 6, 0 - 4 / 6, 1 - 2 * 4 / 6]
    assert est.se == pytest.approx(math.sqrt(3 / 2 * sum(s * s for s in scores)) / 6)


def test_all_pass_and_all_fail_fractions() -> None:
    rollouts = {"a": [1.0, 1.0], "b": [0.0, 0.0], "c": [1.0, 0.0], "d": [1.0, 1.0]}
    assert paired.all_pass_fraction(rollouts).value == pytest.approx(0.5)
    assert paired.all_fail_fraction(rollouts).value == pytest.approx(0.25)


def test_pass_k_at_powers_of_two_up_to_n() -> None:
    rollouts = {"a": [1.0] * 5, "b": [1.0, 0.0, 1.0, 0.0, 1.0], "c": [0.0] * 5}
    table = paired.pass_k(rollouts)
    assert sorted(table["pass_hat_k"]) == [1, 2, 4]
    assert table["pass_at_k"][1].value == pytest.approx(table["pass_hat_k"][1].value)
    # task b: 3 of 5 pass. pass^2 = C(3,2)/C(5,2) = 0.3, pass@2 = 1 - C(2,2)/C(5,2) = 0.9
    assert table["pass_hat_k"][2].value == pytest.approx((1 + 0.3 + 0) / 3)
    assert table["pass_at_k"][2].value == pytest.approx((1 + 0.9 + 0) / 3)
    assert table["pass_hat_k"][4].value == pytest.approx(1 / 3)
    for k in (1, 2, 4):
        est = table["pass_hat_k"][k]
        assert 0 <= est.low <= est.value <= est.high <= 1
    assert paired.powers_of_two(1) == [1] and paired.powers_of_two(9) == [1, 2, 4, 8]


def test_pass_hat_k_difference_pairs_tasks() -> None:
    base = {f"t{i}": [1.0, 1.0, 1.0, 1.0] for i in range(30)}
    cand = {t: ([1.0, 0.0, 1.0, 1.0] if i < 10 else v) for i, (t, v) in enumerate(base.items())}
    diff, is_paired = paired.pass_hat_k_difference(cand, base, 4)
    assert is_paired and diff.value == pytest.approx(-10 / 30) and diff.significant and diff.high < 0


def test_no_data_gives_no_estimate() -> None:
    assert paired.clustered_mean({}).value is None
    assert paired.paired_difference({"a": [1.0]}, {"b": [1.0]}).value is None
    one = paired.paired_difference({"a": [1.0]}, {"a": [0.0]})
    assert one.value == 1.0 and one.low is None


def test_vectorized_counts_give_the_same_figures_as_rollouts() -> None:
    from vigil.compare import stats

    rng = np.random.default_rng(3)
    counts = [(int(n), int(rng.integers(0, n + 1))) for n in rng.integers(1, 9, size=40)]
    trials = np.array([n for n, _ in counts], dtype=float)
    passes = np.array([c for _, c in counts], dtype=float)
    for k in (1, 2, 4, 8):
        keep = trials >= k
        hat = paired.pass_hat_k_of(trials, passes, k)[keep]
        at = paired.pass_at_k_of(trials, passes, k)[keep]
        assert list(hat) == pytest.approx([stats.pass_hat_k(n, c, k) for n, c in counts if n >= k])
        assert list(at) == pytest.approx([stats.pass_at_k(n, c, k) for n, c in counts if n >= k])
        one_each = paired.mean_of_tasks(hat, (0, 1))
        lists = paired.clustered_mean({str(i): [v] for i, v in enumerate(hat)}, (0, 1))
        assert (one_each.value, one_each.se, one_each.low) == pytest.approx((lists.value, lists.se, lists.low))
    c, base = paired.mean_of_tasks(passes / trials, (0, 1)), paired.mean_of_tasks(np.zeros(40), (0, 1))
    d = paired.interval_difference(c, base)
    assert d.value == pytest.approx(c.value) and d.se == pytest.approx(c.se)


def test_differences_without_spread_get_the_exact_permutation_p_value() -> None:
    # two shared tasks that both broke: d = (-1, -1) has no spread, which is no proof (sign flips: 2/2^2)
    diff = paired.paired_difference({"a": [0.0], "b": [0.0]}, {"a": [1.0], "b": [1.0]})
    assert diff.value == -1.0 and diff.p_value == pytest.approx(0.5)
    # no shared task: 3 tasks all passing against 3 others all failing (relabellings: 2/C(6, 3))
    unpaired = paired.unpaired_difference({t: [1.0] for t in "abc"}, {t: [0.0] for t in "xyz"})
    assert unpaired.value == 1.0 and unpaired.p_value == pytest.approx(0.1)
    same = paired.paired_difference({"a": [1.0], "b": [0.0]}, {"a": [1.0], "b": [0.0]})
    assert same.value == 0.0 and same.p_value == 1.0


def test_rates_near_zero_or_one_keep_an_honest_interval() -> None:
    # ten tasks, all passed: Wald's value ± t·se was [1, 1]; the score interval at the effective size is not
    every = paired.mean_of_tasks(np.full(10, 1.0), (0, 1))
    assert every.value == 1.0 and every.high == 1.0 and 0.6 < every.low < 0.8
    none = paired.clustered_mean({f"t{i}": [0.0, 0.0] for i in range(10)}, (0, 1))
    assert none.low == 0.0 and 0.05 < none.high < 0.3
    # away from the bounds it is the t interval it replaces
    half = paired.mean_of_tasks(np.array([float(i % 2) for i in range(200)]), (0, 1))
    assert half.low == pytest.approx(0.5 - 1.972 * half.se, abs=0.002)
    assert half.high == pytest.approx(0.5 + 1.972 * half.se, abs=0.002)


@pytest.mark.parametrize(("tasks", "rollouts", "rate"), [(10, 1, 0.9), (10, 4, 0.98), (30, 1, 0.98), (30, 4, 0.5)])
def test_a_task_success_interval_covers_the_true_rate(tasks: int, rollouts: int, rate: float) -> None:
    # 2,000 simulated suites, per-task success rates drawn around `rate` (Beta, concentration 4)
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(2000):
        p = rng.beta(rate * 4, (1 - rate) * 4, tasks)
        passes = rng.binomial(rollouts, p).astype(float)
        i = paired.mean_of_tasks(passes / rollouts, (0, 1))  # each side of the task success row
        covered += i.low <= rate <= i.high
    assert covered / 2000 >= 0.93, covered / 2000


def test_a_difference_of_task_rates_stays_within_minus_one_and_one() -> None:
    """Two shared tasks whose rates moved by 0 and by 1: the t interval on one degree of freedom reached
    [-585%, +685%]; a difference of rates cannot leave [-100%, +100%]."""
    import numpy as np

    from vigil.compare.pairing import _paired, _Pairs

    pairs = _Pairs(np.array([0, 1]), np.array([0, 1]))
    everything = np.ones(2, bool)
    _, _, diff, paired = _paired(pairs, np.array([0.0, 0.0]), np.array([0.0, 1.0]), everything, everything)
    assert paired and diff.value == 0.5 and (diff.low, diff.high) == (-1.0, 1.0)
    # unpaired (no shared tasks) alike
    none = _Pairs(np.array([], dtype=int), np.array([], dtype=int))
    _, _, diff, paired = _paired(none, np.array([0.0, 0.0]), np.array([0.0, 1.0]), everything, everything)
    assert not paired and diff.low is not None and diff.low >= -1.0 and diff.high is not None and diff.high <= 1.0
