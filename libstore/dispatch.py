"""Dispatch (RocketMQ's reput): apply new CommitLog records to the derived stores.

:class:`ReputMessageService` reads records from its reput offset up to a source's confirm offset
(flushed bytes under SYNC_FLUSH, written bytes under ASYNC_FLUSH), hands each one to every
:class:`CommitLogDispatcher` (the ConsumeQueues, the IndexService), advances, and reports the new
max offset of every queue it touched so held pulls wake up (spec sheet §5, "Reput loop").

Progress: :class:`DispatchCheckpoint` persists a reput offset only after the derived files are
flushed up to it, so it is a lower bound of what they durably hold; a restart replays from
there (dispatchers skip what they already have). Blank END records move to the next segment;
bytes that do not decode with a size are skipped with an error log, as RocketMQ does; an I/O
error in a dispatcher stops progress (logged) and the same records are retried later.

Thread-safety: one thread runs the loop; :meth:`ReputMessageService.wakeup` may be called from
any thread (the CommitLog calls it when its confirm offset moves).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from libstore._files import atomic_write, read_json
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.errors import StoreError, StoreIOError
from libstore.index_service import IndexService
from libstore.message import MessageSysFlag
from libstore.record_codec import DispatchRequest
from libstore.service_thread import ServiceThread

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


class CommitLogDispatcher(Protocol):
    """Something built from CommitLog records (ConsumeQueueStore, IndexService).

    ``dispatch_batch`` gets consecutive records in log order and must be idempotent: the same
    records may be handed in again after a restart.
    """

    def dispatch_batch(self, requests: Sequence[DispatchRequest]) -> None: ...


class RecordSource(Protocol):
    """Where records come from: a local CommitLog (or, in the split topology, a tailed copy)."""

    @property
    def min_offset(self) -> int: ...

    @property
    def confirm_offset(self) -> int: ...

    def roll_next_file(self, offset: int) -> int: ...

    def scan_records(self, from_offset: int, end_offset: int) -> Iterator[DispatchRequest]: ...


class DispatchCheckpoint:
    """``{"reputOffset": N, "logId": ..., "generation": G}`` in a JSON file, replaced atomically.

    ``N`` is a CommitLog offset up to which the owner's derived files were flushed; ``logId``
    and ``G`` the log generation they were read in (libstore.log_generation; "" and 0 when
    unknown).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> int | None:
        """The saved offset, or None when there is none (or it does not parse: rebuild)."""
        try:
            data = read_json(self.path, "dispatch checkpoint")
            return None if data is None else int(data["reputOffset"])
        except (StoreIOError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable dispatch checkpoint %s: %s", self.path, exc)
            return None

    def load_generation(self) -> tuple[str, int]:
        """The saved (log id, generation), or ("", 0) when unknown."""
        try:
            data = read_json(self.path, "dispatch checkpoint")
            if data is None:
                return "", 0
            return str(data.get("logId", "")), int(data.get("generation", 0))
        except (StoreIOError, ValueError, TypeError, AttributeError):
            return "", 0

    def save(self, reput_offset: int, log_id: str = "", generation: int = 0) -> None:
        """Persist ``reput_offset`` (and the log generation it was read in). Raises StoreIOError."""
        data = {"reputOffset": reput_offset, "logId": log_id, "generation": generation}
        atomic_write(self.path, json.dumps(data).encode("utf-8"))


def apply_chunk(
    dispatchers: Sequence[CommitLogDispatcher], chunk: Sequence[DispatchRequest]
) -> dict[QueueKey, int]:
    """Hand consecutive records to every dispatcher; return {(topic, queue id): new max queue
    offset} of the queues they reached (for long polling). Raises what a dispatcher raises."""
    for dispatcher in dispatchers:
        dispatcher.dispatch_batch(chunk)
    no_queue_offset = MessageSysFlag.TRANSACTION_PREPARED_TYPE  # PREPARED 0x4, ROLLBACK 0xC
    return {
        (req.topic, req.queue_id): req.consume_queue_offset + 1
        for req in chunk
        if not req.sys_flag & no_queue_offset
    }


def resume_offset(checkpoint: DispatchCheckpoint, log_min: int, log_max: int) -> int:
    """Where a derived store resumes: its checkpoint clamped into the log, the log's start without one."""
    saved = checkpoint.load()
    if saved is None:
        return log_min
    return min(max(saved, log_min), log_max)


def recover_consume_queues(
    store: ConsumeQueueStore,
    checkpoint: DispatchCheckpoint,
    log_min: int,
    log_max: int,
    last_exit_ok: bool = True,
) -> tuple[int, int]:
    """Bring loaded ConsumeQueues in line with a log holding ``[log_min, log_max)``: keep each
    queue's valid prefix, cut units pointing past the log's end, and after a crash also every
    unit for a record at or past the checkpoint (such units were never flushed: a power loss may
    have torn them, a tags code or an offset half old bytes, and dispatch, which passes over
    records its queues already hold, would never write them again); fix min offsets. Returns
    (CommitLog offset to resume dispatch from, units cut)."""
    store.recover()
    resume = resume_offset(checkpoint, log_min, log_max)
    cut = store.truncate_dirty(log_max if last_exit_ok else resume)
    store.correct_min_offsets(log_min)
    return resume, cut


def recover_index(
    index: IndexService, checkpoint: DispatchCheckpoint, log_min: int, log_max: int, last_exit_ok: bool
) -> tuple[int, int | None]:
    """Bring loaded IndexFiles in line with the log: files with entries past the log's end, or
    (after a crash) past the checkpoint, may be torn and are deleted. Returns (CommitLog offset
    to resume dispatch from, offset the rebuild starts at or None)."""
    resume = resume_offset(checkpoint, log_min, log_max)
    restart = index.discard_after(log_max if last_exit_ok else min(resume, log_max))
    if restart is None:
        return resume, None
    resume = min(resume, max(restart, log_min))
    return resume, resume


class ReputMessageService(ServiceThread):
    """The dispatch loop (see module docstring).

    ``on_arrival(max_offsets)`` gets {(topic, queue id): new max queue offset} after each chunk;
    ``chunk_records`` bounds a chunk so held pulls wake while a backlog is replayed.
    """

    def __init__(
        self,
        source: RecordSource,
        dispatchers: list[CommitLogDispatcher],
        reput_from_offset: int,
        *,
        on_arrival: Callable[[Mapping[QueueKey, int]], None] | None = None,
        chunk_records: int = 4096,
        idle_wait_ms: int = 100,
    ) -> None:
        super().__init__("ReputMessageService")
        self.source = source
        self.dispatchers = dispatchers
        self.reput_from_offset = reput_from_offset
        self.on_arrival = on_arrival
        self.chunk_records = chunk_records
        self.idle_wait_ms = idle_wait_ms
        self.records_dispatched = 0
        self._progress = threading.Condition()
        self._failing = False

    @property
    def behind(self) -> int:
        """Bytes of confirmed log not yet dispatched."""
        return max(0, self.source.confirm_offset - self.reput_from_offset)

    def run_loop(self) -> None:
        if not self.do_reput():
            self.wait_for_running(self.idle_wait_ms)

    def do_reput(self) -> bool:
        """Dispatch one chunk. Returns True when it made progress (more may be waiting)."""
        source = self.source
        start = self.reput_from_offset
        min_offset = source.min_offset
        if start < min_offset:
            log.warning("reput offset %d is below the CommitLog's min %d; skipping ahead", start, min_offset)
            start = self.reput_from_offset = min_offset
        end = source.confirm_offset
        if start >= end:
            return False
        chunk: list[DispatchRequest] = []
        scanned_to = start  # just past the last record or blank END record scanned
        for req in source.scan_records(start, end):
            if not req.success:
                if 0 < req.msg_size <= end - req.commit_log_offset:
                    log.error(
                        "skipping %d bytes at CommitLog offset %d that do not decode as a record",
                        req.msg_size,
                        req.commit_log_offset,
                    )
                    scanned_to = req.commit_log_offset + req.msg_size
                elif not self._failing:
                    log.error("cannot dispatch past CommitLog offset %d: not a record", req.commit_log_offset)
                    self._failing = True
                break
            if req.msg_size == 0:  # blank END record: the scan goes on in the next segment
                scanned_to = source.roll_next_file(req.commit_log_offset)
                continue
            chunk.append(req)
            scanned_to = req.commit_log_offset + req.msg_size
            if len(chunk) >= self.chunk_records:
                break
        arrived: dict[QueueKey, int] = {}
        if chunk:
            try:
                arrived = apply_chunk(self.dispatchers, chunk)
            except StoreError as exc:
                if not self._failing:
                    log.error("dispatch stopped at CommitLog offset %d: %s; retrying", start, exc)
                self._failing = True
                return False
            if self._failing:
                log.info("dispatch resumed at CommitLog offset %d", start)
                self._failing = False
        self._advance(scanned_to, len(chunk), arrived)
        return scanned_to > start

    def _advance(self, offset: int, count: int, arrived: Mapping[QueueKey, int]) -> None:
        with self._progress:
            self.reput_from_offset = offset
            self.records_dispatched += count
            self._progress.notify_all()
        if arrived and self.on_arrival is not None:
            try:
                self.on_arrival(arrived)
            except Exception:
                log.exception("message arrival listener failed")

    def wait_for_reput(self, offset: int, timeout_s: float) -> bool:
        """Block until everything before ``offset`` is dispatched (True) or ``timeout_s`` passes."""
        with self._progress:
            return self._progress.wait_for(lambda: self.reput_from_offset >= offset, timeout_s)

    def catch_up(self) -> None:
        """Dispatch in the calling thread until nothing confirmed is left (start-up)."""
        while self.do_reput():
            pass

    def on_error(self, exc: BaseException) -> None:
        if isinstance(exc, StoreIOError):
            log.error("dispatch thread stopped: %s", exc)
