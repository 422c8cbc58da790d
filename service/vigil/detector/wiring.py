"""Wires the detector: ``GET /v1/alerts``, ``/ui/alerts`` and the alert banner everywhere; the worker in
``serve`` and ``detector`` roles."""

from __future__ import annotations

from pathlib import Path

from vigil.detector import pages
from vigil.detector.api import router
from vigil.detector.loop import Detector
from vigil.detector.models import DetectorFeedRow
from vigil.detector.sampled import sampled_verdict_counter
from vigil.detector.twins import fed_by_rules
from vigil.runtime import Runtime
from vigil.store.erasure import deleting
from vigil.store.signals import conversation_signals, outcome_signals

TEMPLATES = Path(__file__).resolve().parent / "templates"
# what a conversation was fed as; the hourly counts it added to stay (anonymous aggregates)
ERASE = deleting(DetectorFeedRow.conversation_id)


def bad_outcomes(rt: Runtime) -> list[str]:
    from vigil.schema import outcome_types

    return sorted(n for n, t in outcome_types(rt.settings.outcome_types).items() if t.kind == "bad")


def admit_labels(rt: Runtime) -> None:
    """Admit the configured names as metric labels, so none of them folds into ``other``.

    Rule ids, outcome types, judge names and models, and the signals made of them are bounded by
    configuration rather than traffic; with many rule packs they exceed the traffic guard's budget.
    """
    from vigil.schema import outcome_types

    rules = [r.id for r in rt.rules.rules]
    judges = list(rt.judges)
    models = [j.model for j in rt.judges.values()]
    m = rt.metrics
    m.label.admit([*rules, *outcome_types(rt.settings.outcome_types), *models])
    signals = [*conversation_signals(rules), *outcome_signals(bad_outcomes(rt)), *(f"judge:{j}" for j in judges)]
    m.signal.admit(signals)


def build_detector(rt: Runtime) -> Detector:
    admit_labels(rt)

    def rules_for(agent: str, version: str) -> list[str]:
        return [r.id for r in rt.rules.rules_for(agent, version)]

    beat = rt.heartbeat("detector")
    return Detector(rt.settings, rt.sessions, rt.metrics, rules_for, bad_outcomes(rt), heartbeat=beat)


def wire(rt: Runtime) -> Detector | None:
    admit_labels(rt)
    rt.hooks.add_router(router)
    rt.hooks.add_router(pages.router)
    rt.hooks.add_page("Alerts", "/ui/alerts")
    rt.hooks.add_templates(TEMPLATES)
    banner = pages.AlertBanner(rt.sessions, tuple(fed_by_rules(rt.rules).items()))
    if banner not in rt.hooks.banners:
        rt.hooks.banners.append(banner)
    rt.hooks.verdict_listeners.append(sampled_verdict_counter(rt.metrics))
    if ERASE not in rt.hooks.erasers:
        rt.hooks.erasers.append(ERASE)
    if not rt.has_role("serve", "detector"):
        return None
    detector = build_detector(rt)
    rt.provide(detector)
    if rt.has_role("serve"):
        rt.hooks.background.append(detector)
    return detector
