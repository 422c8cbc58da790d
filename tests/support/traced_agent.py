"""A tool-calling agent traced by a real instrumentation package, exporting to Vigil over OTLP.

Run in its own process (each instrumentation patches the ``openai`` client for good):

    python -m tests.support.traced_agent INSTRUMENTATION --llm URL --vigil URL --key KEY [--grpc HOST:PORT]
        [--root span|unfinished] [--capture SPAN_ONLY|EVENT_ONLY|SPAN_AND_EVENT] [--session ID --user ID]

INSTRUMENTATION is ``openai-v2`` (opentelemetry-instrumentation-openai-v2), ``openinference``
(openinference-instrumentation-openai), ``traceloop`` (traceloop-sdk) or ``langfuse`` (the langfuse SDK's
OpenAI integration). The agent asks the scripted model (tests/support/fake_openai.py) to cancel an order,
runs the tools it calls and prints the final answer. ``--root unfinished`` leaves the agent's root span
open (as a crashed or still-running agent does), so only the idle timeout can finish its trace.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "description": "Look an order up by id.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "cancel_pending_order",
            "description": "Cancel a pending order.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"}},
                "required": ["order_id", "reason"],
            },
        },
    },
]
RESULTS = {
    "get_order_details": {"order_id": "#W1", "status": "delivered", "items": ["lamp"]},
    "cancel_pending_order": {"order_id": "#W1", "status": "cancelled"},
}
SYSTEM = "You are a retail support agent. Confirm with the user before any write action."
USER = "Please cancel order #W1, I don't need it anymore."


def run_agent(client: Any, run_tool: Callable[[str, dict[str, Any]], Any], stream: bool = False) -> str:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    for _ in range(6):
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=msgs, tools=TOOLS)
        m = reply.choices[0].message
        msgs.append(m.model_dump(exclude_none=True))
        if not m.tool_calls:
            return str(m.content)
        for c in m.tool_calls:
            result = run_tool(c.function.name, json.loads(c.function.arguments))
            msgs.append({"role": "tool", "tool_call_id": c.id, "content": json.dumps(result)})
    raise RuntimeError("the scripted model never answered")


def plain_tool(name: str, args: dict[str, Any]) -> Any:
    return RESULTS[name]


def _provider(args: argparse.Namespace, service: str) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service, "service.version": "3.1.0"}))
    provider.add_span_processor(BatchSpanProcessor(_span_exporter(args)))
    return provider


def _span_exporter(args: argparse.Namespace) -> Any:
    auth = {"authorization": f"Bearer {args.key}"}
    if args.grpc:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        return GrpcSpanExporter(endpoint=args.grpc, insecure=True, headers=tuple(auth.items()))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=f"{args.vigil}/v1/traces", headers=auth)


def _log_exporter(args: argparse.Namespace) -> Any:
    auth = {"authorization": f"Bearer {args.key}"}
    if args.grpc:
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter

        return GrpcLogExporter(endpoint=args.grpc, insecure=True, headers=tuple(auth.items()))
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    return OTLPLogExporter(endpoint=f"{args.vigil}/v1/logs", headers=auth)


@contextmanager
def _root(tracer: Any, args: argparse.Namespace, name: str = "POST /chat") -> Iterator[None]:
    """The application's own root span (an HTTP server span: no GenAI attribute), or one never ended."""
    attrs = {"http.request.method": "POST", "url.path": "/chat"}
    if args.session:
        attrs["session.id"] = args.session
    if args.user:
        attrs["user.id"] = args.user
    if args.root == "unfinished":
        from opentelemetry import trace

        span = tracer.start_span(name, attributes=attrs)  # never ended: the process "crashes" first
        with trace.use_span(span, end_on_exit=False):
            yield
        return
    with tracer.start_as_current_span(name, attributes=attrs):
        yield


def openai_v2(args: argparse.Namespace) -> str:
    os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
    os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = args.capture
    import openai
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

    provider = _provider(args, "shop-agent-v2")
    logs = LoggerProvider()
    logs.add_log_record_processor(BatchLogRecordProcessor(_log_exporter(args)))
    OpenAIInstrumentor().instrument(tracer_provider=provider, logger_provider=logs)
    client = openai.OpenAI(base_url=args.llm, api_key="test-key")
    with _root(provider.get_tracer("shop"), args):
        answer = run_agent(client, plain_tool)
    logs.force_flush()
    provider.force_flush()
    logs.shutdown()
    provider.shutdown()
    return answer


def openinference(args: argparse.Namespace) -> str:
    import openai
    from openinference.instrumentation import using_session, using_user
    from openinference.instrumentation.openai import OpenAIInstrumentor

    provider = _provider(args, "shop-agent-oi")
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    tracer = provider.get_tracer("shop")
    from openinference.instrumentation import OITracer, TraceConfig

    oi = OITracer(tracer, config=TraceConfig())

    @oi.tool(name="get_order_details")
    def get_order_details(order_id: str) -> Any:
        return RESULTS["get_order_details"]

    @oi.tool(name="cancel_pending_order")
    def cancel_pending_order(order_id: str, reason: str) -> Any:
        return RESULTS["cancel_pending_order"]

    tools = {"get_order_details": get_order_details, "cancel_pending_order": cancel_pending_order}
    client = openai.OpenAI(base_url=args.llm, api_key="test-key")
    session = using_session(args.session) if args.session else nullcontext()
    user = using_user(args.user) if args.user else nullcontext()
    with session, user, _root(tracer, args):
        answer = run_agent(client, lambda name, a: tools[name](**a))
    provider.force_flush()
    provider.shutdown()
    return answer


def traceloop(args: argparse.Namespace) -> str:
    os.environ.setdefault("TRACELOOP_TELEMETRY", "false")
    os.environ["TRACELOOP_TRACE_CONTENT"] = "true"
    import openai
    from traceloop.sdk import Traceloop
    from traceloop.sdk.decorators import tool, workflow
    from traceloop.sdk.instruments import Instruments

    Traceloop.init(
        app_name="shop-agent-tl",
        exporter=_span_exporter(args),
        disable_batch=True,
        telemetry_enabled=False,
        instruments={Instruments.OPENAI},
        resource_attributes={"service.version": "3.1.0"},
    )
    if args.session or args.user:
        Traceloop.set_association_properties(
            {k: v for k, v in (("session_id", args.session), ("user_id", args.user)) if v}
        )

    @tool(name="get_order_details")
    def get_order_details(order_id: str) -> Any:
        return RESULTS["get_order_details"]

    @tool(name="cancel_pending_order")
    def cancel_pending_order(order_id: str, reason: str) -> Any:
        return RESULTS["cancel_pending_order"]

    tools = {"get_order_details": get_order_details, "cancel_pending_order": cancel_pending_order}
    client = openai.OpenAI(base_url=args.llm, api_key="test-key")

    @workflow(name="cancel_order_flow")
    def flow() -> str:
        return run_agent(client, lambda name, a: tools[name](**a))

    answer = flow()
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    provider.force_flush()  # type: ignore[attr-defined]
    provider.shutdown()  # type: ignore[attr-defined]
    return answer


def langfuse(args: argparse.Namespace) -> str:
    from langfuse import Langfuse, propagate_attributes

    client_lf = Langfuse(
        public_key="pk-test", secret_key="sk-test", base_url=args.vigil, span_exporter=_span_exporter(args)
    )
    from langfuse.openai import OpenAI

    client = OpenAI(base_url=args.llm, api_key="test-key")

    def run_tool(name: str, a: dict[str, Any]) -> Any:
        with client_lf.start_as_current_observation(name=name, as_type="tool", input=a) as obs:
            result = RESULTS[name]
            obs.update(output=result)
            return result

    labels = {k: v for k, v in (("session_id", args.session), ("user_id", args.user)) if v}
    with client_lf.start_as_current_observation(name="shop-agent-lf", as_type="agent"), propagate_attributes(**labels):
        answer = run_agent(client, run_tool)
    client_lf.flush()
    client_lf.shutdown()
    return answer


RUNNERS = {"openai-v2": openai_v2, "openinference": openinference, "traceloop": traceloop, "langfuse": langfuse}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("instrumentation", choices=sorted(RUNNERS))
    ap.add_argument("--llm", required=True)
    ap.add_argument("--vigil", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--grpc")
    ap.add_argument("--root", choices=["span", "unfinished"], default="span")
    ap.add_argument("--capture", default="SPAN_ONLY")
    ap.add_argument("--session")
    ap.add_argument("--user")
    args = ap.parse_args()
    print(RUNNERS[args.instrumentation](args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
