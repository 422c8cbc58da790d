"""The compare table: each signal for a baseline and a candidate version, the difference with its
95% interval, a verdict, and red flags (a signal that got worse while others improved).

A table tests a dozen or more signals at once; at 5% each, identical versions would show some
signal "worse" about a third of the time. Verdicts therefore need both the raw 95% interval to
exclude zero and the Holm-adjusted p-value across the table's signals to stay below 5%, which
keeps the chance of any spurious verdict on identical versions at 5%. The intervals shown stay
the raw (unadjusted) 95% ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy.orm import Session

from vigil.compare import pairing, stats
from vigil.compare.pairing import RuleVersions
from vigil.compare.signals import VersionData, load_version, versions_of
from vigil.compare.tasks import load_tasks
from vigil.errors import VigilError
from vigil.schema import OutcomeType
from vigil.store.rollups import hour_of
from vigil.store.signals import OFFLINE_SUFFIX, RulesFor

Direction = Literal["lower_is_better", "higher_is_better"]

BETTER, WORSE, UNSURE, NO_DATA = "better", "worse", "not yet distinguishable", "no data"
MULTIPLICITY = "holm"


class CompareError(VigilError):
    """The versions to compare are unknown or ambiguous."""


class SameVersion(CompareError):
    """A version compared with itself."""


@dataclass(slots=True)
class Row:
    signal: str
    label: str
    kind: str  # rate | mean | p95
    direction: Direction
    baseline: stats.Estimate
    candidate: stats.Estimate
    difference: stats.Estimate
    verdict: str = UNSURE
    red_flag: bool = False
    p_adjusted: float | None = None  # Holm-adjusted across the signals of one comparison
    paired: bool = False  # the difference is paired over shared tasks
    informational: bool = False  # shown with its interval, never tested nor counted in the headline
    grader_changed: str | None = None  # why the sides were not scored the same way

    def as_dict(self) -> dict[str, Any]:
        return {
            "signal": self.signal,
            "label": self.label,
            "kind": self.kind,
            "direction": self.direction,
            "baseline": self.baseline.as_dict(),
            "candidate": self.candidate.as_dict(),
            "difference": self.difference.as_dict(),
            "p_value": self.difference.p_value,
            "p_adjusted": self.p_adjusted,
            "verdict": self.verdict,
            "red_flag": self.red_flag,
            "paired": self.paired,
            "informational": self.informational,
            "grader_changed": self.grader_changed,
        }


def verdict(diff: stats.Estimate, direction: Direction) -> str:
    """The verdict from the raw 95% interval alone; :func:`adjust_for_multiplicity` then tempers it."""
    if diff.value is None:
        return NO_DATA
    if diff.low is None or diff.high is None or diff.low <= 0 <= diff.high:
        return UNSURE
    rose = diff.low > 0
    return WORSE if rose == (direction == "lower_is_better") else BETTER


def _rate_row(
    signal: str, label: str, x0: int, n0: int, x1: int, n1: int, direction: Direction = "lower_is_better"
) -> Row:
    b, c = stats.rate(x0, n0), stats.rate(x1, n1)
    diff = stats.rate_difference(c, b)
    return Row(signal, label, "rate", direction, b, c, diff, verdict(diff, direction))


def _sample_row(
    signal: str,
    label: str,
    kind: str,
    base: Iterable[float],
    cand: Iterable[float],
    resamples: int,
    direction: Direction = "lower_is_better",
) -> Row:
    stat = stats.p95 if kind == "p95" else stats.mean
    base, cand = list(base), list(cand)
    b, c = stats.estimate(base, stat, resamples), stats.estimate(cand, stat, resamples)
    diff = stats.difference(cand, base, stat, resamples)
    return Row(signal, label, kind, direction, b, c, diff, verdict(diff, direction))


def build_rows(
    base: VersionData,
    cand: VersionData,
    types: dict[str, OutcomeType],
    rule_ids: Iterable[str],
    resamples: int,
) -> list[Row]:
    n0, n1 = base.conversations, cand.conversations
    rows: list[Row] = []
    rules = sorted(set(rule_ids) | set(base.rule_conversations) | set(cand.rule_conversations))
    for rule in rules:
        rows.append(
            _rate_row(
                f"rule:{rule}",
                f"rule {rule} failure rate",
                base.rule_conversations.get(rule, 0),
                n0,
                cand.rule_conversations.get(rule, 0),
                n1,
            )
        )
    rows.append(
        _rate_row(
            "forbidden_tool",
            "forbidden tool call rate",
            base.forbidden_conversations,
            n0,
            cand.forbidden_conversations,
            n1,
        )
    )
    for judge in sorted(set(base.judge) | set(cand.judge)):
        (bn, bx), (cn, cx) = base.judge.get(judge, (0, 0)), cand.judge.get(judge, (0, 0))
        name = judge.removesuffix(OFFLINE_SUFFIX)
        label = f"offline judge {name} failure rate" if judge != name else f"judge {name} failure rate"
        rows.append(_rate_row(f"judge:{judge}", label, bx, bn, cx, cn))
    seen = set(base.outcome_conversations) | set(cand.outcome_conversations)
    on0, on1 = _outcome_n(base), _outcome_n(cand)  # the conversations whose outcomes had time to arrive
    for name, t in sorted(types.items()):
        if t.kind == "score":
            if base.outcome_scores.get(name) or cand.outcome_scores.get(name):
                rows.append(
                    _sample_row(
                        f"outcome:{name}",
                        f"mean {name}",
                        "mean",
                        base.outcome_scores.get(name, []),
                        cand.outcome_scores.get(name, []),
                        resamples,
                        "higher_is_better",
                    )
                )
            continue
        direction: Direction = "lower_is_better" if t.kind == "bad" else "higher_is_better"
        # (one version's quality is built against an empty baseline: its own tasks decide)
        graded = name == "task_success" and cand.every_task and (base.every_task or not n0)
        if graded:
            # a grade every trial gets, pass or fail: where both versions' conversations are trials of tasks, the
            # rate is of their graded trials (the task rollups, whole days), whenever the grade came
            (s0, g0), (s1, g1) = _graded(base), _graded(cand)
            rows.append(_rate_row(f"outcome:{name}", f"{name} rate", s0, g0, s1, g1, direction))
            continue
        if name not in seen and name not in ("escalation", "refund_reversal"):
            continue
        rows.append(
            _rate_row(
                f"outcome:{name}",
                f"{name} rate",
                base.outcome_conversations.get(name, 0),
                on0,
                cand.outcome_conversations.get(name, 0),
                on1,
                direction,
            )
        )
    rows.append(
        _rate_row(
            "tool_error",
            "conversations with a failed tool call",
            base.tool_error_conversations,
            n0,
            cand.tool_error_conversations,
            n1,
        )
    )
    rows.append(_sample_row("steps", "messages per conversation", "mean", base.steps, cand.steps, resamples))
    rows.append(_sample_row("cost_usd", "cost per conversation (USD)", "mean", base.cost, cand.cost, resamples))
    rows.append(_sample_row("latency_p95_ms", "p95 latency (ms)", "p95", base.latency, cand.latency, resamples))
    adjust_for_multiplicity(rows)
    mark_red_flags(rows)
    return rows


def _graded(d: VersionData) -> tuple[int, int]:
    """Successes and graded trials (conversations of a task with a task_success outcome) of a version."""
    trials = successes = 0
    for n, x in d.every_task.values():
        trials, successes = trials + n, successes + x
    return successes, trials


def cannot_differ(r: Row) -> bool:
    """A rate row with no event, or nothing but events, on both sides: given that, no split of the
    conversations between the versions could differ, so its p-value is 1 whatever happened. Tarone (1990):
    leaving such a row out of the family keeps the family-wise error rate, while counting it (one of 14 rows
    at 0% on both sides of 21) only made every real difference pay for it. (The gate's rows carry a
    standard error instead of counts: it asks the same of them as no spread and no difference.)"""
    b, c = r.baseline, r.candidate
    if r.kind != "rate" or b.x is None or c.x is None or not b.n or not c.n:
        return False
    return (b.x == 0 and c.x == 0) or (b.x == b.n and c.x == c.n)


def adjust_for_multiplicity(rows: list[Row]) -> list[Row]:
    """Holm's step-down adjustment over the rows' p-values; a better/worse verdict whose adjusted
    p-value is not below 5% becomes "not yet distinguishable". Rows that cannot differ (see
    :func:`cannot_differ`) are left out of the family; their adjusted p-value is 1."""
    for r in rows:
        if r.difference.p_value is not None and cannot_differ(r):
            r.p_adjusted = 1.0
    tested = [
        r
        for r in rows
        if r.difference.p_value is not None
        and not r.informational
        and r.grader_changed is None
        and not cannot_differ(r)
    ]
    if not tested:
        return rows
    adjusted = stats.holm([r.difference.p_value for r in tested if r.difference.p_value is not None])
    for r, p in zip(tested, adjusted, strict=True):
        r.p_adjusted = float(p)
        if r.verdict in (BETTER, WORSE) and r.p_adjusted >= stats.ALPHA:
            r.verdict = UNSURE
    return rows


def mark_red_flags(rows: list[Row]) -> list[Row]:
    """A signal that got worse while another got better is a red flag: an improvement may hide it."""
    improved = [r for r in rows if r.verdict == BETTER and not r.informational]
    for r in rows:
        r.red_flag = r.verdict == WORSE and not r.informational and bool(improved)
    return rows


def _fmt(r: Row, e: stats.Estimate) -> str:
    if e.value is None:
        return "-"
    return f"{100 * e.value:.1f}%" if r.kind == "rate" else f"{e.value:.4g}"


def red_flag_notes(rows: list[Row]) -> list[str]:
    better = [r.signal for r in rows if r.verdict == BETTER and not r.informational]
    return [
        f"{r.label} got worse ({_fmt(r, r.baseline)} → {_fmt(r, r.candidate)}) while {', '.join(better)} improved"
        for r in rows
        if r.red_flag
    ]


def resolve_agent(session: Session, baseline: str, candidate: str, agent: str | None) -> str:
    if agent:
        return agent
    both = sorted(set(versions_of(session, baseline)) & set(versions_of(session, candidate)))
    if len(both) == 1:
        return both[0]
    if not both:
        raise CompareError(f"no agent has conversations of both {baseline!r} and {candidate!r}")
    raise CompareError(
        f"versions {baseline!r} and {candidate!r} exist for several agents ({', '.join(both)}); "
        "say which with --agent / ?agent="
    )


def compare(
    session: Session,
    baseline: str,
    candidate: str,
    types: dict[str, OutcomeType],
    rules_for: RulesFor,
    agent: str | None = None,
    max_sample: int = 20_000,
    resamples: int = 1000,
    since: datetime | None = None,
    until: datetime | None = None,
    metadata_sample: int = 500,
    rule_versions: RuleVersions | None = None,
    per_task: bool = True,
    outcomes_before: datetime | None = None,
) -> dict[str, Any]:
    """The full comparison as a JSON-ready dict (``vigil compare --json`` and ``GET /v1/compare``).

    Outcome rates count, on both sides, only conversations received in whole hours before
    ``outcomes_before`` (``VIGIL_COMPARE_OUTCOME_SETTLE_HOURS`` ago): a new version's outcomes that have
    not arrived yet would otherwise read as a rate of zero against a baseline whose outcomes are in.

    Rule rows are the rules that apply to the agent at either version (and any rule with findings).
    Per-task rows (paired where tasks are shared), the error and truncation rates and each side's
    protocol come from :mod:`vigil.compare.pairing`. ``per_task``: list each task's pass@k and pass^k too
    (thousands of rows at volume).
    """
    if baseline == candidate:
        raise SameVersion(
            f"baseline and candidate are both {baseline!r}: a version compared with itself shows no difference; "
            "pick two different versions"
        )
    agent = resolve_agent(session, baseline, candidate, agent)
    base = load_version(session, agent, baseline, types, max_sample, since, until, outcomes_before)
    cand = load_version(session, agent, candidate, types, max_sample, since, until, outcomes_before)
    for d in (base, cand):
        if not d.conversations:
            raise CompareError(f"agent {agent!r} has no finished conversations of version {d.version!r}")
    if rule_versions is not None:
        base_rules, cand_rules = dict(rule_versions(agent, baseline)), dict(rule_versions(agent, candidate))
    else:
        base_rules = dict.fromkeys(rules_for(agent, baseline), "")
        cand_rules = dict.fromkeys(rules_for(agent, candidate), "")
    rows = build_rows(base, cand, types, {*base_rules, *cand_rules}, resamples)
    base_tasks = load_tasks(session, agent, baseline, metadata_sample, since, until, base.every_task, base.judge)
    cand_tasks = load_tasks(session, agent, candidate, metadata_sample, since, until, cand.every_task, cand.judge)
    extra, tasks = pairing.task_rows(base_tasks, cand_tasks)
    rows += [
        Row(
            t.signal,
            t.label,
            "rate",
            t.direction,
            t.baseline,
            t.candidate,
            t.difference,
            paired=t.paired,
            informational=t.informational,
        )
        for t in extra
    ]
    proto = pairing.protocol(base_tasks, cand_tasks, base_rules, cand_rules)
    changed = pairing.graders_changed([r.signal for r in rows], proto, base_rules, cand_rules)
    for r in rows:  # verdicts again over every row: the per-task rows join the multiplicity correction
        r.grader_changed = changed.get(r.signal)
        r.verdict = pairing.GRADER_CHANGED if r.grader_changed else verdict(r.difference, r.direction)
        r.p_adjusted = None
    adjust_for_multiplicity(rows)
    mark_red_flags(rows)
    return {
        "agent_id": agent,
        "baseline": {"version": baseline, "conversations": base.conversations},
        "candidate": {"version": candidate, "conversations": cand.conversations},
        "window": {"since": since, "until": until},
        "outcomes": {
            "received_before": _cut_used(outcomes_before, base, cand),
            "baseline_conversations": _outcome_n(base),
            "candidate_conversations": _outcome_n(cand),
        },
        "confidence": 1 - stats.ALPHA,
        "multiplicity": {
            "method": MULTIPLICITY,
            "signals": sum(1 for r in rows if r.p_adjusted is not None),
            "note": "verdicts need the raw 95% interval to exclude zero and the Holm-adjusted p-value "
            "across these signals to be below 0.05; intervals are unadjusted",
        },
        "signals": [r.as_dict() for r in rows],
        "red_flags": red_flag_notes(rows),
        "pass_k": {
            "baseline": stats.pass_k_table(base.tasks, per_task=per_task),
            "candidate": stats.pass_k_table(cand.tasks, per_task=per_task),
        },
        "tasks": tasks,
        "protocol": proto,
        "comparable": all(p["same"] for p in proto),
        "graders_changed": changed,
    }


def _outcome_n(d: VersionData) -> int:
    """The conversations an outcome rate of ``d`` counts: those before load_version's cut, or all."""
    return d.conversations if d.outcome_n is None else d.outcome_n


def _cut_used(before: datetime | None, *sides: VersionData) -> datetime | None:
    """The hour the outcome rates count conversations before, if load_version cut any side (None: all)."""
    return hour_of(before) if before is not None and any(d.outcome_n is not None for d in sides) else None


def quality(
    session: Session,
    agent: str,
    version: str,
    types: dict[str, OutcomeType],
    rules_for: RulesFor,
    max_sample: int = 20_000,
    resamples: int = 1000,
    since: datetime | None = None,
    until: datetime | None = None,
    per_task: bool = True,
    outcomes_before: datetime | None = None,
) -> dict[str, Any]:
    """One version's signals with 95% intervals (``GET /v1/quality``); rules and outcomes as in :func:`compare`."""
    d = load_version(session, agent, version, types, max_sample, since, until, outcomes_before)
    # against an empty baseline: only the version's own estimates are computed
    rows = build_rows(VersionData(agent, version), d, types, rules_for(agent, version), resamples)
    return {
        "agent_id": agent,
        "version": version,
        "window": {"since": since, "until": until},
        "outcomes": {"received_before": _cut_used(outcomes_before, d), "conversations": _outcome_n(d)},
        "conversations": d.conversations,
        "signals": [
            {
                "signal": r.signal,
                "label": r.label,
                "kind": r.kind,
                "direction": r.direction,
                **r.candidate.as_dict(),
            }
            for r in rows
        ],
        "pass_k": stats.pass_k_table(d.tasks, per_task=per_task),
    }
