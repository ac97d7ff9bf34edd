"""Tracing costs next to nothing without an exporter (services._common.telemetry): spans are
dropped at their start but still carry a trace id; once an exporter is attached, the standard
OTEL_TRACES_SAMPLER decides."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services._common.telemetry import ExportAwareSampler


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
