"""StoreFiles: what :meth:`CommitLog.load` opens, as one object that exists only once it is open.

A loaded store holds its folder's lock and abort marker (:class:`StoreDirectory`), the
checkpoint, the replication state (``config/haState.json``), the log generation, the topic
table, the transient message store, the segment pre-allocator (with its transient store pool)
and the segment queue itself. :meth:`StoreFiles.open` opens them in that order and, should one
fail, closes what it had opened (the lock first of all), so a failed open leaves nothing
locked or mapped; :meth:`close` releases them in reverse.

Holding them in one object lets the CommitLog ask "is it loaded?" once (its ``files``
property) instead of asserting each of nine attributes is not None on every path.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from libstore.allocate_mapped_file import AllocateMappedFileService
from libstore.config import FlushDiskType, StoreConfig
from libstore.errors import StoreIOError
from libstore.ha_state import HAState
from libstore.log_generation import LogGeneration
from libstore.mapped_file import MappedFile
from libstore.mapped_file_queue import MappedFileQueue
from libstore.store_checkpoint import StoreCheckpoint
from libstore.store_directory import StoreDirectory
from libstore.store_paths import (
    checkpoint_path,
    ha_state_path,
    log_generation_path,
    topics_path,
    transient_scratch_dir,
)
from libstore.topic_config import TopicConfigManager
from libstore.transient_messages import TransientMessageStore
from libstore.transient_store_pool import TransientStorePool

log = logging.getLogger(__name__)


@dataclass(eq=False)
class StoreFiles:
    """The open files of one CommitLog (see module docstring). Build with :meth:`open`."""

    directory: StoreDirectory
    checkpoint: StoreCheckpoint
    ha_state: HAState
    generation: LogGeneration
    topic_config: TopicConfigManager
    transient: TransientMessageStore
    pool: TransientStorePool | None
    allocator: AllocateMappedFileService
    queue: MappedFileQueue

    @classmethod
    def open(cls, config: StoreConfig, topic_config: TopicConfigManager | None = None) -> StoreFiles:
        """Lock ``config.root_dir`` and open everything under it; the segments are mapped but
        not recovered (libstore.recovery does that). ``topic_config``: the caller's topic table,
        else ``<root>/config/topics.json`` is opened. Raises StoreLockedError (another process
        holds the store), StoreIOError, ConfigError; nothing stays open when it raises."""
        root = config.root_dir
        with contextlib.ExitStack() as undo:
            directory = StoreDirectory(root)
            undo.callback(directory.release)
            checkpoint = StoreCheckpoint(checkpoint_path(root))
            undo.callback(_quietly, checkpoint.shutdown)
            ha_state = HAState(ha_state_path(root))
            generation = LogGeneration(log_generation_path(root))
            if topic_config is None:
                topic_config = TopicConfigManager(
                    topics_path(root),
                    auto_create=config.auto_create_topic_enable,
                    default_queue_nums=config.default_topic_queue_nums,
                    max_queue_nums=config.max_queue_nums_per_topic,
                    max_topic_length=config.max_topic_length,
                    max_topic_count=config.max_topic_count,
                )
            transient = TransientMessageStore(
                transient_scratch_dir(root),
                config.transient_store_max_bytes,
                scratch_max_bytes=config.transient_scratch_max_bytes,
                background=True,
            )
            undo.callback(transient.close)
            pool = None
            if config.transient_store_pool_enable:
                pool = TransientStorePool(
                    config.transient_store_pool_size, config.mapped_file_size_commit_log
                )
                undo.callback(pool.destroy)  # also what init() mapped before it failed
                pool.init()
            allocator = AllocateMappedFileService(
                preload=config.preload_mapped_file_enable,
                warm=config.warm_mapped_file_enable,
                warm_flush_pages=(
                    config.flush_least_pages_when_warm_mapped_file
                    if config.flush_disk_type is FlushDiskType.SYNC_FLUSH
                    else 0
                ),
                transient_store_pool=pool,
                fast_fail_if_no_buffer=config.fast_fail_if_no_buffer_in_store_pool,
            )
            read_ahead = config.data_read_ahead_enable
            queue = MappedFileQueue(
                config.commit_log_dir,
                config.mapped_file_size_commit_log,
                allocator,
                on_new_file=None if read_ahead else MappedFile.advise_random,  # segments made from now on
            )
            undo.callback(queue.shutdown)
            queue.load()
            if not read_ahead:
                for mf in queue.mapped_files:
                    mf.advise_random()
            files = cls(
                directory, checkpoint, ha_state, generation, topic_config, transient, pool, allocator, queue
            )
            undo.pop_all()  # opened: close() releases them from now on
        return files

    @property
    def last_exit_ok(self) -> bool:
        """False when the abort marker was found at open: the last owner crashed."""
        return self.directory.last_exit_ok

    def close(self) -> None:
        """Drop the transient messages (they end with the process that holds them), unmap the
        segments, free the pool, close the checkpoint and release the lock. Does not persist
        anything (the CommitLog's shutdown does that first); logs a checkpoint close error."""
        self.transient.close()
        self.queue.shutdown()
        if self.pool is not None:
            self.pool.destroy()
        _quietly(self.checkpoint.shutdown)
        self.directory.release()


def _quietly(close: Callable[[], None]) -> None:
    """Call ``close()``, logging a StoreIOError instead of raising it (a close on the way out)."""
    try:
        close()
    except StoreIOError as exc:
        log.error("%s", exc)
