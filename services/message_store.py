"""MessageStore: the embedded store as one blocking object, for library users, benchmarks and the
crash tests (RocketMQ's ``DefaultMessageStore`` surface).

It runs the very objects ``mqstore serve`` runs (services.embedded.EmbeddedStore: the CommitLog
with its LocalCommitLog port, retry de-duplication and HA controller; DispatchApp and IndexApp
following the log through their TailFollowers) on an event loop in a thread of its own, and
answers from them: there is one dispatch loop, one recovery and one shutdown order, whichever way
the store is used. The folder layout is ``mqstore serve --data``'s (``commitlog/``,
``dispatch/``, ``index/`` under ``config.store_path_root_dir``), so either can open the other's
data.

* :meth:`MessageStore.open`: CommitLog load → recover → start, then each derived service
  recovers against the log's bounds and follows it (see services.embedded).
* Writes: :meth:`put_messages` (LocalCommitLog.append: scheduled messages held, retried
  UNIQ_KEYs answered from the de-duplication window, SYNC_FLUSH / SYNC_MASTER waits).
  Reads: :meth:`get_messages` (pull, with tag filter and statuses), :meth:`wait_for_messages`
  (long polling), :meth:`query_message` (by key), :meth:`look_message_by_id`, offsets by time,
  consumer offsets and progress.
* :meth:`shutdown`: stop intake → let dispatch apply what is confirmed → stop the derived
  services (final flush and checkpoint) → shut the CommitLog down (flush, checkpoint, abort
  marker removed).

Bad input raises: TopicNotFoundError (unknown topic), QueueIdOutOfRangeError (queue id outside
the topic's read queues), InvalidArgumentError (negative offset, count outside
1..maxPullBatchSize, malformed message id); ServiceNotAvailableError once shut down.
Thread-safety: every public method may be called from any thread but the store's own loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from libstore import (
    CommitLog,
    CorruptRecordError,
    InvalidArgumentError,
    MessageRecord,
    OffsetOutOfRangeError,
    PutMessageResults,
    QueueIdOutOfRangeError,
    ServiceNotAvailableError,
    StoreConfig,
    TopicNotFoundError,
)
from libstore.consume_queue import BoundaryType, ConsumeQueue, CqUnit
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.consumer_offset_manager import ConsumerOffsetManager, QueueProgress
from libstore.get_message import GetMessageResult, get_messages
from libstore.index_service import IndexService
from libstore.long_polling import LongPollingService
from libstore.message import MessageFields
from libstore.message_filter import ACCEPT_ALL, TagFilter
from libstore.message_id import decode_message_id
from libstore.record_codec import decode_record
from libstore.results import GetMessageStatus
from services._common import event_loop
from services.embedded import EmbeddedStore

MAX_TIMESTAMP = 2**63 - 1
SHUTDOWN_CATCH_UP_S = 10.0

T = TypeVar("T")


@dataclass(frozen=True)
class DerivedRecovery:
    """What recovery did to the derived stores at open: ConsumeQueue units cut, where the
    IndexFiles were rebuilt from (None: kept), and where dispatch resumed (the lower of the two
    services' resume offsets, a CommitLog offset)."""

    consume_queue_units_cut: int
    index_rebuild_from: int | None
    reput_from_offset: int


class MessageStore:
    """The embedded store (see module docstring). Construct with :meth:`open`."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self._loop = event_loop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mqstore-store", daemon=True)
        self._store: EmbeddedStore | None = None
        self._running = False

    # ------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, config: StoreConfig) -> MessageStore:
        """Open (recovering as needed) and start the store rooted at ``config.store_path_root_dir``.

        Raises StoreLockedError (another process holds it), StoreIOError, ConfigError; on failure
        nothing is left open and an abort marker stays (the next open still recovers abnormally).
        """
        store = cls(config)
        store._thread.start()
        try:
            store._store = store._call(
                EmbeddedStore.open(
                    Path(config.store_path_root_dir), config, index=config.message_index_enable
                )
            )
        except BaseException:
            store._stop_loop()
            raise
        store._running = True
        return store

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the store's loop and wait for its result (its own timeouts bound it)."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def shutdown(self) -> None:
        """Stop in order (see module docstring). Idempotent."""
        if not self._running:
            return
        self._running = False
        store = self.embedded
        store.node.commit_log.stop_accepting()
        store.dispatch.long_polling.wake_all()
        self._call(store.wait_dispatched(store.node.commit_log.confirm_offset, SHUTDOWN_CATCH_UP_S))
        self._call(store.close())
        self._stop_loop()

    @property
    def embedded(self) -> EmbeddedStore:
        if self._store is None:
            raise ServiceNotAvailableError("the store is not open")
        return self._store

    # -- the parts, for tests and tools ---------------------------------------------------------
    @property
    def commit_log(self) -> CommitLog:
        return self.embedded.node.commit_log

    @property
    def consume_queue_store(self) -> ConsumeQueueStore:
        return self.embedded.dispatch.queues

    @property
    def index_service(self) -> IndexService | None:
        index = self.embedded.index
        return index.index if index is not None else None

    @property
    def long_polling(self) -> LongPollingService:
        return self.embedded.dispatch.long_polling

    @property
    def consumer_offsets(self) -> ConsumerOffsetManager:
        return self.embedded.dispatch.offsets

    @property
    def derived_recovery(self) -> DerivedRecovery:
        store = self.embedded
        index = store.index
        return DerivedRecovery(
            store.dispatch.units_cut,
            index.rebuild_from if index is not None else None,
            min(app.resume_offset for app in store.apps),
        )

    # ------------------------------------------------------------------------------------------
    # write
    # ------------------------------------------------------------------------------------------
    def put_messages(self, messages: Sequence[MessageFields]) -> PutMessageResults:
        """Append a batch through the CommitLog's port (see LocalCommitLog.append); returns one
        result per message. Raises ServiceNotAvailableError once shut down, and what the append
        raises for bad messages (MessageIllegalError, InvalidArgumentError, ...)."""
        if not self._running:
            raise ServiceNotAvailableError("the store is not running")
        return self._call(self.embedded.node.port.append(messages))

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
            cq.read_columns,
            self.commit_log.read_many,
            filt or ACCEPT_ALL,
            self.config.max_transfer_bytes_on_message_in_memory,
        )

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
        """:meth:`wait_for_messages` for asyncio callers (on their own loop)."""
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
        index = self.index_service
        if index is None:
            raise ServiceNotAvailableError("the message index is disabled (messageIndexEnable=false)")
        if self.commit_log.topic_config.get(topic) is None:
            raise TopicNotFoundError(f"topic {topic!r} does not exist")
        app = self.embedded.index
        if app is not None:  # what the log confirmed before this call is indexed first
            self._call(app.settle())
        offsets = index.query_offsets(topic, key, max_num, begin_ms, end_ms)
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
        """Confirmed CommitLog bytes not yet in the ConsumeQueues or the index (the slower)."""
        store = self.embedded
        applied = min(
            (app.follower.reput_offset for app in store.apps if app.follower is not None), default=0
        )
        return max(0, store.node.commit_log.confirm_offset - applied)

    def wait_dispatched(self, timeout_s: float = 10.0) -> bool:
        """Block until everything confirmed now is dispatched (tests, start-up readiness)."""
        store = self.embedded
        return self._call(store.wait_dispatched(store.node.commit_log.confirm_offset, timeout_s))
