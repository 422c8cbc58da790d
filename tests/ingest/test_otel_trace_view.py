"""The conversation page of a traced conversation shows its span tree (timings, errors) and links the other
conversations of the same session and user; ``GET /v1/conversations/{id}`` carries the same view."""

from __future__ import annotations

import re
from typing import Any

import orjson

from tests.support.app import REVIEWER
from tests.support.review import review_client, review_runtime
from vigil.ingest.otlp.ingest import TraceIngest


def span(
    trace: str, sid: int, parent: int | None, name: str, start_ms: int, dur_ms: int, **attrs: Any
) -> dict[str, Any]:
    t0 = 1_700_000_000_000_000_000
    return {
        "trace_id": trace,
        "span_id": f"{sid:016x}",
        "parent_span_id": f"{parent:016x}" if parent else None,
        "name": name,
        "kind": 1,
        "start_ns": t0 + start_ms * 1_000_000,
        "end_ns": t0 + (start_ms + dur_ms) * 1_000_000,
        "attributes": attrs,
        "events": [],
        "status": {"code": 2, "message": "upstream timeout"}
        if name.startswith("execute_tool")
        else {"code": 0, "message": ""},
        "resource": {"service.name": "shop-agent"},
    }


def trace(trace_id: str, user: str, session: str = "sess-9") -> list[dict[str, Any]]:
    msgs = orjson.dumps([{"role": "user", "parts": [{"type": "text", "content": f"hello from {user}"}]}]).decode()
    call = orjson.dumps(
        [{"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "lookup", "arguments": {}}]}]
    ).decode()
    chat = {"gen_ai.operation.name": "chat", "gen_ai.input.messages": msgs, "gen_ai.output.messages": call}
    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "c1"}
    return [
        span(trace_id, 1, None, "POST /chat", 0, 900, **{"session.id": session, "user.id": user}),
        span(trace_id, 2, 1, "invoke_agent shop", 5, 880, **{"gen_ai.operation.name": "invoke_agent"}),
        span(trace_id, 3, 2, "chat gpt-4o", 10, 400, **chat),
        span(trace_id, 4, 2, "execute_tool lookup", 420, 300, **tool),
    ]


def test_conversation_page_shows_the_span_tree_and_the_session(sqlite_url: str) -> None:
    rt = review_runtime(sqlite_url)
    ingest = rt.get(TraceIngest)
    a, b = "a" * 32, "b" * 32
    ingest.ingest(trace(a, "u-1"))
    ingest.ingest(trace(b, "u-2"))
    with review_client(rt) as ui:
        api = ui.get(f"/v1/conversations/otel-{a}", headers=REVIEWER).json()
        view = api["trace"]
        assert [(s["name"], s["depth"]) for s in view["spans"]] == [
            ("POST /chat", 0),
            ("invoke_agent shop", 1),
            ("chat gpt-4o", 2),
            ("execute_tool lookup", 2),
        ]
        assert view["spans"][3]["error"] == "upstream timeout" and view["spans"][3]["duration_ms"] == 300
        assert view["session_id"] == "sess-9" and [o["conversation_id"] for o in view["session"]] == [f"otel-{b}"]
        assert view["user_id"] == "u-1" and view["user"] == []

        page = ui.get("/ui/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        ui.post("/ui/login", data={"csrf": csrf, "api_key": "rita-key", "next": "/ui/queue"})
        html = ui.get(f"/ui/review/otel-{a}").text
        assert 'id="trace"' in html and "execute_tool lookup" in html and "error: upstream timeout" in html
        assert "depth-2" in html and "+420.0 ms · 300.0 ms" in html
        assert f'href="/ui/review/otel-{b}"' in html and "Same session <code>sess-9</code>" in html
    rt.close()


def related_block(html: str, key: str) -> str:
    """The page's "Same session" or "Same user" block."""
    m = re.search(rf'<div class="related related-{key}">(.*?)</div>', html, re.S)
    assert m, f"no related-{key} block"
    return m.group(1)


def test_conversations_of_the_same_user_in_different_sessions_link_each_other_by_user(sqlite_url: str) -> None:
    rt = review_runtime(sqlite_url)
    ingest = rt.get(TraceIngest)
    a, b = "c" * 32, "d" * 32
    ingest.ingest(trace(a, "u-7", session="sess-1"))
    ingest.ingest(trace(b, "u-7", session="sess-2"))
    with review_client(rt) as ui:
        for me, other, session in ((a, b, "sess-1"), (b, a, "sess-2")):
            view = ui.get(f"/v1/conversations/otel-{me}", headers=REVIEWER).json()["trace"]
            assert view["user_id"] == "u-7" and [o["conversation_id"] for o in view["user"]] == [f"otel-{other}"]
            assert view["session_id"] == session and view["session"] == []  # linked by user, not by session

        page = ui.get("/ui/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        ui.post("/ui/login", data={"csrf": csrf, "api_key": "rita-key", "next": "/ui/queue"})
        for me, other, session in ((a, b, "sess-1"), (b, a, "sess-2")):
            html = ui.get(f"/ui/review/otel-{me}").text
            user = related_block(html, "user")
            assert "Same user <code>u-7</code>" in user and f'href="/ui/review/otel-{other}"' in user
            same_session = related_block(html, "session")
            assert f"Same session <code>{session}</code>" in same_session and "No other conversation." in same_session
            assert f"otel-{other}" not in same_session
    rt.close()


def test_spans_whose_parents_form_a_cycle_are_shown_once_each_not_dropped() -> None:
    """A's parent B, B's parent A: neither reaches a root, and the tree listed only the root (without a
    root, nothing). Each such group now shows from its earliest span, every span once."""
    from vigil.ingest.otlp.assemble import ordered_tree

    def node(sid: str, parent: str | None, start: float) -> dict[str, Any]:
        return {"span_id": sid, "parent_span_id": parent, "start_ms": start, "name": sid}

    spans = [node("root", None, 0), node("a", "b", 2), node("b", "a", 1), node("c", "a", 3), node("d", "root", 5)]
    tree = [(s["span_id"], s["depth"]) for s in ordered_tree(spans)]
    assert tree == [("root", 0), ("d", 1), ("b", 0), ("a", 1), ("c", 2)]
    rootless = [(s["span_id"], s["depth"]) for s in ordered_tree([node("a", "b", 2), node("b", "a", 1)])]
    assert rootless == [("b", 0), ("a", 1)]


def test_a_parent_span_id_of_all_zeros_is_no_parent() -> None:
    """OTLP: an empty or all-zeros parent id means a root. Read as a child, such a root never finished its
    trace, which waited for the idle timeout instead."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from vigil.ingest.otlp.otlp import parse_json, parse_protobuf

    req = ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.parent_span_id, sp.name = b"\x01" * 16, b"\x02" * 8, bytes(8), "root"
    assert parse_protobuf(req.SerializeToString())[0]["parent_span_id"] is None
    body = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {"traceId": "01" * 16, "spanId": "02" * 8, "parentSpanId": "0" * 16, "name": "root"},
                            {"traceId": "01" * 16, "spanId": "03" * 8, "parentSpanId": "02" * 8, "name": "child"},
                        ]
                    }
                ]
            }
        ]
    }
    parents = [s["parent_span_id"] for s in parse_json(orjson.dumps(body))]
    assert parents == [None, "02" * 8]
