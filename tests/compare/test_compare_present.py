"""How the compare table reads: headline, order, folding, percentage points, money."""

from __future__ import annotations

from typing import Any

from vigil.compare import present


def row(signal: str, verdict: str, b: float | None, c: float | None, kind: str = "rate", **extra: Any) -> dict:
    d = None if b is None or c is None else c - b
    return {
        "signal": signal,
        "label": signal,
        "kind": kind,
        "verdict": verdict,
        "red_flag": False,
        "informational": False,
        "baseline": {"value": b},
        "candidate": {"value": c},
        "difference": {"value": d, "low": None if d is None else d - 0.01, "high": None if d is None else d + 0.01},
        **extra,
    }


def test_headline_counts_tested_rows_only() -> None:
    signals = [
        row("a", "worse", 0.1, 0.2, red_flag=True),
        row("b", "worse", 0.1, 0.3),
        row("c", "better", 0.3, 0.1),
        row("d", "better", 0.3, 0.5, informational=True),
        row("e", "grader changed", 0.1, 0.9),
        row("f", "not yet distinguishable", 0.1, 0.1),
    ]
    h = present.headline({"signals": signals, "baseline": {"version": "v1.4.0"}, "candidate": {"version": "v1.5.0"}})
    assert h["text"] == (
        "v1.5.0 vs v1.4.0: 2 signals worse, 1 better, 1 red flag; 1 signal not comparable (grader changed)"
    )
    one = present.headline({"signals": signals[1:3], "baseline": {"version": "a"}, "candidate": {"version": "b"}})
    assert one["text"] == "b vs a: 1 signal worse, 1 better, 0 red flags"


def test_worse_first_red_flags_on_top_and_zero_rates_folded() -> None:
    signals = [
        row("unsure", "not yet distinguishable", 0.1, 0.12),
        row("better", "better", 0.3, 0.1),
        row("zero", "not yet distinguishable", 0.0, 0.0),
        row("worse", "worse", 0.1, 0.2),
        row("flagged", "worse", 0.1, 0.3, red_flag=True),
        row("info", "worse", 0.1, 0.3, informational=True),
        row("regraded", "grader changed", 0.1, 0.3),
        row("cost_usd", "no data", None, None, kind="mean"),
        row("steps", "not yet distinguishable", 0.0, 0.0, kind="mean"),  # a mean of zero is still shown
    ]
    shown, folded = present.ordered(signals)
    assert [r["signal"] for r in shown] == [
        "flagged",
        "worse",
        "unsure",
        "steps",
        "better",
        "regraded",
        "info",
        "cost_usd",
    ]
    assert [r["signal"] for r in folded] == ["zero"]


def test_percentage_points_and_money() -> None:
    rate = row("forbidden_tool", "worse", 0.0, 0.1)
    rate["difference"].update(low=0.061, high=0.149, se=0.0212)
    assert present.value(rate, rate["candidate"]) == "10.0%"
    assert present.difference(rate) == "+10.0 pp"
    assert present.difference_interval(rate) == "[+6.1, +14.9]"
    assert present.standard_error(rate) == "SE 2.1 pp"
    cost = row("cost_usd", "better", 4.104e-05, 2.5e-05, kind="mean")
    assert present.value(cost, cost["baseline"]) == "$0.000041"
    assert present.difference(cost) == "-$0.000016"
    near_zero = row("truncation_rate", "not yet distinguishable", 0.02, 0.0)
    near_zero["difference"].update(low=-0.04, high=-0.0000001)
    assert present.difference_interval(near_zero) == "[-4.0, ±0.0]"
    latency = row("latency_p95_ms", "better", 5793.2, 2803.0, kind="p95")
    assert present.value(latency, latency["baseline"]) == "5,793 ms" and present.difference(latency) == "-2,990 ms"
