"""Real instrumentation packages tracing a real ``openai`` client against a scripted OpenAI-compatible server,
exporting over OTLP to a running Vigil: each trace becomes one finished, judged conversation whose tool
calls the rules see."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from tests.support.app import make_settings
from tests.support.fake_openai import Script, fake_openai
from tests.support.services import free_port, wait_port
from tests.support.waiting import wait_for as wait_until
from vigil.app.runtime import build_runtime
from vigil.app.server import build_app
from vigil.app.wiring import wire
from vigil.ingest.otlp.models import OtelConversationRow
from vigil.runtime import Runtime
from vigil.store.models import ConversationRow, FindingRow, VerdictRow

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@dataclass
class Vigil:
    base: str
    grpc: str
    rt: Runtime
    llm: str
    script: Script


@pytest.fixture
def vigil(sqlite_url: str) -> Iterator[Vigil]:
    """``vigil serve`` (API, OTLP/HTTP and gRPC, judge worker with the offline judge, idle finisher)."""
    grpc_port = free_port()
    settings = make_settings(
        sqlite_url,
        judge_mode="offline",
        judge_poll_interval_seconds=0.2,
        otlp_trace_idle_seconds=2.0,
        otlp_finish_interval_seconds=0.2,
        otlp_grpc_port=grpc_port,
    )
    rt = wire(build_runtime(settings, registry=CollectorRegistry()), {"serve"})
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(build_app(rt, list(rt.hooks.background)), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    assert wait_port(port) and wait_port(grpc_port)
    with fake_openai() as (llm, script):
        yield Vigil(f"http://127.0.0.1:{port}", f"127.0.0.1:{grpc_port}", rt, llm, script)
    server.should_exit = True
    thread.join(15)
    rt.close()


def run_agent(v: Vigil, instrumentation: str, *extra: str) -> str:
    """Run the traced agent in its own process (each instrumentation patches ``openai`` for good)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "service"), str(ROOT)])}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # traceloop-sdk imports litellm: no network look-up
    cmd = [sys.executable, "-m", "tests.support.traced_agent", instrumentation, "--llm", v.llm]
    cmd += ["--vigil", v.base, "--key", "ingest-key", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Order #W1 is cancelled." in proc.stdout
    return proc.stdout


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    return wait_until(check, timeout, 0.1, what)


def finished_conversation(rt: Runtime, agent: str) -> ConversationRow:
    def find() -> ConversationRow | None:
        with rt.sessions() as s:
            row = s.scalars(
                select(ConversationRow).where(ConversationRow.agent_id == agent, ConversationRow.status == "finished")
            ).first()
            if row is not None:
                s.expunge(row)
            return row

    return wait_for(f"a finished conversation of {agent}", find)


def assert_the_only_conversation(rt: Runtime, row: ConversationRow) -> None:
    """The run's trace became exactly one conversation: no other stored (finished or not), and no other
    still being assembled from spans (a split trace leaves a second key there before its idle finish)."""
    with rt.sessions() as s:
        stored = list(s.scalars(select(ConversationRow.conversation_id)))
        assembling = s.execute(select(OtelConversationRow.conversation_key, OtelConversationRow.conversation_id)).all()
    assert stored == [row.conversation_id]
    assert len(assembling) == 1 and assembling[0].conversation_id == row.conversation_id, assembling
    finished = rt.metrics.registry.get_sample_value
    assert sum(finished("vigil_otlp_conversations_finished_total", {"how": how}) or 0 for how in ("root", "idle")) == 1


def assert_judged_tool_conversation(rt: Runtime, row: ConversationRow) -> dict[str, Any]:
    doc = orjson.loads(row.document)
    msgs = doc["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert msgs[0]["content"].startswith("You are a retail support agent")
    calls = [
        (c["function"]["name"], m["tool_calls"].index(c)) for m in msgs if m.get("tool_calls") for c in m["tool_calls"]
    ]
    assert [name for name, _ in calls] == ["get_order_details", "cancel_pending_order"]
    call_ids = [m["tool_calls"][0]["id"] for m in msgs if m.get("tool_calls")]
    assert [m["tool_call_id"] for m in msgs if m["role"] == "tool"] == call_ids
    assert "delivered" in msgs[3]["content"]
    assert msgs[-1]["content"] == "Order #W1 is cancelled."
    assert row.tool_call_count == 2
    with rt.sessions() as s:
        rules = set(s.scalars(select(FindingRow.rule_id).where(FindingRow.conversation_id == row.conversation_id)))
    # the rules see the tool calls and their results: cancelling a delivered order, without a user's yes
    assert {"no-cancel-delivered-order", "confirm-before-write"} <= rules

    def verdict() -> VerdictRow | None:
        with rt.sessions() as s:
            return s.scalars(select(VerdictRow).where(VerdictRow.conversation_id == row.conversation_id)).first()

    judged = wait_for(f"a verdict on {row.conversation_id}", verdict)
    assert judged.verdict == "fail"  # the offline judge fails a conversation with a high-severity finding
    return doc


def test_openai_v2_content_as_log_events_and_a_plain_http_root(vigil: Vigil) -> None:
    """opentelemetry-instrumentation-openai-v2 with content only in log events (POST /v1/logs); the root is
    the application's HTTP span, which carries no GenAI attribute."""
    run_agent(vigil, "openai-v2", "--capture", "EVENT_ONLY", "--session", "sess-42", "--user", "u-7")
    row = finished_conversation(vigil.rt, "shop-agent-v2")
    doc = assert_judged_tool_conversation(vigil.rt, row)
    assert row.agent_version == "3.1.0"
    assert doc["metadata"]["session_id"] == "sess-42" and doc["metadata"]["user_id"] == "u-7"
    names = [s["name"] for s in doc["metadata"]["trace"]["spans"]]
    assert names[0] == "POST /chat" and names.count("chat gpt-4o-mini") == 3
    text = vigil.rt.metrics.registry.get_sample_value
    assert text("vigil_otlp_log_records_total", {"outcome": "stored"}) == 3
    assert text("vigil_otlp_conversations_finished_total", {"how": "root"}) == 1


def test_openai_v2_over_grpc_with_span_content(vigil: Vigil) -> None:
    run_agent(vigil, "openai-v2", "--grpc", vigil.grpc, "--capture", "SPAN_AND_EVENT")
    row = finished_conversation(vigil.rt, "shop-agent-v2")
    assert_judged_tool_conversation(vigil.rt, row)


def test_openinference_with_tool_spans_finished_by_idle_timeout(vigil: Vigil) -> None:
    """openinference-instrumentation-openai (llm.input_messages.*) plus OpenInference TOOL spans; the root
    span is never ended, so the trace is finished by the idle timeout."""
    run_agent(vigil, "openinference", "--root", "unfinished", "--session", "sess-oi")
    row = finished_conversation(vigil.rt, "shop-agent-oi")
    assert_the_only_conversation(vigil.rt, row)
    doc = assert_judged_tool_conversation(vigil.rt, row)
    assert doc["metadata"]["session_id"] == "sess-oi"
    assert doc["metadata"]["conventions"] == ["openinference"]
    assert [t["function"]["name"] for t in doc["metadata"]["tools"]] == ["get_order_details", "cancel_pending_order"]
    text = vigil.rt.metrics.registry.get_sample_value
    assert text("vigil_otlp_conversations_finished_total", {"how": "idle"}) == 1


def test_traceloop_workflow_and_tool_spans(vigil: Vigil) -> None:
    run_agent(vigil, "traceloop", "--session", "sess-tl", "--user", "u-tl")
    row = finished_conversation(vigil.rt, "shop-agent-tl")
    assert_the_only_conversation(vigil.rt, row)
    doc = assert_judged_tool_conversation(vigil.rt, row)
    assert doc["metadata"]["session_id"] == "sess-tl"
    kinds = {s["name"]: s["kind"] for s in doc["metadata"]["trace"]["spans"]}
    assert kinds["cancel_order_flow.workflow"] == "container"
    assert kinds["get_order_details.tool"] == "tool"


def test_langfuse_generations_and_tool_observations(vigil: Vigil) -> None:
    run_agent(vigil, "langfuse", "--session", "sess-lf", "--user", "u-lf")
    row = finished_conversation(vigil.rt, "shop-agent-lf")
    assert_the_only_conversation(vigil.rt, row)
    doc = assert_judged_tool_conversation(vigil.rt, row)
    assert doc["metadata"]["session_id"] == "sess-lf" and doc["metadata"]["user_id"] == "u-lf"
    assert "langfuse" in doc["metadata"]["conventions"]
    assert row.tokens == 180  # usage_details of three generations
