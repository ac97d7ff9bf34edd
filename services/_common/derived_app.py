"""DerivedStoreApp: the life of a service that holds state derived from the CommitLog (the
dispatch service's ConsumeQueues, the index service's IndexFiles).

start: lock its folder and read the abort marker → load its files → wait for the commitlog
service → recover against the log's bounds (cut what points past the log's end; after a crash,
distrust what was written past the last checkpoint) → follow the Tail stream from the resume
offset → flush periodically and checkpoint (the checkpoint is a reput offset sampled before a
full flush, so it never claims more than the files durably hold).

While running it follows the log's min offset (retention deletes the CommitLog's head): every
``cleanResourceInterval`` the files wholly below it are deleted, then the service's own
retention round runs (the dispatch service's per-topic retention, the index volume's guard).

stop: stop following → final flush and checkpoint → close files → remove the abort marker.
Deleting the folder and restarting rebuilds everything from the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
from opentelemetry.metrics import Observation

from libstore import ServiceNotAvailableError, StoreConfig, StoreIOError
from libstore.consume_queue_store import FlushConsumeQueueService
from libstore.dispatch import CommitLogDispatcher, DispatchCheckpoint
from libstore.store_directory import StoreDirectory
from services._common.metrics import observer, register_once
from services._common.tail_follower import QueueKey, TailFollower
from services._common.telemetry import meter
from services.ports import CommitLogPort, DerivedStatus, LogOffsets

log = logging.getLogger(__name__)


class DerivedStoreApp:
    """Base of DispatchApp and IndexApp; subclasses fill in the ``_hooks``."""

    name = "derived"
    # The Tail stream's linger (ms): 0 for a follower whose readers wait for each record.
    tail_linger_ms = 0

    def __init__(self, config: StoreConfig, commitlog: CommitLogPort) -> None:
        self.config = config
        self.root = Path(config.store_path_root_dir)
        self.commitlog = commitlog
        self.directory: StoreDirectory | None = None
        self.follower: TailFollower | None = None
        self._flusher: FlushConsumeQueueService | None = None
        self.start_offsets: LogOffsets | None = None
        self.resume_offset = 0  # where dispatch resumed at start (a CommitLog offset)
        self._cleaner: asyncio.Task[None] | None = None
        self.cleaned_to = 0  # the CommitLog min offset the last cleanup followed
        self.files_deleted = 0

    # -- hooks ------------------------------------------------------------------------------------
    def _load(self) -> None:
        raise NotImplementedError

    def _recover(self, log_min: int, log_max: int, last_exit_ok: bool) -> int:
        """Bring the files in line with the log; return the CommitLog offset to resume from."""
        raise NotImplementedError

    def _dispatchers(self) -> Sequence[CommitLogDispatcher]:
        raise NotImplementedError

    def _on_arrival(self, arrived: Mapping[QueueKey, int]) -> None:
        """Queues that grew (for long polling)."""

    def _cut(self, log_end: int, reput_offset: int) -> int:
        """The log now ends at ``log_end``: drop what points past it; return where to resume."""
        raise NotImplementedError

    def _flush(self, least_pages: int) -> None:
        raise NotImplementedError

    def _flush_all(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _checkpoint_file(self) -> DispatchCheckpoint:
        raise NotImplementedError

    def _index_mark(self) -> tuple[str, int] | None:
        """The IndexService's applied mark, for services that keep IndexFiles."""
        return None

    def _delete_expired(self, commit_log_min_offset: int) -> int:
        """Delete files wholly below the CommitLog's min offset (retention); return how many."""
        raise NotImplementedError

    async def _retention_round(self) -> int:
        """The service's own cleanup after following the min offset; returns files deleted."""
        return 0

    # -- life -------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.directory = StoreDirectory(self.root)
        try:
            await asyncio.to_thread(self._load)
            offsets = await self._wait_for_commitlog()
            self.start_offsets = offsets
            resume = await asyncio.to_thread(
                self._recover, offsets.min_offset, offsets.max_offset, self.directory.last_exit_ok
            )
        except BaseException:
            self.directory.release()
            raise
        self.resume_offset = resume
        log.info(
            "%s: resuming dispatch at CommitLog offset %d (log ends at %d)",
            self.name,
            resume,
            offsets.max_offset,
        )
        log_id, generation = self._checkpoint_file().load_generation()
        register_once("mqstore.derived", _register_lag_metrics)
        _LIVE.add(self)
        self.follower = TailFollower(
            self.name,
            self.commitlog,
            self._dispatchers(),
            resume,
            # None where nothing reads arrivals (the index): the follower then skips collecting them
            on_arrival=self._on_arrival
            if type(self)._on_arrival is not DerivedStoreApp._on_arrival
            else None,
            on_ahead=self._on_ahead,
            log_id=log_id,
            generation=generation,
            linger_ms=self.tail_linger_ms,
        )
        cfg = self.config
        self._flusher = FlushConsumeQueueService(
            self._flush,
            self.checkpoint,
            self._on_io_error,
            interval_ms=cfg.flush_interval_consume_queue,
            least_pages=cfg.flush_consume_queue_least_pages,
            thorough_interval_ms=cfg.flush_consume_queue_thorough_interval,
        )
        self._flusher.start()
        self.directory.mark_running()
        self.follower.start()
        self.cleaned_to = offsets.min_offset
        self._cleaner = asyncio.create_task(self._follow_min_offset())

    async def _follow_min_offset(self) -> None:
        """Every cleanResourceInterval, once the CommitLog's head has been deleted (retention):
        delete the files wholly below its min offset (on a worker thread)."""
        interval_s = self.config.clean_resource_interval / 1000.0
        while True:
            await asyncio.sleep(interval_s)
            try:
                offsets = await self.commitlog.offsets()
                deleted = 0
                if offsets.min_offset > 0:  # else nothing was ever deleted
                    # Every round, not only when the min offset moved: a file still being
                    # flushed when the head went is deleted in a later round.
                    deleted = await asyncio.to_thread(self._delete_expired, offsets.min_offset)
                deleted += await self._retention_round()
            except (ServiceNotAvailableError, grpc.RpcError) as exc:
                log.info("%s: cleanup skipped this round (%s)", self.name, exc)
                continue
            except StoreIOError as exc:
                self._on_io_error(exc)
                continue
            self.cleaned_to = offsets.min_offset
            self.files_deleted += deleted
            if deleted:
                log.info(
                    "%s: deleted %d expired file(s); the CommitLog's min offset is %d",
                    self.name,
                    deleted,
                    offsets.min_offset,
                )

    async def _wait_for_commitlog(self) -> LogOffsets:
        delay = 0.1
        while True:
            try:
                return await self.commitlog.offsets()
            except (ServiceNotAvailableError, grpc.RpcError) as exc:
                log.info("%s: waiting for the commitlog service (%s)", self.name, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _on_ahead(self, log_end: int) -> int:
        assert self.follower is not None
        return await asyncio.to_thread(self._cut, log_end, self.follower.reput_offset)

    def checkpoint(self) -> None:
        """Flush everything, then record the reput offset sampled before the flush."""
        f = self.follower
        if f is None:
            return
        offset, log_id, generation = f.position
        mark = self._index_mark()  # sampled after the offset: covers every record before it
        self._flush_all()
        self._checkpoint_file().save(offset, log_id, generation, mark)

    def _on_io_error(self, exc: StoreIOError) -> None:
        log.error("%s: I/O error in derived files: %s", self.name, exc)

    async def wait_caught_up(self, timeout_s: float) -> bool:
        """True once everything the commitlog had confirmed at start is applied."""
        if self.follower is None or self.start_offsets is None:
            return False
        return await self.follower.wait_for(self.start_offsets.confirm_offset, timeout_s)

    async def stop(self) -> None:
        _LIVE.discard(self)
        if self._cleaner is not None:
            self._cleaner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cleaner
        if self.follower is not None:
            await self.follower.stop()
        if self._flusher is not None:
            await asyncio.to_thread(self._flusher.shutdown)  # final thorough flush + checkpoint
        await asyncio.to_thread(self._close)
        if self.directory is not None:
            self.directory.mark_clean()
            self.directory.release()

    def lag_observations(self, index: int) -> list[Observation]:
        """Dispatch lag for the metrics: ``index`` 0 bytes, 1 ms (TailFollower.lag)."""
        if self.follower is None:
            return []
        lag = self.follower.lag(time.time_ns() // 1_000_000)
        return [Observation(lag[index], {"follower": self.name})]

    def derived_status(self, files: int = 0) -> DerivedStatus:
        f = self.follower
        if f is None:
            return DerivedStatus(0, 0, 0, files)
        return DerivedStatus(f.reput_offset, f.confirm_offset, f.records_dispatched, files)


# The derived stores of this process, read by the lag gauges when something collects.
_LIVE: weakref.WeakSet[DerivedStoreApp] = weakref.WeakSet()


def _register_lag_metrics() -> None:
    m = meter("mqstore.derived")
    m.create_observable_gauge(
        "mqstore.dispatch.lag_bytes",
        [observer(_LIVE, lambda app: app.lag_observations(0))],
        unit="By",
        description="CommitLog bytes confirmed but not yet applied, per follower (dispatch, index)",
    )
    m.create_observable_gauge(
        "mqstore.dispatch.lag_time",
        [observer(_LIVE, lambda app: app.lag_observations(1))],
        unit="ms",
        description="while behind: time since the last applied record was stored, per follower",
    )
