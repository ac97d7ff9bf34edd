"""TransientStorePool: pooled off-page-cache write buffers for the CommitLog (spec sheet §6).

With ``transientStorePoolEnable`` appends land in one of ``transientStorePoolSize`` anonymous
buffers of segment size (mlocked where the OS allows) instead of the file mapping; the commit
service later writes them into the file with ``pwrite`` (which releases the GIL) and the flush
service makes them durable. Readers only see committed bytes. A buffer returns to the pool once
its segment is fully committed.

Thread-safety: borrow/return are locked; a buffer has one owner at a time.
"""

from __future__ import annotations

import collections
import logging
import mmap
import threading

from libstore import _os

log = logging.getLogger(__name__)


class TransientStorePool:
    """``pool_size`` buffers of ``file_size`` bytes each; call :meth:`init` before use."""

    def __init__(self, pool_size: int, file_size: int) -> None:
        self.pool_size = pool_size
        self.file_size = file_size
        self._available: collections.deque[mmap.mmap] = collections.deque()
        self._all: list[mmap.mmap] = []
        self._locked: list[int] = []
        self._lock = threading.Lock()

    def init(self) -> None:
        """Allocate the buffers and try to mlock them (quietly skipped when not permitted)."""
        for _ in range(self.pool_size):
            buf = mmap.mmap(-1, self.file_size, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            address = _os.mmap_address(buf)
            if _os.mlock(address, self.file_size):
                self._locked.append(address)
            self._all.append(buf)
            self._available.append(buf)

    def borrow_buffer(self) -> mmap.mmap | None:
        """A free buffer, or None when all are in use."""
        with self._lock:
            if not self._available:
                return None
            buf = self._available.popleft()
        if len(self._available) < self.pool_size * 0.4:
            log.debug("transient store pool has only %d buffers left", len(self._available))
        return buf

    def return_buffer(self, buf: mmap.mmap) -> None:
        with self._lock:
            if buf not in self._available:
                self._available.append(buf)

    @property
    def available_buffer_nums(self) -> int:
        return len(self._available)

    def destroy(self) -> None:
        for address in self._locked:
            _os.munlock(address, self.file_size)
        self._locked.clear()
        with self._lock:
            self._available.clear()
        for buf in self._all:
            try:
                buf.close()
            except BufferError:
                log.warning("transient buffer still exported at destroy")
        self._all.clear()
