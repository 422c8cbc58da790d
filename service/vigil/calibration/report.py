"""A judge's calibration report: agreement with people per judge version, and its calibrated state."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vigil.calibration.stats import Agreement, agreement, proportion

CALIBRATED = "calibrated"
UNCALIBRATED = "uncalibrated"


@dataclass(slots=True)
class Pair:
    """One conversation with a human verdict and the judge's verdict on it."""

    conversation_id: str
    human_fail: bool
    verdict: str  # pass | fail | unscored
    judge_version: str
    human_category: str | None = None
    judge_categories: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_labels: int
    min_kappa: float


def state_of(measured: Agreement | None, t: Thresholds) -> tuple[str, str]:
    """``calibrated`` only with at least ``min_labels`` scored labels and kappa at or above ``min_kappa``."""
    n = measured.n if measured else 0
    kappa = measured.kappa.value if measured else None
    if n < t.min_labels:
        return UNCALIBRATED, f"{n} of the {t.min_labels} labels needed"
    if kappa is None:
        return UNCALIBRATED, "kappa is undefined (one class only among the labels)"
    if kappa < t.min_kappa:
        return UNCALIBRATED, f"kappa {kappa:.2f} is below {t.min_kappa:.2f}"
    return CALIBRATED, f"{n} labels, kappa {kappa:.2f} ≥ {t.min_kappa:.2f}"


def measure(pairs: list[Pair]) -> Agreement:
    scored = [p for p in pairs if p.verdict in ("pass", "fail")]
    return agreement([p.human_fail for p in scored], [p.verdict == "fail" for p in scored])


def category_agreement(pairs: list[Pair]) -> dict[str, Any]:
    """On failures both sides agree on and the human categorised: how often the judge named that category."""
    both = [p for p in pairs if p.human_fail and p.verdict == "fail" and p.human_category]
    hits = sum(1 for p in both if p.human_category in p.judge_categories)
    by: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for p in both:
        by[p.human_category or ""][1] += 1
        by[p.human_category or ""][0] += p.human_category in p.judge_categories
    return {
        "rate": proportion(hits, len(both)).as_dict(),
        "by_category": {c: {"matched": m, "n": n} for c, (m, n) in sorted(by.items())},
    }


def version_report(version: str, pairs: list[Pair], t: Thresholds) -> dict[str, Any]:
    measured = measure(pairs)
    state, reason = state_of(measured, t)
    return {
        "judge_version": version,
        "labels": len(pairs),
        "unscored": sum(1 for p in pairs if p.verdict == "unscored"),
        "agreement": measured.as_dict(),
        "categories": category_agreement(pairs),
        "state": state,
        "state_reason": reason,
    }


def by_version(pairs: Iterable[Pair]) -> dict[str, list[Pair]]:
    out: dict[str, list[Pair]] = defaultdict(list)
    for p in pairs:
        out[p.judge_version].append(p)
    return dict(sorted(out.items(), key=lambda kv: version_key(kv[0])))


def version_key(v: str) -> tuple[Any, ...]:
    return tuple((0, int(x), "") if x.isdigit() else (1, 0, x) for x in v.replace("-", ".").split("."))


def report(judge: str, source: str, pairs: list[Pair], t: Thresholds) -> dict[str, Any]:
    """Per-version agreement of ``judge`` with the human verdicts in ``pairs``, from ``source``."""
    versions = [version_report(v, ps, t) for v, ps in by_version(pairs).items()]
    return {
        "judge": judge,
        "source": source,
        "thresholds": {"min_labels": t.min_labels, "min_kappa": t.min_kappa},
        "versions": versions,
    }
