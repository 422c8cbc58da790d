"""Outcomes against conversations that grow: revisions that move the attribution window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import INGEST, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.ingest.simulate import Simulator, parse_versions


@pytest.fixture
def rt_client(db_url):  # type: ignore[no-untyped-def]
    rt = build_runtime(make_settings(db_url, outcome_attribution_window_hours=24), registry=CollectorRegistry())
    with make_client(rt) as c:
        yield rt, c
    rt.close()


def sample(rt, name: str, **labels: str) -> float | None:  # type: ignore[no-untyped-def]
    return rt.metrics.registry.get_sample_value(name, labels)


def test_an_outcome_a_revision_brings_into_the_window_counts_once(rt_client) -> None:
    """vigil_outcomes_total counts outcomes joined within the window, but counted them only when first
    linked: an escalation 30 h after a conversation that a later revision extended by 10 h was attributed
    to the version and stayed out of the counter (and the dashboard) for good."""
    rt, c = rt_client
    conv = next(Simulator(parse_versions("v1:0.0"), 1).stream(1, start=datetime.now(UTC) - timedelta(days=3)))
    cid, ended = conv["conversation_id"], datetime.fromisoformat(conv["ended_at"])
    late = {"conversation_id": cid, "type": "escalation", "occurred_at": (ended + timedelta(hours=30)).isoformat()}
    assert c.post("/v1/conversations", json=conv, headers=INGEST).status_code == 202
    assert c.post("/v1/outcomes", json=late, headers=INGEST).status_code == 202
    labels = {"type": "escalation", "agent": "support-bot", "agent_version": "v1"}
    assert sample(rt, "vigil_outcomes_outside_window_total", type="escalation") == 1
    assert sample(rt, "vigil_outcomes_total", **labels) is None
    for revision in (2, 2, 3):  # the revision, its redelivery, a later one still inside the window
        grown = dict(conv, revision=revision, ended_at=(ended + timedelta(hours=10)).isoformat())
        assert c.post("/v1/conversations", json=grown, headers=INGEST).status_code == 202
        assert sample(rt, "vigil_outcomes_total", **labels) == 1
