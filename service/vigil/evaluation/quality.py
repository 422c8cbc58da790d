"""How well rule findings separate failed conversations from good ones, free of I/O.

Each conversation is an :class:`Observation`: whether it failed (by the chosen outcome), which packs
apply to it and which findings it got. A *signal* is a set of flagged conversations (a rule fired; any
rule of a pack fired at or above a severity; a finding that queues the conversation for review). For
each signal, among the conversations its pack applies to:

- firing rate, firing at failure (= recall) and firing at success, with Wilson intervals;
- precision (share of flagged conversations that failed), Wilson interval;
- lift: firing at failure over firing at success (the positive likelihood ratio), with the log-ratio
  (Katz) interval; a zero count adds 0.5 to every cell for the interval only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scipy.stats import norm
from statsmodels.stats.proportion import proportion_confint

from vigil.schema import SEVERITY_RANK

ALPHA = 0.05
Z = float(norm.ppf(1 - ALPHA / 2))


@dataclass(frozen=True, slots=True)
class Fired:
    pack: str
    rule_id: str
    severity: str
    queues: bool = False  # under the flagging policy this finding alone queues the conversation for review


@dataclass(frozen=True, slots=True)
class Observation:
    conversation_id: str
    task_id: str | None
    failed: bool
    packs: frozenset[str]
    findings: tuple[Fired, ...] = ()


@dataclass(frozen=True, slots=True)
class RuleInfo:
    pack: str
    rule_id: str
    severity: str
    rule_type: str


def wilson(x: int, n: int) -> dict[str, Any]:
    if n <= 0:
        return {"value": None, "low": None, "high": None, "x": x, "n": n}
    low, high = proportion_confint(x, n, alpha=ALPHA, method="wilson")
    return {"value": x / n, "low": float(low), "high": float(high), "x": x, "n": n}


def lift(a: int, fails: int, b: int, goods: int) -> dict[str, Any]:
    """(a / fails) / (b / goods) with the Katz log-ratio interval."""
    if not fails or not goods:
        return {"value": None, "low": None, "high": None}
    if a == 0 and b == 0:
        return {"value": None, "low": None, "high": None}
    ca, cb, cf, cg = (a, b, fails, goods) if a and b else (a + 0.5, b + 0.5, fails + 1, goods + 1)
    log_ratio = math.log((ca / cf) / (cb / cg))
    se = math.sqrt(1 / ca - 1 / cf + 1 / cb - 1 / cg)
    low, high = math.exp(log_ratio - Z * se), math.exp(log_ratio + Z * se)
    if b == 0:  # never fired at success: the ratio is unbounded (JSON has no infinity, so say it)
        return {"value": None, "infinite": True, "low": low, "high": high}
    return {"value": (a / fails) / (b / goods), "low": low, "high": high}


def measure(flagged: Sequence[bool], failed: Sequence[bool]) -> dict[str, Any]:
    """The quality of one signal over the conversations it applies to."""
    a = sum(1 for f, bad in zip(flagged, failed, strict=True) if f and bad)
    b = sum(1 for f, bad in zip(flagged, failed, strict=True) if f and not bad)
    fails = sum(failed)
    goods = len(failed) - fails
    return {
        "conversations": len(failed),
        "failures": fails,
        "flagged": a + b,
        "firing_rate": wilson(a + b, len(failed)),
        "firing_at_failure": wilson(a, fails),
        "firing_at_success": wilson(b, goods),
        "precision": wilson(a, a + b),
        "recall": wilson(a, fails),
        "lift": lift(a, fails, b, goods),
    }


@dataclass
class QualityReport:
    outcome: str
    threshold: str | None
    conversations: int
    failures: int
    left_out: int
    packs: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "review_threshold": self.threshold,
            "conversations": self.conversations,
            "failures": self.failures,
            "without_outcome": self.left_out,
            "packs": self.packs,
        }


def _signal(obs: Sequence[Observation], hit: Callable[[Observation], bool]) -> dict[str, Any]:
    return measure([hit(o) for o in obs], [o.failed for o in obs])


def evaluate(
    observations: Iterable[Observation],
    rules: Sequence[RuleInfo],
    outcome: str,
    threshold: str | None,
    left_out: int = 0,
) -> QualityReport:
    """Per pack: any finding, at each severity and above, what queues for review; then per rule."""
    obs = list(observations)
    report = QualityReport(outcome, threshold, len(obs), sum(o.failed for o in obs), left_out)
    for pack in sorted({r.pack for r in rules}):
        scope = [o for o in obs if pack in o.packs]
        if not scope:
            continue
        severities = sorted({r.severity for r in rules if r.pack == pack}, key=SEVERITY_RANK.__getitem__, reverse=True)
        levels = [{"severity": sev, **_signal(scope, _at_or_above(pack, sev))} for sev in severities]
        per_rule = [
            {
                "rule_id": r.rule_id,
                "rule_type": r.rule_type,
                "severity": r.severity,
                **_signal(scope, _rule(r.rule_id)),
            }
            for r in rules
            if r.pack == pack
        ]
        report.packs.append(
            {
                "pack": pack,
                "any": _signal(scope, _any_of(pack)),
                "review": _signal(scope, _queued_by(pack)),
                "at_or_above": levels,
                "rules": per_rule,
            }
        )
    return report


Hit = Callable[[Observation], bool]


def _any_of(pack: str) -> Hit:
    return lambda o: any(f.pack == pack for f in o.findings)


def _queued_by(pack: str) -> Hit:
    return lambda o: any(f.pack == pack and f.queues for f in o.findings)


def _at_or_above(pack: str, severity: str) -> Hit:
    rank = SEVERITY_RANK[severity]
    return lambda o: any(f.pack == pack and SEVERITY_RANK[f.severity] >= rank for f in o.findings)


def _rule(rule_id: str) -> Hit:
    return lambda o: any(f.rule_id == rule_id for f in o.findings)
