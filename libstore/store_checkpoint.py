"""StoreCheckpoint: the ``checkpoint`` file (spec sheet §5).

A 4096-byte file; big-endian int64 fields::

    @0   physicMsgTimestamp   store time (ms) of the last record covered by a CommitLog flush
    @8   logicsMsgTimestamp   store time (ms) of the last record dispatched to ConsumeQueues
    @16  indexMsgTimestamp    end time (ms) of the last full, flushed IndexFile
    @24  masterFlushedOffset  (RocketMQ 5)
    @32  confirmPhyOffset     (RocketMQ 5)
    @40  flushedPhyOffset     (mqstore) CommitLog offset, a record boundary, below which every
                              byte was fdatasync'ed when this checkpoint was written (0: unknown)

``min_timestamp`` = min(physic, logics) − 3000 ms, floored at 0 (RocketMQ). In mqstore the
ConsumeQueues are derived state with their own reput offset, so the CommitLog's abnormal
recovery starts at ``flushedPhyOffset`` when it is known, else uses
``commit_log_recover_timestamp`` = physic − 3000 ms: it starts from the newest segment whose
first record is at least that old. The file is rewritten in place with pwrite + fdatasync; its
fields share one disk sector, so a torn write leaves the old values or the new ones, and the
CommitLog lowers ``flushedPhyOffset`` durably before it cuts the log below it.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from libstore import durability_hooks
from libstore.errors import StoreIOError

CHECKPOINT_FILE_SIZE = 4096
_LAYOUT = struct.Struct(">qqqqqq")


class StoreCheckpoint:
    """The checkpoint fields in memory and :meth:`flush` to persist them."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self.master_flushed_offset = 0
        self.confirm_phy_offset = 0
        self.flushed_phy_offset = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            new = os.fstat(self._fd).st_size < CHECKPOINT_FILE_SIZE
            if new:
                os.ftruncate(self._fd, CHECKPOINT_FILE_SIZE)
            raw = os.pread(self._fd, _LAYOUT.size, 0)
        except OSError as exc:
            raise StoreIOError(f"cannot open checkpoint {self.path}: {exc.strerror}") from exc
        obs = durability_hooks.observer
        if obs is not None:
            if new:
                obs.created(self.path, CHECKPOINT_FILE_SIZE)  # the folder is not synced: may vanish
            else:
                obs.opened(self.path)
        (
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.master_flushed_offset,
            self.confirm_phy_offset,
            self.flushed_phy_offset,
        ) = _LAYOUT.unpack(raw)

    @property
    def min_timestamp(self) -> int:
        """min(physic, logics) − 3000 ms, at least 0 (RocketMQ ``getMinTimestamp``)."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    @property
    def commit_log_recover_timestamp(self) -> int:
        """physicMsgTimestamp − 3000 ms, at least 0: records older than this were flushed."""
        return max(0, self.physic_msg_timestamp - 3000)

    @property
    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp, self.index_msg_timestamp)

    def flush(self) -> None:
        """Write all fields and fdatasync. Raises StoreIOError."""
        raw = _LAYOUT.pack(
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.master_flushed_offset,
            self.confirm_phy_offset,
            self.flushed_phy_offset,
        )
        try:
            os.pwrite(self._fd, raw, 0)
            durability_hooks.fdatasync(self._fd, self.path, 0, CHECKPOINT_FILE_SIZE)
        except OSError as exc:
            raise StoreIOError(f"cannot write checkpoint {self.path}: {exc.strerror}") from exc

    def shutdown(self) -> None:
        if self._fd >= 0:
            self.flush()
            os.close(self._fd)
            self._fd = -1
