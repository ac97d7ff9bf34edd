"""IndexApp: the index service's objects (IndexFiles, the tail follower).

The index volume has its own usage guard: IndexFiles are large (about 420 MB each by default)
and, on a volume of their own, nothing else frees it. Each cleanup round, when the volume
holding ``index/`` is used above ``diskSpaceCleanForciblyRatio``, the oldest IndexFile goes
(never the one being written), one per round: lookups by key lose the oldest messages' keys
while the messages themselves stay readable by offset and queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from libstore import StoreConfig, StoreError
from libstore.commit_log_cleaner import disk_usage_ratio
from libstore.dispatch import CommitLogDispatcher, DispatchCheckpoint, recover_index
from libstore.index_service import IndexService
from libstore.store_paths import dispatch_checkpoint_path, index_dir
from services._common.derived_app import DerivedStoreApp
from services.index.local import LocalIndex
from services.ports import CommitLogPort

log = logging.getLogger(__name__)

# How long a query waits for the records confirmed before it to be indexed (s).
QUERY_SETTLE_S = 0.5


class IndexApp(DerivedStoreApp):
    """Folder ``config.store_path_root_dir``: ``index/``."""

    name = "index"
    # IndexFiles answer queries by key, which RocketMQ's index also answers only after its
    # reput: a few ms later costs no reader anything, and records arriving one or a few at a
    # time (single sends, every receive and ack's pop-journal record) then come in one chunk
    # per 10 ms instead of one each: for the split topology's RocketMQ 5 consumers (a journal
    # record per ack), about two thirds less index CPU and one Tail message less to send.
    tail_linger_ms = 10

    def __init__(
        self,
        config: StoreConfig,
        commitlog: CommitLogPort,
        *,
        disk_usage: Callable[[Path], float] = disk_usage_ratio,
    ) -> None:
        super().__init__(config, commitlog)
        self._disk_usage = disk_usage  # path -> used share 0..1 (injectable for tests)
        self.guard_deleted = 0  # IndexFiles the usage guard deleted since start
        self.index = IndexService(
            index_dir(self.root), config.max_hash_slot_num, config.max_index_num, config.max_msgs_num_batch
        )
        self.rebuild_from: int | None = None  # where recovery restarted the IndexFiles, if it did
        self.port = LocalIndex(self.index, lambda: self.derived_status(len(self.index.files)), self.settle)

    async def settle(self) -> None:
        """Before a query: wait (at most QUERY_SETTLE_S) until the records the log confirmed by
        now are indexed, so the key of a put that was acknowledged is found although the tail
        lingers; an unreachable log or an index far behind (rebuilding) answers from what is
        applied."""
        follower = self.follower
        if follower is None:
            return
        try:
            offsets = await self.commitlog.offsets()
        except (StoreError, grpc.RpcError):
            return
        await follower.wait_for(offsets.confirm_offset, QUERY_SETTLE_S)

    def _load(self) -> None:
        self.index.load()

    def _recover(self, log_min: int, log_max: int, last_exit_ok: bool) -> int:
        resume, self.rebuild_from = recover_index(
            self.index, self._checkpoint_file(), log_min, log_max, last_exit_ok
        )
        return resume

    def _dispatchers(self) -> Sequence[CommitLogDispatcher]:
        return [self.index]

    def _cut(self, log_end: int, reput_offset: int) -> int:
        restart = self.index.roll_back(log_end)  # live files: their headers are exact
        return min(reput_offset, log_end, restart if restart is not None else log_end)

    def _index_mark(self) -> tuple[str, int] | None:
        return self.index.applied_mark

    def _flush(self, least_pages: int) -> None:
        """IndexFiles are flushed whole, at checkpoints (RocketMQ flushes them when full)."""

    def _flush_all(self) -> None:
        self.index.flush_all()

    def _delete_expired(self, commit_log_min_offset: int) -> int:
        return self.index.delete_expired(commit_log_min_offset)

    async def _retention_round(self) -> int:
        """The index volume's usage guard (module docstring)."""
        folder = index_dir(self.root)
        usage = await asyncio.to_thread(self._disk_usage, folder)
        limit = self.config.disk_space_clean_forcibly_ratio
        files = self.index.files
        if usage * 100.0 <= limit or len(files) < 2:
            return 0
        oldest = files[0]
        log.warning(
            "index volume %.1f%% used, above diskSpaceCleanForciblyRatio %s%%: deleting the oldest "
            "IndexFile %s (keys of records up to CommitLog offset %d can no longer be looked up)",
            usage * 100.0,
            limit,
            oldest.file_name,
            oldest.end_phy_offset,
        )
        deleted = await asyncio.to_thread(self.index.delete_expired, oldest.end_phy_offset + 1)
        self.guard_deleted += deleted
        return deleted

    def _close(self) -> None:
        self.index.shutdown()

    def _checkpoint_file(self) -> DispatchCheckpoint:
        return DispatchCheckpoint(dispatch_checkpoint_path(index_dir(self.root)))
