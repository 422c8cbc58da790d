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
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from vigil.schema import SEVERITY_RANK

ALPHA = 0.05
Z = NormalDist().inv_cdf(1 - ALPHA / 2)


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
    from statsmodels.stats.proportion import proportion_confint  # statsmodels takes a second to import

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
    return measure_counts(a, b, sum(failed), len(failed))


def measure_counts(a: int, b: int, fails: int, n: int) -> dict[str, Any]:
    """:func:`measure` from counts: ``a`` flagged failures, ``b`` flagged successes, of ``n`` conversations
    with ``fails`` failures."""
    goods = n - fails
    return {
        "conversations": n,
        "failures": fails,
        "flagged": a + b,
        "firing_rate": wilson(a + b, n),
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


ANY, REVIEW = ("any",), ("review",)


def _hits(obs: Observation, pack: str, severities: Sequence[str]) -> set[tuple[str, ...]]:
    """The signals of ``pack`` that flag ``obs``: any finding, what queues it, each severity reached, each rule."""
    keys: set[tuple[str, ...]] = {("rule", f.rule_id) for f in obs.findings}
    mine = [f for f in obs.findings if f.pack == pack]
    if mine:
        keys.add(ANY)
        if any(f.queues for f in mine):
            keys.add(REVIEW)
        top = max(SEVERITY_RANK[f.severity] for f in mine)
        keys.update(("severity", sev) for sev in severities if SEVERITY_RANK[sev] <= top)
    return keys


def evaluate(
    observations: Iterable[Observation],
    rules: Sequence[RuleInfo],
    outcome: str,
    threshold: str | None,
    left_out: int = 0,
) -> QualityReport:
    """Per pack: any finding, at each severity and above, what queues for review; then per rule.

    One pass over each pack's conversations counts every signal's flagged failures and successes (a
    conversation without findings flags nothing), so the cost follows the conversations, not the
    conversations times the rules."""
    obs = list(observations)
    report = QualityReport(outcome, threshold, len(obs), sum(o.failed for o in obs), left_out)
    for pack in sorted({r.pack for r in rules}):
        scope = [o for o in obs if pack in o.packs]
        if not scope:
            continue
        severities = sorted({r.severity for r in rules if r.pack == pack}, key=SEVERITY_RANK.__getitem__, reverse=True)
        fails = sum(o.failed for o in scope)
        flagged: tuple[Counter[tuple[str, ...]], Counter[tuple[str, ...]]] = (Counter(), Counter())  # failed, good
        for o in scope:
            if o.findings:
                flagged[0 if o.failed else 1].update(_hits(o, pack, severities))
        n = len(scope)
        report.packs.append(
            {
                "pack": pack,
                "any": measure_counts(flagged[0][ANY], flagged[1][ANY], fails, n),
                "review": measure_counts(flagged[0][REVIEW], flagged[1][REVIEW], fails, n),
                "at_or_above": [
                    {"severity": sev, **measure_counts(flagged[0][key], flagged[1][key], fails, n)}
                    for sev in severities
                    for key in [("severity", sev)]
                ],
                "rules": [
                    {
                        "rule_id": r.rule_id,
                        "rule_type": r.rule_type,
                        "severity": r.severity,
                        **measure_counts(flagged[0][key], flagged[1][key], fails, n),
                    }
                    for r in rules
                    if r.pack == pack
                    for key in [("rule", r.rule_id)]
                ],
            }
        )
    return report
