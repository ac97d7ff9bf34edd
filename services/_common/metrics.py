"""The building blocks of the services' metrics (DESIGN "Observability"; exported by
services._common.telemetry: scraped by Prometheus, pushed by OTLP when configured).

The request path pays as little as it can: an OpenTelemetry SDK measurement costs ~5 us
(attributes hashed and cleaned, an aggregation per reader) and a put or pull made ~20 us of
server CPU dearer with a few of them. So message and byte counts are kept as plain ints per
attribute tuple (:class:`KeyedCounts`, a dict update) and handed to observable counters only
when something collects, and the request path's latency histograms (:class:`LatencyHistogram`)
are prometheus_client's (~0.8 us an observation): those are served on the scrape endpoint only,
not pushed over OTLP (an OpenTelemetry Collector reaches them with its prometheus receiver).
Instruments over many objects (every port of a process) are registered once per process
(:func:`register_once`) and read the live objects at collection.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar

import prometheus_client
from opentelemetry.metrics import CallbackOptions, Histogram, Observation

from services._common.telemetry import meter

# Upper bounds (ms) of latency histogram buckets: sub-millisecond puts and reads through
# SYNC_FLUSH waits and long timeouts.
LATENCY_BUCKETS_MS: Final = (
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
)  # fmt: skip

T = TypeVar("T")


class KeyedCounts:
    """Counts (messages, bytes) by a tuple of attribute values, e.g. ``("TopicA",)`` for the
    attribute names ``("topic",)``. :meth:`add` is a dict update (the request path, on one
    thread); :meth:`observations` may run on a collecting thread (a snapshot of the dict)."""

    __slots__ = ("counts", "names")

    def __init__(self, *names: str) -> None:
        self.names = names
        self.counts: dict[tuple[str, ...], int] = {}

    def add(self, key: tuple[str, ...], n: int) -> None:
        counts = self.counts
        counts[key] = counts.get(key, 0) + n

    def observations(self, extra: dict[str, str | int] | None = None) -> list[Observation]:
        """One observation per key seen so far (counters: totals since the start)."""
        names = self.names
        return [
            Observation(value, {**dict(zip(names, key, strict=True)), **(extra or {})})
            for key, value in list(self.counts.items())
        ]


def observer(
    live: Iterable[T], observe: Callable[[T], list[Observation]]
) -> Callable[[CallbackOptions], list[Observation]]:
    """An observable instrument's callback: ``observe`` of every object in ``live`` (a WeakSet
    of this process's ports) at collection time; an object that fails is left out."""

    def callback(_options: CallbackOptions) -> list[Observation]:
        out: list[Observation] = []
        for item in list(live):
            try:
                out.extend(observe(item))
            except Exception:  # a store shutting down while scraped: report what the others have
                continue
        return out

    return callback


_registered: set[str] = set()
_registered_lock = threading.Lock()


def register_once(name: str, register: Callable[[], None]) -> None:
    """Run ``register`` (creating observable instruments) once per process per ``name``."""
    with _registered_lock:
        if name in _registered:
            return
        _registered.add(name)
    register()


class LatencyHistogram:
    """A latency histogram in ms with :data:`LATENCY_BUCKETS_MS`, by the values of ``labels``,
    in prometheus_client's default registry (the scrape endpoint's): ``name`` is the
    Prometheus name, e.g. ``mqstore_put_latency_milliseconds`` (``_bucket``, ``_sum``,
    ``_count`` samples). One per process per name (:func:`latency_histogram`)."""

    def __init__(self, name: str, description: str, labels: tuple[str, ...]) -> None:
        self._histogram = prometheus_client.Histogram(name, description, labels, buckets=LATENCY_BUCKETS_MS)
        self._children: dict[tuple[str, ...], Any] = {}

    def record(self, ms: float, key: tuple[str, ...]) -> None:
        """One observation of ``ms`` under the label values ``key`` (in ``labels`` order)."""
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._histogram.labels(*key)
        child.observe(ms)


@functools.cache
def latency_histogram(name: str, description: str, *labels: str) -> LatencyHistogram:
    """The process's :class:`LatencyHistogram` called ``name`` (created on first use)."""
    return LatencyHistogram(name, description, labels)


@functools.cache
def wait_histogram(meter_name: str, name: str, description: str) -> Histogram:
    """An OpenTelemetry latency histogram in ms with :data:`LATENCY_BUCKETS_MS` (pushed over OTLP
    too), one per process per name: for waits off the common path (SYNC_MASTER)."""
    return meter(meter_name).create_histogram(
        name, unit="ms", description=description, explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_MS
    )
