"""A message's trace: the producer's context travels in the message, as the OpenTelemetry
messaging semantic conventions describe ("context propagation": the creation context is injected
into the message), so everything that later handles the message can link back to its send.

The context is the W3C Trace Context ``traceparent`` header, kept as a message property of that
name (RocketMQ 5's clients carry the same text in the ``trace_context`` system property, which
the gateway maps to and from it). Producers put it there (services.client.Producer); dispatch and
index spans, the gateway's pull and receive spans and the Python consumer's receive span carry
span links to it. Only the OpenTelemetry API is used here: an application that configured no SDK
gets non-recording spans and no property is added.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from opentelemetry import trace
from opentelemetry.trace import Link, SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT: Final = "traceparent"  # the message property (W3C Trace Context header name)
MAX_LINKS: Final = 128  # links a span carries at most: a span for a large batch links a sample

# Attribute names of the OpenTelemetry messaging semantic conventions (RocketMQ's section).
SYSTEM: Final = "messaging.system"
DESTINATION: Final = "messaging.destination.name"
OPERATION: Final = "messaging.operation"
MESSAGE_ID: Final = "messaging.message.id"
BATCH_COUNT: Final = "messaging.batch.message_count"
CONSUMER_GROUP: Final = "messaging.consumer.group.name"
PARTITION: Final = "messaging.destination.partition.id"  # the queue id
TAG: Final = "messaging.rocketmq.message.tag"
KEYS: Final = "messaging.rocketmq.message.keys"
QUEUE_OFFSET: Final = "messaging.rocketmq.queue.offset"
SYSTEM_NAME: Final = "rocketmq"  # RocketMQ's record layout and protocol

_PROPAGATOR = TraceContextTextMapPropagator()


def current_traceparent() -> str | None:
    """The ``traceparent`` of the current span when it is recorded (sampled), else None."""
    span = trace.get_current_span()
    if not span.is_recording():
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get(TRACEPARENT)


def span_context_of(traceparent: str | None) -> SpanContext | None:
    """The remote span context a ``traceparent`` names; None when absent or malformed."""
    if not traceparent:
        return None
    ctx = _PROPAGATOR.extract({TRACEPARENT: traceparent})
    span_context = trace.get_current_span(ctx).get_span_context()
    return span_context if span_context.is_valid else None


def links_to(traceparents: Iterable[str | None], limit: int = MAX_LINKS) -> list[Link]:
    """Span links to the distinct contexts among ``traceparents`` (at most ``limit``)."""
    links: list[Link] = []
    seen: set[str] = set()
    for text in traceparents:
        if not text or text in seen:
            continue
        seen.add(text)
        span_context = span_context_of(text)
        if span_context is not None:
            links.append(Link(span_context))
            if len(links) >= limit:
                break
    return links


def traceparent_of(properties: Mapping[str, str] | None) -> str | None:
    """The ``traceparent`` property of a message's properties, if any."""
    return properties.get(TRACEPARENT) if properties else None
