"""DispatchApp: the dispatch service's objects (ConsumeQueues, consumer offsets, long polling,
the tail follower) and, when given an address, its gRPC server."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

from opentelemetry.metrics import Observation

from libstore import StoreConfig
from libstore._os import physical_memory
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.consumer_offset_manager import (
    ConsumerOffsetManager,
    ConsumerOffsetPersistService,
    QueueProgress,
)
from libstore.dispatch import CommitLogDispatcher, DispatchCheckpoint, recover_consume_queues
from libstore.long_polling import LongPollingService
from libstore.record_codec import check_record
from libstore.retention_policy import RetentionPolicy
from libstore.store_paths import consume_queue_dir, consumer_offset_path, dispatch_checkpoint_path
from libstore.system_topics import POP_JOURNAL_TOPIC
from services._common.derived_app import DerivedStoreApp
from services._common.metrics import observer, register_once
from services._common.tail_follower import QueueKey
from services._common.telemetry import meter
from services.dispatch.local import LocalDispatch
from services.dispatch.pop import PopService
from services.dispatch.receipt_signer import ReceiptSigner
from services.dispatch.retention import QueueRetention
from services.dispatch.timer import TimerService
from services.dispatch.transaction import TransactionService
from services.dispatch.transient_release import TransientRelease
from services.ports import CommitLogPort


class DispatchApp(DerivedStoreApp):
    """Folder ``config.store_path_root_dir``: ``consumequeue/``, ``config/consumerOffset.json``,
    ``config/subscriptionGroup.json``, ``pop/`` (pop state, services.dispatch.pop), ``timer/``
    (scheduled delivery, services.dispatch.timer) and ``transaction/`` (check-backs,
    services.dispatch.transaction)."""

    name = "dispatch"

    def __init__(self, config: StoreConfig, commitlog: CommitLogPort) -> None:
        super().__init__(config, commitlog)
        self.queues = ConsumeQueueStore(consume_queue_dir(self.root), config.mapped_file_size_consume_queue)
        self.offsets = ConsumerOffsetManager(
            consumer_offset_path(self.root), max_group_length=config.max_group_name_length
        )
        self.long_polling = LongPollingService(self.queues.max_offset_of, max_waiters=config.max_held_polls)
        self.pop = PopService(
            self.root,
            self.queues,
            self.offsets,
            self.long_polling,
            commitlog,
            reput_offset=lambda: self.follower.reput_offset if self.follower is not None else 0,
            max_group_length=config.max_group_name_length,
            signer=ReceiptSigner.load(
                self.root, Path(config.pop_receipt_key_file) if config.pop_receipt_key_file else None
            ),
            in_memory_bytes=physical_memory() * config.access_message_in_memory_max_ratio // 100,
        )
        self.timer = TimerService(self.root, self.queues, commitlog)
        self.transactions = TransactionService(
            self.root,
            self.queues,
            commitlog,
            timeout_ms=config.transaction_timeout,
            interval_ms=config.transaction_check_interval,
            check_max=config.transaction_check_max,
        )
        self.port = LocalDispatch(
            self.queues,
            self.offsets,
            self.long_polling,
            self.pop,
            self.transactions,
            self._store_time_of,
            lambda: self.derived_status(),
            max_batch=config.max_pull_batch_size,
            max_bytes=config.max_transfer_bytes_on_message_in_memory,
        )
        self.retention = QueueRetention(self.queues, self._store_time_of)
        self.transient_release = TransientRelease(
            self.queues,
            self.offsets,
            commitlog,
            lambda: self.follower.position if self.follower is not None else (0, "", 0),
        )
        self.units_cut = 0  # ConsumeQueue units recovery cut at start
        self._background: list[asyncio.Task[None]] = []
        self._background_stop = asyncio.Event()
        self._offset_persist = ConsumerOffsetPersistService(
            self.offsets, config.flush_consumer_offset_interval, self._on_io_error
        )

    async def _store_time_of(self, phy_offset: int, size: int) -> int:
        (raw,) = await self.commitlog.read([(phy_offset, size)])
        if not raw:
            return -1
        req = check_record(raw, 0, len(raw), check_crc=False, decode_properties=False)
        return req.store_timestamp if req.success else -1

    # -- hooks ------------------------------------------------------------------------------------
    def _load(self) -> None:
        self.queues.load()
        self.retention.load()
        self.transient_release.load()
        self.offsets.load()
        self.pop.load()
        self.timer.load()
        self.transactions.load()

    def _recover(self, log_min: int, log_max: int, last_exit_ok: bool) -> int:
        resume, self.units_cut = recover_consume_queues(
            self.queues, self._checkpoint_file(), log_min, log_max, last_exit_ok
        )
        self.pop.journal.rollback(log_max)  # no pop snapshot past the log's end is trusted
        self.transient_release.clamp()  # the saved stubs, to the queues as recovered
        self.retention.clamp(log_max)
        self.retention.apply_saved()
        return resume

    async def _retention_round(self) -> int:
        topics = await self.commitlog.list_topics()
        tombstones = await self.commitlog.topic_tombstones()
        policy = RetentionPolicy.of(topics, tombstones, self.config.file_reserved_time)
        return await self.retention.run_once(policy, int(time.time() * 1000))

    def _dispatchers(self) -> Sequence[CommitLogDispatcher]:
        return [self.queues, self.transient_release]

    def _on_arrival(self, arrived: Mapping[QueueKey, int]) -> None:
        self.long_polling.notify_many(arrived)
        if (POP_JOURNAL_TOPIC, 0) in arrived:
            self.pop.journal.wake()

    def _cut(self, log_end: int, reput_offset: int) -> int:
        self.queues.truncate_dirty(log_end)
        self.transient_release.clamp()
        self.retention.clamp(log_end)
        self.pop.journal.rollback(log_end)
        return min(reput_offset, log_end)

    def _flush(self, least_pages: int) -> None:
        self.queues.flush(least_pages)

    def _flush_all(self) -> None:
        self.queues.flush_all()
        self.transient_release.save()  # after the checkpoint's offset was sampled (module doc)

    def _delete_expired(self, commit_log_min_offset: int) -> int:
        pause_s = self.config.delete_consume_queue_files_interval / 1000.0

        def pause() -> bool:  # deleteConsumeQueueFilesInterval between queues, as RocketMQ
            time.sleep(pause_s)
            return True

        return self.queues.delete_expired(commit_log_min_offset, pause=pause)

    def _close(self) -> None:
        self.queues.shutdown()

    def _checkpoint_file(self) -> DispatchCheckpoint:
        return DispatchCheckpoint(dispatch_checkpoint_path(consume_queue_dir(self.root)))

    # -- life -------------------------------------------------------------------------------------
    async def start(self) -> None:
        await super().start()
        register_once("mqstore.dispatch.consumers", _register_consumer_metrics)
        _LIVE.add(self)
        self.pop.start()
        self._offset_persist.start()
        self._background_stop = asyncio.Event()
        self._background = [
            asyncio.create_task(self.pop.run_revive(self._background_stop)),
            asyncio.create_task(self.timer.run(self._background_stop)),
            asyncio.create_task(self.transactions.run_orphan_sweep(self._background_stop)),
            asyncio.create_task(self.transient_release.run(self._background_stop)),
        ]

    def consumer_lag(self) -> list[Observation]:
        """Per consumer group and topic: messages still to consume, summed over the topic's
        queues (QueueProgress.lag: from the committed offset, or the queue's min, to its max)."""
        out = []
        for group, topic in self.offsets.groups():
            committed = self.offsets.offsets_of(group, topic)
            lag = sum(
                QueueProgress(
                    cq.queue_id,
                    committed.get(cq.queue_id, -1),
                    cq.min_offset_in_queue,
                    cq.max_offset_in_queue,
                ).lag
                for cq in self.queues.queues_of(topic)
            )
            out.append(Observation(lag, {"group": group, "topic": topic}))
        return out

    def transient_release_counts(self) -> list[Observation]:
        """Transient release rounds run and transient messages freed, since start."""
        release = self.transient_release
        return [
            Observation(release.rounds, {"what": "rounds"}),
            Observation(release.messages_released, {"what": "messages"}),
        ]

    async def stop(self) -> None:
        _LIVE.discard(self)
        self._background_stop.set()
        for task in self._background:
            await task
        self._background = []
        self.long_polling.wake_all()
        await self.pop.close()  # while the follower still runs: its snapshot reads the journal back
        await super().stop()
        await asyncio.to_thread(self._offset_persist.shutdown)


# The dispatch stores of this process, read by the consumer lag gauge when something collects.
_LIVE: weakref.WeakSet[DispatchApp] = weakref.WeakSet()


def _register_consumer_metrics() -> None:
    meter("mqstore.dispatch").create_observable_gauge(
        "mqstore.consumer.lag",
        [observer(_LIVE, DispatchApp.consumer_lag)],
        description="messages a consumer group has still to consume in a topic (all its queues)",
    )
    meter("mqstore.dispatch").create_observable_gauge(
        "mqstore.pull.held",
        [observer(_LIVE, lambda app: [Observation(app.long_polling.waiting)])],
        description="pulls and pops held on the dispatch service until a message arrives or their wait ends",
    )
    meter("mqstore.dispatch").create_observable_counter(
        "mqstore.transient.release",
        [observer(_LIVE, DispatchApp.transient_release_counts)],
        description="transient release rounds run (what=rounds) and transient messages they freed"
        " (what=messages) since the dispatch service started",
    )
