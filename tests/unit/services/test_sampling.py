"""Tracing costs next to nothing without an exporter (services._common.telemetry): our tracers
open no span, servers start without the per-RPC span interceptor, other spans are dropped at
their start; once an exporter is attached, the standard OTEL_TRACES_SAMPLER decides."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN

from services._common.telemetry import (
    ExportAwareSampler,
    GatedTracer,
    configure_tracing,
    server_interceptors,
)


def _provider() -> tuple[TracerProvider, ExportAwareSampler, InMemorySpanExporter]:
    provider = TracerProvider()
    sampler = ExportAwareSampler(provider.sampler)  # what OTEL_TRACES_SAMPLER says
    provider.sampler = sampler  # type: ignore[misc]
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, sampler, exporter


def test_without_an_exporter_spans_are_dropped_but_keep_their_trace_ids() -> None:
    provider, sampler, exporter = _provider()
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("dropped") as span:
        assert not span.is_recording() and span.get_span_context().is_valid
        with tracer.start_as_current_span("child") as child:  # same trace, still dropped
            assert child.get_span_context().trace_id == span.get_span_context().trace_id
    sampler.exporting = True
    with tracer.start_as_current_span("kept") as span:
        assert span.is_recording()
    assert [s.name for s in exporter.get_finished_spans()] == ["kept"]


def test_once_exporting_the_standard_sampler_variable_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    provider, sampler, exporter = _provider()
    sampler.exporting = True
    with provider.get_tracer("t").start_as_current_span("off") as span:
        assert not span.is_recording()
    assert exporter.get_finished_spans() == ()


def test_our_tracers_open_no_span_until_an_exporter_is_attached() -> None:
    provider, sampler, exporter = _provider()
    gated = GatedTracer(provider.get_tracer("t"), sampler)
    with gated.start_as_current_span("skipped") as span:
        span.set_attribute("mqstore.records", 3)  # a no-op on the invalid span
        assert span is INVALID_SPAN and trace.get_current_span() is INVALID_SPAN
    sampler.exporting = True
    with gated.start_as_current_span("kept") as span:
        assert span.is_recording() and trace.get_current_span() is span
    assert [s.name for s in exporter.get_finished_spans()] == ["kept"]


def test_servers_get_the_rpc_span_interceptor_only_while_spans_are_exported() -> None:
    sampler = configure_tracing().sampler
    before = sampler.exporting  # type: ignore[attr-defined]
    try:
        sampler.exporting = False  # type: ignore[attr-defined]
        assert server_interceptors() == []
        sampler.exporting = True  # type: ignore[attr-defined]
        assert server_interceptors()
    finally:
        sampler.exporting = before  # type: ignore[attr-defined]
