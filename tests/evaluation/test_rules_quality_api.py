"""``GET /v1/rules/quality`` answers: a 404 says which traffic had no conversation with the outcome."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from tests.support.app import INGEST, REVIEWER, make_client, make_settings
from tests.support.review import simulated
from vigil.app.runtime import build_runtime


def test_a_filter_that_matches_no_traffic_is_named_in_the_404(sqlite_url: str) -> None:
    """With agent or version set, the 404 said only that no conversation had the outcome, as if it were
    never recorded at all; it now names the agent and version that matched nothing."""
    rt = build_runtime(make_settings(sqlite_url), registry=CollectorRegistry())
    try:
        with make_client(rt) as client:
            convs = simulated(20, "v1:0.5", seed=3)
            for conv in convs:
                conv["outcomes"] = [{"type": "task_success", "value": 1.0}]
            assert client.post("/v1/conversations", json=convs, headers=INGEST).status_code == 202
            agent = convs[0]["agent_id"]
            ok = client.get("/v1/rules/quality", params={"outcome": "task_success"}, headers=REVIEWER)
            assert ok.status_code == 200 and ok.json()["conversations"] == 20, ok.text[:300]
            r = client.get("/v1/rules/quality", params={"outcome": "task_success", "agent": "nobody"}, headers=REVIEWER)
            assert r.status_code == 404 and "agent 'nobody'" in r.json()["detail"], r.text
            r = client.get(
                "/v1/rules/quality",
                params={"outcome": "task_success", "agent": agent, "version": "v9"},
                headers=REVIEWER,
            )
            assert r.status_code == 404, r.text
            assert f"agent {agent!r}" in r.json()["detail"] and "version 'v9'" in r.json()["detail"]
            # no filter: the outcome itself was never recorded, and the answer says only that
            r = client.get("/v1/rules/quality", params={"outcome": "csat"}, headers=REVIEWER)
            assert r.status_code == 404 and "agent" not in r.json()["detail"], r.text
    finally:
        rt.close()
