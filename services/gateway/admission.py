"""Push back on produce when the gateway cannot keep up (RocketMQ's "broker busy").

A RocketMQ broker refuses a send with SYSTEM_BUSY when it has waited in the send queue longer
than ``waitTimeMillsInSendQueue`` (200 ms) or when the put lock is stalled; clients back off
and send again. A gateway here has no send queue of its own: every call becomes a task on the
event loop at once, so an offered load above what the suite can serve would otherwise pile up
as tasks and buffered requests without bound, and each call's latency with it.

:class:`ProduceAdmission` admits a produce (own API Produce, RocketMQ 5 SendMessage) only when

* the event loop's lag (how late a timer set ``sample_interval_ms`` ahead runs: the time a
  ready call waits before it runs) has not passed ``waitTimeMillsInSendQueue`` in each of the
  last two samples, and
* the request bytes of the produce calls it holds (being appended, or waiting for the flush or
  the replica) plus this one stay within ``maxInflightProduceBytes``; one call is always
  admitted when none is held, whatever its size.

One stall alone (a collector pause, the process descheduled on a busy host) refuses nothing:
it is over by the time it is measured and leaves no backlog behind it, and RocketMQ's Python
client gives up on a TOO_MANY_REQUESTS send instead of backing off. A loop that stays behind
from one sample to the next is the backlog the push back is for.

Otherwise it raises :class:`~libstore.errors.SystemBusyError` before anything of the request
is written, so the client may send it again; the error carries a retry hint (milliseconds):
the lag measured, or :data:`BYTES_RETRY_MS` for the byte bound, within
[:data:`MIN_RETRY_MS`, :data:`MAX_RETRY_MS`]. The own API answers RESOURCE_EXHAUSTED with the
``grpc-retry-pushback-ms`` trailer and a ``google.rpc.RetryInfo``; the RocketMQ 5 protocol
answers TOO_MANY_REQUESTS, which its clients retry with their back-off policy.

Used from the event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from libstore.errors import SystemBusyError
from services.gateway.limits import GatewayLimits

MIN_RETRY_MS = 10
MAX_RETRY_MS = 1_000
BYTES_RETRY_MS = 50
SAMPLE_INTERVAL_MS = 20


class ProduceAdmission:
    """Admits produce calls or pushes back (module docstring). ``max_queue_wait_ms``:
    waitTimeMillsInSendQueue (ms); ``max_inflight_bytes``: maxInflightProduceBytes (bytes);
    ``sample_interval_ms``: how often the loop's lag is measured (ms)."""

    def __init__(
        self, max_queue_wait_ms: int, max_inflight_bytes: int, sample_interval_ms: int = SAMPLE_INTERVAL_MS
    ) -> None:
        if max_queue_wait_ms <= 0 or max_inflight_bytes <= 0 or sample_interval_ms <= 0:
            raise ValueError("admission bounds must be positive")
        self.max_queue_wait_ms = max_queue_wait_ms
        self.max_inflight_bytes = max_inflight_bytes
        self.sample_interval_ms = sample_interval_ms
        self.inflight_bytes = 0
        self.lag_ms = 0.0  # the last sample's lag (ms)
        self.previous_lag_ms = 0.0  # the one before it
        self.refused = 0
        self._sampler: asyncio.Task[None] | None = None

    def _ensure_sampler(self) -> None:
        if self._sampler is None or self._sampler.done():
            self._sampler = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.sample_interval_ms / 1000.0
        while True:
            due = loop.time() + interval
            await asyncio.sleep(interval)
            self.previous_lag_ms, self.lag_ms = self.lag_ms, max(0.0, (loop.time() - due) * 1000.0)

    @classmethod
    def of(cls, limits: GatewayLimits) -> ProduceAdmission:
        """The admission ``limits`` set (waitTimeMillsInSendQueue, maxInflightProduceBytes)."""
        return cls(limits.wait_time_mills_in_send_queue, limits.max_inflight_produce_bytes)

    async def close(self) -> None:
        """Stop measuring the loop's lag (the server is stopping)."""
        task, self._sampler = self._sampler, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @contextlib.contextmanager
    def admit(self, size: int) -> Iterator[None]:
        """Hold ``size`` request bytes while the body runs. Raises SystemBusyError (nothing
        held) when the loop stays behind or the bytes held would pass the bound (module
        docstring)."""
        self._ensure_sampler()
        lag = min(self.lag_ms, self.previous_lag_ms)
        if lag > self.max_queue_wait_ms:
            self.refused += 1
            hint = int(min(MAX_RETRY_MS, max(MIN_RETRY_MS, lag)))
            raise SystemBusyError(
                f"broker busy: calls wait {lag:.0f} ms before they run, more than "
                f"waitTimeMillsInSendQueue ({self.max_queue_wait_ms} ms); nothing was written, "
                f"retry after {hint} ms",
                retry_after_ms=hint,
            )
        held = self.inflight_bytes
        if held and held + size > self.max_inflight_bytes:
            self.refused += 1
            raise SystemBusyError(
                f"broker busy: {held} bytes of produce requests are in flight and this one "
                f"({size} bytes) would pass maxInflightProduceBytes ({self.max_inflight_bytes}); "
                f"nothing was written, retry after {BYTES_RETRY_MS} ms",
                retry_after_ms=BYTES_RETRY_MS,
            )
        self.inflight_bytes = held + size
        try:
            yield
        finally:
            self.inflight_bytes -= size
