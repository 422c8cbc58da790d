"""Vigil's own tracing: off by default, a span per batch and per stage when on, the LLM call as a child."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from tests.support.app import make_settings
from vigil import observability as spans
from vigil.app.runtime import build_runtime
from vigil.app.wiring import wire
from vigil.ingest.pipeline import Envelope
from vigil.ingest.simulate import Simulator, parse_versions
from vigil.schema import Conversation


@pytest.fixture
def memory() -> Iterator[InMemorySpanExporter]:
    spans.shutdown()
    exporter = InMemorySpanExporter()
    yield exporter
    spans.shutdown()


def test_off_by_default_and_on_by_standard_variables(sqlite_url: str) -> None:
    settings = make_settings(sqlite_url)
    assert not spans.wanted(settings, environ={})
    assert spans.wanted(settings, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert spans.wanted(settings, environ={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"})
    assert spans.wanted(make_settings(sqlite_url, tracing_enabled=True), environ={})
    assert spans.configure(settings, environ={}) is False
    assert spans.span("vigil.batch") is spans.NOOP
    assert spans.llm_call("gpt-4o") is spans.NOOP


def test_endpoint_variable_switches_on_the_otlp_exporter(sqlite_url: str, memory: InMemorySpanExporter) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SERVICE_NAME": "vigil-eu"}
    assert spans.configure(make_settings(sqlite_url), environ=env) is True
    assert spans.enabled()
    assert spans.span("x") is not spans.NOOP
    spans.shutdown()
    assert not spans.enabled()


def test_batch_and_stage_spans(sqlite_url: str, memory: InMemorySpanExporter) -> None:
    rt = wire(build_runtime(make_settings(sqlite_url), registry=CollectorRegistry()), {"replay"})
    spans.shutdown()  # whatever the environment asked for, this test exports to memory
    assert spans.configure(rt.settings, exporter=memory)
    sim = Simulator(parse_versions("v1:0.5"), seed=3)
    envelopes = [Envelope(orjson.dumps(c), "kafka", "conversations", 0, i) for i, c in enumerate(sim.stream(20))]
    envelopes.append(Envelope(b"{broken", "kafka", "conversations", 0, 99))
    rt.pipeline.process_raw(envelopes)
    with (
        spans.span("vigil.judge", judge="helpfulness"),
        spans.llm_call("gpt-4o-mini", judge="helpfulness") as call,
    ):
        call.usage(812, 64)
    spans.force_flush()
    finished = {s.name: s for s in memory.get_finished_spans()}
    batch = finished["vigil.batch"]
    assert batch.attributes["vigil.source"] == "kafka" and batch.attributes["vigil.batch.size"] == 21
    for child in ("vigil.decode_rules", "vigil.store"):
        assert finished[child].parent.span_id == batch.context.span_id
        assert finished[child].context.trace_id == batch.context.trace_id
    assert finished["vigil.store"].attributes["vigil.stored"] == 20
    llm = finished["chat gpt-4o-mini"]
    assert llm.parent.span_id == finished["vigil.judge"].context.span_id
    assert llm.attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert llm.attributes["gen_ai.usage.input_tokens"] == 812
    assert llm.attributes["gen_ai.usage.output_tokens"] == 64
    assert llm.attributes["vigil.judge"] == "helpfulness"
    rt.close()


def test_documents_checked_elsewhere_have_a_rules_span(sqlite_url: str, memory: InMemorySpanExporter) -> None:
    """HTTP and OTLP batches are decoded before the pipeline: their rules run in a ``vigil.rules`` child."""
    rt = wire(build_runtime(make_settings(sqlite_url), registry=CollectorRegistry()), {"replay"})
    spans.shutdown()
    assert spans.configure(rt.settings, exporter=memory)
    sim = Simulator(parse_versions("v1:0.5"), seed=4)
    convs = list(sim.stream(5))
    items = [(Conversation.model_validate(c), orjson.dumps(c).decode(), None) for c in convs]
    rt.pipeline.process_documents(items, [], "http")
    spans.force_flush()
    finished = {s.name: s for s in memory.get_finished_spans()}
    batch = finished["vigil.batch"]
    assert batch.attributes["vigil.source"] == "http"
    for child in ("vigil.rules", "vigil.store"):
        assert finished[child].parent.span_id == batch.context.span_id
    rt.close()


def test_failed_stage_span_records_the_error(sqlite_url: str, memory: InMemorySpanExporter) -> None:
    spans.configure(make_settings(sqlite_url), exporter=memory)
    with pytest.raises(RuntimeError), spans.span("vigil.store"):
        raise RuntimeError("database went away")
    spans.force_flush()
    (failed,) = memory.get_finished_spans()
    assert failed.status.status_code.name == "ERROR"
    assert failed.events[0].name == "exception"


@pytest.mark.slow
def test_replay_exports_its_spans_by_the_standard_variables(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A real `vigil replay` process, configured only by OTEL_* variables, exports over OTLP/HTTP."""
    import os
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.support.services import free_port
    from vigil.ingest.otlp.otlp import parse, protobuf_response

    received: list[tuple[str, dict[str, str], bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["content-length"]))
            received.append((self.path, dict(self.headers), body))
            reply = protobuf_response(0, "")
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            return None

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sim = tmp_path / "sim.jsonl"
        convs = Simulator(parse_versions("v1:0.2"), 1).stream(30)
        sim.write_bytes(b"".join(orjson.dumps(c) + b"\n" for c in convs))
        env = {
            **os.environ,
            "VIGIL_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=acme",
            "OTEL_SERVICE_NAME": "vigil-replay-test",
        }
        env.pop("VIGIL_TRACING_ENABLED", None)
        done = subprocess.run(
            [sys.executable, "-m", "vigil.app.cli", "replay", str(sim), "--batch", "10"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    finally:
        server.shutdown()
    assert received, "no spans were exported"
    assert {path for path, _, _ in received} == {"/v1/traces"}
    assert all(h.get("x-tenant") == "acme" for _, h, _ in received)
    exported = [s for _, _, body in received for s in parse(body, "application/x-protobuf")[0]]
    batches = [s for s in exported if s["name"] == "vigil.batch"]
    assert len(batches) == 3 and all(b["attributes"]["vigil.source"] == "replay" for b in batches)
    assert exported[0]["resource"]["service.name"] == "vigil-replay-test"
    stores = [s for s in exported if s["name"] == "vigil.store"]
    assert {s["parent_span_id"] for s in stores} == {b["span_id"] for b in batches}
