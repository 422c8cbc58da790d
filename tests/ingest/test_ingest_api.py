from __future__ import annotations

import orjson
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import ADMIN, INGEST, REVIEWER, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.ingest.simulate import Simulator, parse_versions


def sim(n: int, versions: str = "v1:0.0", seed: int = 1) -> list[dict]:
    return list(Simulator(parse_versions(versions), seed).stream(n))


def test_batch_keeps_valid_items_and_names_invalid_fields(client) -> None:
    good = sim(3)
    bad = dict(good[0], conversation_id="bad-1")
    del bad["agent_id"]
    bad2 = dict(good[1], conversation_id="bad-2", messages=[{"role": "robot", "content": "x"}])
    r = client.post("/v1/conversations", content=orjson.dumps([good[0], bad, good[1], bad2, good[2]]), headers=INGEST)
    assert r.status_code == 422
    body = r.json()
    assert body["accepted"] == 3 and body["stored"] == 3 and body["rejected"] == 2
    fields = {e["index"]: [x["field"] for x in e["errors"]] for e in body["errors"]}
    assert fields[1] == ["agent_id"]
    assert fields[3][0].startswith("messages.0.role")
    listed = client.get("/v1/conversations", headers=REVIEWER).json()
    assert listed["total"] == 3
    dead = client.get("/v1/dead-letters", headers=ADMIN).json()
    # one letter per reason and request, naming every invalid item
    assert [d["reason"] for d in dead] == ["schema_invalid"]
    assert "item 1: agent_id" in dead[0]["detail"] and "item 3: messages.0.role" in dead[0]["detail"]


def test_single_object_and_idempotent_redelivery(client) -> None:
    conv = sim(1)[0]
    for _ in range(3):
        r = client.post("/v1/conversations", json=conv, headers=INGEST)
        assert r.status_code == 202
    assert client.get("/v1/conversations", headers=REVIEWER).json()["total"] == 1
    metrics = client.get("/metrics").text
    assert 'vigil_conversations_processed_total{agent="support-bot",agent_version="v1",source="http"} 1.0' in metrics
    assert 'vigil_conversations_duplicate_total{source="http"} 2.0' in metrics


def test_newer_revision_supersedes_and_replaces_findings(client) -> None:
    conv = [c for c in sim(40, "v1:1.0") if c["metadata"]["simulated_defect"] == "pii_leak"][0]
    cid = conv["conversation_id"]
    client.post("/v1/conversations", json=conv, headers=INGEST)
    first = client.get(f"/v1/conversations/{cid}", headers=REVIEWER).json()
    assert "pii-in-reply" in {f["rule_id"] for f in first["findings"]}
    fixed = dict(conv, revision=2, messages=[m for m in conv["messages"] if "email is" not in (m.get("content") or "")])
    client.post("/v1/conversations", json=fixed, headers=INGEST)
    second = client.get(f"/v1/conversations/{cid}", headers=REVIEWER).json()
    assert second["revision"] == 2
    assert "pii-in-reply" not in {f["rule_id"] for f in second["findings"]}
    # an older revision arriving late changes nothing
    client.post("/v1/conversations", json=conv, headers=INGEST)
    assert client.get(f"/v1/conversations/{cid}", headers=REVIEWER).json()["revision"] == 2


def test_malformed_body_is_dead_lettered(client) -> None:
    r = client.post("/v1/conversations", content=b'{"conversation_id": "x", ', headers=INGEST)
    assert r.status_code == 400 and "not JSON" in r.json()["detail"]
    dead = client.get("/v1/dead-letters", headers=ADMIN).json()
    assert dead[0]["reason"] == "malformed_json" and dead[0]["raw_preview"].startswith('{"conversation_id"')


def test_oversized_item_is_rejected(sqlite_url) -> None:
    rt = build_runtime(make_settings(sqlite_url, max_message_bytes=2048), registry=CollectorRegistry())
    with make_client(rt) as c:
        conv = sim(1)[0]
        conv["messages"][1]["content"] = "x" * 5000
        r = c.post("/v1/conversations", json=conv, headers=INGEST)
        assert r.status_code == 422
        assert "exceeds the limit" in r.json()["errors"][0]["errors"][0]["message"]
        assert c.get("/v1/dead-letters", headers=ADMIN).json()[0]["reason"] == "oversized"


def test_inline_outcome_of_an_undeclared_type_is_stored_and_warned_about(sqlite_url) -> None:
    rt = build_runtime(make_settings(sqlite_url, outcome_types="chargeback:bad"), registry=CollectorRegistry())
    with make_client(rt) as c:
        convs = sim(3)
        convs[0]["outcomes"] = [{"type": "escalation"}, {"type": "chargeback"}]  # built in, declared
        convs[2]["outcomes"] = [{"type": "refund_revarsal", "value": 1}]  # a typo
        r = c.post("/v1/conversations", json=convs, headers=INGEST)
        assert r.status_code == 202, r.text
        body = r.json()
        assert body["stored"] == 3 and body["errors"] == []
        [w] = body["warnings"]
        assert w["index"] == 2 and w["conversation_id"] == convs[2]["conversation_id"]
        assert "'refund_revarsal' is not declared" in w["message"] and "VIGIL_OUTCOME_TYPES" in w["message"]
        # nothing is lost: the outcome is kept with its conversation, as declared later it would count
        stored = c.get(f"/v1/conversations/{convs[2]['conversation_id']}", headers=REVIEWER)
        assert stored.status_code == 200, stored.text
        assert [o["type"] for o in stored.json()["outcomes"]] == ["refund_revarsal"]
        # the same in another format
        record = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
        assert c.post("/v1/conversations", json=sim(1)[0], headers=INGEST).json()["warnings"] == []
        r = c.post("/v1/conversations?format=openai&agent_id=a&agent_version=v1", json=record, headers=INGEST)
        assert r.status_code == 202 and r.json()["warnings"] == []
        # an end before the start is kept as sent, and said
        backwards = dict(sim(1)[0], conversation_id="backwards")
        backwards["started_at"], backwards["ended_at"] = "2026-01-02T10:00:00Z", "2026-01-02T09:00:00Z"
        r = c.post("/v1/conversations", json=backwards, headers=INGEST)
        assert r.status_code == 202 and r.json()["stored"] == 1
        [w] = r.json()["warnings"]
        assert w["field"] == "ended_at" and "before started_at" in w["message"]


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer nope"}, 401), (REVIEWER, 403), (INGEST, 202), (ADMIN, 202)],
)
def test_ingest_requires_ingest_role(client, headers, status) -> None:
    r = client.post("/v1/conversations", json=sim(1)[0], headers=headers)
    assert r.status_code == status


def test_reads_require_reviewer(client) -> None:
    assert client.get("/v1/conversations", headers=INGEST).status_code == 403
    assert client.get("/v1/conversations").status_code == 401
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").json()["status"] == "ready"


def test_list_filters(client) -> None:
    convs = sim(60, "v1:0.0,v2:1.0", seed=3)
    client.post("/v1/conversations", json=convs, headers=INGEST)
    v2 = client.get("/v1/conversations", params={"version": "v2", "limit": 500}, headers=REVIEWER).json()
    assert v2["total"] == sum(1 for c in convs if c["agent_version"] == "v2")
    pii = client.get("/v1/conversations", params={"rule": "pii-in-reply"}, headers=REVIEWER).json()
    expected = sum(1 for c in convs if c["metadata"]["simulated_defect"] == "pii_leak")
    assert pii["total"] == expected > 0
    crit = client.get("/v1/conversations", params={"severity": "critical"}, headers=REVIEWER).json()
    assert crit["total"] == expected
    # a severity in any case, as the review queue takes it; an unknown one is a 422 naming the five
    for spelt in ("CRITICAL", "Critical"):
        r = client.get("/v1/conversations", params={"severity": spelt}, headers=REVIEWER)
        assert r.status_code == 200, r.text
        assert r.json()["total"] == expected
    high = [client.get("/v1/conversations", params={"severity": s}, headers=REVIEWER).json() for s in ("HIGH", "high")]
    assert high[0]["total"] == high[1]["total"] > 0
    for unknown in ("severe", "HIGHEST", ""):
        r = client.get("/v1/conversations", params={"severity": unknown}, headers=REVIEWER)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["query", "severity"]
        assert "'info', 'low', 'medium', 'high' or 'critical'" in r.json()["detail"][0]["msg"]
    assert client.get("/v1/conversations/nope", headers=REVIEWER).status_code == 404


def test_schema_endpoint_and_openapi(client) -> None:
    schema = client.get("/v1/schema/conversation", headers=INGEST).json()
    assert "conversation_id" in schema["required"] and "messages" in schema["required"]
    assert "v1" in schema["$id"]
    spec = client.get("/openapi.json").json()
    assert "/v1/conversations" in spec["paths"] and "Conversation" in spec["components"]["schemas"]


def test_rules_endpoint_lists_rules_and_argument_schemas(client) -> None:
    body = client.get("/v1/rules", headers=REVIEWER).json()
    ids = {r["id"] for r in body["rules"]}
    assert "pii-in-reply" in ids and "confirm-before-write" in ids
    forbidden = body["rule_types"]["forbidden_tool"]
    assert "tools" in forbidden["args"]["properties"] and forbidden["doc"]
