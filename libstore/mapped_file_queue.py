"""MappedFileQueue: the ordered segments of one log (CommitLog or a ConsumeQueue).

Segments are contiguous: segment *i* starts at ``first.file_from_offset + i * mapped_file_size``.
The queue tracks two log-wide watermarks, ``committed_where`` and ``flushed_where`` (absolute
offsets), and advances them one segment at a time, as RocketMQ does: a commit/flush touches the
segment holding the current watermark only.

Loading (spec sheet §0): every ``<20 digits>`` file in the folder, sorted; a 0-byte last file is
deleted; leftover ``*.tmp`` files (a crash during creation) are deleted; any other size mismatch
fails the load, and so does a gap between segments, unless everything after it is zeros
(segments created ahead and never written: deleted). Loaded segments start full; recovery then
truncates.

Truncation and reset are durable before they return (segment fdatasynced, folder fsynced) and
take the allocator's segments created ahead past the new end with them.

Thread-safety: the segment list is replaced, never mutated in place, so readers can take a
snapshot without a lock; appends come from one writer; commit/flush from one thread each. Two
threads replace the list while the log runs, the writer (a new segment at the tail) and the
cleaner (the oldest goes from the head); each replacement reads and writes the list under one
small lock, or one of them would put back a list without the other's change (a lost new segment
is created again at the same offset and overwrites what was appended to it).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from libstore import durability_hooks
from libstore._files import fsync_dir
from libstore.allocate_mapped_file import AllocateMappedFileService
from libstore.errors import StoreIOError
from libstore.mapped_file import (
    FILE_NAME_DIGITS,
    MappedFile,
    file_name_to_offset,
    offset_to_file_name,
)

log = logging.getLogger(__name__)


class MappedFileQueue:
    """Segments of ``mapped_file_size`` bytes under ``store_path`` (see module docstring).

    ``allocator`` pre-creates segments in the background (CommitLog); without one, segments are
    created synchronously by the writer. ``on_new_file`` is called with each new segment.
    """

    def __init__(
        self,
        store_path: Path,
        mapped_file_size: int,
        allocator: AllocateMappedFileService | None = None,
        *,
        create_kwargs: dict[str, object] | None = None,
        on_new_file: Callable[[MappedFile], None] | None = None,
    ) -> None:
        self.store_path = Path(store_path)
        self.mapped_file_size = mapped_file_size
        self.allocator = allocator
        self.mapped_files: list[MappedFile] = []
        self.flushed_where = 0
        self.committed_where = 0
        self.store_timestamp = 0
        self._create_kwargs = create_kwargs or {}
        self._on_new_file = on_new_file
        # Flush/commit and truncation move the same watermarks: one at a time.
        self._flush_lock = threading.RLock()
        # Held only while the list is read and replaced (module docstring, thread-safety).
        self._list_lock = threading.Lock()

    # -- loading ------------------------------------------------------------------------------
    def load(self) -> None:
        """Map every segment in the folder (see module docstring). Raises StoreIOError."""
        self.store_path.mkdir(parents=True, exist_ok=True)
        names = []
        for entry in os.scandir(self.store_path):
            if entry.name.endswith(".tmp"):
                log.warning("deleting %s left by an interrupted segment creation", entry.path)
                os.unlink(entry.path)
                continue
            if len(entry.name) == FILE_NAME_DIGITS and entry.name.isdigit() and entry.is_file():
                names.append(entry.name)
        names.sort()
        files: list[MappedFile] = []
        try:
            for i, name in enumerate(names):
                path = self.store_path / name
                size = path.stat().st_size
                if size == 0 and i == len(names) - 1:
                    log.warning("deleting empty last segment %s", path)
                    path.unlink()
                    continue
                if size != self.mapped_file_size:
                    raise StoreIOError(
                        f"{path} is {size} bytes but segments are {self.mapped_file_size}; "
                        "was the store created with another mapped file size?"
                    )
                files.append(MappedFile.open(path, self.mapped_file_size))
            for i, (prev, cur) in enumerate(itertools.pairwise(files), start=1):
                if cur.file_from_offset == prev.file_from_offset + self.mapped_file_size:
                    continue
                if not all(_all_zeros(mf) for mf in files[i:]):
                    raise StoreIOError(
                        f"segment gap: {prev.file_name} is followed by {cur.file_name} in {self.store_path}"
                    )
                # Created ahead and never written (a store cut back before a crash): not data.
                for mf in files[i:]:
                    log.warning(
                        "deleting %s: an empty segment after a gap in %s", mf.file_name, self.store_path
                    )
                    mf.destroy()
                del files[i:]
                fsync_dir(self.store_path)
                break
        except StoreIOError:
            for mf in files:
                mf.close()
            raise
        self.mapped_files = files

    # -- lookup -------------------------------------------------------------------------------
    def get_first_mapped_file(self) -> MappedFile | None:
        files = self.mapped_files
        return files[0] if files else None

    def get_last_mapped_file(self) -> MappedFile | None:
        files = self.mapped_files
        return files[-1] if files else None

    def get_last_mapped_file_or_create(self, start_offset: int = 0) -> MappedFile | None:
        """The last segment, or a new one when there is none or the last is full.

        ``start_offset`` is where the log starts when there is no segment yet (rounded down to a
        segment boundary). Returns None when creation timed out; raises DiskFullError/StoreIOError.
        """
        last = self.get_last_mapped_file()
        if last is not None and not last.is_full():
            return last
        if last is None:
            create_offset = start_offset - start_offset % self.mapped_file_size
        else:
            create_offset = last.file_from_offset + self.mapped_file_size
        return self._create(create_offset)

    def _create(self, create_offset: int) -> MappedFile | None:
        path = self.store_path / offset_to_file_name(create_offset)
        if self.allocator is not None:
            next_next = self.store_path / offset_to_file_name(create_offset + self.mapped_file_size)
            mf = self.allocator.put_request_and_return_mapped_file(path, next_next, self.mapped_file_size)
        else:
            mf = MappedFile.create(path, self.mapped_file_size, **self._create_kwargs)  # type: ignore[arg-type]
        if mf is None:
            return None
        if not self.mapped_files:
            mf.first_create_in_queue = True
        with self._list_lock:
            self.mapped_files = [*self.mapped_files, mf]
        if self._on_new_file is not None:
            self._on_new_file(mf)
        return mf

    def find_mapped_file_by_offset(
        self, offset: int, return_first_on_not_found: bool = False
    ) -> MappedFile | None:
        """The segment holding absolute ``offset``, or None (or the first segment) when none does."""
        files = self.mapped_files
        if not files:
            return None
        first = files[0]
        index = (offset - first.file_from_offset) // self.mapped_file_size
        if 0 <= index < len(files):
            mf = files[index]
            if mf.file_from_offset <= offset < mf.file_from_offset + self.mapped_file_size:
                return mf
        return first if return_first_on_not_found else None

    # -- offsets ------------------------------------------------------------------------------
    def get_min_offset(self) -> int:
        """Offset of the first byte still on disk; -1 when there is no segment."""
        first = self.get_first_mapped_file()
        return first.file_from_offset if first is not None else -1

    def get_max_offset(self) -> int:
        """Offset just past the last readable byte (committed, with a transient store pool)."""
        last = self.get_last_mapped_file()
        return last.file_from_offset + last.readable_position if last is not None else 0

    def get_max_wrote_position(self) -> int:
        """Offset just past the last appended byte."""
        last = self.get_last_mapped_file()
        return last.file_from_offset + last.wrote_position if last is not None else 0

    def remain_how_many_data_to_flush(self) -> int:
        return self.get_max_offset() - self.flushed_where

    # -- commit / flush -----------------------------------------------------------------------
    def commit(self, least_pages: int) -> bool:
        """Commit the segment holding ``committed_where``; True when the watermark moved."""
        with self._flush_lock:
            mf = self.find_mapped_file_by_offset(self.committed_where, self.committed_where == 0)
            if mf is None:
                return False
            position = mf.commit(least_pages)
            where = mf.file_from_offset + position
            moved = where != self.committed_where
            self.committed_where = where
            return moved

    def flush(self, least_pages: int) -> bool:
        """Flush the segment holding ``flushed_where``; True when the watermark moved."""
        with self._flush_lock:
            mf = self.find_mapped_file_by_offset(self.flushed_where, self.flushed_where == 0)
            if mf is None:
                return False
            store_ts = mf.store_timestamp
            position = mf.flush(least_pages)
            where = mf.file_from_offset + position
            moved = where != self.flushed_where
            self.flushed_where = where
            if moved and store_ts:
                self.store_timestamp = store_ts
            return moved

    def flush_to(self, target: int, least_pages: int = 0) -> int:
        """Flush segment after segment until ``flushed_where >= target`` or nothing moves."""
        while self.flushed_where < target:
            if not self.flush(least_pages):
                break
        return self.flushed_where

    def commit_to(self, target: int, least_pages: int = 0) -> int:
        """Commit segment after segment until ``committed_where >= target`` or nothing moves."""
        while self.committed_where < target:
            if not self.commit(least_pages):
                break
        return self.committed_where

    # -- truncation / deletion ----------------------------------------------------------------
    def delete_expired_files(
        self,
        expired_before: float,
        *,
        force: bool = False,
        batch_max: int = 10,
        pause: Callable[[], bool] | None = None,
        keep_from: int | None = None,
    ) -> list[tuple[str, int]]:
        """Delete segments from the head of the queue, oldest first (spec §9, RocketMQ's
        ``deleteExpiredFileByTime``): each whose last modification (mtime, seconds since the
        epoch) is before ``expired_before``, or any with ``force``; see :meth:`delete_head_files`
        for what is never deleted and the arguments. Without ``force``, a segment holding bytes
        at or past ``keep_from`` (an absolute offset; None: no such bound) is kept. Raises
        StoreIOError."""

        def doomed(mf: MappedFile) -> str:
            if not force and keep_from is not None and mf.file_from_offset + mf.file_size > keep_from:
                return ""
            try:
                modified = os.stat(mf.path).st_mtime
            except FileNotFoundError:
                modified = 0.0
            except OSError as exc:
                raise StoreIOError(f"cannot stat {mf.path}: {exc.strerror}") from exc
            if modified < expired_before:
                return "expired"
            return "disk usage forces it" if force else ""

        return self.delete_head_files(doomed, batch_max=batch_max, pause=pause)

    def delete_head_files(
        self,
        doomed: Callable[[MappedFile], str],
        *,
        batch_max: int = 10,
        pause: Callable[[], bool] | None = None,
    ) -> list[tuple[str, int]]:
        """Delete segments from the head while ``doomed(segment)`` gives a reason (non-empty):
        stops at the first it keeps. Never deletes the newest segment or one holding bytes not
        yet flushed (with a write buffer, flushed implies committed). At most ``batch_max`` per
        call; ``pause`` runs between two deletions and returns False to stop early (shutdown).
        The folder is fsynced once after the deletions.

        Readers that look up a deleted segment find none (their offset is below the min offset);
        one that still holds a view of its bytes keeps the mapping alive until it lets go (the
        file is already unlinked). Returns (file name, size in bytes) of each deleted segment.
        Raises StoreIOError when a file cannot be removed."""
        deleted: list[tuple[str, int]] = []
        while len(deleted) < batch_max:
            if deleted and pause is not None and not pause():
                break
            with self._flush_lock:
                files = self.mapped_files
                if len(files) < 2:
                    break
                mf = files[0]
                if mf.file_from_offset + mf.file_size > self.flushed_where:
                    break
                why = doomed(mf)
                if not why:
                    break
                with self._list_lock:  # the writer may have added a segment since ``files``
                    self.mapped_files = self.mapped_files[1:]  # readers see the new list or the old
                log.info("deleting segment %s: %s", mf.file_name, why)
                try:
                    mf.destroy()
                except OSError as exc:
                    raise StoreIOError(f"cannot delete {mf.path}: {exc.strerror}") from exc
                deleted.append((mf.file_name, mf.file_size))
        if deleted:
            fsync_dir(self.store_path)
        return deleted

    def truncate_dirty_files(self, offset: int, *, move_to: Path | None = None) -> list[Path]:
        """Cut the log at ``offset``: segments past it are deleted (or, with ``move_to``, moved
        into that folder), the one holding it is truncated, durably (its file fdatasynced, the
        folder fsynced), and segments the allocator created ahead past the new end are deleted
        too. Returns the paths the moved segments now have. Raises StoreIOError."""
        with self._flush_lock:
            return self._truncate_locked(offset, move_to)

    def _truncate_locked(self, offset: int, move_to: Path | None, *, zero_tail: bool = True) -> list[Path]:
        """See :meth:`truncate_dirty_files`; without ``zero_tail`` the segment holding ``offset``
        only takes its positions there (its tail is known to be never written)."""
        keep: list[MappedFile] = []
        gone: list[MappedFile] = []
        for mf in self.mapped_files:
            if mf.file_tail_offset <= offset:
                keep.append(mf)
            elif offset >= mf.file_from_offset:
                if zero_tail:
                    mf.truncate_to(offset - mf.file_from_offset)
                else:
                    mf.set_positions(offset - mf.file_from_offset)
                keep.append(mf)
            else:
                gone.append(mf)
        with self._list_lock:
            self.mapped_files = keep
        self.flushed_where = min(self.flushed_where, offset)
        self.committed_where = min(self.committed_where, offset)
        moved = self._remove(gone, move_to, f"beyond the log end {offset}")
        self._discard_created_ahead(self.segment_start_of(offset) + self.mapped_file_size)
        return moved

    def trust_end(self, offset: int) -> None:
        """End the log at ``offset`` as a clean shutdown recorded it (libstore.recovery): the
        segment holding it takes its positions there and segments past it (empty ones the
        allocator made ahead) are deleted, without reading or zeroing a byte. Raises StoreIOError."""
        with self._flush_lock:
            self._truncate_locked(offset, None, zero_tail=False)

    def reset_to_empty(self, start_offset: int) -> None:
        """Delete every segment, durably; the next append creates the segment holding
        ``start_offset``. Raises StoreIOError."""
        with self._flush_lock:
            with self._list_lock:
                gone, self.mapped_files = self.mapped_files, []
            self.flushed_where = self.committed_where = start_offset
            self._remove(gone, None, "the log restarts empty")
            self._discard_created_ahead(0)

    def _remove(self, files: list[MappedFile], move_to: Path | None, why: str) -> list[Path]:
        """Delete ``files`` (or move them into ``move_to``) and fsync the folder(s)."""
        moved: list[Path] = []
        if move_to is not None and files:
            move_to.mkdir(parents=True, exist_ok=True)
        for mf in files:
            if move_to is None:
                log.info("deleting segment %s: %s", mf.file_name, why)
                mf.destroy()
                continue
            mf.close()
            target = move_to / mf.file_name
            try:
                os.replace(mf.path, target)
            except OSError as exc:
                raise StoreIOError(f"cannot move {mf.path} to {move_to}: {exc.strerror}") from exc
            if durability_hooks.observer is not None:
                durability_hooks.observer.moved(mf.path, target)
            log.warning("moved segment %s to %s: %s", mf.file_name, move_to, why)
            moved.append(target)
        if files:
            fsync_dir(self.store_path)
            if move_to is not None:
                fsync_dir(move_to)
        return moved

    def _discard_created_ahead(self, offset: int) -> None:
        if self.allocator is not None and self.allocator.discard_from(self.store_path, offset):
            fsync_dir(self.store_path)

    def shutdown(self) -> None:
        for mf in self.mapped_files:
            mf.close()
        self.mapped_files = []

    def segment_start_of(self, offset: int) -> int:
        """Start offset of the segment that holds (or would hold) ``offset``."""
        return offset - offset % self.mapped_file_size

    def roll_next_file(self, offset: int) -> int:
        """Start of the segment after the one holding ``offset`` (RocketMQ ``rollNextFile``)."""
        return offset + self.mapped_file_size - offset % self.mapped_file_size

    def file_name_of(self, offset: int) -> str:
        return offset_to_file_name(self.segment_start_of(offset))

    @staticmethod
    def parse_file_name(name: str) -> int:
        return file_name_to_offset(name)


def _all_zeros(mf: MappedFile, chunk: int = 1 << 20) -> bool:
    """True when every byte of the segment is zero."""
    buf = mf.buffer
    zeros = bytes(chunk)
    for pos in range(0, mf.file_size, chunk):
        n = min(chunk, mf.file_size - pos)
        if buf[pos : pos + n] != zeros[:n]:
            return False
    return True
