"""Helpers of the review tests: a runtime wired with the review stage, seeded traffic, hostile transcripts."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from tests.support.app import REVIEWER, make_settings
from vigil.app.runtime import build_runtime
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.runtime import Runtime
from vigil.schema import Conversation


def review_runtime(url: str, **overrides: Any) -> Runtime:
    """A runtime with only the review stage wired (its tests do not depend on other stages' state)."""
    import vigil.ingest.wiring as ingest_wiring
    import vigil.review.wiring as review_wiring

    rt = build_runtime(make_settings(url, **overrides), registry=CollectorRegistry())
    rt.roles = frozenset({"api"})
    ingest_wiring.wire(rt)  # POST /v1/conversations
    review_wiring.wire(rt)
    return rt


def review_client(rt: Runtime):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    from vigil.app.server import build_app

    return TestClient(build_app(rt))


def simulated(n: int, versions: str = "v1:0.6", seed: int = 7) -> list[dict[str, Any]]:
    return list(Simulator(parse_versions(versions), seed).stream(n))


def store(rt: Runtime, convs: list[dict[str, Any]]) -> None:
    rt.pipeline.process([Conversation.model_validate(c) for c in convs], "test")


XSS_PAYLOADS = [
    "<script>window.__xss = 1; alert(1)</script>",
    '<img src=x onerror="window.__xss = 2; alert(2)">',
    '<a href="javascript:window.__xss=3">click me</a>',
    "{{ 7 * 7 }} {% raw %}{% endraw %} ${7*7} <svg onload=alert(4)>",
    '"><iframe srcdoc="<script>parent.__xss=5</script>"></iframe>',
]


def xss_conversation(cid: str = "xss-<script>alert(1)</script>") -> dict[str, Any]:
    """A conversation whose every string an attacker controls: ids, messages, tool names, arguments."""
    evil = " ".join(XSS_PAYLOADS)
    return {
        "conversation_id": cid,
        "agent_id": "support-bot",
        "agent_version": "v-<img src=x onerror=alert(9)>",
        "task_id": "<script>window.__xss=6</script>",
        "messages": [
            {"role": "system", "content": "You are a support agent. " + evil},
            {"role": "user", "content": "Where did you send my receipt? " + evil},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {
                            "name": "get_order_details<script>window.__xss=7</script>",
                            "arguments": '{"order_id": "<img src=x onerror=window.__xss=8>"}',
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "c1",
                "is_error": True,
                "content": "Error: <script>window.__xss=10</script> javascript:alert(1)",
            },
            {"role": "assistant", "content": "Sure! I sent it to eve@example.com. " + evil},
        ],
        "metadata": {"note": evil},
    }


def long_conversation(n: int, cid: str = "long-1", leak_at: int | None = None) -> dict[str, Any]:
    """A valid conversation of ``n`` short messages (a long agent run); the assistant message at
    ``leak_at`` is an assistant message that leaks an e-mail address, so a rule flags it."""
    messages: list[dict[str, Any]] = []
    for i in range(n):
        role = "user" if i % 2 == 0 and i != leak_at else "assistant"
        text = f"go on {i}" if role == "user" else f"did {i}"
        if i == leak_at:
            text = f"did {i}: sent to eve@example.com"
        messages.append({"role": role, "content": text})
    return {"conversation_id": cid, "agent_id": "coder", "agent_version": "v1", "messages": messages}


def queue_of(api, **params):  # type: ignore[no-untyped-def]
    """GET /v1/review/queue with ``params`` (up to 500 items), asserting it answered 200."""
    r = api.get("/v1/review/queue", params={"limit": 500, **params}, headers=REVIEWER)
    assert r.status_code == 200, r.text
    return r.json()
