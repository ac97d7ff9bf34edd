"""LocalCommitLog: the CommitLogPort over a libstore CommitLog in this process.

Runs on the service's event loop. An append encodes and copies on the loop (one lock per batch,
no await in between, so de-duplication needs no lock of its own), then awaits the group commit
(SYNC_FLUSH) without blocking the loop. The tail stream reads whole records up to the confirm
offset (the flushed offset under SYNC_FLUSH) and sleeps on the CommitLog's confirm listener, so
consumers never see bytes a crash could erase.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import struct
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence

from libstore import (
    CommitLog,
    CorruptRecordError,
    InvalidArgumentError,
    Message,
    MessageConst,
    OffsetOutOfRangeError,
    PutMessageResults,
    PutMessageStatus,
    TopicConfig,
)
from libstore.message_id import encode_host
from libstore.record_codec import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    DispatchRequest,
    EncodedBatch,
)
from services._common.telemetry import tracer
from services.commitlog.dedup_window import DedupWindow, Placed
from services.ports import LogOffsets, TailChunk

DEFAULT_CHUNK_BYTES = 1024 * 1024
DECODED_BATCHES_KEPT = 1024
DEFAULT_HEARTBEAT_MS = 1000
_TOTAL_MAGIC = struct.Struct(">ii")
_RECORD_MAGICS = (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)


class LocalCommitLog:
    """CommitLogPort over ``log``; ``dedup`` (optional) catches retried batches by UNIQ_KEY."""

    def __init__(self, log: CommitLog, dedup: DedupWindow | None = None) -> None:
        self.log = log
        self.dedup = dedup
        self._tracer = tracer("mqstore.commitlog")
        # Recently appended client-encoded batches, decoded by their validation: start offset ->
        # (end offset, requests with their final offsets). In-process followers take these
        # instead of decoding the same bytes again; an older offset reads the log as usual.
        self._decoded: OrderedDict[int, tuple[int, list[DispatchRequest]]] = OrderedDict()

    # -- append ---------------------------------------------------------------------------------
    async def append(self, messages: Sequence[Message]) -> PutMessageResults:
        with self._tracer.start_as_current_span("commitlog.append") as span:
            span.set_attribute("mqstore.messages", len(messages))
            fresh, placed = self._split_replays(messages)
            appended = self.log.append_messages(fresh) if fresh else None
            if appended is not None:
                self._remember(fresh, appended.results)
            results = self._merge(messages, appended.results if appended else None, placed)
            wait_store = appended.wait_store if appended is not None else True
            # Durable once the furthest record is: replays may sit before or after the new ones.
            ends = [p + s for p, s in zip(results.phy_offsets, results.sizes, strict=True)]
            if ends:
                results.status = await self._wait_durable(max(ends), wait_store)
            span.set_attribute("mqstore.status", results.status.name)
            return results

    async def append_records(self, raw: bytes, born_host: str = "") -> PutMessageResults:
        """Append client-encoded records (see RecordEncoder.adopt_records): validated here, CRC
        included; records whose UNIQ_KEY is in the de-duplication window get their first result."""
        log = self.log
        with self._tracer.start_as_current_span("commitlog.append") as span:
            batch = log.adopt_records(raw, _born_host_bytes(born_host))
            n = len(batch.sizes)
            span.set_attribute("mqstore.messages", n)
            placed: dict[int, Placed] = {}
            dedup = self.dedup
            if dedup is not None:
                for i, (topic, uniq) in enumerate(zip(batch.topics, batch.uniq_keys, strict=True)):
                    if uniq:
                        hit = dedup.get(topic, uniq)
                        if hit is not None:
                            placed[i] = hit
            fresh_batch = batch.subset([i for i in range(n) if i not in placed]) if placed else batch
            appended = log.append_batch(fresh_batch) if fresh_batch.sizes else None
            if appended is not None:
                self._keep_decoded(fresh_batch, appended.results)
            if appended is not None and dedup is not None:
                res = appended.results
                for i in range(res.appended):
                    uniq = fresh_batch.uniq_keys[i]
                    if uniq:
                        dedup.put(
                            fresh_batch.topics[i],
                            uniq,
                            Placed(
                                res.phy_offsets[i], res.sizes[i], res.queue_offsets[i], res.store_timestamp
                            ),
                        )
            results = self._merge(range(n), appended.results if appended else None, placed)
            ends = [p + s for p, s in zip(results.phy_offsets, results.sizes, strict=True)]
            if ends:
                results.status = await self._wait_durable(max(ends), True)
            span.set_attribute("mqstore.status", results.status.name)
            return results

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
        start = results.phy_offsets[0]
        self._decoded[start] = (results.phy_offsets[n - 1] + results.sizes[n - 1], requests)
        while len(self._decoded) > DECODED_BATCHES_KEPT:
            self._decoded.popitem(last=False)

    def _split_replays(self, messages: Sequence[Message]) -> tuple[list[Message], dict[int, Placed]]:
        dedup = self.dedup
        if dedup is None:
            return list(messages), {}
        fresh: list[Message] = []
        placed: dict[int, Placed] = {}
        for i, m in enumerate(messages):
            uniq = m.properties.get(MessageConst.UNIQ_KEY) if m.properties else None
            hit = dedup.get(m.topic, uniq) if uniq else None
            if hit is None:
                fresh.append(m)
            else:
                placed[i] = hit
        return fresh, placed

    def _remember(self, fresh: Sequence[Message], results: PutMessageResults) -> None:
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

    async def _wait_durable(self, next_offset: int, wait_store: bool) -> PutMessageStatus:
        log = self.log
        future = log.submit_flush_request(max(next_offset, 0), wait_store)
        if future is None:
            return PutMessageStatus.PUT_OK
        with self._tracer.start_as_current_span("commitlog.flush_wait"):
            try:
                return await asyncio.wait_for(
                    asyncio.wrap_future(future), log.config.sync_flush_timeout / 1000.0
                )
            except TimeoutError:
                return PutMessageStatus.FLUSH_DISK_TIMEOUT

    # -- read -----------------------------------------------------------------------------------
    async def read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]:
        with self._tracer.start_as_current_span("commitlog.read") as span:
            span.set_attribute("mqstore.ranges", len(ranges))
            return self.log.read_many(ranges)

    # -- tail -----------------------------------------------------------------------------------
    async def tail(
        self, from_offset: int, *, max_chunk_bytes: int = 0, heartbeat_ms: int = 0, decoded: bool = False
    ) -> AsyncIterator[TailChunk]:
        """Chunks of whole records from ``from_offset`` (a record boundary), forever. With
        ``decoded``, a batch appended as client-encoded records comes as its decoded requests
        (``records``, no bytes) while it is among the last DECODED_BATCHES_KEPT batches.

        Raises OffsetOutOfRangeError when ``from_offset`` is past the log's end (the caller's
        derived state is ahead of this log: it must cut back to the end and resume there).
        """
        log = self.log
        max_bytes = max_chunk_bytes or DEFAULT_CHUNK_BYTES
        heartbeat_s = (heartbeat_ms or DEFAULT_HEARTBEAT_MS) / 1000.0
        if from_offset > log.max_offset:
            raise OffsetOutOfRangeError(
                f"tail from {from_offset} is past the CommitLog's end {log.max_offset}"
            )
        loop = asyncio.get_running_loop()
        moved = asyncio.Event()

        def on_confirm(_offset: int) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
                loop.call_soon_threadsafe(moved.set)

        log.add_confirm_listener(on_confirm)
        try:
            offset = max(from_offset, log.min_offset)
            while True:
                moved.clear()
                confirm = log.confirm_offset
                if offset < confirm:
                    hit = self._decoded.get(offset) if decoded else None
                    if hit is not None and hit[0] <= confirm:
                        yield TailChunk(offset, b"", hit[0], confirm, log.min_offset, hit[1])
                        offset = hit[0]
                        continue
                    chunk = self._chunk(offset, confirm, max_bytes)
                    offset = chunk.next_offset
                    yield chunk
                    continue
                try:
                    await asyncio.wait_for(moved.wait(), heartbeat_s)
                except TimeoutError:
                    yield TailChunk(offset, b"", offset, confirm, log.min_offset)
        finally:
            log.remove_confirm_listener(on_confirm)

    def _chunk(self, offset: int, confirm: int, max_bytes: int) -> TailChunk:
        """Whole records from ``offset``, up to ``max_bytes`` (at least one record), the confirm
        offset and the segment's end (a blank END record is included and ends the chunk)."""
        log = self.log
        assert log.queue is not None
        mf = log.queue.find_mapped_file_by_offset(offset)
        if mf is None:
            raise OffsetOutOfRangeError(f"offset {offset} is not in the CommitLog")
        base = mf.file_from_offset
        start = pos = offset - base
        limit = min(mf.readable_position, confirm - base)
        buf = mf.buffer
        next_offset = -1
        while pos < limit:
            if limit - pos < 8:
                raise CorruptRecordError(f"truncated record header at offset {base + pos}")
            size, magic = _TOTAL_MAGIC.unpack_from(buf, pos)
            if magic == BLANK_MAGIC_CODE:
                pos += 8
                next_offset = log.roll_next_file(base + pos - 8)
                break
            if magic not in _RECORD_MAGICS or size <= 0 or pos + size > limit:
                raise CorruptRecordError(f"no record at CommitLog offset {base + pos}")
            if pos > start and pos + size - start > max_bytes:
                break
            pos += size
        data = bytes(buf[start:pos])
        if next_offset < 0:
            next_offset = base + pos
        return TailChunk(offset, data, next_offset, confirm, log.min_offset)

    # -- offsets and topics ---------------------------------------------------------------------
    async def offsets(self) -> LogOffsets:
        log = self.log
        cfg = log.config
        disk = shutil.disk_usage(cfg.commit_log_dir)
        return LogOffsets(
            log.min_offset,
            log.max_offset,
            log.confirm_offset,
            log.flushed_offset,
            cfg.flush_disk_type.value,
            cfg.broker_role.value,
            cfg.mapped_file_size_commit_log,
            disk.free,
            disk.total,
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
        return self.log.topic_config.delete(topic)


def _born_host_bytes(text: str) -> bytes:
    """8 encoded bytes of an IPv4 "ip:port", or b"" (IPv6 and empty: leave the record's)."""
    ip, sep, port = text.rpartition(":")
    if not sep or ":" in ip or not port.isdigit():
        return b""
    try:
        return encode_host(ip, int(port))
    except InvalidArgumentError:
        return b""
