"""Wires the detector: ``GET /v1/alerts`` everywhere; the worker in ``serve`` and ``detector`` roles."""

from __future__ import annotations

from ..runtime import Runtime
from .api import router
from .counts import conversation_signals, outcome_signals
from .sampled import sampled_verdict_counter
from .worker import Detector


def bad_outcomes(rt: Runtime) -> list[str]:
    from ..outcomes.types import outcome_types

    return sorted(n for n, t in outcome_types(rt.settings.outcome_types).items() if t.kind == "bad")


def admit_labels(rt: Runtime) -> None:
    """Admit the configured names as metric labels, so none of them folds into ``other``.

    Rule ids, outcome types, judge names and models, and the signals made of them are bounded by
    configuration rather than traffic; with many rule packs they exceed the traffic guard's budget.
    """
    from ..outcomes.types import outcome_types

    rules = [r.id for r in rt.rules.rules]
    judge = rt.extras.get("judge")
    judges = list(judge.engine.judges) if judge is not None else []
    models = [lane.model for lane in judge.engine.lanes.values()] if judge is not None else []
    m = rt.metrics
    m.label.admit([*rules, *outcome_types(rt.settings.outcome_types), *models])
    signals = [*conversation_signals(rules), *outcome_signals(bad_outcomes(rt)), *(f"judge:{j}" for j in judges)]
    m.signal.admit(signals)


def build_detector(rt: Runtime) -> Detector:
    admit_labels(rt)
    def rules_for(agent: str, version: str) -> list[str]:
        return [r.id for r in rt.rules.rules_for(agent, version)]

    return Detector(rt.settings, rt.sessions, rt.metrics, rules_for, bad_outcomes(rt))


def wire(rt: Runtime) -> None:
    admit_labels(rt)
    rt.extras.setdefault("routers", []).append(router)
    rt.extras.setdefault("verdict_listeners", []).append(sampled_verdict_counter(rt.metrics))
    roles = rt.extras.get("roles", set())
    if roles & {"serve", "detector"}:
        detector = build_detector(rt)
        rt.extras["detector"] = detector
        if "serve" in roles:
            rt.extras.setdefault("background", []).append(detector)
