"""Wires the outcomes stage: the join stage, ``POST /v1/outcomes``, the outcomes topic, the demo sink."""

from __future__ import annotations

from ..runtime import Runtime
from .api import router
from .ingest import OutcomeStore
from .join import OutcomeJoin


def wire(rt: Runtime) -> None:
    store = OutcomeStore(rt.settings, rt.sessions, rt.metrics, rt.extras.setdefault("outcome_listeners", []))
    rt.extras["outcome_store"] = store
    rt.pipeline.downstream.append(OutcomeJoin(store))
    rt.extras.setdefault("topic_handlers", {})[rt.settings.kafka_outcomes_topic] = store.handle_envelopes
    rt.extras["outcome_sink"] = store.sink
    rt.extras.setdefault("routers", []).append(router)
