"""OpenTelemetry for every service: one TracerProvider and one MeterProvider per process, gRPC
interceptors that open a span per RPC and propagate the context over gRPC metadata, named
tracers for the storage steps (append, flush wait, replica wait, dispatch, read) and meters for
the numbers operators watch (replication lag and acked offsets, SYNC_MASTER wait time).

Exporters (DESIGN "Observability"): OTLP over gRPC when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set
(the standard OTEL_* variables configure it; metrics every ``OTEL_METRIC_EXPORT_INTERVAL`` ms),
the console when ``MQSTORE_TRACE_CONSOLE=1``, otherwise none. Sampling follows the standard
``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG`` (default: parent-based, always on) while an
exporter is attached; with none, servers run without the per-RPC span interceptor and this
module's tracers (:func:`tracer`) open no span at all, so tracing costs the request path nothing
(spans other code opens are dropped at their start by the sampler). Metrics can also be scraped:
:func:`start_metrics_endpoint` (``mqstore serve --metrics-listen``). Tests add an
in-memory exporter with :func:`add_span_exporter` and read metrics with :func:`metrics_snapshot`
(a collection of the scrape endpoint's reader).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
import prometheus_client
from opentelemetry import metrics, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor, filters
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, MetricsData, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

_lock = threading.Lock()
_provider: TracerProvider | None = None
_meter_provider: MeterProvider | None = None
_metric_reader: _ScrapedReader | None = None


class ExportAwareSampler(Sampler):
    """``delegate`` (the OTEL_TRACES_SAMPLER one) once an exporter is attached
    (:attr:`exporting`); until then every span is dropped: nothing could be exported, so
    nothing is recorded."""

    def __init__(self, delegate: Sampler) -> None:
        self.delegate = delegate
        self.exporting = False

    def should_sample(
        self, parent_context: Any, trace_id: int, name: str, *args: Any, **kwargs: Any
    ) -> SamplingResult:
        if not self.exporting:
            parent = trace.get_current_span(parent_context).get_span_context()
            return SamplingResult(Decision.DROP, None, parent.trace_state if parent.is_valid else None)
        return self.delegate.should_sample(parent_context, trace_id, name, *args, **kwargs)

    def get_description(self) -> str:
        return f"ExportAware{{{self.delegate.get_description()}}}"


def configure_tracing(service_name: str = "mqstore", env: Mapping[str, str] | None = None) -> TracerProvider:
    """The process's TracerProvider, created on first call (later calls return it)."""
    global _provider
    with _lock:
        if _provider is not None:
            return _provider
        environ = os.environ if env is None else env
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        # The SDK read OTEL_TRACES_SAMPLER into provider.sampler; no tracer exists yet, so the
        # wrapper is what every tracer will use.
        sampler = ExportAwareSampler(provider.sampler)
        provider.sampler = sampler
        if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            sampler.exporting = True
        if environ.get("MQSTORE_TRACE_CONSOLE") == "1":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
            sampler.exporting = True
        trace.set_tracer_provider(provider)
        _provider = provider
        _configure_metrics(provider.resource, environ)
        return provider


class _ScrapedReader(PrometheusMetricReader):
    """The Prometheus exporter's reader (collected when prometheus_client's registry is
    scraped), keeping the data of its last collection for :func:`metrics_snapshot`. One reader
    for both: each reader a MeterProvider has costs every measurement ~2.5 us more."""

    last: MetricsData | None = None
    # Set while this thread collects for :meth:`snapshot` (a scrape on another thread still
    # hands its data on: collect() calls back on the thread that called it).
    _snapshotting = threading.local()

    def snapshot(self) -> MetricsData | None:
        """Collect now, for the caller only (a scrape would otherwise see this data twice)."""
        self._snapshotting.on = True
        try:
            self.collect()
        finally:
            self._snapshotting.on = False
        return self.last

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        self.last = metrics_data
        if not getattr(self._snapshotting, "on", False):
            super()._receive_metrics(metrics_data, timeout_millis, **kwargs)


def _configure_metrics(resource: Resource, environ: Mapping[str, str]) -> None:
    global _meter_provider, _metric_reader
    # A provider's readers are fixed when it is created: this one always, and it costs nothing
    # until something collects (a scrape of :func:`start_metrics_endpoint`, metrics_snapshot).
    _metric_reader = _ScrapedReader()
    readers: list[MetricReader] = [_metric_reader]
    if environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    _meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    metrics.set_meter_provider(_meter_provider)


def meter(name: str) -> metrics.Meter:
    """A meter for one service (``mqstore.commitlog``...)."""
    configure_tracing()
    assert _meter_provider is not None
    return _meter_provider.get_meter(name)


def metrics_snapshot() -> dict[str, list[tuple[dict[str, Any], float]]]:
    """Current metric values: {name: [(attributes, value), ...]} (sums and gauges: the value;
    histograms: the sum of recorded values)."""
    configure_tracing()
    assert _metric_reader is not None
    out: dict[str, list[tuple[dict[str, Any], float]]] = {}
    with _lock:
        data = _metric_reader.snapshot()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points = out.setdefault(m.name, [])
                for p in m.data.data_points:
                    value = getattr(p, "value", None)
                    if value is None:
                        value = getattr(p, "sum", 0.0)
                    points.append((dict(p.attributes or {}), float(value or 0)))
    return out


class MetricsEndpoint:
    """The process's Prometheus scrape endpoint: ``GET /metrics`` on ``address`` in the text
    exposition format (every mqstore.* instrument of this process, names in Prometheus form:
    ``mqstore.put.messages`` -> ``mqstore_put_messages_total``; plus prometheus_client's process
    metrics: CPU, memory, open files). Plain HTTP, no authentication: it names topics and
    consumer groups, so listen on an address only the scraper reaches."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        host, port = server.server_address[:2]
        self.address = f"{host if isinstance(host, str) else host.decode()}:{port}"

    def close(self) -> None:
        """Stop serving and release the port (waits for the server thread)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def start_metrics_endpoint(listen: str) -> MetricsEndpoint:
    """Serve the scrape endpoint on ``listen`` (host:port; port 0 picks a free one) from a
    daemon thread. Raises ValueError for a malformed address, OSError when it cannot bind."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"metrics listen address must be host:port, got {listen!r}")
    configure_tracing()
    server, thread = prometheus_client.start_http_server(int(port), host.strip("[]"))
    return MetricsEndpoint(server, thread)


def add_span_exporter(exporter: SpanExporter) -> None:
    """Send every span also to ``exporter``, synchronously (tests: InMemorySpanExporter); spans
    are sampled from now on (OTEL_TRACES_SAMPLER)."""
    provider = configure_tracing()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if isinstance(provider.sampler, ExportAwareSampler):
        provider.sampler.exporting = True


def shutdown_tracing() -> None:
    """Flush exporters (at process exit)."""
    if _provider is not None:
        _provider.shutdown()
    if _meter_provider is not None:
        _meter_provider.shutdown()


_NO_SPAN = contextlib.nullcontext(trace.INVALID_SPAN)


class GatedTracer:
    """A tracer that opens spans only while an exporter is attached (the sampler's
    :attr:`ExportAwareSampler.exporting`); without one, :meth:`start_as_current_span` hands
    back the invalid span at once (attributes and events on it are no-ops): no ids are drawn,
    no context is attached, and the request path pays nothing for tracing."""

    def __init__(self, inner: trace.Tracer, sampler: ExportAwareSampler) -> None:
        self.inner = inner
        self.sampler = sampler

    def start_as_current_span(self, name: str, **kwargs: Any) -> AbstractContextManager[trace.Span]:
        if not self.sampler.exporting:
            return _NO_SPAN
        return self.inner.start_as_current_span(name, **kwargs)


def tracer(name: str) -> GatedTracer:
    """A tracer for one service or library layer (``mqstore.gateway``, ``mqstore.commitlog``...)."""
    provider = configure_tracing()
    return GatedTracer(provider.get_tracer(name), _export_sampler(provider))


def _export_sampler(provider: TracerProvider) -> ExportAwareSampler:
    sampler = provider.sampler
    assert isinstance(sampler, ExportAwareSampler), "configure_tracing installs it"
    return sampler


# The stream that carries internal unary calls (services._common.mux): each call it carries gets
# its own client and server spans there; a span for the stream itself would last as long as
# the connection, and the interceptor cannot wrap a stream handler that writes (not yields).
_NOT_CARRIED_STREAM = filters.negate(filters.service_name("mqstore.v1.CallMux"))


def server_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """Per-RPC server spans (OpenTelemetry's interceptor, which also takes the caller's trace
    context from the metadata) for a server started while an exporter is attached; none
    otherwise. grpc.aio runs a server with any interceptor through a chain of coroutines and
    handler objects on every call: ~0.15 ms of a one-message Produce on this project's 2-core
    hosts, for spans nobody could see. An exporter attached to a running server does not add
    RPC spans to it (the OTEL_* variables attach theirs before any server starts)."""
    provider = configure_tracing()
    if not _export_sampler(provider).exporting:
        return []
    return [aio_server_interceptor(tracer_provider=provider, filter_=_NOT_CARRIED_STREAM)]


def client_interceptors() -> list[Any]:
    """Per-RPC client spans that inject the trace context into the call's metadata, for a
    channel opened while an exporter is attached (the OTEL_* variables attach theirs when the
    process configures tracing, before any channel opens); none otherwise. grpc.aio fixes a
    channel's interceptors when it is opened and runs every call through an extra task and
    wrapper objects when it has any: ~100 us of CPU a call (250 -> 350 us against a
    do-nothing server) for spans nobody could see."""
    provider = configure_tracing()
    if not _export_sampler(provider).exporting:
        return []
    return list(aio_client_interceptors(tracer_provider=provider, filter_=_NOT_CARRIED_STREAM))
