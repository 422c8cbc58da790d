"""Wires the detector: ``GET /v1/alerts`` everywhere; the worker in ``serve`` and ``detector`` roles."""

from __future__ import annotations

from ..runtime import Runtime
from .api import router
from .worker import Detector


def build_detector(rt: Runtime) -> Detector:
    from ..outcomes.types import outcome_types

    bad = sorted(n for n, t in outcome_types(rt.settings.outcome_types).items() if t.kind == "bad")
    return Detector(rt.settings, rt.sessions, rt.metrics, lambda: [r.id for r in rt.rules.rules], bad)


def wire(rt: Runtime) -> None:
    rt.extras.setdefault("routers", []).append(router)
    roles = rt.extras.get("roles", set())
    if roles & {"serve", "detector"}:
        detector = build_detector(rt)
        rt.extras["detector"] = detector
        if "serve" in roles:
            rt.extras.setdefault("background", []).append(detector)
