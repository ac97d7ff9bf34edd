"""Dispatch (RocketMQ's reput): apply new CommitLog records to the derived stores.

A follower (services._common.tail_follower.TailFollower, the one dispatch loop of every
topology) reads records from its reput offset up to the log's confirm offset (flushed bytes under
SYNC_FLUSH, written bytes under ASYNC_FLUSH) and hands them, in log order, to every
:class:`CommitLogDispatcher` (the ConsumeQueues, the IndexService) through :func:`apply_chunk`,
which reports the new max offset of every queue it touched so held pulls wake up (spec sheet §5,
"Reput loop").

Progress: :class:`DispatchCheckpoint` persists a reput offset only after the derived files are
flushed up to it, so it is a lower bound of what they durably hold; a restart replays from
there (dispatchers skip what they already have). :func:`recover_consume_queues` and
:func:`recover_index` bring loaded derived files in line with the log before the replay.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from libstore._files import atomic_write, read_json
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.dispatch_request import DispatchRequest
from libstore.errors import StoreIOError
from libstore.index_service import IndexService
from libstore.queue_runs import QueueRun, queue_runs

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


class CommitLogDispatcher(Protocol):
    """Something built from CommitLog records (ConsumeQueueStore, IndexService).

    ``dispatch_batch`` gets consecutive records in log order and must be idempotent: the same
    records may be handed in again after a restart. A dispatcher that works queue by queue (the
    ConsumeQueues, the transient release) also has ``dispatch_runs(runs)``, which
    :func:`apply_chunk` calls instead with the chunk's :func:`~libstore.queue_runs.queue_runs`
    (units included), grouped once for all of them and for the arrivals.
    """

    def dispatch_batch(self, requests: Sequence[DispatchRequest]) -> None: ...


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

    def load_index_mark(self) -> tuple[str, int] | None:
        """The saved ``indexMark`` (IndexService.applied_mark at the checkpoint), or None."""
        try:
            data = read_json(self.path, "dispatch checkpoint")
            mark = None if data is None else data.get("indexMark")
            return None if mark is None else (str(mark[0]), int(mark[1]))
        except (StoreIOError, ValueError, TypeError, AttributeError, IndexError, KeyError):
            return None

    def save(
        self,
        reput_offset: int,
        log_id: str = "",
        generation: int = 0,
        index_mark: tuple[str, int] | None = None,
    ) -> None:
        """Persist ``reput_offset`` (and the log generation it was read in; for the index, the
        IndexService's applied mark sampled before the flush). Raises StoreIOError."""
        data: dict[str, object] = {"reputOffset": reput_offset, "logId": log_id, "generation": generation}
        if index_mark is not None:
            data["indexMark"] = list(index_mark)
        atomic_write(self.path, json.dumps(data).encode("utf-8"))


def apply_chunk(
    dispatchers: Sequence[CommitLogDispatcher], chunk: Sequence[DispatchRequest], *, arrivals: bool = True
) -> dict[QueueKey, int]:
    """Hand consecutive records to every dispatcher; return {(topic, queue id): new max queue
    offset} of the queues they reached (for long polling; {} without ``arrivals``, for a caller
    that wakes no consumers). Raises what a dispatcher raises."""
    runs: list[QueueRun] | None = None
    for dispatcher in dispatchers:
        by_queue = getattr(dispatcher, "dispatch_runs", None)
        if by_queue is None:
            dispatcher.dispatch_batch(chunk)
            continue
        if runs is None:
            runs = queue_runs(chunk)
        by_queue(runs)
    if not arrivals:
        return {}
    if runs is None:
        runs = queue_runs(chunk, with_units=False)
    return {(topic, queue_id): last + 1 for topic, queue_id, _, last, *_ in runs}


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
    """Bring loaded IndexFiles in line with the log: keep only entries for records before the
    log's end and, after a crash, before the checkpoint, rolling the file that holds the first
    later entry back to what is known flushed (IndexService.roll_back with the checkpoint's
    index mark) rather than deleting it. Without a mark (a checkpoint written before marks
    existed, or none) files with entries past that point are deleted and rebuilt. Returns
    (CommitLog offset to resume dispatch from, offset a rebuild starts at or None)."""
    resume = resume_offset(checkpoint, log_min, log_max)
    if last_exit_ok:
        index.roll_back(log_max)  # every header is what the last run wrote and flushed
        return resume, None
    bound = min(resume, log_max)
    mark = checkpoint.load_index_mark()
    restart = index.roll_back(bound, mark) if mark is not None else index.discard_after(bound)
    if restart is None:
        return resume, None
    resume = min(resume, max(restart, log_min))
    return resume, resume
