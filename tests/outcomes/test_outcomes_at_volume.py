"""Outcomes in bulk (a message or poll of more outcomes than one Postgres statement takes parameters), and
a request of outcomes refused for several reasons."""

from __future__ import annotations

import orjson
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select

from tests.support.app import ADMIN, INGEST, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.pipeline import Envelope
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.outcomes.ingest import OutcomeStore
from vigil.schema import Conversation
from vigil.store.models import OutcomeLinkRow, OutcomeRow

# Postgres' protocol takes at most 65,535 parameters a statement: one bind parameter per outcome (an IN
# list of ids or keys) stalled the consumer on such a message, retrying it as if the database were away
OVER_THE_LIMIT = 70_000


@pytest.mark.postgres
def test_a_message_of_more_outcomes_than_a_statement_takes_parameters_is_stored_and_redelivered(pg_url) -> None:
    rt = wire(build_runtime(make_settings(pg_url), registry=CollectorRegistry()), {"consume"})
    store = rt.get(OutcomeStore)
    stored = [Conversation.model_validate(c) for c in Simulator(parse_versions("v1:0.0"), 3).stream(20)]
    rt.pipeline.process(stored, "test")
    ids = [c.conversation_id for c in stored] + [f"later-{i}" for i in range(OVER_THE_LIMIT)]
    items = [{"conversation_id": cid, "type": "thumbs_down", "idempotency_key": f"k{i}"} for i, cid in enumerate(ids)]
    env = Envelope(orjson.dumps(items), "kafka", "outcomes", 0, 0, "bulk")

    first = store.handle_envelopes([env])
    assert (first.received, first.stored, first.errors) == (len(ids), len(ids), [])
    again = store.handle_envelopes([env])  # redelivered: every key is known already
    assert (again.stored, again.duplicates, again.errors) == (0, len(ids), [])
    with rt.sessions() as s:
        assert s.scalar(select(func.count()).select_from(OutcomeRow)) == len(ids)
        assert s.scalar(select(func.count()).select_from(OutcomeLinkRow)) == len(stored)
    rt.close()


def test_a_request_of_outcomes_failing_for_different_reasons_is_filed_under_each(db_url) -> None:
    registry = CollectorRegistry()
    rt = build_runtime(make_settings(db_url), registry=registry)
    items = [
        {"conversation_id": "c1", "type": "chargeback"},
        {"conversation_id": "c1", "type": "escalation", "value": "high"},
        {"conversation_id": "c1", "type": "thumbs_up"},
        {"type": "csat"},
    ]
    with make_client(rt) as c:
        assert c.post("/v1/outcomes", json=items, headers=INGEST).status_code == 422
        for reason, named in (("unknown_outcome_type", ["item 0"]), ("schema_invalid", ["item 1", "item 3"])):
            [letter] = c.get("/v1/dead-letters", params={"reason": reason}, headers=ADMIN).json()
            assert all(n in letter["detail"] for n in named) and "item 2" not in letter["detail"]
            counted = registry.get_sample_value("vigil_dead_letters_total", {"reason": reason, "source": "http"})
            assert counted == 1, reason
    rt.close()
