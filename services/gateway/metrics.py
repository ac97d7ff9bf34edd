"""The gateway's metrics, per process: what consumers got, per topic and consumer group, through
both protocols (Pull, PullMany, RocketMQ 5's ReceiveMessage): ``mqstore.get.messages`` and
``mqstore.get.bytes`` (records delivered) and ``mqstore_get_latency_milliseconds`` (per topic,
scrape only: from the
moment the dispatch service answered which messages to the moment they were read and the answer
built; a long poll's hold is not in it, as it is no cost of the read).
"""

from __future__ import annotations

import functools
import time

from services._common.metrics import KeyedCounts, latency_histogram, observer
from services._common.telemetry import meter

METER = "mqstore.gateway"


class GetMetrics:
    """What the process's gateway reads add to its metrics (see module docstring); one per
    process (:func:`get_metrics`), shared by both protocols' servicers."""

    def __init__(self) -> None:
        self.messages = KeyedCounts("topic", "group")
        self.bytes = KeyedCounts("topic", "group")
        self._latency = latency_histogram(
            "mqstore_get_latency_milliseconds", "time to read the messages of a pull (scrape only)", "topic"
        )

    def record(self, topic: str, group: str, messages: int, nbytes: int, started: float) -> None:
        """A read for ``group`` in ``topic`` delivered ``messages`` records of ``nbytes`` bytes;
        ``started``: ``time.perf_counter()`` when the dispatch service answered."""
        self._latency.record((time.perf_counter() - started) * 1000.0, (topic,))
        if messages:
            key = (topic, group)
            self.messages.add(key, messages)
            self.bytes.add(key, nbytes)


@functools.cache
def get_metrics() -> GetMetrics:
    """The process's GetMetrics, its observable counters registered on first use."""
    metrics = GetMetrics()
    m = meter(METER)
    m.create_observable_counter(
        "mqstore.get.messages",
        [observer([metrics], lambda g: g.messages.observations())],
        description="messages delivered to consumers",
    )
    m.create_observable_counter(
        "mqstore.get.bytes",
        [observer([metrics], lambda g: g.bytes.observations())],
        unit="By",
        description="bytes of messages delivered to consumers",
    )
    return metrics
