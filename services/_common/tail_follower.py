"""TailFollower: the reput of every topology (embedded and split). It follows a CommitLogPort's
Tail stream from its reput offset and applies the records to its dispatchers (ConsumeQueues or
IndexFiles), then reports the queues that grew (long polling).

Decoding and applying a large chunk run in a worker thread, so the service's event loop keeps
answering RPCs while a backlog is replayed; a chunk of up to one produce batch's worth (the
steady state: one append) is applied on the loop, which costs less than the hop. The stream reconnects with
backoff after the commitlog service goes away. When the log was cut under the follower — it is now
shorter than the reput offset (it lost an unflushed tail in a crash), or it reports
LogDivergedError for the generation the follower last read (a crash recovery or a returning master
cut bytes it had read, and the log may have grown past them since) — ``on_ahead(offset)`` drops
what was derived from bytes at or past ``offset`` and returns where to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

import grpc

from libstore import LogDivergedError, OffsetOutOfRangeError, ServiceNotAvailableError, StoreError
from libstore.aio_deadline import wait_within
from libstore.dispatch import CommitLogDispatcher, apply_chunk
from libstore.dispatch_request import DispatchRequest
from libstore.log_scanner import scan_buffer
from services._common import message_trace
from services._common.telemetry import tracer
from services.ports import CommitLogPort, TailChunk

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]

# Chunks up to this size are applied on the event loop (about 1.2 us a record: ~1.2 ms for 1,024,
# the most one Produce carries); larger ones, a backlog being replayed, on a worker thread, which
# lets the loop take the GIL back every switch interval (5 ms) meanwhile. Applying is Python code,
# which holds the GIL: on a worker it runs no sooner, and the hop and the GIL hand-overs cost more
# than the work for a batch (the in-process Produce + dispatch + index of batches of 64: 26.5 ->
# 21.7 us a message when the limit went from 16 records to 256; 2 clients x 4 batches of 256 in
# flight, whose appends often land together in one chunk: 61,070 -> 66,018 msgs/s, 17.7 -> 16.3
# server us a message, when it went from 256 records / 320 KiB to 1,024 / 1,280 KiB).
INLINE_BYTES = 1280 * 1024
INLINE_RECORDS = 1024


class TailFollower:
    """See module docstring. ``name`` labels logs and spans ("dispatch", "index")."""

    def __init__(
        self,
        name: str,
        port: CommitLogPort,
        dispatchers: Sequence[CommitLogDispatcher],
        reput_offset: int,
        *,
        on_arrival: Callable[[Mapping[QueueKey, int]], None] | None = None,
        on_ahead: Callable[[int], Awaitable[int]] | None = None,
        max_chunk_bytes: int = 1024 * 1024,
        log_id: str = "",
        generation: int = 0,
        linger_ms: int = 0,
    ) -> None:
        self.name = name
        self.port = port
        self.dispatchers = list(dispatchers)
        # (reput offset, log id, generation), replaced as one value: a checkpoint taken on
        # another thread never pairs an offset with the wrong generation.
        self.position = (reput_offset, log_id, generation)
        self.confirm_offset = reput_offset
        self.records_dispatched = 0
        self.applied_store_ms = 0  # store timestamp of the last record applied (0: none yet)
        self.on_arrival = on_arrival
        self.on_ahead = on_ahead
        self.max_chunk_bytes = max_chunk_bytes
        self.linger_ms = linger_ms  # the Tail stream's linger (CommitLogPort.tail)
        self.caught_up = asyncio.Event()
        # wait_for's callers: (offset to reach, future), resolved as the position passes them.
        # A list checked only when not empty: a Condition cost a lock and a notify per chunk.
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._tracer = tracer(f"mqstore.{name}")

    @property
    def reput_offset(self) -> int:
        return self.position[0]

    @property
    def log_id(self) -> str:
        return self.position[1]

    @property
    def generation(self) -> int:
        return self.position[2]

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name=f"{self.name}-tail")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run(self) -> None:
        delay = 0.05
        while True:
            try:
                async for chunk in self.port.tail(
                    self.reput_offset,
                    max_chunk_bytes=self.max_chunk_bytes,
                    decoded=True,
                    log_id=self.log_id,
                    generation=self.generation,
                    linger_ms=self.linger_ms,
                ):
                    await self._apply(chunk)
                    delay = 0.05
            except asyncio.CancelledError:
                raise
            except LogDivergedError as exc:
                if self.on_ahead is None:
                    raise
                resume = await self.on_ahead(exc.consistent_offset)
                log.warning(
                    "%s: the CommitLog was cut at %d since generation %d; dropped what was derived past "
                    "it, resuming at %d (generation %d)",
                    self.name,
                    exc.consistent_offset,
                    self.generation,
                    resume,
                    exc.generation,
                )
                self._move_to((resume, exc.log_id, exc.generation))
                continue
            except OffsetOutOfRangeError:
                offsets = await self.port.offsets()
                if self.on_ahead is None:
                    raise
                resume = await self.on_ahead(offsets.max_offset)
                log.warning(
                    "%s: the CommitLog ends at %d, before reput offset %d: cut back, resuming at %d",
                    self.name,
                    offsets.max_offset,
                    self.reput_offset,
                    resume,
                )
                self._move_to((resume, self.log_id, self.generation))
                continue
            except (ServiceNotAvailableError, grpc.RpcError) as exc:
                log.info("%s: CommitLog tail interrupted (%s); reconnecting", self.name, _short(exc))
            except StoreError as exc:
                log.error("%s: dispatch failed at %d: %s; retrying", self.name, self.reput_offset, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _apply(self, chunk: TailChunk) -> None:
        self.confirm_offset = chunk.confirm_offset
        if chunk.offset > self.reput_offset:
            log.warning(
                "%s: the CommitLog now starts at %d, past reput offset %d",
                self.name,
                chunk.offset,
                self.reput_offset,
            )
        if chunk.data or chunk.records:
            with self._tracer.start_as_current_span(f"{self.name}.dispatch") as span:
                small = len(chunk.data) <= INLINE_BYTES and len(chunk.records or ()) <= INLINE_RECORDS
                if small:  # a few records: cheaper here than a hop to a worker thread and back
                    records, arrived = self._decode_and_apply(chunk)
                else:
                    records, arrived = await asyncio.to_thread(self._decode_and_apply, chunk)
                count = len(records)
                if span.is_recording():  # links to the sends of the messages applied
                    span.set_attribute("mqstore.records", count)
                    span.set_attribute("mqstore.offset", chunk.offset)
                    for link in message_trace.links_to(r.trace_context for r in records):
                        span.add_link(link.context)
            self.records_dispatched += count
            if arrived and self.on_arrival is not None:
                self.on_arrival(arrived)
        if chunk.log_id:
            self._move_to((chunk.next_offset, chunk.log_id, chunk.generation))
        else:
            self._move_to((chunk.next_offset, self.log_id, self.generation))
        if self.reput_offset >= self.confirm_offset:
            self.caught_up.set()

    def _decode_and_apply(self, chunk: TailChunk) -> tuple[Sequence[DispatchRequest], dict[QueueKey, int]]:
        if chunk.records is not None:  # decoded by the append's validation, in this process
            records = chunk.records
        else:
            records, _, invalid = scan_buffer(chunk.data, chunk.offset)
            if invalid is not None:
                raise OffsetOutOfRangeError(
                    f"the tail chunk at {chunk.offset} holds bytes that are not records"
                )
        arrived = (
            apply_chunk(self.dispatchers, records, arrivals=self.on_arrival is not None) if records else {}
        )
        if records:
            self.applied_store_ms = records[-1].store_timestamp
        return records, arrived

    def lag(self, now_ms: int) -> tuple[int, int]:
        """How far behind the log this follower is: bytes between what it applied and what the
        log last confirmed to it, and ms (0 when caught up; else the time since the last record
        it applied was stored: an upper bound of the oldest unapplied record's wait)."""
        behind = max(0, self.confirm_offset - self.reput_offset)
        if not behind:
            return 0, 0
        return behind, max(0, now_ms - self.applied_store_ms) if self.applied_store_ms else 0

    def _move_to(self, position: tuple[int, str, int]) -> None:
        """Take ``position`` (reput offset, log id, generation) and wake the waiters it passed."""
        self.position = position
        if self._waiters:
            reached = position[0]
            waiting = []
            for offset, done in self._waiters:
                if reached < offset:
                    waiting.append((offset, done))
                elif not done.done():
                    done.set_result(None)
            self._waiters = waiting

    async def wait_for(self, offset: int, timeout_s: float) -> bool:
        """Wait until everything before ``offset`` is applied (True) or ``timeout_s`` passes."""
        if self.reput_offset >= offset:
            return True
        entry = (offset, asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        try:
            await wait_within(entry[1], timeout_s)
        except TimeoutError:
            return False
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)
        return True


def _short(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError):
        return f"{exc.code().name}"
    return str(exc)
