"""IndexApp: the index service's objects (IndexFiles, the tail follower)."""

from __future__ import annotations

from collections.abc import Sequence

from libstore import StoreConfig
from libstore.dispatch import CommitLogDispatcher, DispatchCheckpoint, recover_index
from libstore.index_service import IndexService
from libstore.store_paths import dispatch_checkpoint_path, index_dir
from services._common.derived_app import DerivedStoreApp
from services.index.local import LocalIndex
from services.ports import CommitLogPort


class IndexApp(DerivedStoreApp):
    """Folder ``config.store_path_root_dir``: ``index/``."""

    name = "index"

    def __init__(self, config: StoreConfig, commitlog: CommitLogPort) -> None:
        super().__init__(config, commitlog)
        self.index = IndexService(
            index_dir(self.root), config.max_hash_slot_num, config.max_index_num, config.max_msgs_num_batch
        )
        self.rebuild_from: int | None = None  # where recovery restarted the IndexFiles, if it did
        self.port = LocalIndex(self.index, lambda: self.derived_status(len(self.index.files)))

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

    def _close(self) -> None:
        self.index.shutdown()

    def _checkpoint_file(self) -> DispatchCheckpoint:
        return DispatchCheckpoint(dispatch_checkpoint_path(index_dir(self.root)))
