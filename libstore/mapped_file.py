"""MappedFile: one fixed-size, memory-mapped segment of a log, named by its start offset.

A segment's name is its first byte's offset in the whole log, zero-padded to 20 digits
(spec sheet §0). Three watermarks, all byte positions inside the file, with
``wrote_position >= committed_position >= flushed_position``:

* ``wrote_position``: bytes appended (in the mapping, or in the transient write buffer);
* ``committed_position``: bytes in the file's page cache (equals wrote without a write buffer);
* ``flushed_position``: bytes known durable (after fdatasync).

Readers see ``readable_position`` bytes (committed with a write buffer, else wrote).

Creation (:meth:`MappedFile.create`) goes through ``<name>.tmp``: blocks are allocated with
posix_fallocate, so stores through the mapping cannot fault on ENOSPC (where the filesystem
cannot allocate, the file is left sparse and appends keep to pwrite; copy-on-write filesystems
may still fail such a store); then the file is renamed into place, so a crash never leaves a
short segment. Optional page-cache preload (reads) and RocketMQ's warm-up (zeros, then mlock +
MADV_WILLNEED) happen before the rename, on the allocating thread, with the GIL released in each
read/write call.

Records are appended with ``pwrite`` into the file (the kernel copies into the page cache: no
page fault per 4 KiB page, and the GIL is released during the copy); readers use the mapping,
which shares that page cache. An append may instead be stored through the mapping (the
writer's choice: CommitLog does it for one message or a small batch under ASYNC_FLUSH). With a
transient store pool, appends go to the pooled buffer.

Thread-safety: one writer appends; one flush (and one commit) thread may run concurrently; any
thread may read. Durability uses ``os.fdatasync`` on the file descriptor (covers stores through
the shared mapping; unlike ``mmap.flush`` it releases the GIL). Crash policy: nothing here
decides what is valid after a crash; recovery sets the positions.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from libstore import _os, durability_hooks
from libstore.errors import DiskFullError, OffsetOutOfRangeError, StoreIOError

if TYPE_CHECKING:
    from libstore.transient_store_pool import TransientStorePool

log = logging.getLogger(__name__)

OS_PAGE_SIZE = 4096
FILE_NAME_DIGITS = 20


def offset_to_file_name(offset: int) -> str:
    """A segment name: its start offset zero-padded to 20 digits."""
    return f"{offset:0{FILE_NAME_DIGITS}d}"


def file_name_to_offset(name: str) -> int:
    """Inverse of :func:`offset_to_file_name`; ValueError for anything that is not 20 digits."""
    if len(name) != FILE_NAME_DIGITS or not name.isdigit():
        raise ValueError(f"not a segment name: {name!r}")
    return int(name)


class MappedFile:
    """One segment: append, read, commit, flush, warm-up, destroy (see module docstring).
    ``file_from_offset``: the offset of its first byte in its log, by default read from its
    name (a file of another kind, an IndexFile, names it: 0)."""

    def __init__(
        self,
        path: Path,
        file_size: int,
        fd: int,
        *,
        transient_store_pool: TransientStorePool | None = None,
        file_from_offset: int | None = None,
    ) -> None:
        self.path = path
        self.file_name = path.name
        self.file_from_offset = (
            file_name_to_offset(path.name) if file_from_offset is None else file_from_offset
        )
        self.file_size = file_size
        self._fd = fd
        self._mmap = mmap.mmap(fd, file_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.wrote_position = 0
        self.committed_position = 0
        self.flushed_position = 0
        self.store_timestamp = 0
        self.first_create_in_queue = False
        self._locked_address = 0
        self._pool = transient_store_pool
        self._write_buffer: mmap.mmap | None = None
        if transient_store_pool is not None:
            self._write_buffer = transient_store_pool.borrow_buffer()
        self._closed = False
        # Every block of the file is allocated: a store through the mapping cannot meet a full
        # disk (as SIGBUS). Set by create/open; append_records stores through the mapping only then.
        self.blocks_allocated = False

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        path: Path,
        file_size: int,
        *,
        preload: bool = False,
        warm: bool = False,
        warm_flush_pages: int = 0,
        transient_store_pool: TransientStorePool | None = None,
        file_from_offset: int | None = None,
    ) -> MappedFile:
        """Create a zeroed segment of ``file_size`` bytes at ``path`` (via ``path.tmp``, then rename).

        ``preload`` reads the new file into the page cache; ``warm`` writes zeros over it
        (fdatasync every ``warm_flush_pages`` pages when > 0) and mlocks it. Raises DiskFullError
        when the space cannot be allocated, StoreIOError on other OS errors and when ``path``
        exists already.
        """
        tmp = path.with_name(path.name + ".tmp")
        fd = -1
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            allocated = _os.allocate_blocks(fd, file_size)
            if warm:
                _warm_fd(fd, file_size, warm_flush_pages)
            elif preload:
                _os.read_through(fd, 0, file_size)
            if os.path.lexists(path):  # never over a segment: it may hold acknowledged records
                raise FileExistsError(errno.EEXIST, "the segment exists already", str(path))
            os.rename(tmp, path)
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)  # the new name survives a power loss
            finally:
                os.close(dfd)
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            if exc.errno in (28, 27, 122):  # ENOSPC, EFBIG, EDQUOT
                raise DiskFullError(
                    f"cannot allocate {file_size} bytes for {path.name}: {exc.strerror}"
                ) from exc
            raise StoreIOError(f"cannot create {path}: {exc.strerror}") from exc
        obs = durability_hooks.observer
        if obs is not None:
            obs.created(path, file_size)
            obs.folder_synced(path.parent)
        mf = cls(
            path, file_size, fd, transient_store_pool=transient_store_pool, file_from_offset=file_from_offset
        )
        mf.blocks_allocated = allocated or warm  # the warm-up wrote every page
        if warm:
            mf.mlock()
        return mf

    @classmethod
    def open(cls, path: Path, file_size: int, *, file_from_offset: int | None = None) -> MappedFile:
        """Map an existing segment; positions start at the file size until recovery sets them.

        Raises StoreIOError when the file's size is not ``file_size``.
        """
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise StoreIOError(f"cannot open {path}: {exc.strerror}") from exc
        actual = os.fstat(fd).st_size
        if actual != file_size:
            os.close(fd)
            raise StoreIOError(f"{path} is {actual} bytes, expected {file_size}")
        mf = cls(path, file_size, fd, file_from_offset=file_from_offset)
        mf.blocks_allocated = _os.blocks_allocated(fd, file_size)  # a copied-in file may be sparse
        mf.wrote_position = mf.committed_position = mf.flushed_position = file_size
        if durability_hooks.observer is not None:
            durability_hooks.observer.opened(path)
        return mf

    # -- positions ----------------------------------------------------------------------------
    @property
    def fd(self) -> int:
        """The segment's file descriptor (for lseek SEEK_DATA and the like; do not close it)."""
        return self._fd

    @property
    def buffer(self) -> mmap.mmap:
        """The mapping, for in-place decoding (``struct.unpack_from``); do not keep views of it."""
        return self._mmap

    @property
    def readable_position(self) -> int:
        return self.committed_position if self._write_buffer is not None else self.wrote_position

    @property
    def remaining(self) -> int:
        return self.file_size - self.wrote_position

    @property
    def file_tail_offset(self) -> int:
        return self.file_from_offset + self.file_size

    @property
    def has_write_buffer(self) -> bool:
        return self._write_buffer is not None

    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    def set_positions(self, position: int) -> None:
        """Set wrote, committed and flushed positions (recovery)."""
        if not 0 <= position <= self.file_size:
            raise ValueError(f"position {position} outside 0..{self.file_size}")
        self.wrote_position = self.committed_position = self.flushed_position = position

    # -- writing ------------------------------------------------------------------------------
    def append_records(self, data: Any, *, through_mapping: bool = False) -> int:
        """Copy whole records (bytes-like) at the write position; return the position they start at.

        The first 4 bytes (the first record's TOTALSIZE) are stored last, so a process killed
        mid-copy leaves a zero size where recovery will stop. The caller guarantees the data fits.
        Written with pwrite, or with ``through_mapping`` stored through the mapping (no syscall;
        a page fault on each page first touched, or first written again after a flush) when
        every block of the file is allocated (:attr:`blocks_allocated`): in a sparse file a full
        disk would meet the store as SIGBUS, where pwrite fails with ENOSPC.
        Raises OSError when the write fails (the caller treats it as fail-stop).
        """
        start = self.wrote_position
        n = len(data)
        view = memoryview(data)
        try:
            if self._write_buffer is not None:
                self._write_buffer[start + 4 : start + n] = view[4:]
                self._write_buffer[start : start + 4] = view[:4]
            else:
                if through_mapping and self.blocks_allocated:
                    mapping = self._mmap
                    mapping[start + 4 : start + n] = view[4:]
                    mapping[start : start + 4] = view[:4]
                else:
                    _pwrite_all(self._fd, view[4:], start + 4)
                    _pwrite_all(self._fd, view[:4], start)
                if durability_hooks.observer is not None:
                    durability_hooks.observer.written(self.path, start, start + n)
        finally:
            view.release()
        self.wrote_position = start + n
        return start

    def append_raw(self, data: Any) -> int:
        """Copy raw log bytes (e.g. a blank record, or bytes received from a master) as they are."""
        start = self.wrote_position
        n = len(data)
        target = self._write_buffer if self._write_buffer is not None else self._mmap
        target[start : start + n] = data
        if target is self._mmap and durability_hooks.observer is not None:
            durability_hooks.observer.written(self.path, start, start + n)
        self.wrote_position = start + n
        return start

    def fill_to_end(self, blank: bytes) -> None:
        """Write the end-of-file blank and mark the file full. With a pooled write buffer, the
        buffer's bytes after the blank are zeroed first: the commit writes the whole rest of the
        buffer into the file, and a reused buffer still holds an earlier segment's records there."""
        start = self.append_raw(blank)
        if self._write_buffer is not None:
            rest = start + len(blank)
            self._write_buffer[rest : self.file_size] = bytes(self.file_size - rest)
        self.wrote_position = self.file_size

    # -- reading ------------------------------------------------------------------------------
    def read(self, position: int, size: int) -> bytes:
        """A copy of ``size`` bytes at ``position``; OffsetOutOfRangeError beyond the readable bytes."""
        if position < 0 or size < 0 or position + size > self.readable_position:
            raise OffsetOutOfRangeError(
                f"range [{position}, {position + size}) of {self.file_name} is past its readable "
                f"position {self.readable_position}"
            )
        return self._mmap[position : position + size]

    # -- commit / flush -----------------------------------------------------------------------
    def commit(self, least_pages: int) -> int:
        """Write buffered bytes into the file (transient store pool); return committed_position.

        Without a write buffer this only tracks the wrote position. When the whole file is
        committed its buffer goes back to the pool.
        """
        buf = self._write_buffer
        if buf is None:
            self.committed_position = self.wrote_position
            return self.committed_position
        write = self.wrote_position
        committed = self.committed_position
        if write > committed and self._able(committed, write, least_pages, OS_PAGE_SIZE):
            view = memoryview(buf)
            try:
                pos = committed
                while pos < write:
                    pos += os.pwrite(self._fd, view[pos:write], pos)
            except OSError as exc:
                raise StoreIOError(f"commit of {self.file_name} failed: {exc.strerror}") from exc
            finally:
                view.release()
            if durability_hooks.observer is not None:
                durability_hooks.observer.written(self.path, committed, write)
            self.committed_position = write
        if self.committed_position >= self.file_size and self._pool is not None:
            self._pool.return_buffer(buf)
            self._write_buffer = None
        return self.committed_position

    def flush(self, least_pages: int) -> int:
        """fdatasync when enough is unflushed (``least_pages`` 4 KiB pages, 0 = any byte, a full
        file always); return flushed_position. Raises StoreIOError when fdatasync fails."""
        value = self.readable_position
        flushed = self.flushed_position
        if value > flushed and (self.is_full() or self._able(flushed, value, least_pages, OS_PAGE_SIZE)):
            try:  # [flushed, value) includes direct stores (ConsumeQueue units) too
                durability_hooks.fdatasync(self._fd, self.path, flushed, value)
            except OSError as exc:
                raise StoreIOError(f"fdatasync of {self.file_name} failed: {exc.strerror}") from exc
            self.flushed_position = value
        return self.flushed_position

    def force(self) -> None:
        """fdatasync the whole file now, whatever the positions say (recovery: the bytes it
        keeps may sit only in the page cache, left by a process that was killed before it
        flushed them). Raises StoreIOError."""
        try:
            durability_hooks.fdatasync(self._fd, self.path)
        except OSError as exc:
            raise StoreIOError(f"fdatasync of {self.file_name} failed: {exc.strerror}") from exc

    @staticmethod
    def _able(done: int, target: int, least_pages: int, page: int) -> bool:
        if least_pages > 0:
            return target // page - done // page >= least_pages
        return target > done

    # -- memory -------------------------------------------------------------------------------
    def mlock(self) -> bool:
        """mlock the mapping and advise WILLNEED; quietly False where the OS refuses."""
        address = _os.mmap_address(self._mmap)
        ok = _os.mlock(address, self.file_size)
        if ok:
            self._locked_address = address
        _os.madvise(self._mmap, mmap.MADV_WILLNEED)
        return ok

    def munlock(self) -> None:
        if self._locked_address:
            _os.munlock(self._locked_address, self.file_size)
            self._locked_address = 0

    def advise_random(self) -> None:
        """madvise(MADV_RANDOM): no read-ahead (RocketMQ dataReadAheadEnable=false)."""
        _os.madvise(self._mmap, mmap.MADV_RANDOM)

    # -- truncation / lifecycle ---------------------------------------------------------------
    def truncate_to(self, position: int) -> None:
        """Drop everything from ``position`` on: positions move back and the tail reads as zeros,
        durably (fdatasync before it returns).

        Zeroing keeps stale records from ever being taken for valid ones by a later recovery;
        syncing it keeps a power loss from bringing them back after the caller acted on the cut
        (a slave that then adopted its new master's epochs would take them for the master's).
        Raises StoreIOError.
        """
        if self._write_buffer is not None:
            end = max(self.wrote_position, position)
            self._write_buffer[position:end] = bytes(end - position)
        try:
            if not _os.zero_range(self._fd, position, self.file_size - position):
                self.blocks_allocated = False
            durability_hooks.fdatasync(self._fd, self.path, position, self.file_size)
        except OSError as exc:
            raise StoreIOError(f"cannot truncate {self.file_name} at {position}: {exc.strerror}") from exc
        self.set_positions(position)

    def close(self) -> None:
        """Unmap and close; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.munlock()
        if self._write_buffer is not None and self._pool is not None:
            self._pool.return_buffer(self._write_buffer)
            self._write_buffer = None
        try:
            self._mmap.close()
        except BufferError:  # a reader still holds a view; the OS unmaps at exit
            log.warning("%s still has exported views at close", self.file_name)
        os.close(self._fd)

    def destroy(self) -> None:
        """Close and delete the file (durable once the caller fsyncs the folder)."""
        self.close()
        self.path.unlink(missing_ok=True)
        if durability_hooks.observer is not None:
            durability_hooks.observer.removed(self.path)

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return (
            f"MappedFile({self.file_name}, wrote={self.wrote_position}, committed={self.committed_position}, "
            f"flushed={self.flushed_position})"
        )


def _pwrite_all(fd: int, data: memoryview, position: int) -> None:
    while data:
        written = os.pwrite(fd, data, position)
        data = data[written:]
        position += written


def _warm_fd(fd: int, file_size: int, flush_pages: int) -> None:
    """RocketMQ's warm-up: zero every page; fdatasync every ``flush_pages`` pages (SYNC_FLUSH)."""
    step = flush_pages * OS_PAGE_SIZE if flush_pages > 0 else file_size
    pos = 0
    while pos < file_size:
        n = min(step, file_size - pos)
        _os.write_zeros(fd, pos, n)
        pos += n
        if flush_pages > 0:
            os.fdatasync(fd)
