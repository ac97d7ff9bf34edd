"""MessageStore: the whole embedded store (RocketMQ's ``DefaultMessageStore``).

One CommitLog, the ConsumeQueues and IndexFiles built from it by dispatch, consumer offsets and
long polling, behind one object:

* :meth:`MessageStore.open` = load → recover → start. Recovery runs the CommitLog's (normal or
  abnormal), then brings each derived store (ConsumeQueues, IndexFiles) back in line with the
  log: units past the log's end are cut, IndexFiles that may be torn after a crash are deleted,
  and dispatch resumes from the lowest of their checkpoints (a checkpoint lives inside its
  folder, so deleting ``consumequeue/`` or ``index/`` rebuilds it from the log).
* Writes: :meth:`put_messages` (see CommitLog). Reads: :meth:`get_messages` (pull, with tag
  filter and statuses), :meth:`wait_for_messages` (long polling), :meth:`query_message` (by
  key), :meth:`look_message_by_id`, offsets by time, consumer offsets and progress.
* :meth:`shutdown`: refuse puts → dispatch what is confirmed → flush derived files and their
  checkpoints → persist consumer offsets → shut the CommitLog down (flush, checkpoint, abort
  file removed).

Bad input raises: TopicNotFoundError (unknown topic), QueueIdOutOfRangeError (queue id outside
the topic's read queues), InvalidArgumentError (negative offset, count outside
1..maxPullBatchSize, malformed message id). Thread-safety: every public method may be called
from any thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from libstore.commit_log import CommitLog
from libstore.config import StoreConfig
from libstore.consume_queue import BoundaryType, ConsumeQueue, CqUnit
from libstore.consume_queue_store import ConsumeQueueStore, FlushConsumeQueueService
from libstore.consumer_offset_manager import ConsumerOffsetManager, ConsumerOffsetPersistService
from libstore.dispatch import (
    CommitLogDispatcher,
    DispatchCheckpoint,
    ReputMessageService,
    recover_consume_queues,
    recover_index,
)
from libstore.errors import (
    CorruptRecordError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    QueueIdOutOfRangeError,
    ServiceNotAvailableError,
    StoreIOError,
    TopicNotFoundError,
)
from libstore.get_message import GetMessageResult, get_messages
from libstore.index_service import IndexService
from libstore.long_polling import LongPollingService
from libstore.message import Message, MessageRecord
from libstore.message_filter import ACCEPT_ALL, TagFilter
from libstore.message_id import decode_message_id
from libstore.record_codec import decode_record
from libstore.results import GetMessageStatus, PutMessageResults
from libstore.store_paths import (
    consume_queue_dir,
    consumer_offset_path,
    dispatch_checkpoint_path,
    index_dir,
)

log = logging.getLogger(__name__)

MAX_TIMESTAMP = 2**63 - 1


@dataclass(frozen=True)
class QueueProgress:
    """A consumer group's position in one queue: committed offset (-1: never), max offset, lag."""

    queue_id: int
    committed_offset: int
    min_offset: int
    max_offset: int

    @property
    def lag(self) -> int:
        start = self.committed_offset if self.committed_offset >= 0 else self.min_offset
        return max(0, self.max_offset - start)


@dataclass
class DerivedRecovery:
    """What recovery did to the derived stores: units cut, index files dropped, where dispatch
    resumes (a CommitLog offset)."""

    consume_queue_units_cut: int = 0
    index_rebuild_from: int | None = None
    reput_from_offset: int = 0


class MessageStore:
    """The embedded store (see module docstring)."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        root = config.root_dir
        self.commit_log = CommitLog(config)
        self.consume_queue_store = ConsumeQueueStore(
            consume_queue_dir(root), config.mapped_file_size_consume_queue
        )
        self.index_service: IndexService | None = None
        if config.message_index_enable:
            self.index_service = IndexService(
                index_dir(root), config.max_hash_slot_num, config.max_index_num, config.max_msgs_num_batch
            )
        self._cq_checkpoint = DispatchCheckpoint(dispatch_checkpoint_path(consume_queue_dir(root)))
        self._index_checkpoint = DispatchCheckpoint(dispatch_checkpoint_path(index_dir(root)))
        self.consumer_offsets = ConsumerOffsetManager(
            consumer_offset_path(root), max_group_length=config.max_group_name_length
        )
        self.long_polling = LongPollingService(
            self.get_max_offset_in_queue, max_waiters=config.max_held_polls
        )
        self.reput: ReputMessageService | None = None
        self.derived_recovery: DerivedRecovery | None = None
        self._flush_cq: FlushConsumeQueueService | None = None
        self._offset_persist: ConsumerOffsetPersistService | None = None
        self._running = False

    # ------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, config: StoreConfig) -> MessageStore:
        """load() → recover() → start(). Raises StoreLockedError, StoreIOError, ConfigError."""
        store = cls(config)
        try:
            store.load()
            store.recover()
            store.start()
        except BaseException:
            store._close_after_failed_open()
            raise
        return store

    def load(self) -> bool:
        """Lock the store and map every file. Returns whether the last shutdown was clean."""
        ok = self.commit_log.load()
        self.consume_queue_store.load()
        if self.index_service is not None:
            self.index_service.load()
        self.consumer_offsets.load()
        return ok

    def recover(self) -> DerivedRecovery:
        """Recover the CommitLog, then bring the derived stores in line with it."""
        self.commit_log.recover()
        log_min, log_max = self.commit_log.min_offset, self.commit_log.max_offset
        report = DerivedRecovery()
        reput_from, report.consume_queue_units_cut = recover_consume_queues(
            self.consume_queue_store, self._cq_checkpoint, log_min, log_max, self.commit_log.last_exit_ok
        )
        if self.index_service is not None:
            index_from, report.index_rebuild_from = recover_index(
                self.index_service, self._index_checkpoint, log_min, log_max, self.commit_log.last_exit_ok
            )
            reput_from = min(reput_from, index_from)
        report.reput_from_offset = reput_from
        self.derived_recovery = report
        log.info(
            "derived stores: %d ConsumeQueue units cut, dispatch resumes at %d%s",
            report.consume_queue_units_cut,
            reput_from,
            f", index rebuilt from {report.index_rebuild_from}"
            if report.index_rebuild_from is not None
            else "",
        )
        return report

    def start(self) -> None:
        """Start the CommitLog, dispatch, the derived-file flusher and the offset persister."""
        assert self.derived_recovery is not None, "recover() first"
        cfg = self.config
        self.commit_log.start()
        dispatchers: list[CommitLogDispatcher] = [self.consume_queue_store]
        if self.index_service is not None:
            dispatchers.append(self.index_service)
        self.reput = ReputMessageService(
            self.commit_log,
            dispatchers,
            self.derived_recovery.reput_from_offset,
            on_arrival=self.long_polling.notify_many,
        )
        reput = self.reput
        self.commit_log.add_confirm_listener(lambda _offset: reput.wakeup())
        self._flush_cq = FlushConsumeQueueService(
            self.consume_queue_store.flush,
            self.checkpoint_derived,
            self._on_io_error,
            interval_ms=cfg.flush_interval_consume_queue,
            least_pages=cfg.flush_consume_queue_least_pages,
            thorough_interval_ms=cfg.flush_consume_queue_thorough_interval,
        )
        self._offset_persist = ConsumerOffsetPersistService(
            self.consumer_offsets, cfg.flush_consumer_offset_interval, self._on_io_error
        )
        for svc in (self.reput, self._flush_cq, self._offset_persist):
            svc.start()
        self._running = True

    def checkpoint_derived(self) -> None:
        """Flush the ConsumeQueues and IndexFiles, then record how far they are complete."""
        reput = self.reput
        if reput is None:
            return
        offset = reput.reput_from_offset  # sampled first: everything before it is in the files
        self.consume_queue_store.flush_all()
        self._cq_checkpoint.save(offset)
        if self.index_service is not None:
            self.index_service.flush_all()
            self._index_checkpoint.save(offset)

    def shutdown(self) -> None:
        """Stop in order (see module docstring). Idempotent."""
        if not self._running:
            return
        self._running = False
        self.commit_log.stop_accepting()
        self.long_polling.wake_all()
        if self.reput is not None:
            self.reput.shutdown()
            self.reput.catch_up()
        for svc in (self._flush_cq, self._offset_persist):
            if svc is not None:
                svc.shutdown()
        self.consume_queue_store.shutdown()
        if self.index_service is not None:
            self.index_service.shutdown()
        self.commit_log.shutdown()

    def _close_after_failed_open(self) -> None:
        for svc in (self.reput, self._flush_cq, self._offset_persist):
            if svc is not None:
                svc.shutdown()
        self.consume_queue_store.shutdown()
        if self.index_service is not None:
            for f in self.index_service.files:
                f.close()
        self.commit_log.abandon()

    def _on_io_error(self, exc: StoreIOError) -> None:
        log.error("derived store I/O error: %s", exc)

    # ------------------------------------------------------------------------------------------
    # write
    # ------------------------------------------------------------------------------------------
    def put_messages(self, messages: Sequence[Message]) -> PutMessageResults:
        """Append a batch (see CommitLog.put_messages)."""
        if not self._running:
            raise ServiceNotAvailableError("the store is not running")
        return self.commit_log.put_messages(messages)

    # ------------------------------------------------------------------------------------------
    # read
    # ------------------------------------------------------------------------------------------
    def _check_queue(self, topic: str, queue_id: int) -> None:
        config = self.commit_log.topic_config.get(topic)
        if config is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        if not isinstance(queue_id, int) or not 0 <= queue_id < config.read_queue_nums:
            raise QueueIdOutOfRangeError(
                f"queue id {queue_id!r} out of range: topic {topic!r} has "
                f"{config.read_queue_nums} read queues"
            )

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        self._check_queue(topic, queue_id)
        return self.consume_queue_store.find(topic, queue_id)

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queue_store.find(topic, queue_id)
        return cq.min_offset_in_queue if cq is not None else 0

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queue_store.find(topic, queue_id)
        return cq.max_offset_in_queue if cq is not None else 0

    def get_messages(
        self,
        group: str,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        tag_filter: TagFilter | str | None = None,
    ) -> GetMessageResult:
        """Pull up to ``max_count`` messages of ``topic``/``queue_id`` from queue offset ``offset``.

        ``tag_filter`` is a TagFilter or a TAG expression (``"a || b"``, ``"*"``). Returns a
        GetMessageResult (statuses as RocketMQ's GetMessageStatus); raises as in the module
        docstring.
        """
        if not group:
            raise InvalidArgumentError("consumer group must be non-empty")
        if not isinstance(offset, int) or offset < 0:
            raise InvalidArgumentError(f"queue offset must be a non-negative integer, got {offset!r}")
        limit = self.config.max_pull_batch_size
        if not isinstance(max_count, int) or not 1 <= max_count <= limit:
            raise InvalidArgumentError(f"max_count must be within 1..{limit}, got {max_count!r}")
        filt = tag_filter if isinstance(tag_filter, TagFilter) else TagFilter(tag_filter)
        cq = self._queue(topic, queue_id)
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        return get_messages(
            offset,
            max_count,
            cq.min_offset_in_queue,
            cq.max_offset_in_queue,
            cq.read_units,
            self._read_records,
            filt or ACCEPT_ALL,
            self.config.max_transfer_bytes_on_message_in_memory,
        )

    def _read_records(self, ranges: list[tuple[int, int]]) -> list[bytes | None]:
        return self.commit_log.read_many(ranges)

    def read_units(self, topic: str, queue_id: int, offset: int, max_count: int) -> list[CqUnit]:
        """Raw ConsumeQueue units from ``offset`` (the dispatch service's GetEntries)."""
        cq = self._queue(topic, queue_id)
        return cq.read_units(offset, max_count) if cq is not None else []

    def wait_for_messages(
        self, topic: str, queue_id: int, offset: int, timeout_ms: int | None = None
    ) -> bool:
        """Long polling: block until the queue has a unit at ``offset`` or the hold time passes."""
        self._check_queue(topic, queue_id)
        hold = self.config.long_polling_hold_time if timeout_ms is None else timeout_ms
        return self.long_polling.wait_for_messages(topic, queue_id, offset, hold)

    async def wait_for_messages_async(
        self, topic: str, queue_id: int, offset: int, timeout_ms: int | None = None
    ) -> bool:
        """:meth:`wait_for_messages` for asyncio callers."""
        self._check_queue(topic, queue_id)
        hold = self.config.long_polling_hold_time if timeout_ms is None else timeout_ms
        return await self.long_polling.wait_for_messages_async(topic, queue_id, offset, hold)

    def get_offset_in_queue_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, boundary: BoundaryType = BoundaryType.LOWER
    ) -> int:
        """Queue offset by store time (see ConsumeQueue.get_offset_in_queue_by_time)."""
        cq = self._queue(topic, queue_id)
        if cq is None:
            return 0
        return cq.get_offset_in_queue_by_time(timestamp_ms, self.commit_log.pickup_store_timestamp, boundary)

    def query_message(
        self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0, end_ms: int = MAX_TIMESTAMP
    ) -> list[MessageRecord]:
        """Messages of ``topic`` whose KEYS hold ``key`` (or whose unique key is ``key``), stored
        within [begin_ms, end_ms], newest first, at most min(max_num, maxMsgsNumBatch)."""
        if not key:
            raise InvalidArgumentError("key must be non-empty")
        if max_num <= 0:
            raise InvalidArgumentError(f"max_num must be > 0, got {max_num}")
        if self.index_service is None:
            raise ServiceNotAvailableError("the message index is disabled (messageIndexEnable=false)")
        if self.commit_log.topic_config.get(topic) is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        offsets = self.index_service.query_offsets(topic, key, max_num, begin_ms, end_ms)
        raws = self.commit_log.read_many([(phy, 0) for phy in offsets])  # size 0: the whole record
        out = []
        for phy, raw in zip(offsets, raws, strict=True):
            if raw is None:
                continue  # the log no longer holds it
            try:
                record = decode_record(raw)
            except CorruptRecordError:
                continue
            if record.phy_offset != phy:
                continue  # another record now sits there
            if record.topic == topic and (key in record.keys or record.uniq_key == key):
                out.append(record)
        return out

    def look_message_by_id(self, msg_id: str) -> MessageRecord:
        """The message with offset message id ``msg_id`` (spec §2).

        Raises InvalidArgumentError (malformed id), OffsetOutOfRangeError (not in this log).
        """
        parts = decode_message_id(msg_id)
        try:
            return self.commit_log.read_message(parts.phy_offset)
        except CorruptRecordError as exc:
            raise OffsetOutOfRangeError(f"no message starts at offset {parts.phy_offset}") from exc

    # ------------------------------------------------------------------------------------------
    # consumer offsets and progress
    # ------------------------------------------------------------------------------------------
    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record ``group``'s next offset in the queue; OffsetOutOfRangeError past its max."""
        self._check_queue(topic, queue_id)
        max_offset = self.get_max_offset_in_queue(topic, queue_id)
        if offset > max_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is past the max offset {max_offset} of {topic}-{queue_id}"
            )
        self.consumer_offsets.commit_offset(group, topic, queue_id, offset)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """``group``'s committed offset in the queue, -1 when it never committed one."""
        self._check_queue(topic, queue_id)
        return self.consumer_offsets.query_offset(group, topic, queue_id)

    def consumer_progress(self, group: str, topic: str) -> list[QueueProgress]:
        """Per read queue of ``topic``: committed offset, bounds and lag of ``group``."""
        config = self.commit_log.topic_config.get(topic)
        if config is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        committed = self.consumer_offsets.offsets_of(group, topic)
        return [
            QueueProgress(
                qid,
                committed.get(qid, -1),
                self.get_min_offset_in_queue(topic, qid),
                self.get_max_offset_in_queue(topic, qid),
            )
            for qid in range(config.read_queue_nums)
        ]

    # ------------------------------------------------------------------------------------------
    # dispatch progress
    # ------------------------------------------------------------------------------------------
    @property
    def dispatch_behind(self) -> int:
        """Confirmed CommitLog bytes not yet in the ConsumeQueues/index."""
        return self.reput.behind if self.reput is not None else 0

    def wait_dispatched(self, timeout_s: float = 10.0) -> bool:
        """Block until everything confirmed now is dispatched (tests, start-up readiness)."""
        if self.reput is None:
            return False
        target = self.commit_log.confirm_offset
        deadline = time.monotonic() + timeout_s
        while True:
            if self.reput.wait_for_reput(target, 0.05):
                return True
            if self.reput.reput_from_offset >= self.commit_log.confirm_offset:
                return True  # a blank END record: nothing left to dispatch
            if time.monotonic() >= deadline:
                return False
