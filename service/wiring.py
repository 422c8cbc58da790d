"""Connects the later stages to a runtime: downstream stages, background workers, topic handlers.

Each stage exposes ``wire(rt)``; it may append to ``rt.pipeline.downstream`` and to these
``rt.extras`` lists/dicts:

- ``background``: objects with async ``start()``/``stop()`` run inside ``vigil serve``;
- ``topic_handlers``: Kafka topic → handler of a batch of :class:`~service.pipeline.Envelope`;
- ``conversation_enrichers``: ``fn(session, conversation_dict)`` adding to ``GET /v1/conversations/{id}``;
- ``outcome_sink``: ``fn(list_of_outcome_dicts)`` used by the demo traffic;
- ``routers``: FastAPI routers mounted by the app;
- ``verdict_listeners``: ``fn(session, list_of_VerdictRow)``, called in the transaction that stores verdicts;
- ``outcome_listeners``: ``fn(session, list_of_OutcomeRow)``, called in the transaction that stores
  outcomes (joined to a stored conversation or not yet).
"""

from __future__ import annotations

from .runtime import Runtime

STAGES: list[str] = [
    # module paths with a ``wire(rt)`` function, in data-flow order
    "service.tracing.wiring",
    "service.judge.wiring",
    "service.review.wiring",
    "service.outcomes.wiring",
    "service.compare.wiring",
    "service.detector.wiring",
    "service.calibration.wiring",
]


def wire(rt: Runtime, roles: set[str] | None = None) -> Runtime:
    """Wire every stage into ``rt``.

    ``roles`` says which process this is and so which background workers a stage may add:
    ``serve`` (API with every in-process worker: the embedded default), ``api`` (API only),
    ``consume``, ``judge-worker``, ``detector``, ``replay`` (downstream stages only, no workers).
    """
    import importlib

    rt.extras.setdefault("background", [])
    rt.extras.setdefault("topic_handlers", {})
    rt.extras.setdefault("conversation_enrichers", [])
    rt.extras.setdefault("routers", [])
    rt.extras.setdefault("verdict_listeners", [])
    rt.extras.setdefault("outcome_listeners", [])
    rt.extras["roles"] = roles or {"serve"}
    for path in STAGES:
        importlib.import_module(path).wire(rt)
    return rt
