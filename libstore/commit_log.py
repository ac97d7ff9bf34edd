"""CommitLog: the single writer of the message log (spec sheet §1, §5, §6).

Lifecycle (RocketMQ's): :meth:`load` (lock the store, detect the abort file, map segments) →
:meth:`recover` (normal or abnormal, see :mod:`libstore.recovery`) → :meth:`start` (flush
services, pre-allocation, abort file) → :meth:`shutdown` (stop intake, drain flushes, checkpoint,
snapshot, remove the abort file). :meth:`CommitLog.open` does the first three.

Write path: :meth:`put_messages` validates and encodes the whole batch outside the lock
(:class:`~libstore.record_encoder.RecordEncoder`), then, under one lock per batch, assigns each
message its physical offset and queue offset, stamps the store time and copies contiguous runs of
records into the current segment, rolling to the next segment with a blank END record when a
record does not fit. Then the flush policy applies: SYNC_FLUSH waits for the group commit to
cover the batch (FLUSH_DISK_TIMEOUT after ``syncFlushTimeout``), ASYNC_FLUSH returns at once.
A message whose WAIT property reads false (libstore.message.waits_for_store) is not waited for:
the wait reaches the end of the batch's last message that waits, and the others read PUT_OK
whatever it came to (PutMessageResults.unwaited); a batch of such messages only wakes the flusher.
Transient messages (libstore.durability) are not waited for either: their whole records go to
:attr:`transient` (the TransientMessageStore) before their stubs are written, and every read of
records (:meth:`read_many`, :meth:`read_message`) gives the whole record for a stub, or None
when the store no longer holds it (a restart, a failover, retention).

Errors: bad input raises MessageIllegalError (subclasses) or TopicNotFoundError and writes
nothing; a shut-down or unwriteable store raises ServiceNotAvailableError, a SLAVE
NotMasterError, a stalled put lock OSPageCacheBusyError. A failure while appending (no space for
a new segment) is a per-message status (CREATE_MAPPED_FILE_FAILED) for the messages not
written; those written before it keep their results. An OSError while writing or flushing is
fail-stop: the store stops taking writes.

Watermarks: ``max_offset`` (readable end) ≥ ``flushed_offset``; ``confirm_offset`` is what
consumers may see: ``flushed_offset`` under SYNC_FLUSH, ``max_offset`` under ASYNC_FLUSH, and
under SYNC_MASTER never past what the slaves hold (:class:`~libstore.ha_service.HAService`).
Listeners added with :meth:`add_confirm_listener` are called (on the writer, flush or ack
thread) whenever it moves; append listeners whenever the log grows. They must not block.

Replication (spec sheet §7): the broker role is the configured one, or the one saved in
``config/haState.json`` by the last promotion or demotion, and can change at run time
(:meth:`set_broker_role`). A master's puts feed :attr:`ha_service`; a SLAVE refuses puts and
takes its master's bytes at the same offsets (:meth:`append_replica`), and can cut a divergent
tail (:meth:`truncate_to`). Every truncation of bytes that followers may have read bumps the
log generation first (:mod:`libstore.log_generation`).

Thread-safety: every public method may be called from any thread.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import operator
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import cast

from libstore.commit_log_cleaner import CleanCommitLogService
from libstore.config import BrokerRole, FlushDiskType, StoreConfig
from libstore.dispatch_request import DispatchRequest
from libstore.durability import hold_entries, mark_transient
from libstore.errors import (
    CorruptRecordError,
    DiskFullError,
    NotMasterError,
    OffsetOutOfRangeError,
    OSPageCacheBusyError,
    ServiceNotAvailableError,
    StoreIOError,
)
from libstore.flush import CommitRealTimeService, FlushRealTimeService, GroupCommitRequest, GroupCommitService
from libstore.ha_service import HAService
from libstore.ha_state import EpochEntry, HAState
from libstore.log_generation import LogGeneration
from libstore.log_reads import (
    decode_record_at,
    read_record,
    read_records,
    read_records_framed,
    store_timestamp_of,
)
from libstore.log_scanner import scan_log
from libstore.mapped_file import MappedFile
from libstore.mapped_file_queue import MappedFileQueue
from libstore.message import MessageFields, MessageRecord, MessageSysFlag
from libstore.message_id import encode_host
from libstore.producer_input import (
    PRODUCER_SYS_FLAGS,
    STORE_PROPERTIES,
    check_producer_properties,
    check_producer_topic,
)
from libstore.quarantine import Quarantine
from libstore.queue_offset_table import QueueKey, QueueOffsetSnapshot, QueueOffsetTable
from libstore.queue_round_robin import QueueRoundRobin
from libstore.record_codec import (
    END_FILE_MIN_BLANK_LENGTH,
    encode_blank,
)
from libstore.record_encoder import EncodedBatch, RecordEncoder, assign_offsets
from libstore.recovery import (
    RecoveryReport,
    read_clean_end,
    rebuild_queue_offsets,
    recover_commit_log,
    write_clean_end,
)
from libstore.replica_segments import append_replicated, cut_segments, is_record_boundary, read_chunk
from libstore.results import PutMessageResults, PutMessageStatus
from libstore.retention_policy import RetentionPolicy
from libstore.scheduled_message import hold_all_scheduled
from libstore.segment_summary import UNQUEUED, SegmentSummaries
from libstore.service_thread import ServiceThread
from libstore.store_checkpoint import StoreCheckpoint
from libstore.store_files import StoreFiles
from libstore.store_paths import (
    clean_end_path,
    queue_offset_table_path,
    segment_summary_dir,
)
from libstore.topic_config import TopicConfigManager
from libstore.transient_messages import TransientMessageStore

log = logging.getLogger(__name__)

# Under ASYNC_FLUSH, an append of fewer bytes (one message, a small batch) is stored through the
# segment's mapping rather than written with pwrite (MappedFile.append_records): two syscalls
# cost more than its copy and the page fault of every fourth 1 KiB record. Per 1 KiB record, one
# at a time: 1.2-2.6 us against 4.0-5.2; in runs of 4 to 16, 0.8 against 1.0-2.2; from runs of
# 64 (about 72 KiB) pwrite is as fast or faster. Not under SYNC_FLUSH: each group-commit flush
# write-protects the page being filled, and the next store to it faults again (batches of 16
# with 32 asyncio producers ran at 0.55-0.6x through the mapping).
SMALL_APPEND_BYTES = 32 * 1024
_EVERY_ONE_WAITS: frozenset[int] = frozenset()  # PutMessageResults.unwaited of most batches


class AppendResult:
    """Outcome of :meth:`CommitLog.append_messages`: per-message results before any flush wait,
    and the :class:`EncodedBatch` appended (``batch``: record *i* of its buffer is the log's
    bytes at ``results.phy_offsets[i]``, offsets and store time filled in).

    ``next_offset`` is the CommitLog offset just past the last appended record, -1 when nothing
    was appended. ``wait_offset`` is the group commit (and SYNC_MASTER) target: just past the
    last appended record whose message waits for the store, -1 when none does (every message
    said WAIT=false, libstore.message.waits_for_store; those results read PUT_OK whatever the
    waits come to, see PutMessageResults.unwaited).
    """

    __slots__ = ("batch", "results")

    def __init__(self, results: PutMessageResults, batch: EncodedBatch | None = None) -> None:
        self.results = results
        # The batch appended (its buffer holds the records as the log now does), None when
        # nothing was encoded.
        self.batch = batch

    @property
    def next_offset(self) -> int:
        return self.results.next_offset

    @property
    def wait_offset(self) -> int:
        end = self.results.durable_end()
        return -1 if end is None else end


class CommitLog:
    """The message log of one store (see module docstring).

    ``config`` gives paths, sizes and policies; ``topic_config`` the topic table used for queue
    id checks (created under ``<root>/config`` when omitted).
    """

    def __init__(self, config: StoreConfig, *, topic_config: TopicConfigManager | None = None) -> None:
        self.config = config
        self.root = config.root_dir
        self._store_host = encode_host(*config.store_host_address)
        self._encoder = RecordEncoder(self._store_host, config.max_message_size, config.max_topic_length)
        self._topic_config = topic_config  # the caller's, else load() opens the store's own
        # (topic table version, {topic: write queue count}) for adopt_records; see there.
        self._adopt_topics: tuple[int, dict[str, int]] = (-1, {})
        # The same for append_messages' encoder: (version, {topic: (prefix, magic, queue count)}).
        self._encode_topics: tuple[int, dict[str, tuple[bytes, int, int]]] = (-1, {})
        self._put_lock = threading.Lock()
        self._begin_time_in_lock = 0.0
        self._offsets = QueueOffsetTable(queue_offset_table_path(self.root))
        # Queues of messages sent to queue -1 (a topic's table is the store's once loaded).
        self._round_robin = QueueRoundRobin(lambda topic: self.topic_config.write_queue_nums(topic))
        self._files: StoreFiles | None = None  # made by load(), kept (closed) after shutdown
        self._last_record_at = -1  # offset of the last record appended (-1: not known)
        self._services: list[ServiceThread] = []
        self._group_commit: GroupCommitService | None = None
        self._flush_service: ServiceThread | None = None
        self._commit_service: CommitRealTimeService | None = None
        self._snapshot_service: _SnapshotService | None = None
        self._listeners: list[Callable[[int], None]] = []
        self._io_error_listeners: list[Callable[[StoreIOError], None]] = []
        self._append_listeners: list[Callable[[int], None]] = []
        self._confirm_cond = threading.Condition()
        # Threads in wait_for_confirm, counted before they read the offset: a move that finds
        # none skips the condition (an append on the request path pays nothing for it).
        self._confirm_waiters = 0
        # Appends under this many bytes are stored through the mapping: SMALL_APPEND_BYTES under
        # ASYNC_FLUSH, none under SYNC_FLUSH.
        self._mapped_append_below = (
            SMALL_APPEND_BYTES if config.flush_disk_type is FlushDiskType.ASYNC_FLUSH else 0
        )
        self._role = config.broker_role
        self._master_confirm = 0  # SLAVE: what its master lets consumers see (set_master_confirm)
        self.ha_service = HAService(
            lambda: self.max_offset,
            in_sync_replicas=config.in_sync_replicas,
            max_gap=config.ha_max_gap_not_in_sync,
            housekeeping_ms=config.ha_housekeeping_interval,
            on_replicated=self._notify_confirm,
        )
        self._running = False
        self._writeable = True
        self._disk_full = ""  # why puts are refused for disk usage ("" when they are not)
        self.cleaner: CleanCommitLogService | None = None  # started with the log
        self.summaries = SegmentSummaries(segment_summary_dir(self.root))
        self._loaded = False
        self.last_exit_ok = True
        self.recovery_report: RecoveryReport | None = None
        self.quarantine = Quarantine(config.root_dir)

    @property
    def files(self) -> StoreFiles:
        """The store's open files (libstore.store_files); ServiceNotAvailableError before
        :meth:`load`. After :meth:`shutdown` they are the closed ones."""
        files = self._files
        if files is None:
            raise ServiceNotAvailableError("the CommitLog is not loaded")
        return files

    @property
    def queue(self) -> MappedFileQueue:
        """The segments (MappedFileQueue)."""
        return self.files.queue

    @property
    def checkpoint(self) -> StoreCheckpoint:
        return self.files.checkpoint

    @property
    def ha_state(self) -> HAState:
        """Epochs, the saved role and the master address (``config/haState.json``)."""
        return self.files.ha_state

    @property
    def generation(self) -> LogGeneration:
        """The log generation, bumped before every cut (libstore.log_generation)."""
        return self.files.generation

    @property
    def transient(self) -> TransientMessageStore:
        """Whole records of transient messages, by their stubs' offsets (libstore.durability)."""
        return self.files.transient

    # ------------------------------------------------------------------------------------------
    # lifecycle
    # ------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, config: StoreConfig, *, topic_config: TopicConfigManager | None = None) -> CommitLog:
        """load() → recover() → start(); raises StoreLockedError, StoreIOError, ConfigError."""
        commit_log = cls(config, topic_config=topic_config)
        try:
            commit_log.load()
            commit_log.recover()
            commit_log.start()
        except BaseException:
            commit_log.abandon()
            raise
        return commit_log

    def load(self) -> bool:
        """Lock the store, read the checkpoint and map the segments (libstore.store_files).
        Returns whether the last shutdown was clean (no abort file)."""
        files = self._files = StoreFiles.open(self.config, self._topic_config)
        self.last_exit_ok = files.last_exit_ok
        saved = files.ha_state.role
        if saved is not None and saved is not self._role:
            log.info(
                "broker role %s (saved by the last role switch; configured %s)", saved.value, self._role.value
            )
            self._role = saved
        self.summaries.load()
        self._loaded = True
        return self.last_exit_ok

    def recover(self) -> RecoveryReport:
        """Normal or abnormal recovery, then rebuild the queue-offset table (see libstore.recovery).

        After a crash, or when a clean shutdown's log still ends in bytes that are not records,
        the log generation is bumped at the recovered end before the log is cut there: followers
        in other processes may have read bytes past it. Non-zero bytes cut go to the quarantine
        folder (libstore.quarantine)."""
        report = recover_commit_log(
            self.queue,
            normal=self.last_exit_ok,
            recover_timestamp=self.checkpoint.commit_log_recover_timestamp,
            check_crc=self.config.check_crc_on_recover,
            before_cut=self.generation.bump,
            quarantine=self.quarantine,
            clean_end=read_clean_end(clean_end_path(self.root)) if self.last_exit_ok else None,
            flushed_offset=self.checkpoint.flushed_phy_offset,
        )
        self._last_record_at = report.last_record_offset
        # Recovery forced what it read: the log is durable to its end (and no longer reaches a
        # flushed offset it cut below).
        self.checkpoint.flushed_phy_offset = report.end_offset
        self.checkpoint.flush()
        snapshot = self._offsets.load(report.end_offset, self.generation)
        offsets, scanned, used = rebuild_queue_offsets(
            self.queue, snapshot, report.end_offset, (report.start_offset, report.queue_offsets_seen)
        )
        report.queue_offset_records_scanned = scanned
        report.queue_offset_snapshot_used = used
        self._offsets.replace(offsets, report.end_offset)
        self._offsets.save(
            self._offsets.snapshot_at(report.end_offset, self.generation, offsets), self.generation
        )
        self.summaries.reconcile(
            [(mf.file_from_offset, mf.file_from_offset + mf.wrote_position) for mf in self.queue.mapped_files]
        )
        if self._role is BrokerRole.SLAVE:
            self.ha_state.truncate(report.end_offset)  # the master's entries come back at the handshake
        else:
            self.ha_state.clamp(report.end_offset)
        # SYNC_MASTER: what the slaves held when the checkpoint was last written; SLAVE: what its
        # master confirmed, as last heard.
        confirmed = min(self.checkpoint.confirm_phy_offset, report.end_offset)
        self.ha_service.reset_replicated_offset(confirmed)
        self._master_confirm = confirmed
        self.recovery_report = report
        return report

    def start(self) -> None:
        """Start pre-allocation and the flush services; create the abort file. Idempotent:
        :meth:`open` has started them already, and a second set would outlive :meth:`shutdown`
        (a snapshot thread writing the checkpoint after it was closed)."""
        files = self.files
        if self._snapshot_service is not None:
            return
        cfg = self.config
        files.allocator.start()
        self._services.append(files.allocator)
        if cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            self._group_commit = GroupCommitService(
                self.queue,
                self._on_flushed,
                self._on_io_error,
                commit_first=files.pool is not None,
            )
            self._flush_service = self._group_commit
        else:
            self._flush_service = FlushRealTimeService(
                self.queue,
                self._on_flushed,
                self._on_io_error,
                interval_ms=cfg.flush_interval_commit_log,
                least_pages=cfg.flush_commit_log_least_pages,
                thorough_interval_ms=cfg.flush_commit_log_thorough_interval,
                timed=cfg.flush_commit_log_timed,
            )
            if files.pool is not None:
                self._commit_service = CommitRealTimeService(
                    self.queue,
                    self._flush_service,
                    self._on_io_error,
                    interval_ms=cfg.commit_interval_commit_log,
                    least_pages=cfg.commit_commit_log_least_pages,
                    thorough_interval_ms=cfg.commit_commit_log_thorough_interval,
                    on_committed=self._on_committed,
                )
        self._snapshot_service = _SnapshotService(self, cfg.queue_offset_snapshot_interval)
        self.cleaner = CleanCommitLogService(self, cfg)
        for svc in (self._commit_service, self._flush_service, self._snapshot_service, self.cleaner):
            if svc is not None:
                svc.start()
                self._services.append(svc)
        files.directory.mark_running()
        self._running = True

    def shutdown(self) -> None:
        """Stop intake, drain commit and flush, write checkpoint and snapshot, remove the abort
        file (only when the store is still writeable), unmap and unlock. Idempotent."""
        if not self._loaded:
            return
        self.stop_accepting()
        for svc in (
            self.cleaner,
            self._snapshot_service,
            self._commit_service,
            self._flush_service,
            self.files.allocator,
        ):
            if svc is not None:
                svc.shutdown()
        clean = self._writeable
        try:
            if clean:
                if self.queue.store_timestamp:
                    self.checkpoint.physic_msg_timestamp = self.queue.store_timestamp
                self.checkpoint.confirm_phy_offset = self.persisted_confirm
                self.checkpoint.flush()
                self.save_queue_offset_snapshot()
                self.summaries.save_dirty()
                if self._last_record_at >= 0:  # the next start validates this record only
                    write_clean_end(
                        clean_end_path(self.root), self.queue.get_max_offset(), self._last_record_at
                    )
        except StoreIOError as exc:
            log.error("shutdown could not persist state: %s", exc)
            clean = False
        if clean and self.queue.flushed_where >= self.queue.get_max_offset():
            try:
                self.files.directory.mark_clean()
            except StoreIOError as exc:
                log.error("%s", exc)
        self._close_files()

    def _close_files(self) -> None:
        if self._files is not None:
            self._files.close()
        self._loaded = False

    def abandon(self) -> None:
        """Stop services and release files and the lock without persisting anything: for an open
        that failed part-way (a checkpoint or snapshot of an unrecovered log would be wrong)."""
        self._running = False
        for svc in self._services:
            svc.shutdown()
        self._close_files()

    # ------------------------------------------------------------------------------------------
    # write path
    # ------------------------------------------------------------------------------------------
    def put_messages(self, messages: Sequence[MessageFields]) -> PutMessageResults:
        """Append ``messages`` as one batch and apply the flush policy; one result per message.

        Blocks under SYNC_FLUSH until the group commit covers the batch (at most
        ``syncFlushTimeout`` ms, then FLUSH_DISK_TIMEOUT), and under SYNC_MASTER until the
        slaves hold it (at most ``slaveTimeout`` ms, then FLUSH_SLAVE_TIMEOUT; at once
        SLAVE_NOT_AVAILABLE without an in-sync slave). Raises as described in the module
        docstring; a raised exception means nothing of the batch was written.
        """
        appended = self.append_messages(messages)
        if appended.next_offset < 0:
            return appended.results
        status = self._wait_flush(appended)
        replica = self.submit_replica_request(appended.wait_offset, appended.wait_offset >= 0)
        if status is PutMessageStatus.PUT_OK and replica is not None:
            try:
                status = replica.result(self.config.slave_timeout / 1000.0)
            except FutureTimeout:
                status = PutMessageStatus.FLUSH_SLAVE_TIMEOUT
        appended.results.status = status
        return appended.results

    def submit_replica_request(
        self, next_offset: int, wait_store: bool = True
    ) -> Future[PutMessageStatus] | None:
        """SYNC_MASTER: a future resolved PUT_OK once the slaves hold the log up to
        ``next_offset`` (already SLAVE_NOT_AVAILABLE when none is in sync); the caller applies
        ``slaveTimeout``. None under other roles or when ``wait_store`` is False."""
        if self._role is not BrokerRole.SYNC_MASTER or not wait_store:
            return None
        return self.ha_service.submit_replica_request(next_offset)

    def _wait_flush(self, appended: AppendResult) -> PutMessageStatus:
        if self.config.flush_disk_type is not FlushDiskType.SYNC_FLUSH:
            return PutMessageStatus.PUT_OK
        wait_offset = appended.wait_offset
        future = self.submit_flush_request(
            wait_offset if wait_offset >= 0 else appended.next_offset, wait_offset >= 0
        )
        if future is None:
            return PutMessageStatus.PUT_OK
        try:
            return future.result(self.config.sync_flush_timeout / 1000.0)
        except FutureTimeout:
            return PutMessageStatus.FLUSH_DISK_TIMEOUT

    def request_flush(self, next_offset: int) -> bool:
        """SYNC_FLUSH: have the group commit flush at least up to ``next_offset`` (bytes) in its
        next round, with no waiter; the confirm listeners tell when it did. False (nothing
        done) under ASYNC_FLUSH."""
        gc = self._group_commit
        if gc is None:
            return False
        gc.request_flush(next_offset)
        return True

    def flush_and_wait(self, target: int, timeout_s: float) -> bool:
        """SYNC_FLUSH: have the group commit flush up to ``target`` (bytes) now and block until
        it did, at most ``timeout_s`` seconds (GroupCommitService.flush_and_wait); True when the
        flushed offset reached ``target`` (the confirm listeners may not have heard of it yet).
        False after the timeout, when the flush failed or the flush thread is not running, and
        under ASYNC_FLUSH."""
        gc = self._group_commit
        return gc is not None and gc.flush_and_wait(target, timeout_s)

    @property
    def group_commit_flush_ms(self) -> float | None:
        """SYNC_FLUSH: how long the slowest recent group-commit round took to flush (ms,
        fdatasync included; each round the larger of its own time and 0.9x the figure
        before); None under ASYNC_FLUSH."""
        gc = self._group_commit
        return gc.flush_ms if gc is not None else None

    def submit_flush_request(
        self, next_offset: int, wait_store: bool = True
    ) -> Future[PutMessageStatus] | None:
        """SYNC_FLUSH: a future resolved once ``flushed_offset >= next_offset`` (PUT_OK) or with
        FLUSH_DISK_TIMEOUT. None under ASYNC_FLUSH, or when ``wait_store`` is False (the flusher
        is only woken). For asyncio callers: ``asyncio.wrap_future``."""
        gc = self._group_commit
        if gc is None:
            return None
        if not wait_store:
            gc.wakeup()
            return None
        req = GroupCommitRequest(next_offset, self.config.sync_flush_timeout)
        gc.put_request(req)
        return req.future

    def append_messages(
        self,
        messages: Sequence[MessageFields],
        *,
        place_unassigned: bool = False,
        hold_scheduled: bool = True,
        expected_epoch: int = 0,
    ) -> AppendResult:
        """Validate, encode and append ``messages`` without waiting for any flush. With
        ``place_unassigned``, a message with queue id -1 is placed round robin over its topic's
        write queues (the message itself is not changed), as client-encoded records with QUEUEID -1 are
        (:meth:`adopt_records`); otherwise -1 is out of range like any other bad queue id. With
        ``hold_scheduled`` (the default), delayed messages go to the timer topic
        (libstore.scheduled_message.hold_if_scheduled); a caller that already did that passes False.

        Results carry PUT_OK for appended messages and CREATE_MAPPED_FILE_FAILED for those that
        found no segment to go to; raises like :meth:`put_messages`. ``expected_epoch`` (> 0):
        append only while this store is the master of that epoch, else NotMasterError (fencing
        for a writer whose own state is only valid for one master term, see :meth:`append_batch`).
        """
        self._check_writable()
        if not messages:
            return AppendResult(PutMessageResults(0))
        now = time.time_ns() // 1_000_000
        if hold_scheduled:  # delay/timer: held in the timer topic
            messages = hold_all_scheduled(messages, now)
        topics = self.topic_config
        # Topics met by earlier puts, while the table is unchanged (a batch of one message of a
        # known topic is encoded in C from its first message on).
        version, known = self._encode_topics
        if version != topics.version:
            version, known = self._encode_topics = (topics.version, {})
        batch = self._encoder.encode_batch(
            messages,
            now,
            topics.write_queue_nums,
            choose_queue=self._round_robin if place_unassigned else None,
            known_topics=known,
        )
        mark_transient(batch, topics.transient_topics)
        return self.append_batch(batch, expected_epoch=expected_epoch)

    def adopt_records(
        self, raw: bytes | bytearray | memoryview, born_host: bytes = b"", *, max_records: int = 0
    ) -> EncodedBatch:
        """Validate client-encoded records for this store (see RecordEncoder.adopt_records);
        records with QUEUEID -1 are placed round robin over their topic's write queues, and
        ``born_host`` (8 encoded bytes) fills a 0.0.0.0:0 BORNHOST. Only producers send records,
        so what they may not put is refused (libstore.producer_input: system topics, the store's
        properties) and SYSFLAG is masked to the producer's bits. May run on a worker thread.

        Raises MessageIllegalError (or a subclass; also past ``max_records`` records, 0: no
        bound) or TopicNotFoundError; nothing is written.
        """
        self._check_writable()
        topics = self.topic_config
        # Topics producers may put to, with their queue counts, while the table is unchanged.
        version, known = self._adopt_topics
        if version != topics.version:
            version, known = self._adopt_topics = (topics.version, {})
        batch = self._encoder.adopt_records(
            raw,
            time.time_ns() // 1_000_000,
            topics.write_queue_nums,
            choose_queue=self._round_robin,
            born_host=born_host,
            check_topic=check_producer_topic,
            check_properties=check_producer_properties,
            forbidden_properties=STORE_PROPERTIES,
            sys_flag_mask=PRODUCER_SYS_FLAGS,
            max_records=max_records,
            known_topics=known,
        )
        if not batch.scheduled:  # else the caller encodes its messages again (LocalCommitLog)
            mark_transient(batch, topics.transient_topics)
        return batch

    def append_batch(self, batch: EncodedBatch, *, expected_epoch: int = 0) -> AppendResult:
        """Append a validated batch (from the encoder or :meth:`adopt_records`) under the put
        lock, without waiting for any flush. With ``expected_epoch`` > 0 the batch is refused
        (NotMasterError, nothing written) unless this store's newest epoch is that one: a
        writer that read the log under one master term does not write into the next."""
        self._check_writable()
        if not batch.sizes:
            return AppendResult(PutMessageResults(0))
        if self.is_os_page_cache_busy():
            raise OSPageCacheBusyError("the put lock has been held for too long; retry later")
        with self._put_lock:
            if not self._running:
                raise ServiceNotAvailableError("the store is shutting down")
            if self._role is BrokerRole.SLAVE:
                raise NotMasterError(f"this store became a SLAVE of broker group {self.config.broker_name}")
            if expected_epoch and self.ha_state.last_epoch != expected_epoch:
                raise NotMasterError(
                    f"this store is the master of epoch {self.ha_state.last_epoch}, not {expected_epoch}"
                )
            self._begin_time_in_lock = time.monotonic()
            try:
                results = self._append_locked(batch)
            finally:
                self._begin_time_in_lock = 0.0
            if results.phy_offsets:
                self._last_record_at = results.phy_offsets[-1]
        if results.appended:
            self._after_append(results.next_offset)
        return AppendResult(results, batch)

    def _check_writable(self) -> None:
        if not self._running:
            raise ServiceNotAvailableError("the store is not running")
        if self._role is BrokerRole.SLAVE:
            raise NotMasterError(
                f"this store is a SLAVE of broker group {self.config.broker_name} and does not take puts"
            )
        if not self._writeable:
            raise ServiceNotAvailableError("the store is not writeable after an I/O error")
        if self._disk_full:
            raise DiskFullError(self._disk_full)

    def _append_locked(self, batch: EncodedBatch) -> PutMessageResults:
        """Assign offsets and copy the batch into segments, rolling as needed (put lock held).

        Each run of records that fits the current segment is patched (queue offset, physical
        offset, store time) and copied with one slice assignment.
        """
        queue = self.queue
        store_ts = time.time_ns() // 1_000_000
        buf = batch.buf
        positions = batch.positions
        sizes = batch.sizes
        keys = batch.queue_keys
        ts_positions = batch.store_ts_positions
        table = self._offsets.offsets
        n = len(sizes)
        phys: list[int] = []
        qoffs: list[int] = []
        failed = PutMessageStatus.CREATE_MAPPED_FILE_FAILED
        transient = batch.transient
        if transient:  # room for every whole record first: SystemBusyError writes nothing
            self.transient.make_room(batch.transient_bytes)
        i = 0
        while i < n:
            try:
                mf = queue.get_last_mapped_file_or_create(0)
            except DiskFullError as exc:
                log.error("cannot create a CommitLog segment: %s", exc)
                mf = None
            except StoreIOError as exc:
                self._on_io_error(exc)
                mf = None
            if mf is None:
                break
            base = mf.file_from_offset + mf.wrote_position
            first = positions[i]
            # Records i..j-1 fit in front of the 8 bytes kept for the END blank.
            j = bisect.bisect_right(positions, first + mf.remaining - END_FILE_MIN_BLANK_LENGTH, i, n + 1) - 1
            delta = base - first
            assign_offsets(buf, positions, ts_positions, keys, table, i, j, delta, store_ts, qoffs)
            if j > i:
                used = positions[j] - first
                if transient:  # whole records held before their stubs can be read
                    self._hold_transient(batch, i, j, delta)
                try:
                    with memoryview(buf) as view:
                        mf.append_records(
                            view[first : first + used],
                            through_mapping=used < self._mapped_append_below,
                        )
                except (OSError, ValueError) as exc:
                    # The records never reached the segment; the log is unchanged.
                    if transient:
                        self.transient.truncate_from(base)
                    self._offsets.roll_back(qoffs, keys, i, j)
                    del qoffs[len(phys) :]
                    self._on_io_error(StoreIOError(f"append failed: {exc}"))
                    failed = PutMessageStatus.UNKNOWN_ERROR
                    break
                phys.extend([pos + delta for pos in positions[i:j]])
                mf.store_timestamp = store_ts
                # For retention: the run's topics (libstore.segment_summary).
                self.summaries.note(
                    mf.file_from_offset,
                    _run_topics(keys, i, j),
                    store_ts,
                    positions[j - 1] + delta,
                    base + used,
                )
            if j < n:
                # Record j does not fit: close this segment with a blank and roll.
                mf.fill_to_end(encode_blank(mf.remaining))
                self.summaries.seal(mf.file_from_offset, mf.file_tail_offset)
            i = j
        return PutMessageResults(
            n,
            phy_offsets=phys,
            sizes=sizes,
            queue_offsets=qoffs,
            store_timestamp=store_ts,
            store_host=self._store_host,
            failed_status=failed,
            unwaited=frozenset(batch.no_wait) if batch.no_wait else _EVERY_ONE_WAITS,
            in_log_order=True,
        )

    def _hold_transient(self, batch: EncodedBatch, start: int, stop: int, delta: int) -> None:
        """Put the whole records of the transient messages among records ``start``..``stop``-1
        of ``batch`` into :attr:`transient`, under their stubs' offsets, with the offsets and
        store time just assigned to the stubs (put lock held; the room was made for them)."""
        keys, ends, data = hold_entries(batch, start, stop, delta)
        self.transient.put_run(keys, ends, data, ordered=True)

    def _after_append(self, next_offset: int) -> None:
        self.ha_service.on_append(next_offset)
        for listener in self._append_listeners:
            try:
                listener(next_offset)
            except Exception:
                log.exception("append listener failed")
        if self.config.flush_disk_type is FlushDiskType.ASYNC_FLUSH:
            if self._commit_service is not None:
                self._commit_service.wakeup()
            elif self._flush_service is not None and not self.config.flush_commit_log_timed:
                self._flush_service.wakeup()
            if self.files.pool is None:
                self._notify_confirm(next_offset)

    def is_os_page_cache_busy(self) -> bool:
        """True when a put has held the lock longer than ``osPageCacheBusyTimeOutMills``."""
        begin = self._begin_time_in_lock
        return (
            begin != 0.0 and (time.monotonic() - begin) * 1000 > self.config.os_page_cache_busy_time_out_mills
        )

    # ------------------------------------------------------------------------------------------
    # watermarks and listeners
    # ------------------------------------------------------------------------------------------
    def _on_flushed(self, flushed_where: int) -> None:
        if self.queue.store_timestamp:
            self.checkpoint.physic_msg_timestamp = self.queue.store_timestamp
        # Clamped: a flush that raced a cut of the log must not point past its new end.
        self.checkpoint.flushed_phy_offset = min(flushed_where, self.queue.get_max_offset())
        if self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            self._notify_confirm(flushed_where)

    def _on_committed(self, committed_where: int) -> None:
        if self.config.flush_disk_type is FlushDiskType.ASYNC_FLUSH:
            self._notify_confirm(committed_where)

    def _on_io_error(self, exc: StoreIOError) -> None:
        if self._writeable:
            log.error("store at %s is no longer writeable: %s", self.root, exc)
        self._writeable = False
        for listener in self._io_error_listeners:
            try:
                listener(exc)
            except Exception:
                log.exception("I/O error listener failed")

    def _notify_confirm(self, offset: int) -> None:
        if self._confirm_waiters:
            with self._confirm_cond:
                self._confirm_cond.notify_all()
        for listener in self._listeners:
            try:
                listener(offset)
            except Exception:
                log.exception("confirm-offset listener failed")

    def wait_for_confirm(self, offset: int, timeout_s: float) -> bool:
        """Block until ``confirm_offset >= offset`` or ``timeout_s`` seconds pass; True if reached."""
        deadline = time.monotonic() + timeout_s
        with self._confirm_cond:
            self._confirm_waiters += 1  # before the offset is read: see _notify_confirm
            try:
                while self.confirm_offset < offset:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._loaded:
                        return False
                    self._confirm_cond.wait(min(left, 0.5))
            finally:
                self._confirm_waiters -= 1
        return True

    def add_append_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(max_offset)`` whenever the log grows (puts and replica appends)."""
        self._append_listeners.append(listener)

    def remove_append_listener(self, listener: Callable[[int], None]) -> None:
        with contextlib.suppress(ValueError):
            self._append_listeners.remove(listener)

    def add_confirm_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(confirm_offset)`` whenever the confirm offset moves (must not block)."""
        self._listeners.append(listener)

    def remove_confirm_listener(self, listener: Callable[[int], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def add_io_error_listener(self, listener: Callable[[StoreIOError], None]) -> None:
        """Call ``listener(exc)`` (on the failing thread; must not block) when a write or an
        fdatasync fails and the store stops taking writes."""
        self._io_error_listeners.append(listener)

    def remove_io_error_listener(self, listener: Callable[[StoreIOError], None]) -> None:
        with contextlib.suppress(ValueError):
            self._io_error_listeners.remove(listener)

    @property
    def flush_failed(self) -> bool:
        """True once a SYNC_FLUSH group-commit fdatasync failed: nothing past the flushed offset
        will be confirmed durable (other I/O errors leave the group commit flushing)."""
        return self._group_commit is not None and self._group_commit.io_failed

    @property
    def group_commit_flushes(self) -> int:
        """fdatasync rounds the SYNC_FLUSH group commit has made since start (0 under ASYNC_FLUSH);
        messages acknowledged divided by this is the group-commit batching factor."""
        return self._group_commit.flush_rounds if self._group_commit is not None else 0

    @property
    def writeable(self) -> bool:
        return self._writeable

    @property
    def disk_full(self) -> str:
        """Why puts are refused for disk usage, or "" when they are not (see :meth:`set_disk_full`)."""
        return self._disk_full

    def set_disk_full(self, reason: str) -> None:
        """Refuse puts with DiskFullError(``reason``) until called with "" (RocketMQ's DISK_FULL
        run state, set and cleared by the cleanup service, libstore.commit_log_cleaner). Nothing
        already stored is affected; a SLAVE keeps replicating."""
        if reason and not self._disk_full:
            log.error("CommitLog: refusing puts: %s", reason)
        elif self._disk_full and not reason:
            log.warning("CommitLog: taking puts again: disk usage is back under the warning level")
        self._disk_full = reason

    def delete_head_segments(
        self,
        doomed: Callable[[MappedFile], str],
        *,
        batch_max: int,
        pause: Callable[[], bool] | None = None,
    ) -> list[tuple[str, int]]:
        """Delete segments from the head while ``doomed(segment)`` gives a reason
        (MappedFileQueue.delete_head_files: never the newest, never unflushed bytes, at most
        ``batch_max``); their summaries go with them. Returns (file name, bytes) per deleted
        segment. Raises StoreIOError."""
        deleted = self.queue.delete_head_files(doomed, batch_max=batch_max, pause=pause)
        self._after_head_deleted(deleted)
        return deleted

    def _after_head_deleted(self, deleted: list[tuple[str, int]]) -> None:
        """Segments went from the head: their summaries go, and the transient messages whose
        stubs they held."""
        self.summaries.drop(MappedFileQueue.parse_file_name(name) for name, _ in deleted)
        if deleted:
            self.transient.release_below(self.min_offset)

    def refresh_summaries(self, budget_bytes: int = 1 << 62) -> int:
        """Scan what the segment summaries miss (replicated bytes, the tail after a restart),
        oldest first, at most about ``budget_bytes``; returns how many gaps were closed
        (libstore.segment_summary)."""
        return self.summaries.fill_gaps(self._summarise, budget_bytes)

    def _summarise(self, start: int, end: int) -> Iterator[tuple[str, int, int]]:
        """(summary topic, store ms, offset) of each record in [start, end); StoreIOError when
        the bytes are not records or not readable yet."""
        reached = start
        for req in scan_log(self.queue, start, end, decode_properties=False, yield_blanks=True):
            if not req.success:
                raise StoreIOError(f"no record at CommitLog offset {req.commit_log_offset}")
            if req.msg_size == 0:  # the blank END record: the rest of the segment is empty
                return
            tx = req.sys_flag & MessageSysFlag.TRANSACTION_PREPARED_TYPE  # PREPARED, ROLLBACK
            yield (UNQUEUED if tx else req.topic), req.store_timestamp, req.commit_log_offset
            reached = req.next_offset
        if reached < end:
            raise StoreIOError(f"CommitLog bytes {reached}..{end} are not readable yet")

    def retention_policy(self) -> RetentionPolicy:
        """The retention settings now: fileReservedTime, topics' retentionHours, tombstones."""
        topics = self.topic_config
        return RetentionPolicy.of(topics.list(), topics.tombstones(), self.config.file_reserved_time)

    def delete_topic(self, topic: str) -> bool:
        """Remove ``topic`` from the topic table, leaving a tombstone at the log's end: every
        message it stored so far is expired (its queues' min offsets move past them, its
        segments go once nothing else holds them). False when it did not exist."""
        with self._put_lock:
            end = self.queue.get_max_wrote_position()
            return self.topic_config.delete(topic, end)

    def delete_expired_segments(
        self,
        expired_before: float,
        *,
        force: bool,
        batch_max: int,
        pause: Callable[[], bool] | None = None,
        keep_from: int | None = None,
    ) -> list[tuple[str, int]]:
        """Delete segments from the head of the log (MappedFileQueue.delete_expired_files, spec
        §9): last modified before ``expired_before`` (seconds since the epoch), or any but the
        newest with ``force``; without ``force`` none holding bytes at or past ``keep_from``.
        Returns (file name, bytes) per deleted segment; the log's ``min_offset`` is then the
        first kept segment's start. Raises StoreIOError."""
        deleted = self.queue.delete_expired_files(
            expired_before, force=force, batch_max=batch_max, pause=pause, keep_from=keep_from
        )
        self._after_head_deleted(deleted)
        return deleted

    @property
    def running(self) -> bool:
        return self._running

    @property
    def store_host(self) -> bytes:
        """The encoded store host (8 or 20 bytes) used in records and message ids."""
        return self._store_host

    @property
    def topic_config(self) -> TopicConfigManager:
        """The topic table: the one given to the constructor (also before :meth:`load`), else
        the store's own, opened by load(). ServiceNotAvailableError before load without one."""
        if self._files is None and self._topic_config is not None:
            return self._topic_config
        return self.files.topic_config

    @property
    def min_offset(self) -> int:
        """First offset still on disk (0 for an empty log)."""
        return max(self.queue.get_min_offset(), 0)

    @property
    def max_offset(self) -> int:
        """Offset just past the last readable byte."""
        return self.queue.get_max_offset()

    @property
    def flushed_offset(self) -> int:
        """Offset up to which the log is durable (fdatasync'ed)."""
        return self.queue.flushed_where

    @property
    def confirm_offset(self) -> int:
        """What consumers may see: flushed under SYNC_FLUSH, readable under ASYNC_FLUSH; under
        SYNC_MASTER, never past what the slaves hold; on a SLAVE, never past what its master
        confirmed (:meth:`set_master_confirm`)."""
        if self.config.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            confirm = self.flushed_offset
        else:
            confirm = self.max_offset
        role = self._role
        if role is BrokerRole.SYNC_MASTER:
            confirm = min(confirm, self.ha_service.replicated_offset)
        elif role is BrokerRole.SLAVE:
            confirm = min(confirm, self._master_confirm)
        return confirm

    def set_master_confirm(self, offset: int) -> None:
        """SLAVE: the master's confirm offset, as its latest replication frame said (RocketMQ 5's
        confirmOffset). The slave's own consumers see no further: bytes past it may still be
        lost with the master (a power loss before its flush) and cut from this log when it
        comes back. Persisted with the checkpoint, so a restarted slave keeps the bound."""
        if offset != self._master_confirm:
            self._master_confirm = offset
            self._notify_confirm(self.confirm_offset)

    @property
    def persisted_confirm(self) -> int:
        """What the checkpoint keeps as confirmPhyOffset: a master's replicated offset (SYNC_MASTER
        acks), a slave's master confirm offset."""
        return self._master_confirm if self._role is BrokerRole.SLAVE else self.ha_service.replicated_offset

    @property
    def broker_role(self) -> BrokerRole:
        """The current replication role (see :meth:`set_broker_role`)."""
        return self._role

    def queue_offset_of(self, topic: str, queue_id: int) -> int:
        """Next queue offset the CommitLog will assign in (topic, queue_id)."""
        return self._offsets.next_offset(topic, queue_id)

    def queue_offset_table(self) -> dict[QueueKey, int]:
        """A copy of the queue-offset table."""
        with self._put_lock:
            return dict(self._offsets.offsets)

    def save_queue_offset_snapshot(self) -> None:
        """Persist the queue-offset table with the offset and log generation it is valid at (a
        SLAVE first extends it over the bytes replicated since the last snapshot). Taken under
        the put lock, written after it: a cut in between makes it stale, and it is then not
        written (QueueOffsetTable.save), or not trusted should it land anyway."""
        if self._role is BrokerRole.SLAVE:
            self.refresh_queue_offsets()
        with self._put_lock:
            table = self._offsets
            offset = (
                table.covered_to if self._role is BrokerRole.SLAVE else self.queue.get_max_wrote_position()
            )
            snapshot = table.snapshot_at(offset, self.generation)
        table.save(snapshot, self.generation)

    def refresh_queue_offsets(self) -> int:
        """SLAVE: extend the queue-offset table over the records replicated since it was last
        brought up to date (scanned outside the put lock). Returns the records scanned."""
        with self._put_lock:
            start, table, gen = (
                self._offsets.covered_to,
                dict(self._offsets.offsets),
                self.generation.generation,
            )
            end = self.queue.get_max_wrote_position()
        if end <= start:
            return 0
        offsets, scanned, _ = rebuild_queue_offsets(self.queue, QueueOffsetSnapshot(start, table), end)
        with self._put_lock:
            if self._offsets.covered_to == start and self.generation.generation == gen:
                self._offsets.replace(offsets, end)
        return scanned

    # ------------------------------------------------------------------------------------------
    # replication (spec sheet §7)
    # ------------------------------------------------------------------------------------------
    def set_broker_role(self, role: BrokerRole) -> None:
        """Switch role at run time, between puts. Becoming a master: the queue-offset table is
        brought up to the log's end and everything already in the log counts as replicated (it
        came from the previous master). Becoming a SLAVE: puts are refused from now on and
        pending SYNC_MASTER waits end with SLAVE_NOT_AVAILABLE. The caller persists the role
        (``ha_state.save_role``); a store that becomes the master goes through
        :meth:`start_master_term` instead, which also begins its epoch."""
        self._switch_role(role, begin_term=False, min_epoch=0)

    def start_master_term(self, role: BrokerRole, min_epoch: int = 0) -> EpochEntry:
        """Become (or stay) the master in ``role`` and begin a new epoch at the log's end
        (:meth:`HAState.begin_term`: ``max(last + 1, min_epoch)``), persisted before any put can
        land in it: at every start, restart and promotion of a master (spec sheet §7). Returns
        the new entry. Raises ValueError for ``role`` SLAVE, StoreIOError when the epoch cannot
        be persisted (the role is then unchanged)."""
        if role is BrokerRole.SLAVE:
            raise ValueError("a SLAVE does not begin a master term")
        entry = self._switch_role(role, begin_term=True, min_epoch=min_epoch)
        assert entry is not None
        return entry

    def _switch_role(self, role: BrokerRole, *, begin_term: bool, min_epoch: int) -> EpochEntry | None:
        old = self._role
        if old is BrokerRole.SLAVE and role is not BrokerRole.SLAVE:
            self.refresh_queue_offsets()
        entry = None
        with self._put_lock:
            end = self.queue.get_max_wrote_position()
            if begin_term:
                entry = self.ha_state.begin_term(end, min_epoch)
            if old is BrokerRole.SLAVE and role is not BrokerRole.SLAVE:
                table = self._offsets
                if table.covered_to < end:
                    snapshot = QueueOffsetSnapshot(table.covered_to, table.offsets)
                    table.offsets, _, _ = rebuild_queue_offsets(self.queue, snapshot, end)
                table.covered_to = end
                self._round_robin.clear()
                self.ha_service.reset_replicated_offset(end)
            elif role is BrokerRole.SLAVE and old is not BrokerRole.SLAVE:
                self._offsets.covered_to = end
                # A failover: the new master never had the transient messages.
                self.transient.truncate_from(0)
                self._master_confirm = self.confirm_offset  # no more than it showed as the master
            if role is not BrokerRole.SLAVE:
                # Tombstones copied from a master that held more: this log's new messages
                # start at its own end.
                self.topic_config.clamp_tombstones(end)
            self._role = role
        if role is not BrokerRole.SYNC_MASTER:
            self.ha_service.fail_waiters(PutMessageStatus.SLAVE_NOT_AVAILABLE)
        if old is not role:
            log.info("broker role %s -> %s at CommitLog offset %d", old.value, role.value, self.max_offset)
        self._notify_confirm(self.confirm_offset)
        return entry

    def append_replica(self, offset: int, data: bytes | memoryview) -> int:
        """SLAVE: append log bytes received from the master at the same ``offset``; returns the
        new end of the log. ``data`` holds whole records and may end with the 8-byte blank END
        record of its segment (then the segment is full and the next append starts the next one).

        Raises ServiceNotAvailableError on a master or a stopped store, OffsetOutOfRangeError
        when ``offset`` is not this log's end, CorruptRecordError when the
        bytes are not whole records of one segment. Nothing is written when it raises.
        """
        if self._role is not BrokerRole.SLAVE:
            raise ServiceNotAvailableError("only a SLAVE takes replicated log bytes")
        n = len(data)
        if n == 0:
            return self.max_offset
        with self._put_lock:
            if not self._running:
                raise ServiceNotAvailableError("the store is shutting down")
            try:
                new_end = append_replicated(self.queue, self.summaries, offset, data)
            except StoreIOError as exc:
                self._on_io_error(exc)
                raise
            self._last_record_at = -1  # not tracked for replicated bytes: the next start scans
        self._after_append(new_end)
        return new_end

    def truncate_to(self, offset: int) -> None:
        """SLAVE: cut the log at ``offset`` (a record boundary), e.g. the tail a returning master
        wrote that its successor never had. Bumps the log generation first, rebuilds the
        queue-offset table, forgets epochs past the cut, and wakes tail readers.

        Raises OffsetOutOfRangeError when ``offset`` is not where a record (or a segment's
        blank END record) starts: such a cut would leave half a record for the next recovery
        to drop, acknowledged messages with it; nothing is cut then."""
        if self._role is not BrokerRole.SLAVE:
            raise ServiceNotAvailableError("only a SLAVE cuts its log")
        with self._put_lock:
            end = self.queue.get_max_wrote_position()
            if offset >= end:
                return
            if not is_record_boundary(self.queue, offset):
                raise OffsetOutOfRangeError(f"cannot cut the CommitLog at {offset}: no record starts there")
            self._cut_locked(offset, drop_all=False)
            log.warning("CommitLog cut at %d (%d bytes dropped)", offset, end - offset)
        self._notify_confirm(self.confirm_offset)

    def reset_to(self, offset: int) -> None:
        """SLAVE: drop the whole log and start it again at ``offset`` (a segment boundary): the
        master no longer holds what would follow this log's end."""
        if self._role is not BrokerRole.SLAVE:
            raise ServiceNotAvailableError("only a SLAVE resets its log")
        with self._put_lock:
            self._cut_locked(offset, drop_all=True)
            log.warning("CommitLog reset to start at %d", offset)
        self._notify_confirm(self.confirm_offset)

    def _cut_locked(self, offset: int, *, drop_all: bool) -> None:
        """Make the log end at ``offset`` (put lock held): bump the log generation first (cut
        point 0 when ``drop_all``, else ``offset``), then drop the bytes past ``offset`` (with
        ``drop_all`` every byte, the log restarting empty at ``offset``), rebuild and save the
        queue-offset table, and forget epochs that start past ``offset``."""
        self.generation.bump(0 if drop_all else offset)
        self._last_record_at = -1
        self.transient.truncate_from(0 if drop_all else offset)
        if self.checkpoint.flushed_phy_offset > offset or drop_all:
            # Lowered durably before the bytes go: recovery must never start past the new end.
            self.checkpoint.flushed_phy_offset = 0 if drop_all else offset
            self.checkpoint.flush()
        cut_segments(self.queue, self.summaries, offset, drop_all=drop_all)
        offsets: dict[QueueKey, int] = {}
        if not drop_all:
            snapshot = self._offsets.load(offset, self.generation)
            offsets, _, _ = rebuild_queue_offsets(self.queue, snapshot, offset)
        self._offsets.replace(offsets, offset)
        self.topic_config.clamp_tombstones(offset)
        self._master_confirm = min(self._master_confirm, offset)  # the new master's frames say more
        self._offsets.save(self._offsets.snapshot_at(offset, self.generation, offsets), self.generation)
        self.ha_state.truncate(offset)

    def read_chunk(self, offset: int, limit: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole records from ``offset`` for a follower (libstore.replica_segments.read_chunk):
        (bytes, offset of the next chunk). Raises OffsetOutOfRangeError, CorruptRecordError."""
        return read_chunk(self.queue, offset, limit, max_bytes)

    # ------------------------------------------------------------------------------------------
    # read path
    # ------------------------------------------------------------------------------------------
    def get_message(self, phy_offset: int, size: int) -> bytes:
        """The raw bytes of the record at ``phy_offset`` (``size`` bytes, as put results give);
        libstore.log_reads.read_record. Raises OffsetOutOfRangeError."""
        return read_record(self.queue, phy_offset, size)

    def read_many(
        self, ranges: Sequence[tuple[int, int]], *, max_bytes: int = 0, max_record_size: int = 0
    ) -> list[bytes | None]:
        """Whole records at (offset, size) ranges (size 0: as TOTALSIZE says), None where the
        log no longer holds one; a transient message's stub reads as its whole record.
        libstore.log_reads.read_records. Raises InvalidArgumentError past ``max_bytes``."""
        return read_records(
            self.queue, self.transient, ranges, max_bytes=max_bytes, max_record_size=max_record_size
        )

    def read_many_framed(
        self, ranges: Sequence[tuple[int, int]], tag: int, *, max_bytes: int = 0, max_record_size: int = 0
    ) -> bytes:
        """:meth:`read_many`'s records framed as a protobuf ``repeated bytes`` field with the
        one-byte ``tag`` (libstore.log_reads.read_records_framed: a reply's records copied once,
        out of the mapping). Raises InvalidArgumentError past ``max_bytes``."""
        return read_records_framed(
            self.queue, self.transient, ranges, tag, max_bytes=max_bytes, max_record_size=max_record_size
        )

    def read_message(self, phy_offset: int, size: int | None = None) -> MessageRecord:
        """Decode the record at ``phy_offset`` (libstore.log_reads.decode_record_at); raises
        OffsetOutOfRangeError (also for a transient message no longer held) or CorruptRecordError."""
        return decode_record_at(self.queue, self.transient, phy_offset, size)

    def scan_records(
        self, from_offset: int, end_offset: int, *, decode_properties: bool = True
    ) -> Iterator[DispatchRequest]:
        """Everything dispatch needs between two record boundaries: valid records, blank END
        records (``msg_size`` 0) and, if the scan meets bytes that are not a record, one last
        request with ``success`` False (see libstore.log_scanner.scan_log)."""
        return scan_log(
            self.queue, from_offset, end_offset, decode_properties=decode_properties, yield_blanks=True
        )

    def roll_next_file(self, offset: int) -> int:
        """Start of the segment after the one holding ``offset``."""
        return self.queue.roll_next_file(offset)

    def stop_accepting(self) -> None:
        """Refuse new puts from now on and wait for the one in flight (shutdown, step 1)."""
        self._running = False
        with self._put_lock:
            pass

    def pickup_store_timestamp(self, phy_offset: int, size: int) -> int:
        """STORETIMESTAMP (ms) of the record at ``phy_offset``, or -1 when the log no longer
        holds it (RocketMQ ``pickupStoreTimestamp``; libstore.log_reads.store_timestamp_of)."""
        return store_timestamp_of(self.queue, phy_offset, size)

    def iter_records(
        self,
        from_offset: int,
        end_offset: int | None = None,
        *,
        check_crc: bool = False,
        decode_properties: bool = True,
    ) -> Iterator[DispatchRequest]:
        """Records from ``from_offset`` (a record boundary) to ``end_offset`` (default: the
        confirm offset when called). Raises CorruptRecordError on bytes that are not a record."""
        end = self.confirm_offset if end_offset is None else end_offset
        start = max(from_offset, self.min_offset)
        for req in scan_log(self.queue, start, end, check_crc=check_crc, decode_properties=decode_properties):
            if not req.success:
                raise CorruptRecordError(f"invalid record at offset {req.commit_log_offset}")
            yield req


class _SnapshotService(ServiceThread):
    """Every ``interval_ms``: flush the checkpoint and save the queue-offset snapshot."""

    def __init__(self, commit_log: CommitLog, interval_ms: int) -> None:
        super().__init__("CommitLogSnapshotService")
        self.commit_log = commit_log
        self.interval_ms = interval_ms

    def run_loop(self) -> None:
        self._stopped.wait(self.interval_ms / 1000.0)
        if self.stopped:
            return
        cl = self.commit_log
        if not cl.writeable:
            return
        try:
            cl.checkpoint.confirm_phy_offset = cl.persisted_confirm
            cl.checkpoint.flush()
            cl.save_queue_offset_snapshot()
        except StoreIOError as exc:
            cl._on_io_error(exc)


_TOPIC_OF = operator.itemgetter(0)


def _run_topics(keys: list[QueueKey | None], i: int, j: int) -> Iterable[str]:
    """The topics of records ``i..j-1`` (UNQUEUED for one that takes no queue offset), for the
    segment summary; C loops when every record has a queue key, as nearly all do."""
    if j - i == 1:
        key = keys[i]
        return (key[0] if key else UNQUEUED,)
    run = keys[i:j]
    if None in run:
        return {k[0] if k else UNQUEUED for k in run}
    return set(map(_TOPIC_OF, cast("list[QueueKey]", run)))  # no None in the run
