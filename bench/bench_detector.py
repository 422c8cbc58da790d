"""Detector benchmark on simulated Bernoulli streams: baseline failure rate 5%, shifts to 7.5% and 10%.

Reports, per shift, the mean detection delay in conversations and false alarms per 100,000
conversations for
  (a) Vigil's detector: the Bernoulli CUSUMs of ``vigil.detector.cusum`` with the default settings
      (shifts 1.5x and 2x, ARL0 200,000), fed one conversation at a time and in batches of 50 (one
      detector pass), with the baseline known and estimated from 20,000 baseline conversations
      (the cautious upper bound the detector uses);
  (b) a fixed-window threshold alert (failures in a tumbling window of W conversations >= k), with
      W and k tuned to the same false-alarm rate (1 per 100,000) and the fastest W kept, computed
      exactly from the binomial distribution with the change at a window's start (its best case);
  (c) the theoretical CUSUM delay log(ARL0) / KL(p1 || p0) with ARL0 = 100,000.

Delays start from a zero statistic at the change (the CUSUM's worst case). False alarms count
every alarm on in-control streams, restarting the statistic after each.

    python -m bench.bench_detector            # about a minute on one core
    python -m bench.bench_detector --quick
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy.stats import binom

from vigil.detector.cusum import Cusum, kl_bernoulli, upper_bound
from vigil.settings import Settings

P0 = 0.05
SHIFTS = (0.075, 0.10)
TARGET_FA_PER_100K = 1.0
ARL0_THEORY = 100_000


def design(p0_used: float, s: Settings) -> Cusum:
    ratios = [float(r) for r in s.detector_shifts.split(",")]
    return Cusum.design(p0_used, ratios, s.detector_min_abs_shift, s.detector_arl0)


def weights(c: Cusum) -> tuple[np.ndarray, np.ndarray]:
    w = np.array(c.weights())
    return w[:, 0], w[:, 1]


def false_alarms(
    c: Cusum, p: float, streams: int, steps: int, batch: int, rng: np.random.Generator
) -> tuple[float, int]:
    """Alarms per 100,000 in-control conversations (statistic restarted after each alarm), and their count."""
    a, b = weights(c)
    stats = np.zeros((streams, len(a)))
    alarms = 0
    for _ in range(steps):
        x = rng.binomial(batch, p, size=streams)[:, None]
        stats = np.minimum(c.cap, np.maximum(0.0, stats + x * a + (batch - x) * b))
        hit = (stats >= c.h).any(axis=1)
        if hit.any():
            alarms += int(hit.sum())
            stats[hit] = 0.0
    return alarms / (streams * steps * batch) * 1e5, alarms


def delays(c: Cusum, p: float, streams: int, batch: int, rng: np.random.Generator, cap: int = 200_000) -> float:
    """Mean conversations from the change to the alarm (counted at the end of the alarming batch)."""
    a, b = weights(c)
    stats = np.zeros((streams, len(a)))
    done = np.zeros(streams, dtype=bool)
    delay = np.zeros(streams)
    n = 0
    while not done.all() and n < cap:
        n += batch
        x = rng.binomial(batch, p, size=streams)[:, None]
        stats = np.minimum(c.cap, np.maximum(0.0, stats + x * a + (batch - x) * b))
        hit = (stats >= c.h).any(axis=1) & ~done
        delay[hit] = n
        done |= hit
    delay[~done] = cap
    return float(delay.mean())


def calibrated(known: Cusum, target_per_100k: float, streams: int, steps: int, seed: int) -> Cusum:
    """The same CUSUMs with the threshold lowered until false alarms reach the target (bisection)."""
    lo, hi = 4.0, known.h
    for _ in range(10):
        mid = (lo + hi) / 2
        trial = Cusum(known.p0, known.p1s, mid, 1.5 * mid)
        fa, _ = false_alarms(trial, P0, streams, steps, 1, np.random.default_rng(seed))
        lo, hi = (mid, hi) if fa > target_per_100k else (lo, mid)
    return Cusum(known.p0, known.p1s, hi, 1.5 * hi)


def window_delay(w: int, k: int, p0: float, p1: float) -> float:
    """Mean delay when the change falls uniformly inside a window (the first window is mixed)."""
    q = binom.sf(k - 1, w, p1)
    total = 0.0
    offsets = np.linspace(0, w - 1, 25).astype(int)
    for u in offsets:  # u conversations of the window were before the change
        before = binom.pmf(np.arange(u + 1), u, p0)
        after_tail = binom.sf(k - 1 - np.arange(u + 1), w - u, p1)
        q_u = float(np.dot(before, after_tail))
        total += (w - u) + (1 - q_u) * w / q
    return total / len(offsets)


def fixed_window(p0: float, p1: float, target_per_100k: float) -> tuple[int, int, float, float]:
    """Fastest tumbling window (W, k) at or below the false-alarm target: (W, k, FA per 100k, mean delay)."""
    best = None
    for w in (100, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000, 7500, 10000, 20000, 40000):
        allowed = target_per_100k * w / 1e5  # alarm probability per window
        k = int(binom.isf(allowed, w, p0))
        while binom.sf(k - 1, w, p0) > allowed:
            k += 1
        fa = binom.sf(k - 1, w, p0) * 1e5 / w
        delay = window_delay(w, k, p0, p1)
        if best is None or delay < best[3]:
            best = (w, k, fa, delay)
    assert best is not None
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="Smaller samples (rough figures).")
    parser.add_argument("--seed", type=int, default=2024)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    s = Settings()
    fa_streams, fa_steps = (500, 20_000) if args.quick else (2000, 50_000)
    delay_streams = 500 if args.quick else 2000
    baseline_n = 20_000
    t0 = time.perf_counter()

    known = design(P0, s)
    est_p0 = [
        upper_bound(int(rng.binomial(baseline_n, P0)), baseline_n, s.detector_baseline_confidence) for _ in range(3)
    ]
    estimated = [design(p, s) for p in est_p0]
    rows = []
    fa_known, n_known = false_alarms(known, P0, fa_streams, fa_steps, 1, rng)
    fa_batch, _ = false_alarms(known, P0, fa_streams, fa_steps // 50, 50, rng)
    est_runs = [false_alarms(c, P0, fa_streams // 3, fa_steps, 1, rng) for c in estimated]
    fa_est = float(np.mean([r[0] for r in est_runs]))
    total = fa_streams * fa_steps
    # when no alarm is seen, the window alert is tuned to the 95% upper bound of Vigil's rate
    matched = max(fa_known, 3.0 / total * 1e5)
    print(
        f"{total:,} in-control conversations: {n_known} false alarms with the known baseline "
        f"({fa_known:.4f} per 100k; 95% upper bound {(n_known + 3) / total * 1e5:.4f}); estimated baselines "
        f"{', '.join(f'{p:.4f}' for p in est_p0)}: {sum(r[1] for r in est_runs)} false alarms"
    )
    print(
        f"CUSUM threshold h = log({s.detector_arl0:,.0f} x {len(known.p1s)}) = {known.h:.2f}; "
        f"tuned shifts p1 = {', '.join(f'{p:.4f}' for p in known.p1s)}"
    )
    equal = calibrated(known, TARGET_FA_PER_100K, fa_streams // 2, fa_steps // 2, args.seed)
    fa_equal, n_equal = false_alarms(equal, P0, fa_streams, fa_steps, 1, rng)
    print(
        f"same CUSUMs at about 1 false alarm per 100k: h = {equal.h:.2f}, measured {fa_equal:.3f} per 100k "
        f"({n_equal} alarms)"
    )
    for p1 in SHIFTS:
        theory = math.log(ARL0_THEORY) / kl_bernoulli(p1, P0)
        d_equal = delays(equal, p1, delay_streams, 1, rng)
        d_known = delays(known, p1, delay_streams, 1, rng)
        d_batch = delays(known, p1, delay_streams, 50, rng)
        d_est = float(np.mean([delays(c, p1, delay_streams // 3, 1, rng) for c in estimated]))
        same = fixed_window(P0, p1, matched)
        target = fixed_window(P0, p1, TARGET_FA_PER_100K)
        rows.append((p1, theory, d_known, d_batch, d_est, same, target, d_equal))
    print()
    print(
        "| shift | (c) log(1e5)/KL | (a) Vigil delay | (a) batches of 50 | (a) baseline from 20k | "
        f"(b) window at Vigil's FA ({matched:.3f}/100k): W, k, delay | (a) CUSUMs at 1/100k | "
        "(b) window at 1/100k: W, k, delay | (a)/(c) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for p1, theory, dk, db, de, (w1, k1, _, d1), (w2, k2, _, d2), dq in rows:
        print(
            f"| 5% → {100 * p1:g}% | {theory:,.0f} | {dk:,.0f} | {db:,.0f} | {de:,.0f} | "
            f"W={w1:,}, k={k1}, {d1:,.0f} | {dq:,.0f} | W={w2:,}, k={k2}, {d2:,.0f} | {dk / theory:.2f} |"
        )
    print(
        f"\nFalse alarms per 100k: known baseline {fa_known:.4f}, batches of 50 {fa_batch:.4f}, "
        f"estimated baseline {fa_est:.4f}. ({time.perf_counter() - t0:.0f} s, seed {args.seed}, "
        f"{delay_streams} change streams per cell)"
    )


if __name__ == "__main__":
    main()
