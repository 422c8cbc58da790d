"""The release gate: two runs of the same suite, signal by signal, paired where tasks match.

Each row has both sides' estimate and the candidate-minus-baseline difference with its 95% interval,
treating tasks (not rollouts) as the sample: paired over shared tasks where the runs share at least two,
else each side clustered by task. A row *regresses* when it moved the wrong way and its Holm-adjusted
p-value over the gating rows is below 0.05. A row whose grader differs between the sides is marked
``grader changed`` and never counts as a regression: its scores were not produced the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vigil.compare import (
    EMPTY,
    Interval,
    Rollouts,
    clustered_mean,
    difference,
    holm,
    pass_at_k,
    pass_hat_k,
    pass_k,
    per_task,
    powers_of_two,
    spread_free_p_value,
)
from vigil.evaluation.runs import PROTOCOL_KEYS, Run

SIGNIFICANCE = 0.05
RESAMPLES = 2000
SEED = 20240611

Better = Literal["higher", "lower"]


@dataclass
class Row:
    signal: str
    unit: Literal["rate", "count", "usd", "seconds"]
    better: Better
    grader: str | None  # the protocol key that says how this signal is measured
    baseline: Interval
    candidate: Interval
    difference: Interval
    paired: bool
    gating: bool = True
    verdict: str = "no significant change"
    red_flag: str | None = None

    @property
    def worse(self) -> bool:
        d = self.difference.value
        return d is not None and (d < 0 if self.better == "higher" else d > 0)

    @property
    def better_point(self) -> bool:
        d = self.difference.value
        return d is not None and (d > 0 if self.better == "higher" else d < 0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "signal": self.signal,
            "unit": self.unit,
            "better": self.better,
            "grader": self.grader,
            "baseline": self.baseline.as_dict(),
            "candidate": self.candidate.as_dict(),
            "difference": self.difference.as_dict(),
            "paired": self.paired,
            "gating": self.gating,
            "verdict": self.verdict,
            "red_flag": self.red_flag,
        }


def _row(
    signal: str,
    unit: Any,
    better: Better,
    grader: str | None,
    base: Rollouts,
    cand: Rollouts,
    bounds: tuple[float, float] | None = None,
    gating: bool = True,
) -> Row:
    diff, is_paired = difference(cand, base)
    return Row(
        signal,
        unit,
        better,
        grader,
        clustered_mean(base, bounds),
        clustered_mean(cand, bounds),
        diff,
        is_paired,
        gating,
    )


def _flags(run: Run, attr: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in run.rollouts:
        v = getattr(r, attr)
        if v is not None:
            out.setdefault(r.task_id, []).append(float(bool(v)))
    return out


def _p95(groups: list[np.ndarray]) -> float:
    return float(np.percentile(np.concatenate(groups), 95))


def _p95_row(base: dict[str, list[float]], cand: dict[str, list[float]]) -> Row:
    """p95 latency: cluster (task) bootstrap, resampling shared tasks together where the runs pair."""
    shared = sorted(set(base) & set(cand))
    is_paired = len(shared) >= 2
    rng = np.random.default_rng(SEED)

    def side(values: dict[str, list[float]]) -> Interval:
        groups = [np.asarray(v) for v in values.values() if v]
        if not groups:
            return EMPTY
        point = _p95(groups)
        if len(groups) < 2:
            return Interval(point, None, None, None, len(groups))
        boot = [_p95([groups[i] for i in rng.integers(0, len(groups), len(groups))]) for _ in range(RESAMPLES)]
        lo, hi = np.percentile(boot, [2.5, 97.5])
        return Interval(point, float(np.std(boot, ddof=1)), float(lo), float(hi), len(groups))

    b, c = side(base), side(cand)
    if b.value is None or c.value is None:
        return Row("p95 latency (s)", "seconds", "lower", "harness", b, c, EMPTY, False)
    point = c.value - b.value
    bg = [np.asarray(base[t]) for t in (shared if is_paired else base)]
    cg = [np.asarray(cand[t]) for t in (shared if is_paired else cand)]
    boots = []
    for _ in range(RESAMPLES):
        if is_paired:
            idx = rng.integers(0, len(shared), len(shared))
            boots.append(_p95([cg[i] for i in idx]) - _p95([bg[i] for i in idx]))
        else:
            bi, ci = rng.integers(0, len(bg), len(bg)), rng.integers(0, len(cg), len(cg))
            boots.append(_p95([cg[i] for i in ci]) - _p95([bg[i] for i in bi]))
    se = float(np.std(boots, ddof=1))
    lo, hi = np.percentile(boots, [2.5, 97.5])
    if se > 0:
        p = 2 * (1 - _phi(abs(point) / se))
    else:  # every task's latencies the same on either side: the exact permutation test
        p = spread_free_p_value(point, len(shared)) if is_paired else spread_free_p_value(point, len(bg), len(cg))
    diff = Interval(point, se, float(lo), float(hi), len(shared) if is_paired else min(len(bg), len(cg)), p)
    return Row("p95 latency (s)", "seconds", "lower", "harness", b, c, diff, is_paired)


def _phi(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


def build_rows(base: Run, cand: Run) -> list[Row]:
    bs, cs = base.by_task("success"), cand.by_task("success")
    sizes = [len(v) for v in (*bs.values(), *cs.values()) if v]
    rows: list[Row] = []
    for k in powers_of_two(min(sizes) if sizes else 0):
        per_b = pass_k(_at_least(bs, k))
        per_c = pass_k(_at_least(cs, k))
        for key, name in (("pass_hat_k", f"pass^{k}"), ("pass_at_k", f"pass@{k}")):
            if k == 1 and key == "pass_at_k":
                continue
            fn = pass_hat_k if key == "pass_hat_k" else pass_at_k
            diff, is_paired = difference(per_task(cs, k, fn), per_task(bs, k, fn))
            label = "pass@1 (= pass^1)" if k == 1 else name
            rows.append(
                Row(
                    label,
                    "rate",
                    "higher",
                    "grader",
                    per_b[key][k],
                    per_c[key][k],
                    diff,
                    is_paired,
                    k == 1 or key == "pass_hat_k",
                )
            )
    for name, passed, better in (("tasks all rollouts pass", 1.0, "higher"), ("tasks all rollouts fail", 0.0, "lower")):
        tb = {t: [float(all(x == passed for x in v))] for t, v in bs.items()}
        tc = {t: [float(all(x == passed for x in v))] for t, v in cs.items()}
        rows.append(_row(name, "rate", better, "grader", tb, tc, (0, 1), gating=False))  # type: ignore[arg-type]
    rows.append(_row("avg steps", "count", "lower", "harness", base.by_task("steps"), cand.by_task("steps")))
    rows.append(
        _row("cost per task (USD)", "usd", "lower", "model", base.by_task("cost_usd"), cand.by_task("cost_usd"))
    )
    rows.append(_p95_row(base.by_task("latency_s"), cand.by_task("latency_s")))
    for name, attr, grader in (
        ("forbidden-tool rate", "forbidden_tool", "rule_packs"),
        ("error rate", "error", "harness"),
        ("truncation rate", "truncated", "budgets"),
    ):
        rows.append(_row(name, "rate", "lower", grader, _flags(base, attr), _flags(cand, attr), (0, 1)))
    return [r for r in rows if r.baseline.value is not None or r.candidate.value is not None]


def _at_least(values: dict[str, list[float]], k: int) -> dict[str, list[float]]:
    return {t: v for t, v in values.items() if len(v) >= k}


def protocol_diff(base: Run, cand: Run) -> list[dict[str, Any]]:
    out = []
    for key in PROTOCOL_KEYS:
        b, c = base.protocol.get(key), cand.protocol.get(key)
        if b is None and c is None:
            continue
        out.append({"key": key, "baseline": b, "candidate": c, "same": b == c})
    return out


def judge_rows(rows: list[Row], changed: set[str]) -> list[Row]:
    # a row with no spread and no difference (every task the same on both sides) cannot differ under any
    # relabelling: its p-value is 1 whatever happened, and Holm's family leaves it out (Tarone, 1990; the
    # compare table's rule, vigil.compare.table.cannot_differ, asks it of counts: its rows carry no spread)
    gating = [
        r
        for r in rows
        if r.gating
        and r.grader not in changed
        and r.difference.p_value is not None
        and not (r.difference.value == 0 and r.difference.se == 0)
    ]
    p_values = [r.difference.p_value for r in gating]
    adjusted = dict(zip((id(r) for r in gating), holm([1.0 if p is None else p for p in p_values]), strict=True))
    for r in rows:
        if r.grader in changed:
            r.verdict = f"grader changed ({r.grader})"
        elif r.difference.value is None or r.difference.low is None:
            r.verdict = "no interval"
        elif r.difference.significant and not r.gating:
            r.verdict = ("worse" if r.worse else "better") + " (not gating)"
        elif r.difference.significant and adjusted.get(id(r), 1.0) < SIGNIFICANCE:
            r.verdict = "REGRESSION" if r.worse else "improved"
        elif r.difference.significant:
            r.verdict = ("worse" if r.worse else "better") + " (not after Holm)"
    cheaper = [r.signal for r in rows if r.signal in ("avg steps", "cost per task (USD)") and r.better_point]
    if cheaper:
        for r in rows:
            if r.unit == "rate" and r.worse and r.grader not in changed:
                r.red_flag = f"worse while {' and '.join(cheaper)} improved"
    return rows


def gate(base: Run, cand: Run) -> dict[str, Any]:
    protocol = protocol_diff(base, cand)
    changed = {p["key"] for p in protocol if not p["same"] and p["key"] in ("grader", "judge", "rule_packs")}
    rows = judge_rows(build_rows(base, cand), changed)
    bt, ct = {r.task_id for r in base.rollouts}, {r.task_id for r in cand.rollouts}
    regressions = [r.signal for r in rows if r.verdict == "REGRESSION"]
    return {
        "baseline": {"path": str(base.path), "format": base.format, "rollouts": len(base.rollouts), "tasks": len(bt)},
        "candidate": {"path": str(cand.path), "format": cand.format, "rollouts": len(cand.rollouts), "tasks": len(ct)},
        "tasks": {"shared": len(bt & ct), "baseline_only": len(bt - ct), "candidate_only": len(ct - bt)},
        "protocol": protocol,
        "comparable": all(p["same"] for p in protocol),
        "graders_changed": sorted(changed),
        "rows": [r.as_dict() for r in rows],
        "red_flags": [f"{r.signal}: {r.red_flag}" for r in rows if r.red_flag],
        "regressions": regressions,
        "regression": bool(regressions),
    }


def _fmt(e: dict[str, Any], unit: str, signed: bool = False) -> str:
    if e.get("value") is None:
        return "–"
    if unit == "rate":
        f = (lambda x: f"{100 * x:+.1f}%") if signed else (lambda x: f"{100 * x:.1f}%")
    elif unit == "usd":
        f = (lambda x: f"{x:+.4f}") if signed else (lambda x: f"{x:.4f}")
    else:
        f = (lambda x: f"{x:+.2f}") if signed else (lambda x: f"{x:.2f}")
    out = f(e["value"])
    if e.get("low") is not None:
        out += f" [{f(e['low'])}, {f(e['high'])}]"
    return out


def print_gate(result: dict[str, Any], out: Console) -> None:
    b, c, t = result["baseline"], result["candidate"], result["tasks"]
    out.print(f"baseline  {escape(str(b['path']))} ({b['format']}): {b['rollouts']} rollouts of {b['tasks']} tasks")
    out.print(f"candidate {escape(str(c['path']))} ({c['format']}): {c['rollouts']} rollouts of {c['tasks']} tasks")
    out.print(
        f"tasks: {t['shared']} shared, {t['baseline_only']} baseline only, {t['candidate_only']} candidate only"
        + ("" if t["shared"] >= 2 else " — unpaired comparison")
    )
    table = Table("signal", "baseline", "candidate", "difference [95%]", "paired", "verdict", title="gate")
    for r in result["rows"]:
        verdict = r["verdict"] + (f"  🚩 {r['red_flag']}" if r["red_flag"] else "")
        style = "red" if r["verdict"] == "REGRESSION" or r["red_flag"] else None
        table.add_row(
            r["signal"],
            _fmt(r["baseline"], r["unit"]),
            _fmt(r["candidate"], r["unit"]),
            _fmt(r["difference"], r["unit"], signed=True),
            "yes" if r["paired"] else "no",
            verdict,
            style=style,
        )
    out.print(table)
    proto = Table("protocol", "baseline", "candidate", "", title="how each side was produced")
    for p in result["protocol"]:
        proto.add_row(p["key"], str(p["baseline"])[:70], str(p["candidate"])[:70], "same" if p["same"] else "DIFFERS")
    out.print(proto)
    if not result["comparable"]:
        out.print("[yellow]the two runs were not produced the same way (see DIFFERS above)[/yellow]")
    if result["regression"]:
        out.print(f"[red]REGRESSION: {escape(', '.join(result['regressions']))}[/red]")
    else:
        out.print("[green]no significant regression[/green]")
