"""A conversation nested as deep as ingest accepts (orjson reads 1,024 levels) reads back as it was sent."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from tests.support.app import INGEST, REVIEWER, make_client, make_settings
from vigil.app.runtime import build_runtime
from vigil.ingest.pipeline import Envelope


def nested(depth: int, kind: str) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"d": value} if kind == "object" else [value]
    return value


def spelled(depth: int, kind: str) -> bytes:
    """``nested(depth, kind)`` as compact JSON (orjson writes no more than 255 levels itself)."""
    if kind == "object":
        return b'{"d":' * depth + b'"bottom"' + b"}" * depth
    return b"[" * depth + b'"bottom"' + b"]" * depth


def conversation(cid: str, deep: Any) -> dict[str, Any]:
    return {
        "conversation_id": cid,
        "agent_id": "a",
        "agent_version": "v1",
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"deep": deep, "n": 2**70 + 1},
    }


@pytest.mark.parametrize(("depth", "kind"), [(260, "object"), (400, "array"), (1000, "array"), (1000, "object")])
def test_a_deeply_nested_conversation_is_stored_and_served_as_sent(db_url: str, depth: int, kind: str) -> None:
    rt = build_runtime(make_settings(db_url), registry=CollectorRegistry())
    sent = conversation(f"http-{kind}-{depth}", nested(depth, kind))
    with make_client(rt) as c:
        head = orjson.dumps({k: v for k, v in sent.items() if k != "metadata"})
        # an integer beyond 64 bits too, kept exact
        big = head[:-1] + b',"metadata":{"deep":' + spelled(depth, kind) + b',"n":' + str(2**70 + 1).encode() + b"}}"
        assert c.post("/v1/conversations", content=big, headers=INGEST).status_code == 202
        # the Kafka consumer's way in: the same decoder, the same stored document
        kafka = big.replace(sent["conversation_id"].encode(), f"kafka-{kind}-{depth}".encode())
        result = rt.pipeline.process_raw([Envelope(kafka, "kafka", "conversations", 0, 0, "k")])
        assert len(result.stored) == 1 and not result.dead_letters
        for cid in (sent["conversation_id"], f"kafka-{kind}-{depth}"):
            r = c.get(f"/v1/conversations/{cid}", headers=REVIEWER)
            assert r.status_code == 200, r.text[:300]
            answer = orjson.loads(r.content)  # (Python's parser, and ==, stop short of 1,000 levels)
            assert answer["conversation_id"] == cid and answer["findings"] == []
            assert answer["conversation"]["messages"] == sent["messages"]
            assert spelled(depth, kind) in r.content and b'"n":' + str(2**70 + 1).encode() in r.content
    rt.close()
