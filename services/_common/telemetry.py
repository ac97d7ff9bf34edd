"""OpenTelemetry for every service: one TracerProvider per process, gRPC interceptors that open a
span per RPC and propagate the context over gRPC metadata, and named tracers for the storage
steps (append, flush wait, dispatch, read).

Exporters (DESIGN "Observability"): OTLP over gRPC when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set
(the standard OTEL_* variables configure it), the console when ``MQSTORE_TRACE_CONSOLE=1``,
otherwise none (spans are still created, so trace ids reach logs and error messages). Tests add
an in-memory exporter with :func:`add_span_exporter`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

from services._common.errors import StoreErrorInterceptor

_lock = threading.Lock()
_provider: TracerProvider | None = None


def configure_tracing(service_name: str = "mqstore", env: Mapping[str, str] | None = None) -> TracerProvider:
    """The process's TracerProvider, created on first call (later calls return it)."""
    global _provider
    with _lock:
        if _provider is not None:
            return _provider
        environ = os.environ if env is None else env
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        if environ.get("MQSTORE_TRACE_CONSOLE") == "1":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
        trace.set_tracer_provider(provider)
        _provider = provider
        return provider


def add_span_exporter(exporter: SpanExporter) -> None:
    """Send every span also to ``exporter``, synchronously (tests: InMemorySpanExporter)."""
    configure_tracing().add_span_processor(SimpleSpanProcessor(exporter))


def shutdown_tracing() -> None:
    """Flush exporters (at process exit)."""
    if _provider is not None:
        _provider.shutdown()


def tracer(name: str) -> trace.Tracer:
    """A tracer for one service or library layer (``mqstore.gateway``, ``mqstore.commitlog``...)."""
    return configure_tracing().get_tracer(name)


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """Per-RPC server spans (outermost, so failures are recorded), then error mapping."""
    return [aio_server_interceptor(tracer_provider=configure_tracing()), StoreErrorInterceptor()]


def client_interceptors() -> list[Any]:
    """Per-RPC client spans that inject the trace context into the call's metadata."""
    return list(aio_client_interceptors(tracer_provider=configure_tracing()))
