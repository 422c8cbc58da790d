"""Wires the outcomes stage: the join stage, ``POST /v1/outcomes``, the outcomes topic, the demo sink."""

from __future__ import annotations

from vigil.outcomes.api import replay, router
from vigil.outcomes.ingest import OutcomeStore
from vigil.outcomes.join import OutcomeJoin
from vigil.runtime import Runtime


def wire(rt: Runtime) -> OutcomeStore:
    store = OutcomeStore(rt.settings, rt.sessions, rt.metrics, rt.hooks.outcome_listeners, rt.future_bound)
    rt.provide(store)
    rt.hooks.downstream.append(OutcomeJoin(store))
    rt.hooks.topic_handlers[rt.settings.kafka_outcomes_topic] = store.handle_envelopes
    rt.hooks.outcome_sink = store.sink
    rt.hooks.add_router(router)
    expansion = rt.settings.max_json_expansion
    rt.hooks.replayers["outcomes"] = lambda raw, params: replay(store, raw, expansion, params)
    return store
