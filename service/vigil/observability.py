"""Vigil's own tracing: a span per batch and per stage, the judge call as a child span.

Off by default. :func:`configure` turns it on when ``VIGIL_TRACING_ENABLED`` is true or an OTLP
endpoint is set in the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` variables; the exporter then reads every other ``OTEL_*``
variable itself (headers, timeout, compression, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``).

When off, :func:`span` returns one shared do-nothing object: no OpenTelemetry call, no allocation.

Usage from any stage::

    from vigil.observability import span, llm_call

    with span("vigil.sampler", conversations=len(batch)):
        ...
    with llm_call(model, judge="helpfulness") as call:
        reply = ...
        call.usage(prompt_tokens, completion_tokens)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from vigil.settings import Settings

_tracer: Any = None
_provider: Any = None

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


class _NoopSpan:
    """Stands in for a span when tracing is off; every method does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoopSpan:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        return False

    def set_attribute(self, key: str, value: Any) -> None:
        return None

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        return None

    def usage(self, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        return None


NOOP = _NoopSpan()


class _Span:
    """A live span used as a context manager; ends (and records an exception) on exit."""

    __slots__ = ("_cm", "_span")

    def __init__(self, name: str, attributes: Mapping[str, Any]) -> None:
        self._cm = _tracer.start_as_current_span(name, attributes=_clean(attributes))
        self._span: Any = None

    def __enter__(self) -> _Span:
        self._span = self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> bool:
        return bool(self._cm.__exit__(*exc))

    def set_attribute(self, key: str, value: Any) -> None:
        if value is not None:
            self._span.set_attribute(key, value)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self._span.set_attributes(_clean(attributes))

    def usage(self, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """Token counts of an LLM call, as GenAI semantic-convention attributes."""
        self.set_attribute("gen_ai.usage.input_tokens", prompt_tokens)
        self.set_attribute("gen_ai.usage.output_tokens", completion_tokens)


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in attributes.items() if v is not None}


def enabled() -> bool:
    return _tracer is not None


def span(name: str, **attributes: Any) -> _Span | _NoopSpan:
    """A child of the current span (or a root). Use as ``with span("vigil.store", n=3) as s:``."""
    if _tracer is None:
        return NOOP
    return _Span(name, attributes)


def llm_call(model: str, **attributes: Any) -> _Span | _NoopSpan:
    """The span of one LLM request (e.g. the judge): ``gen_ai.*`` attributes, tokens via ``.usage()``."""
    if _tracer is None:
        return NOOP
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
    attrs.update({f"vigil.{k}": v for k, v in attributes.items()})
    return _Span(f"chat {model}", attrs)


def wanted(settings: Settings, environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return settings.tracing_enabled or any(env.get(v) for v in ENDPOINT_VARS)


def configure(settings: Settings, exporter: Any = None, environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on if :func:`wanted` (or if ``exporter`` is given, for tests); idempotent.

    Uses its own ``TracerProvider`` rather than the global one, so an application that embeds
    Vigil keeps its own tracing setup.
    """
    global _tracer, _provider
    if _tracer is not None:
        return True
    if exporter is None and not wanted(settings, environ):
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from vigil import __version__

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    env = os.environ if environ is None else environ
    attrs = {"service.version": __version__}
    if not env.get("OTEL_SERVICE_NAME") and "service.name=" not in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attrs["service.name"] = "vigil"
    resource = Resource.create(attrs)
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _provider = provider
    _tracer = provider.get_tracer("vigil", __version__)
    return True


def shutdown() -> None:
    """Flush and stop the exporter; tracing is off afterwards."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


def force_flush() -> None:
    if _provider is not None:
        _provider.force_flush()
