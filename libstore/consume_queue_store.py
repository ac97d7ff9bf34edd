"""ConsumeQueueStore: every ConsumeQueue of a store, and the dispatcher that fills them.

Layout: ``consumequeue/<topic>/<queueId>/<20-digit offset>`` (spec sheet §0, §3). Dispatch
(:meth:`ConsumeQueueStore.dispatch`) appends one unit per CommitLog record whose transaction
type is NOT or COMMIT; PREPARED and ROLLBACK records and blank END records get none (§9).

Flushing (RocketMQ's FlushConsumeQueueService, §6): every ``flushIntervalConsumeQueue`` ms the
queues with at least ``flushConsumeQueueLeastPages`` dirty pages are flushed; every
``flushConsumeQueueThoroughInterval`` ms all of them are, and then the caller's checkpoint hook
runs (the dispatcher saves how far the flushed queues are complete).

Thread-safety: one dispatcher thread appends; readers may look queues up and read from any
thread; queue creation is locked.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from libstore.consume_queue import ConsumeQueue
from libstore.dispatch_request import DispatchRequest
from libstore.errors import StoreIOError
from libstore.queue_runs import QueueRun, queue_runs
from libstore.service_thread import ServiceThread

log = logging.getLogger(__name__)


class ConsumeQueueStore:
    """The ConsumeQueues under ``store_path`` (the ``consumequeue`` folder).

    ``mapped_file_size`` is the configured segment size in bytes (6,000,000 by default).
    """

    def __init__(self, store_path: Path, mapped_file_size: int) -> None:
        self.store_path = Path(store_path)
        self.mapped_file_size = mapped_file_size
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------
    def load(self) -> None:
        """Map every queue found on disk. Raises StoreIOError."""
        self.store_path.mkdir(parents=True, exist_ok=True)
        queues: dict[tuple[str, int], ConsumeQueue] = {}
        for topic_entry in sorted(os.scandir(self.store_path), key=lambda e: e.name):
            if not topic_entry.is_dir():
                continue
            for queue_entry in os.scandir(topic_entry.path):
                if not (queue_entry.is_dir() and queue_entry.name.isdigit()):
                    continue
                cq = ConsumeQueue(
                    topic_entry.name, int(queue_entry.name), self.store_path, self.mapped_file_size
                )
                cq.load()
                queues[(cq.topic, cq.queue_id)] = cq
        self._queues = queues

    def recover(self) -> None:
        """Keep each queue's valid prefix (see ConsumeQueue.recover)."""
        for cq in self._queues.values():
            cq.recover()

    def shutdown(self) -> None:
        for cq in list(self._queues.values()):
            cq.shutdown()

    def destroy(self) -> None:
        """Delete every queue (a rebuild from the CommitLog follows)."""
        with self._lock:
            for cq in self._queues.values():
                cq.destroy()
            self._queues = {}

    # -- lookup ---------------------------------------------------------------------------------
    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get((topic, queue_id))

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            with self._lock:
                cq = self._queues.get((topic, queue_id))
                if cq is None:
                    cq = ConsumeQueue(topic, queue_id, self.store_path, self.mapped_file_size)
                    cq.queue.store_path.mkdir(parents=True, exist_ok=True)
                    self._queues = {**self._queues, (topic, queue_id): cq}
        return cq

    def queues(self) -> Iterator[ConsumeQueue]:
        return iter(list(self._queues.values()))

    def max_offset_of(self, topic: str, queue_id: int) -> int:
        """The queue offset the next unit of (topic, queue id) takes; 0 for an unknown queue."""
        cq = self._queues.get((topic, queue_id))
        return cq.max_offset_in_queue if cq is not None else 0

    def queues_of(self, topic: str, queue_id: int = -1) -> list[ConsumeQueue]:
        """The ConsumeQueues of one topic by queue id (a snapshot); with ``queue_id`` >= 0 only
        that queue (none when it has no ConsumeQueue)."""
        if queue_id >= 0:
            cq = self._queues.get((topic, queue_id))
            return [cq] if cq is not None else []
        # list(): one step under the GIL, so a metrics scrape on another thread may call this
        # while the dispatch thread adds a queue.
        return sorted(
            (cq for (t, _), cq in list(self._queues.items()) if t == topic), key=lambda cq: cq.queue_id
        )

    def topics(self) -> dict[str, list[int]]:
        """Queue ids of every topic that has a ConsumeQueue."""
        out: dict[str, list[int]] = {}
        for topic, qid in sorted(self._queues):
            out.setdefault(topic, []).append(qid)
        return out

    @property
    def max_physic_offset(self) -> int:
        """Largest message end any queue points to (-1 when all are empty)."""
        return max((cq.max_physic_offset for cq in self._queues.values()), default=-1)

    # -- dispatch -------------------------------------------------------------------------------
    def dispatch(self, req: DispatchRequest) -> None:
        """Apply one record (see :meth:`dispatch_batch`)."""
        self.dispatch_batch((req,))

    def dispatch_batch(self, requests: Sequence[DispatchRequest]) -> None:
        """Apply consecutive records: a unit for NOT/COMMIT records, nothing for PREPARED and
        ROLLBACK ones (spec §9). Each queue's records are written as one run (libstore.queue_runs).

        Raises StoreIOError when a queue cannot be written.
        """
        self.dispatch_runs(queue_runs(requests))

    def dispatch_runs(self, runs: Sequence[QueueRun]) -> None:
        """:meth:`dispatch_batch` for records already grouped by queue (libstore.queue_runs,
        units included). Raises StoreIOError."""
        queues = self._queues
        for topic, queue_id, first, _, first_end, last_end, units, members, _ in runs:
            cq = queues.get((topic, queue_id)) or self.find_or_create(topic, queue_id)
            if units is not None and cq.put_packed(units, first, first_end, last_end):
                continue
            for req in members:  # a hole or a repeat, a roll, a replay: record by record
                cq.put_message_position_info(
                    req.commit_log_offset, req.msg_size, req.tags_code, req.consume_queue_offset
                )

    def truncate_dirty(self, phy_offset: int) -> int:
        """Cut units pointing at or past CommitLog offset ``phy_offset``; returns how many."""
        return sum(cq.truncate_dirty_logic_files(phy_offset) for cq in self._queues.values())

    def delete_expired(self, commit_log_min_offset: int, *, pause: Callable[[], bool] | None = None) -> int:
        """Delete, queue after queue, the ConsumeQueue segments wholly below the CommitLog's
        min offset and correct each queue's min offset (ConsumeQueue.delete_expired_files);
        ``pause`` runs after each queue that deleted something and returns False to stop early.
        Returns how many segments were deleted. Raises StoreIOError."""
        total = 0
        for cq in list(self._queues.values()):
            n = cq.delete_expired_files(commit_log_min_offset)
            total += n
            if n and pause is not None and not pause():
                break
        return total

    def correct_min_offsets(self, commit_log_min_offset: int) -> None:
        for cq in self._queues.values():
            cq.correct_min_offset(commit_log_min_offset)

    # -- flush ----------------------------------------------------------------------------------
    def flush(self, least_pages: int) -> None:
        """Flush each queue's current segment when ``least_pages`` are dirty (0: anything)."""
        for cq in list(self._queues.values()):
            cq.flush(least_pages)

    def flush_all(self) -> None:
        """Flush every unit written so far. Raises StoreIOError."""
        for cq in list(self._queues.values()):
            cq.flush_all()


class FlushConsumeQueueService(ServiceThread):
    """Periodic flush of derived files (ConsumeQueues, IndexFiles) and the dispatch checkpoint.

    ``flush(least_pages)`` flushes what is dirty; ``checkpoint()`` runs after a thorough flush
    (everything) and must make the flushed state's progress durable. On shutdown both run once
    more. ``on_io_error`` receives a StoreIOError (fail-stop is the owner's decision).
    """

    def __init__(
        self,
        flush: Callable[[int], None],
        checkpoint: Callable[[], None],
        on_io_error: Callable[[StoreIOError], None],
        *,
        interval_ms: int,
        least_pages: int,
        thorough_interval_ms: int,
    ) -> None:
        super().__init__("FlushConsumeQueueService")
        self._flush = flush
        self._checkpoint = checkpoint
        self._on_io_error = on_io_error
        self.interval_ms = interval_ms
        self.least_pages = least_pages
        self.thorough_interval_ms = thorough_interval_ms
        self._last_thorough = time.monotonic()

    def run_loop(self) -> None:
        self._stopped.wait(self.interval_ms / 1000.0)
        if self.stopped:
            return
        now = time.monotonic()
        thorough = (now - self._last_thorough) * 1000 >= self.thorough_interval_ms
        if thorough:
            self._last_thorough = now
        self._run(thorough)

    def _run(self, thorough: bool) -> None:
        try:
            if thorough:
                self._checkpoint()
            else:
                self._flush(self.least_pages)
        except StoreIOError as exc:
            self._on_io_error(exc)

    def on_shutdown(self) -> None:
        self._run(True)
