"""The compare table's per-task rows and each side's protocol, from two versions' :class:`TaskData`.

The success rate is the mean over tasks of each task's rate. Where the versions share task ids it is
compared **paired**: per shared task the difference of the two sides' success rates, ``d_i``, and the
interval of its mean from ``sqrt(Var(d_i) / M)`` over the ``M`` shared tasks. With several rollouts per
task every interval treats tasks, not rollouts, as the sample (clustered by task). pass^k and pass@k
appear at k = 2, 4, 8, ... up to the fewest rollouts of any repeated task whenever tasks repeat on both
sides; the shares of tasks where every rollout passed or failed, and the error and truncation rates, are
rows of their own.

A row whose *grader* differs between the sides (the grader of task outcomes, a judge's version, the
rules behind a rule row) is marked ``grader changed`` instead of better or worse: its scores were not
produced the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from vigil.compare import stats
from vigil.compare.paired import (
    Interval,
    Rollouts,
    clustered_mean,
    difference,
    interval_difference,
    mean_of_tasks,
    pass_at_k_of,
    pass_hat_k_of,
    powers_of_two,
)
from vigil.compare.tasks import NOT_RECORDED, PROTOCOL_KEYS, TaskData

Direction = Literal["lower_is_better", "higher_is_better"]
RuleVersions = Callable[[str, str], Mapping[str, str]]
"""(agent, version) -> {rule id: how the rule is defined (pack, type, digest)} for the rules that apply."""

GRADER_CHANGED = "grader changed"
UNIT = (0.0, 1.0)


@dataclass(frozen=True, slots=True)
class TaskRow:
    signal: str
    label: str
    direction: Direction
    baseline: stats.Estimate
    candidate: stats.Estimate
    difference: stats.Estimate
    paired: bool
    grader: str
    informational: bool = False  # shown with its interval, never part of the verdict count


def estimate(i: Interval) -> stats.Estimate:
    return stats.Estimate(i.value, i.low, i.high, i.tasks, p_value=i.p_value, se=i.se)


def _row(
    signal: str,
    label: str,
    direction: Direction,
    base: Rollouts,
    cand: Rollouts,
    grader: str,
    informational: bool = False,
) -> TaskRow:
    diff, is_paired = difference(cand, base)
    return TaskRow(
        signal,
        label,
        direction,
        estimate(clustered_mean(base, UNIT)),
        estimate(clustered_mean(cand, UNIT)),
        estimate(diff),
        is_paired,
        grader,
        informational,
    )


class _Side:
    """One version's per-task counts as arrays."""

    def __init__(self, counts: Mapping[str, tuple[int, int]]) -> None:
        self.tasks = list(counts)
        self.pos = {t: i for i, t in enumerate(self.tasks)}
        self.n = np.array([counts[t][0] for t in self.tasks], dtype=float)
        self.c = np.array([counts[t][1] for t in self.tasks], dtype=float)


@dataclass(frozen=True, slots=True)
class _Pairs:
    """The shared tasks' positions on either side."""

    b: np.ndarray
    c: np.ndarray

    @classmethod
    def of(cls, b: _Side, c: _Side) -> _Pairs:
        shared = [t for t in b.tasks if t in c.pos]
        return cls(np.array([b.pos[t] for t in shared], dtype=int), np.array([c.pos[t] for t in shared], dtype=int))


def _paired(
    pairs: _Pairs, b_values: np.ndarray, c_values: np.ndarray, b_mask: np.ndarray, c_mask: np.ndarray
) -> tuple[Interval, Interval, Interval, bool]:
    """Both sides' means of a per-task value and the difference: paired over shared tasks (two or more)."""
    b_side, c_side = mean_of_tasks(b_values[b_mask], UNIT), mean_of_tasks(c_values[c_mask], UNIT)
    both = b_mask[pairs.b] & c_mask[pairs.c]
    if int(both.sum()) >= 2:
        return b_side, c_side, _within_unit(mean_of_tasks(c_values[pairs.c[both]] - b_values[pairs.b[both]])), True
    return b_side, c_side, _within_unit(interval_difference(c_side, b_side)), False


def _within_unit(diff: Interval) -> Interval:
    """A difference of two values in [0, 1] lies in [-1, 1]: its t interval over a few tasks can reach far
    past that (two tasks with differences 0 and 1: [-585%, +685%]). Clipped, it still excludes zero exactly
    when it did."""
    if diff.low is None or diff.high is None:
        return diff
    return replace(diff, low=max(-1.0, diff.low), high=min(1.0, diff.high))


def _task_row(
    signal: str,
    label: str,
    direction: Direction,
    sides: tuple[Interval, Interval, Interval, bool],
    informational: bool = False,
) -> TaskRow:
    b_side, c_side, diff, is_paired = sides
    return TaskRow(
        signal,
        label,
        direction,
        estimate(b_side),
        estimate(c_side),
        estimate(diff),
        is_paired,
        "grader",
        informational,
    )


def rollout_ks(base: TaskData, cand: TaskData) -> list[int]:
    """k = 2, 4, ... up to the fewest rollouts of any task that repeats, when tasks repeat on both sides."""
    b, c = base.repeated, cand.repeated
    if not b or not c:
        return []
    n = min(min(nc[0] for nc in b.values()), min(nc[0] for nc in c.values()))
    return [k for k in powers_of_two(n) if k >= 2]


def task_rows(base: TaskData, cand: TaskData) -> tuple[list[TaskRow], dict[str, Any]]:
    rows: list[TaskRow] = []
    b, c = _Side(base.tasks), _Side(cand.tasks)
    shared = set(b.pos) & set(c.pos)
    pairs = _Pairs.of(b, c)
    ks = rollout_ks(base, cand)
    if b.tasks and c.tasks:
        everything_b, everything_c = np.ones(b.n.size, bool), np.ones(c.n.size, bool)
        # each task counts once on either side, as in the difference of the tasks' rates and in pass@1:
        # rates pooled over trials would weigh a task by its traffic, and a task run 10 times could then
        # move a side that the paired difference, one value per task, does not see
        sides = _paired(pairs, b.c / b.n, c.c / c.n, everything_b, everything_c)
        how = f"paired over {len(shared)} shared tasks" if sides[3] else "clustered by task, no shared tasks"
        rows.append(_task_row("tasks:success", f"task success ({how})", "higher_is_better", sides))
        for k in ks:
            for key, fn, informational in (("pass^", pass_hat_k_of, False), ("pass@", pass_at_k_of, True)):
                what = "all" if key == "pass^" else "at least one of"
                sides = _paired(pairs, fn(b.n, b.c, k), fn(c.n, c.c, k), b.n >= k, c.n >= k)
                label = f"{key}{k}: {what} {k} rollouts of a task pass"
                rows.append(_task_row(f"tasks:{key}{k}", label, "higher_is_better", sides, informational))
        for name, direction in (("all_pass", "higher_is_better"), ("all_fail", "lower_is_better")):
            passed = name == "all_pass"
            b_values = (b.c == b.n) if passed else (b.c == 0)
            c_values = (c.c == c.n) if passed else (c.c == 0)
            sides = _paired(pairs, b_values.astype(float), c_values.astype(float), everything_b, everything_c)
            label = f"tasks where every rollout {'passed' if passed else 'failed'}"
            rows.append(_task_row(f"tasks:{name}", label, direction, sides, True))  # type: ignore[arg-type]
    if base.error or cand.error:
        rows.append(
            _row(
                "error_rate",
                "error rate (the run ended in an error)",
                "lower_is_better",
                base.error,
                cand.error,
                "harness",
            )
        )
        rows.append(
            _row(
                "truncation_rate",
                "truncation rate (the run hit a step, turn, token or time budget)",
                "lower_is_better",
                base.truncated,
                cand.truncated,
                "budgets",
            )
        )
    summary: dict[str, Any] = {
        side: {
            "tasks": len(d.tasks),
            "repeated": len(d.repeated),
            "rollouts": sum(nc[0] for nc in d.tasks.values()),
            "metadata_read": d.metadata_read,
        }
        for side, d in (("baseline", base), ("candidate", cand))
    }
    summary.update(shared=len(shared), paired=len(shared) >= 2, ks=ks)
    return rows, summary


def _entry(key: str, b: Counter[str], c: Counter[str], unit: str = "conversations") -> dict[str, Any]:
    def vals(x: Counter[str]) -> list[dict[str, Any]]:
        return [{"value": v, unit: n} for v, n in sorted(x.items(), key=lambda kv: (-kv[1], kv[0]))]

    return {"key": key, "baseline": vals(b), "candidate": vals(c), "same": set(b) == set(c)}


def _rules_summary(versions: Mapping[str, str]) -> Counter[str]:
    import hashlib

    if not versions:
        return Counter({"no rules": 1})
    packs = sorted({v.split("/", 1)[0] for v in versions.values()})
    digest = hashlib.sha256("\n".join(f"{k}={v}" for k, v in sorted(versions.items())).encode()).hexdigest()[:12]
    return Counter({f"{len(versions)} rules of {', '.join(packs)} (sha256 {digest})": 1})


def protocol(
    base: TaskData,
    cand: TaskData,
    base_rules: Mapping[str, str],
    cand_rules: Mapping[str, str],
) -> list[dict[str, Any]]:
    """How each side was produced, key by key, each marked same or not.

    Metadata keys count the latest conversations that carry each value; a side that records nothing for a
    key the other side records shows ``(not recorded)``. Judges: the versions and models of the verdicts.
    """
    out = []
    for key in PROTOCOL_KEYS:
        b, c = base.protocol.get(key), cand.protocol.get(key)
        if b is None and c is None:
            continue
        b = b or Counter({NOT_RECORDED: base.metadata_read})
        c = c or Counter({NOT_RECORDED: cand.metadata_read})
        out.append(_entry(key, b, c))
    for judge in sorted(set(base.judges) & set(cand.judges)):
        out.append(_entry(judge, base.judges[judge], cand.judges[judge], "verdicts"))
    entry = _entry("rule_packs", _rules_summary(base_rules), _rules_summary(cand_rules), "versions")
    for side in ("baseline", "candidate"):
        for v in entry[side]:
            v.pop("versions")
    out.append(entry)
    return out


def graders_changed(
    signals: list[str],
    proto: list[dict[str, Any]],
    base_rules: Mapping[str, str],
    cand_rules: Mapping[str, str],
) -> dict[str, str]:
    """Signal -> why its grader differs between the sides, for the signals whose grader changed."""
    differs = {p["key"] for p in proto if not p["same"]}
    out: dict[str, str] = {}
    for s in signals:
        if s.startswith("rule:"):
            rule = s.removeprefix("rule:")
            if base_rules.get(rule) != cand_rules.get(rule):
                which = "baseline" if rule in base_rules else "candidate" if rule in cand_rules else None
                out[s] = (
                    f"rule {rule} applies to the {which} only"
                    if which and (rule in base_rules) != (rule in cand_rules)
                    else f"rule {rule} is defined differently"
                )
        elif s == "forbidden_tool":
            fb = {k: v for k, v in base_rules.items() if "/forbidden_tool/" in v}
            fc = {k: v for k, v in cand_rules.items() if "/forbidden_tool/" in v}
            if fb != fc:
                out[s] = "the forbidden-tool rules differ"
        elif s.startswith("judge:") and s in differs:
            out[s] = "the judge's version or model differs"
        elif (s == "outcome:task_success" or s.startswith("tasks:")) and "grader" in differs:
            out[s] = "the grader recorded in the conversations' metadata differs"
    return out
