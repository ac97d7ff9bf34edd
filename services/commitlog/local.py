"""LocalCommitLog: the CommitLogPort over a libstore CommitLog in this process.

Runs on the service's event loop. An append encodes and copies on the loop (one lock per batch,
no await in between, so de-duplication needs no lock of its own), then awaits, without blocking
the loop, the group commit (SYNC_FLUSH) and the slaves' acknowledgement (SYNC_MASTER) together;
the first non-OK status wins (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE).
The tail stream reads whole records up to the confirm offset (flushed under SYNC_FLUSH, held by
the slaves under SYNC_MASTER) and sleeps until that offset moves (ConfirmRelay), so consumers
never see bytes a crash or a master loss could erase; it fails with LogDivergedError when the
log was cut under a follower (libstore.log_generation).

Bounds (the store's config): client-encoded record batches carry at most
``maxMessagesPerRequest`` records in at most ``maxRequestBytes``, and are validated on a worker
thread when larger than ``offloadValidationBytes`` (the loop takes turns with it); a read
never returns more than the largest record for a range, and one through the Read RPC asks for
at most ``maxReadRangesPerCall`` ranges and returns at most ``maxReadBytesPerCall`` bytes.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from typing import TypeVar

from libstore import (
    CommitLog,
    InvalidArgumentError,
    LogDivergedError,
    Message,
    MessageConst,
    NotMasterError,
    OffsetOutOfRangeError,
    PutMessageResults,
    PutMessageStatus,
    TopicConfig,
)
from libstore.aio_deadline import wait_within
from libstore.commit_log import AppendResult
from libstore.commit_log_cleaner import used_share
from libstore.dispatch_request import DispatchRequest
from libstore.durability import is_transient_message
from libstore.log_scanner import scan_buffer
from libstore.message import MessageFields, waits_for_store
from libstore.message_id import encode_host
from libstore.record_codec import decode_record
from libstore.record_encoder import EncodedBatch
from libstore.scheduled_message import hold_all_scheduled
from services._common.telemetry import tracer
from services.commitlog import metrics
from services.commitlog.confirm_relay import ConfirmRelay
from services.commitlog.decoded_batches import DecodedBatches
from services.commitlog.dedup_window import DedupWindow, Placed, window_keys
from services.ports import LogOffsets, TailChunk

DEFAULT_CHUNK_BYTES = 1024 * 1024
MAX_TAIL_LINGER_MS = 10_000  # a Tail stream's longest linger (TailRequest.linger_ms)
_STATUS_ATTRIBUTES = {status: {"status": status.name} for status in PutMessageStatus}
DECODED_BATCHES_KEPT = 1024
# ... and at most this many records among them: each kept request is an object the garbage
# collector walks on every full collection, so the cache stays small (followers in the same
# process take a batch within milliseconds; one that falls behind reads the log).
DECODED_RECORDS_KEPT = 16_384
DECODED_CHUNKS_KEPT = 32  # up to 32 MiB of log, decoded: what two followers catching up share
# Message-form batches just written, as bytes, for the first in-process follower to decode.
WRITTEN_BATCHES_KEPT = 256
WRITTEN_BYTES_KEPT = 4 * 1024 * 1024
INLINE_DECODE_BYTES = 16 * 1024  # smaller chunks are decoded on the loop, larger on a worker
DEFAULT_HEARTBEAT_MS = 1000
_V = TypeVar("_V")


class LocalCommitLog:
    """CommitLogPort over ``log``; ``dedup`` (optional) catches retried batches by UNIQ_KEY."""

    def __init__(self, log: CommitLog, dedup: DedupWindow | None = None) -> None:
        self.log = log
        self.dedup = dedup
        self._tracer = tracer("mqstore.commitlog")
        # Recently appended client-encoded batches, decoded by their validation, with their
        # final offsets. In-process followers take these instead of decoding the same bytes
        # again; an older offset reads the log as usual.
        self._decoded = DecodedBatches(DECODED_BATCHES_KEPT, DECODED_RECORDS_KEPT)
        # Chunks read back from the log and decoded for a follower: start -> (end, requests).
        self._chunks: OrderedDict[int, tuple[int, list[DispatchRequest]]] = OrderedDict()
        self._decoding: dict[int, asyncio.Future[None]] = {}  # chunks being decoded, by start
        # Message-form batches just appended, as the log holds them: start -> (end, bytes).
        self._written: OrderedDict[int, tuple[int, bytes]] = OrderedDict()
        self._written_bytes = 0
        # Where each in-process follower's stream stands (its next offset): what all of them
        # have passed leaves the caches above at once. Held until the caches' bounds dropped
        # them, the requests were young objects that every young garbage collection walked
        # (tens of thousands at 20,000 msgs/s: ~20 ms pauses, the produce p99).
        self._readers: dict[object, int] = {}
        self._relay: ConfirmRelay | None = None
        self.put_metrics = metrics.track(self)
        # With an election (services.commitlog.election): True while this store may take and
        # acknowledge puts (it leads its group and its lease surely holds). None: always.
        self.fence: Callable[[], bool] | None = None

    @property
    def relay(self) -> ConfirmRelay:
        """The log's confirm-offset moves on this event loop (created on first use, on the loop)."""
        relay = self._relay
        if relay is None:
            relay = self._relay = ConfirmRelay(self.log)
        return relay

    def close(self) -> None:
        """Stop listening to the log; puts still waiting for the flush are answered (see
        ConfirmRelay.close)."""
        if self._relay is not None:
            self._relay.close()
            self._relay = None

    def forget_recent(self) -> None:
        """Drop the de-duplication window and decoded batches (the log was cut, or this store
        changed role): what they point at may no longer be in the log."""
        self._decoded.clear()
        self._chunks.clear()
        self._forget_written()
        if self.dedup is not None:
            self.dedup.clear()

    # -- append ---------------------------------------------------------------------------------
    def _check_fence(self) -> None:
        """Refuse a put while the fence is down (NotMasterError: the client looks for the master)."""
        if self.fence is not None and not self.fence():
            raise NotMasterError("this store does not hold its group's leadership lease; find the master")

    def _fence_results(self, results: PutMessageResults) -> None:
        """After the waits: a store whose fence went down meanwhile (its lease ran out, it was
        paused past it) acknowledges nothing, WAIT=false messages included: another member may
        be the master by now, without them."""
        if self.fence is not None and results.appended and not self.fence():
            results.unwaited = frozenset()
            results.status = PutMessageStatus.SLAVE_NOT_AVAILABLE

    async def append(
        self, messages: Sequence[MessageFields], *, expected_epoch: int = 0
    ) -> PutMessageResults:
        started = time.perf_counter()
        self._check_fence()
        topics = [m.topic for m in messages]
        with self._tracer.start_as_current_span("commitlog.append") as span:
            span.set_attribute("mqstore.messages", len(messages))
            # Scheduled messages go to the timer topic here, before the de-duplication window
            # keys them by the topic written: the copy the timer delivers later under the real
            # topic and the same UNIQ_KEY is not taken for a replay.
            now = time.time_ns() // 1_000_000
            messages = hold_all_scheduled(messages, now)
            fresh, placed = self._split_replays(messages)
            appended = (
                self.log.append_messages(
                    fresh, place_unassigned=True, hold_scheduled=False, expected_epoch=expected_epoch
                )
                if fresh
                else None
            )
            if appended is not None:
                self._keep_encoded(appended)
                self._remember(fresh, appended.results)
            results = self._merge(messages, appended.results if appended else None, placed)
            if placed:  # replays take their WAIT from the message sent again, as a first send would
                transient = self.log.topic_config.transient_topics
                results.unwaited = frozenset(
                    i
                    for i, m in enumerate(messages)
                    if (m.properties and not waits_for_store(m.properties.get(MessageConst.WAIT)))
                    or is_transient_message(m.topic, m.properties, transient)
                )
            try:
                await self._wait_durable(results)
                self._fence_results(results)
            finally:  # appended: counted even when the caller gives up waiting
                self.put_metrics.record(topics, results, started)
            span.set_attribute("mqstore.status", results.status.name)
        return results

    async def append_records(self, raw: bytes, born_host: str = "") -> PutMessageResults:
        """Append client-encoded records (see RecordEncoder.adopt_records): validated here, CRC
        included; records whose UNIQ_KEY is in the de-duplication window get their first result."""
        started = time.perf_counter()
        self._check_fence()
        log = self.log
        cfg = log.config
        if len(raw) > cfg.max_request_bytes:
            raise InvalidArgumentError(
                f"a request carries at most {cfg.max_request_bytes} bytes (maxRequestBytes), got {len(raw)}"
            )
        with self._tracer.start_as_current_span("commitlog.append") as span:
            validate = functools.partial(
                log.adopt_records, raw, _born_host_bytes(born_host), max_records=cfg.max_messages_per_request
            )
            # Validating (CRC, every field, the records' Python objects) holds the GIL wherever it
            # runs, so a worker thread does it no sooner: it only lets the loop take the GIL back
            # every switch interval (5 ms) while a batch of many MiB is checked. A batch under
            # offloadValidationBytes (2 MiB, at most maxMessagesPerRequest records) takes ~0.4-3
            # ms here, and on a worker the hop and the GIL hand-overs cost more than they spare
            # the loop: 2 clients x 4 batches of 256 in flight (~290 KiB each, interleaved A/B, 4
            # rounds) went from 63,036 to 75,269 msgs/s and from 16.9 to 14.4 server us a message
            # when they stopped crossing (the limit was 256 KiB). Offsets are assigned below, on
            # the loop, under one lock.
            batch = (
                await asyncio.to_thread(validate) if len(raw) > cfg.offload_validation_bytes else validate()
            )
            if batch.scheduled:
                # A delay or timer property (seen while validating): take the message path,
                # which holds scheduled messages in the timer topic. Rare, so decoding is fine.
                return await self.append(_messages_of(batch))
            n = len(batch.sizes)
            span.set_attribute("mqstore.messages", n)
            dedup = self.dedup
            # The window's keys are built once for the lookup and the put (a batch's n strings).
            keys = window_keys(batch.topics, batch.uniq_keys) if dedup is not None and n > 1 else None
            placed = dedup.get_many(batch.topics, batch.uniq_keys, keys) if dedup is not None else {}
            if placed:
                fresh = [i for i in range(n) if i not in placed]
                fresh_batch = batch.subset(fresh)
                keys = None if keys is None else [keys[i] for i in fresh]
            else:
                fresh_batch = batch
            appended = log.append_batch(fresh_batch) if fresh_batch.sizes else None
            if appended is not None:
                self._keep_decoded(fresh_batch, appended.results)
            if appended is not None and dedup is not None:
                res = appended.results
                dedup.put_many(
                    fresh_batch.topics,
                    fresh_batch.uniq_keys,
                    res.phy_offsets[: res.appended],
                    res.sizes,
                    res.queue_offsets,
                    res.store_timestamp,
                    keys,
                )
            results = self._merge(range(n), appended.results if appended else None, placed)
            if batch.no_wait:  # replays included: the batch's indexes are the results'
                results.unwaited = frozenset(batch.no_wait)
            try:
                await self._wait_durable(results)
                self._fence_results(results)
            finally:
                self.put_metrics.record(batch.topics, results, started)
            span.set_attribute("mqstore.status", results.status.name)
        return results

    async def _decode_chunk(self, data: bytes, offset: int, next_offset: int) -> list[DispatchRequest] | None:
        """The records of a chunk read from the log, decoded once for every in-process follower
        (dispatch and index read the same chunks while catching up): kept among the last
        DECODED_CHUNKS_KEPT. None when the bytes are not whole records (and maybe a closing blank
        END record): the follower then gets the raw bytes and reports them."""
        if len(data) > INLINE_DECODE_BYTES:
            done = asyncio.get_running_loop().create_future()
            self._decoding[offset] = done
            try:
                records, scanned_to, invalid = await asyncio.to_thread(scan_buffer, data, offset)
            finally:
                del self._decoding[offset]
                done.set_result(None)
        else:
            records, scanned_to, invalid = scan_buffer(data, offset)
        if invalid is not None or scanned_to != offset + len(data):  # all of it: records, a blank
            return None
        self._chunks[offset] = (next_offset, records)
        while len(self._chunks) > DECODED_CHUNKS_KEPT:
            self._chunks.popitem(last=False)
        return records

    def _keep_decoded(self, batch: EncodedBatch, results: PutMessageResults) -> None:
        n = results.appended
        if not n:
            return
        requests = batch.requests[:n]
        ts = results.store_timestamp
        for req, phy, qoff in zip(requests, results.phy_offsets, results.queue_offsets, strict=False):
            req.commit_log_offset = phy
            req.consume_queue_offset = qoff
            req.store_timestamp = ts
        end = results.phy_offsets[n - 1] + results.sizes[n - 1]
        self._decoded.keep(results.phy_offsets[0], end, requests)

    def _keep_encoded(self, appended: AppendResult) -> None:
        """Keep the bytes of a message-form batch just appended (its encoder's buffer: what the
        log now holds, offsets filled in) for the in-process followers: the first to reach it
        decodes these (:meth:`tail`) instead of reading the log back, whose freshly written
        pages cost ~13 µs a record on a first read against ~5 µs on a second. Not when no
        follower reads in this process (a commitlog service on its own), nor for a batch whose
        records went to two segments."""
        batch, results = appended.batch, appended.results
        n = results.appended
        if batch is None or not n or not self._readers:
            return
        positions = batch.positions
        start = results.phy_offsets[0]
        size = positions[n] - positions[0]
        if results.phy_offsets[n - 1] - start != positions[n - 1] - positions[0]:
            return  # rolled to a new segment midway: a blank lies between two of the records
        if size > WRITTEN_BYTES_KEPT:
            return
        written = self._written
        if written and start < next(reversed(written.values()))[0]:
            self._forget_written()  # the log was cut and written again
        written[start] = (start + size, bytes(batch.buf[positions[0] : positions[n]]))
        self._written_bytes += size
        while len(written) > WRITTEN_BATCHES_KEPT or self._written_bytes > WRITTEN_BYTES_KEPT:
            _, (_, data) = written.popitem(last=False)
            self._written_bytes -= len(data)

    def _forget_written(self) -> None:
        self._written.clear()
        self._written_bytes = 0

    def _split_replays(
        self, messages: Sequence[MessageFields]
    ) -> tuple[list[MessageFields], dict[int, Placed]]:
        dedup = self.dedup
        if dedup is None:
            return list(messages), {}
        fresh: list[MessageFields] = []
        placed: dict[int, Placed] = {}
        for i, m in enumerate(messages):
            uniq = m.properties.get(MessageConst.UNIQ_KEY) if m.properties else None
            hit = dedup.get(m.topic, uniq) if uniq else None
            if hit is None:
                fresh.append(m)
            else:
                placed[i] = hit
        return fresh, placed

    def _remember(self, fresh: Sequence[MessageFields], results: PutMessageResults) -> None:
        if self.dedup is None:
            return
        ts = results.store_timestamp
        for i in range(results.appended):
            m = fresh[i]
            uniq = m.properties.get(MessageConst.UNIQ_KEY) if m.properties else None
            if uniq:
                self.dedup.put(
                    m.topic,
                    uniq,
                    Placed(results.phy_offsets[i], results.sizes[i], results.queue_offsets[i], ts),
                )

    def _merge(
        self, messages: Sequence[object], fresh: PutMessageResults | None, placed: dict[int, Placed]
    ) -> PutMessageResults:
        """Results in message order: replays from the window, the others from the append."""
        if not placed:
            return fresh if fresh is not None else PutMessageResults(0)
        phys: list[int] = []
        sizes: list[int] = []
        qoffs: list[int] = []
        failed = PutMessageStatus.UNKNOWN_ERROR
        k = 0  # index into the fresh results
        for i in range(len(messages)):
            hit = placed.get(i)
            if hit is None:
                assert fresh is not None
                if k >= fresh.appended:  # this one failed: so is everything after it, as reported
                    failed = fresh.failed_status
                    break
                hit = Placed(
                    fresh.phy_offsets[k], fresh.sizes[k], fresh.queue_offsets[k], fresh.store_timestamp
                )
                k += 1
            phys.append(hit.phy_offset)
            sizes.append(hit.size)
            qoffs.append(hit.queue_offset)
        return PutMessageResults(
            len(messages),
            phy_offsets=phys,
            sizes=sizes,
            queue_offsets=qoffs,
            store_timestamp=fresh.store_timestamp if fresh is not None else 0,
            store_host=self.log.store_host,
            failed_status=failed,
        )

    async def _wait_durable(self, results: PutMessageResults) -> None:
        """Wait until every appended or replayed message of ``results`` that waits for the store
        (not in ``unwaited``) holds as the flush (SYNC_FLUSH) and replication (SYNC_MASTER)
        policies say, both waits run together, and set ``results.status`` to the outcome (a
        non-OK wins); with none waiting, only wake the group commit. One coroutine: under
        ASYNC_FLUSH on an ASYNC_MASTER it returns without awaiting anything."""
        end = results.durable_end()
        log = self.log
        relay = self.relay
        if end is None:
            if results.appended:
                relay.request_flush(results.next_offset)
            return
        target = max(end, 0)
        replica = log.submit_replica_request(target)
        flush = relay.flushed(target) if relay.request_flush(target) else None
        if flush is None and replica is None:
            return
        if replica is None:
            assert flush is not None
            results.status = await self._wait_flush(flush)
        elif flush is None:
            results.status = await self._wait_replica(replica)
        else:
            statuses = await asyncio.gather(self._wait_flush(flush), self._wait_replica(replica))
            results.status = next(
                (s for s in statuses if s is not PutMessageStatus.PUT_OK), PutMessageStatus.PUT_OK
            )

    async def _wait_flush(self, flushed: asyncio.Future[PutMessageStatus]) -> PutMessageStatus:
        """Await ``flushed`` (ConfirmRelay.flushed) for at most ``syncFlushTimeout``."""
        with self._tracer.start_as_current_span("commitlog.flush_wait"):
            started = time.perf_counter()
            if flushed.done():
                status = flushed.result()
            else:
                try:
                    async with asyncio.timeout(self.log.config.sync_flush_timeout / 1000.0):
                        status = await flushed
                except TimeoutError:
                    status = PutMessageStatus.FLUSH_DISK_TIMEOUT
            waited = (time.perf_counter() - started) * 1000.0
            self.put_metrics.flush_wait.record(waited, (status.name,))
            return status

    async def _wait_replica(self, future: Future[PutMessageStatus]) -> PutMessageStatus:
        with self._tracer.start_as_current_span("commitlog.replica_wait") as span:
            started = time.monotonic()
            try:
                if future.done():
                    status = future.result()
                else:
                    status = await wait_within(
                        asyncio.wrap_future(future), self.log.config.slave_timeout / 1000.0
                    )
            except TimeoutError:
                status = PutMessageStatus.FLUSH_SLAVE_TIMEOUT
            waited = (time.monotonic() - started) * 1000.0
            self.put_metrics.sync_master_wait.record(waited, _STATUS_ATTRIBUTES[status])
            span.set_attribute("mqstore.status", status.name)
            span.set_attribute("mqstore.replicated_offset", self.log.ha_service.replicated_offset)
            return status

    # -- read -----------------------------------------------------------------------------------
    async def read(self, ranges: Sequence[tuple[int, int]], *, bounded: bool = False) -> list[bytes | None]:
        """The records at ``ranges`` (see CommitLog.read_many); a range never reads more than the
        largest record. ``bounded`` (the Read RPC: ranges a remote caller chose) also raises
        InvalidArgumentError for more than ``maxReadRangesPerCall`` ranges or records past
        ``maxReadBytesPerCall`` bytes; in-process callers ask for what they were bounded to."""
        with self._tracer.start_as_current_span("commitlog.read") as span:
            span.set_attribute("mqstore.ranges", len(ranges))
            return self.log.read_many(ranges, **self._read_bounds(len(ranges), bounded))

    async def read_framed(
        self, ranges: Sequence[tuple[int, int]], tag: int, *, bounded: bool = False
    ) -> bytes:
        """:meth:`read`'s records framed as a protobuf ``repeated bytes`` field with the one-byte
        ``tag`` (CommitLog.read_many_framed: copied once, out of the mapping), under the same
        bounds."""
        with self._tracer.start_as_current_span("commitlog.read") as span:
            span.set_attribute("mqstore.ranges", len(ranges))
            return self.log.read_many_framed(ranges, tag, **self._read_bounds(len(ranges), bounded))

    def _read_bounds(self, count: int, bounded: bool) -> dict[str, int]:
        """A read's keyword bounds; InvalidArgumentError for a ``bounded`` one of more than
        ``maxReadRangesPerCall`` ranges."""
        cfg = self.log.config
        if bounded and count > cfg.max_read_ranges_per_call:
            raise InvalidArgumentError(
                f"a read asks for at most {cfg.max_read_ranges_per_call} ranges (maxReadRangesPerCall), "
                f"got {count}"
            )
        return {
            "max_bytes": cfg.max_read_bytes_per_call if bounded else 0,
            "max_record_size": cfg.max_record_size,
        }

    # -- tail -----------------------------------------------------------------------------------
    async def tail(
        self,
        from_offset: int,
        *,
        max_chunk_bytes: int = 0,
        heartbeat_ms: int = 0,
        decoded: bool = False,
        log_id: str = "",
        generation: int = 0,
        linger_ms: int = 0,
    ) -> AsyncIterator[TailChunk]:
        """Chunks of whole records from ``from_offset`` (a record boundary), forever. With
        ``decoded`` (in-process followers) chunks come as decoded requests (``records``, no
        bytes): batches appended as client-encoded records as their validation decoded them,
        while they are among the last DECODED_BATCHES_KEPT (from the record at the follower's
        offset on, consecutive batches joined up to ``max_chunk_bytes``); other bytes decoded
        here once and shared by the followers that read the same chunk (:meth:`_decode_chunk`),
        a chunk ending where the next kept batch starts. With ``linger_ms`` (0..MAX_TAIL_LINGER_MS),
        a chunk that would hold less than ``max_chunk_bytes`` waits that long first, so the
        records confirmed meanwhile join it.

        Raises LogDivergedError when the log was cut since the caller's ``(log_id,
        generation)`` (at the start, or later while streaming), OffsetOutOfRangeError when
        ``from_offset`` is past the log's end (the caller's derived state is ahead of this log:
        it must cut back to the end and resume there).
        """
        log = self.log
        gens = log.generation
        assert gens is not None
        max_bytes = max_chunk_bytes or DEFAULT_CHUNK_BYTES
        heartbeat_s = (heartbeat_ms or DEFAULT_HEARTBEAT_MS) / 1000.0
        linger_s = min(max(linger_ms, 0), MAX_TAIL_LINGER_MS) / 1000.0
        _check_divergence(gens.log_id, gens.generation, log_id, generation, gens.divergence_point)
        stream_gen = gens.generation
        if from_offset > log.max_offset:
            raise OffsetOutOfRangeError(
                f"tail from {from_offset} is past the CommitLog's end {log.max_offset}"
            )
        loop = asyncio.get_running_loop()
        moved = asyncio.Event()
        relay = self.relay

        # The heartbeat: one timer per idle period, not one per wait. It is armed for
        # ``beat_at`` (``heartbeat_s`` after the stream last yielded) and, when it fires while
        # chunks kept the stream busy, re-armed for the new ``beat_at``. Arming a timeout around
        # every wait cost two timer-heap operations per append and follower.
        beat_at = loop.time() + heartbeat_s
        beat_fired = False

        def on_beat() -> None:
            nonlocal beat_fired
            beat_fired = True
            moved.set()

        beat = loop.call_at(beat_at, on_beat)
        relay.subscribe(moved.set)
        reader = object()
        try:
            offset = max(from_offset, log.min_offset)
            if decoded:
                self._readers[reader] = offset
            lid = gens.log_id
            lingered = False  # the chunk about to be read has waited linger_s already
            while True:
                moved.clear()
                if gens.generation != stream_gen:
                    self._decoded.clear()
                    self._chunks.clear()
                    self._forget_written()
                    _check_divergence(lid, gens.generation, lid, stream_gen, gens.divergence_point)
                    stream_gen = gens.generation
                confirm = log.confirm_offset
                if offset < confirm and linger_s and not lingered and confirm - offset < max_bytes:
                    lingered = True
                    await asyncio.sleep(linger_s)
                    continue
                lingered = False
                if offset < confirm:
                    hit = (
                        (self._decoded.take(offset, confirm, max_bytes) or self._chunks.get(offset))
                        if decoded
                        else None
                    )
                    if hit is not None and hit[0] <= confirm:
                        beat_at = loop.time() + heartbeat_s
                        yield TailChunk(offset, b"", hit[0], confirm, log.min_offset, hit[1], lid, stream_gen)
                        offset = hit[0]
                        self._passed(reader, offset)
                        continue
                    pending = self._decoding.get(offset) if decoded else None
                    if pending is not None:  # another follower is decoding this chunk: share it
                        await asyncio.shield(pending)
                        continue
                    limit = confirm
                    if decoded:  # stop at the next kept batch: from there on, no decoding
                        following = self._decoded.next_start(offset)
                        if following is not None:
                            limit = min(limit, following)
                    written = self._written.get(offset) if decoded else None
                    try:
                        if written is not None and written[0] <= limit and len(written[1]) <= max_bytes:
                            next_offset, data = written
                        else:
                            data, next_offset = log.read_chunk(offset, limit, max_bytes)
                    except OffsetOutOfRangeError:
                        if offset >= log.min_offset:
                            raise
                        offset = log.min_offset  # retention deleted it while this follower lagged
                        continue
                    records = await self._decode_chunk(data, offset, next_offset) if decoded else None
                    raw = data if records is None else b""
                    beat_at = loop.time() + heartbeat_s
                    yield TailChunk(
                        offset, raw, next_offset, confirm, log.min_offset, records, lid, stream_gen
                    )
                    offset = next_offset
                    if decoded:
                        self._passed(reader, offset)
                    continue
                if beat_fired:
                    beat_fired = False
                    idle = loop.time() >= beat_at  # nothing yielded for heartbeat_s
                    if idle:
                        beat_at = loop.time() + heartbeat_s
                    beat = loop.call_at(beat_at, on_beat)
                    if idle:  # say where the log stands
                        yield TailChunk(offset, b"", offset, confirm, log.min_offset, None, lid, stream_gen)
                        continue
                await moved.wait()
        finally:
            beat.cancel()
            relay.unsubscribe(moved.set)
            self._readers.pop(reader, None)
            if not self._readers:  # no in-process follower left to take them
                self._forget_written()

    def _passed(self, reader: object, offset: int) -> None:
        """``reader`` (an in-process follower's stream) now stands at ``offset``: drop the
        decoded batches and chunks that every such reader has passed."""
        readers = self._readers
        readers[reader] = offset
        low = min(readers.values())
        self._decoded.drop_before(low)
        _drop_passed(self._chunks, low)
        for _, data in _drop_passed(self._written, low):
            self._written_bytes -= len(data)

    # -- offsets and topics ---------------------------------------------------------------------
    async def offsets(self) -> LogOffsets:
        log = self.log
        cfg = log.config
        disk = shutil.disk_usage(cfg.commit_log_dir)
        quarantine = log.quarantine.summary()
        epochs = log.ha_state.epochs
        cleaner = log.cleaner
        last = cleaner.last_round if cleaner is not None else None
        return LogOffsets(
            log.min_offset,
            log.max_offset,
            log.confirm_offset,
            log.flushed_offset,
            cfg.flush_disk_type.value,
            log.broker_role.value,
            cfg.mapped_file_size_commit_log,
            disk.free,
            disk.total,
            log.generation.log_id,
            log.generation.generation,
            log.ha_state.last_epoch,
            cfg.broker_name,
            cfg.broker_id,
            str(quarantine.path),
            quarantine.files,
            quarantine.bytes,
            epochs[-1].start_offset if epochs else 0,
            used_share(disk),
            log.disk_full,
            last.at_ms if last is not None else 0,
            cleaner.deleted_files if cleaner is not None else 0,
            cleaner.deleted_bytes if cleaner is not None else 0,
        )

    async def upsert_topic(self, config: TopicConfig) -> TopicConfig:
        return self.log.topic_config.create_or_update(config)

    async def get_topic(self, topic: str, *, create: bool = False) -> TopicConfig | None:
        topics = self.log.topic_config
        if create and topics.get(topic) is None:
            topics.write_queue_nums(topic)  # auto-creates, or raises TopicNotFoundError
        return topics.get(topic)

    async def list_topics(self) -> list[TopicConfig]:
        return self.log.topic_config.list()

    async def delete_topic(self, topic: str) -> bool:
        return await asyncio.to_thread(self.log.delete_topic, topic)

    async def topic_tombstones(self) -> dict[str, int]:
        return self.log.topic_config.tombstones()

    async def release_transient(
        self, below: int, log_id: str = "", generation: int = 0, keep: Sequence[int] = ()
    ) -> int:
        store = self.log.transient
        gens = self.log.generation
        if log_id and (log_id, generation) != (gens.log_id, gens.generation):
            return 0  # computed before a cut: new stubs may lie below ``below``
        # A worker thread: the store's lock may be held by a page-out step's write.
        return await asyncio.to_thread(store.release_below, below, keep)


def _messages_of(batch: EncodedBatch) -> list[Message]:
    """The adopted records of ``batch`` as Messages (queue ids as placed, hosts as filled)."""
    return [
        decode_record(batch.buf, pos, pos + size, check_crc=False).to_message()
        for pos, size in zip(batch.positions, batch.sizes, strict=False)
    ]


def _check_divergence(
    log_id: str,
    current: int,
    caller_log_id: str,
    caller_generation: int,
    divergence_point: Callable[[str, int], int | None],
) -> None:
    cut = divergence_point(caller_log_id, caller_generation)
    if cut is not None:
        raise LogDivergedError(
            f"the CommitLog was cut at {cut} after generation {caller_generation} of log "
            f"{caller_log_id or '?'}: drop what was derived from offsets >= {cut}",
            cut,
            log_id,
            current,
        )


@functools.lru_cache(maxsize=4096)
def _born_host_bytes(text: str) -> bytes:
    """8 encoded bytes of an IPv4 "ip:port", or b"" (IPv6 and empty: leave the record's)."""
    ip, sep, port = text.rpartition(":")
    if not sep or ":" in ip or not port.isdigit():
        return b""
    try:
        return encode_host(ip, int(port))
    except InvalidArgumentError:
        return b""


def _drop_passed(kept: OrderedDict[int, tuple[int, _V]], low: int) -> list[tuple[int, _V]]:
    """Remove (and return) the entries of ``kept`` (start -> (end, value), in log order) that
    end at or before ``low``."""
    dropped = []
    while kept:
        start = next(iter(kept))
        if kept[start][0] > low:
            break
        dropped.append(kept.pop(start))
    return dropped
