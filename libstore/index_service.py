"""IndexService: the IndexFiles of a store, built by dispatch and queried by key (spec sheet §4).

Each dispatched record adds ``topic#UNIQ_KEY`` and ``topic#k`` for every non-empty token of its
KEYS property (split on one space); ROLLBACK records add nothing. Entries go to the newest
IndexFile; a full file is left for the flusher and a new one, named by the current local time
and seeded with the full file's end offset and time, takes over.

Replays are harmless: a record at or before the last indexed CommitLog offset is skipped. After
a crash the owner calls :meth:`IndexService.discard_after` with the offset known to be indexed
and flushed: newer files (which may be torn) are deleted and dispatch restarts from the oldest
deleted file's first offset (RocketMQ deletes index files newer than its checkpoint likewise).

Queries: newest file first, only files whose time span overlaps [begin, end], newest entry first
within a file, at most ``maxMsgsNumBatch`` offsets; hashes only, so callers confirm the keys.

Thread-safety: one dispatcher thread writes; queries may run from any thread (the file list is
replaced, never mutated in place).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from libstore import record_codec
from libstore._files import fsync_dir
from libstore.dispatch_request import DispatchRequest
from libstore.errors import StoreIOError
from libstore.index_file import IndexFile, index_hash_of
from libstore.message import MessageSysFlag
from libstore.tags import java_string_hashes

log = logging.getLogger(__name__)

_NAME_FORMAT = "%Y%m%d%H%M%S"


def index_file_name(ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` of a time in ms since the epoch, local time (spec §0)."""
    moment = dt.datetime.fromtimestamp(ms / 1000)
    return moment.strftime(_NAME_FORMAT) + f"{ms % 1000:03d}"


def index_file_time(name: str) -> int:
    """Inverse of :func:`index_file_name` (ms); ValueError for other names."""
    if len(name) != 17 or not name.isdigit():
        raise ValueError(f"not an index file name: {name!r}")
    moment = dt.datetime.strptime(name[:14], _NAME_FORMAT)
    return int(moment.timestamp()) * 1000 + int(name[14:])


def index_entries(
    requests: Sequence[DispatchRequest], last: int
) -> tuple[list[int], list[int], list[int], int]:
    """The IndexFile entries of ``requests`` (records in log order) after CommitLog offset
    ``last``: ``(key hashes, CommitLog offsets, store times, the last offset indexed)``, one
    entry for ``topic#UNIQ_KEY`` and one per KEYS token ``topic#k`` of each record that has
    any (none for ROLLBACK records, nor for records at or before ``last``: replays). In C when
    libstore._codec is built, hashing the keys without building them; the Python below is
    its reference (all the batch's keys hashed at once)."""
    ext = record_codec.native()
    if ext is not None and type(last) is int:
        found = ext.index_entries(requests if type(requests) is list else list(requests), last)
        if found is not NotImplemented:
            return found  # type: ignore[no-any-return]
    keys: list[str] = []
    offsets: list[int] = []  # per key: the record's CommitLog offset and store time
    timestamps: list[int] = []
    rollback = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
    mask = MessageSysFlag.TRANSACTION_TYPE_MASK
    for req in requests:
        offset = req.commit_log_offset
        if offset <= last or req.sys_flag & mask == rollback:
            continue
        uniq = req.uniq_key
        if not req.keys and not uniq:
            continue
        prefix = req.topic + "#"
        ts = req.store_timestamp
        if uniq:
            keys.append(prefix + uniq)
            offsets.append(offset)
            timestamps.append(ts)
        for key in req.keys:
            keys.append(prefix + key)
            offsets.append(offset)
            timestamps.append(ts)
        last = offset
    if not keys:
        return [], [], [], last
    if ext is not None:
        return ext.index_hashes(keys), offsets, timestamps, last
    return [index_hash_of(h) for h in java_string_hashes(keys)], offsets, timestamps, last


class IndexService:
    """IndexFiles under ``store_path`` (the ``index`` folder); sizes from the config keys
    maxHashSlotNum/maxIndexNum; ``max_msgs_num_batch`` caps query results."""

    def __init__(
        self, store_path: Path, hash_slot_num: int, index_num: int, max_msgs_num_batch: int = 64
    ) -> None:
        self.store_path = Path(store_path)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.max_msgs_num_batch = max_msgs_num_batch
        self.files: list[IndexFile] = []
        self._dirty: set[str] = set()
        self._lock = threading.Lock()
        self.last_indexed_offset = -1
        # (file name, index count) after the last dispatched batch: every entry below it is
        # completely written. Sampled for the checkpoint before a flush (see roll_back).
        self.applied_mark: tuple[str, int] | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def load(self) -> None:
        """Map the IndexFiles on disk (oldest first). Raises StoreIOError."""
        self.store_path.mkdir(parents=True, exist_ok=True)
        names = []
        for entry in os.scandir(self.store_path):
            if entry.name.endswith(".tmp"):
                os.unlink(entry.path)
            elif len(entry.name) == 17 and entry.name.isdigit():
                names.append(entry.name)
        files = []
        try:
            for name in sorted(names):
                files.append(IndexFile.open(self.store_path / name, self.hash_slot_num, self.index_num))
        except StoreIOError:
            for f in files:
                f.close()
            raise
        self.files = files
        self._refresh_last_indexed()

    def _refresh_last_indexed(self) -> None:
        files = self.files
        if not files or (len(files) == 1 and files[0].index_count <= 1):
            self.last_indexed_offset = -1
        else:
            self.last_indexed_offset = files[-1].end_phy_offset

    def discard_after(self, phy_offset: int) -> int | None:
        """Delete the first file holding an entry for a record at or past ``phy_offset`` and every
        file after it. Returns the CommitLog offset dispatch must restart from to rebuild what
        was deleted (the first deleted entry's), or None when nothing was deleted."""
        with self._lock:
            cut = _first_reaching(self.files, phy_offset)
            if cut is None:
                return None
            restart = self.files[cut].begin_phy_offset
            self._delete_locked(cut)
        return restart

    def roll_back(self, phy_offset: int, mark: tuple[str, int] | None = None) -> int | None:
        """Make the files hold only entries for records before ``phy_offset``, keeping what can
        be trusted instead of deleting whole files.

        ``mark`` is None when every file's header is what this process wrote (a live store, or
        one shut down cleanly); after a crash it is the :attr:`applied_mark` saved with the
        checkpoint: that file's entries below its count were flushed, as were the files before
        it, while the files after it were made since and are deleted. The first file with an
        entry at or past ``phy_offset`` keeps its entries before it (see IndexFile.roll_back),
        later files are deleted. Returns the CommitLog offset dispatch must restart from to
        rebuild what was lost before ``phy_offset``, or None when nothing was. Raises
        StoreIOError."""
        with self._lock:
            files = self.files
            if mark is None:
                limit = len(files)  # every header is exact
            else:
                names = [f.file_name for f in files]
                if mark[0] not in names:
                    # The marked file is gone (removed by hand): keep the files older than it,
                    # rebuild from where they end.
                    older = sum(1 for n in names if n < mark[0])
                    self._delete_locked(older)
                    return min(phy_offset, files[older - 1].end_phy_offset if older else 0)
                limit = names.index(mark[0])  # the files before it were flushed whole
            cut = _first_reaching(files[:limit], phy_offset)
            if cut is None:
                if mark is None:
                    return None
                cut = limit
            durable = mark[1] if mark is not None and cut == limit else files[cut].index_count
            f = files[cut]
            kept = f.roll_back(phy_offset, durable)
            self._dirty.discard(f.file_name)
            log.info(
                "index file %s rolled back to %d entries (records before CommitLog offset %d)",
                f.file_name,
                kept - 1,
                phy_offset,
            )
            self._delete_locked(cut + 1 if kept > 1 else cut)
        return None

    def _delete_locked(self, first: int) -> None:
        """Delete files ``first..`` (lock held)."""
        for f in self.files[first:]:
            log.info("deleting index file %s (to CommitLog offset %d)", f.file_name, f.end_phy_offset)
            self._dirty.discard(f.file_name)
            f.destroy()
        self.files = self.files[:first]
        self._refresh_last_indexed()
        self._forget_mark_if_gone()

    def delete_expired(self, commit_log_min_offset: int) -> int:
        """Delete, oldest first, the IndexFiles whose every entry is for a record below
        ``commit_log_min_offset`` (RocketMQ's ``deleteExpiredFile``); never the newest file.
        Returns how many were deleted. Raises StoreIOError."""
        with self._lock:
            files = self.files
            n = 0
            while n < len(files) - 1 and files[n].end_phy_offset < commit_log_min_offset:
                n += 1
            if not n:
                return 0
            for f in files[:n]:
                log.info(
                    "deleting index file %s: its records end at %d, below the CommitLog's min offset %d",
                    f.file_name,
                    f.end_phy_offset,
                    commit_log_min_offset,
                )
                self._dirty.discard(f.file_name)
                f.destroy()
            self.files = files[n:]
            self._forget_mark_if_gone()
        fsync_dir(self.store_path)
        return n

    def _forget_mark_if_gone(self) -> None:
        if self.applied_mark is not None and self.applied_mark[0] not in {f.file_name for f in self.files}:
            self.applied_mark = None

    def flush_all(self) -> None:
        """fdatasync every file written since its last flush. Raises StoreIOError; the files it
        did not flush stay marked as written, so the next call flushes them."""
        with self._lock:
            files = [f for f in self.files if f.file_name in self._dirty]
            self._dirty.difference_update(f.file_name for f in files)
        for i, f in enumerate(files):
            try:
                if not f.closed:
                    f.flush()
            except BaseException:
                with self._lock:
                    self._dirty.update(g.file_name for g in files[i:])
                raise

    def shutdown(self) -> None:
        try:
            self.flush_all()
        finally:
            for f in self.files:
                f.close()

    # -- build ----------------------------------------------------------------------------------
    def dispatch(self, req: DispatchRequest) -> None:
        """Index one record's unique key and keys (see :meth:`dispatch_batch`)."""
        self.dispatch_batch((req,))

    def dispatch_batch(self, requests: Sequence[DispatchRequest]) -> None:
        """Index ``topic#UNIQ_KEY`` and ``topic#k`` per KEYS token of each record, skipping
        ROLLBACK records and records at or before the last indexed offset (replays)
        (:func:`index_entries`). Raises StoreIOError when a file cannot be made."""
        hashes, offsets, timestamps, last = index_entries(requests, self.last_indexed_offset)
        if not hashes:
            return
        f = self.files[-1] if self.files else self._new_file(None)
        done = f.put_many(hashes, offsets, timestamps)
        self._dirty.add(f.file_name)
        while done < len(hashes):  # the file is full: roll
            f = self._new_file(f)
            done += f.put_many(hashes, offsets, timestamps, done)
            self._dirty.add(f.file_name)
        self.last_indexed_offset = last
        self.applied_mark = (f.file_name, f.index_count)

    def _new_file(self, full: IndexFile | None) -> IndexFile:
        now = time.time_ns() // 1_000_000
        if self.files:
            now = max(now, index_file_time(self.files[-1].file_name) + 1)
        path = self.store_path / index_file_name(now)
        end_phy = full.end_phy_offset if full is not None else 0
        end_ts = full.end_timestamp if full is not None else 0
        f = IndexFile.create(
            path, self.hash_slot_num, self.index_num, end_phy_offset=end_phy, end_timestamp=end_ts
        )
        with self._lock:
            self.files = [*self.files, f]
        if full is not None:
            log.info("index file %s is full; %s takes over", full.file_name, f.file_name)
        return f

    # -- query ----------------------------------------------------------------------------------
    def query_offsets(self, topic: str, key: str, max_num: int, begin: int, end: int) -> list[int]:
        """CommitLog offsets of messages indexed under ``key`` in ``topic`` with store time in
        [begin, end] (ms), newest first, at most min(max_num, maxMsgsNumBatch)."""
        limit = min(max_num, self.max_msgs_num_batch)
        full_key = f"{topic}#{key}"
        out: list[int] = []
        for f in reversed(self.files):
            if len(out) >= limit:
                break
            if f.is_time_matched(begin, end):
                try:
                    out.extend(f.select_phy_offsets(full_key, limit - len(out), begin, end))
                except ValueError:  # file deleted under us
                    continue
            if f.begin_timestamp < begin:
                break
        return out


def _first_reaching(files: Sequence[IndexFile], phy_offset: int) -> int | None:
    """Index of the first file holding an entry for a record at or past ``phy_offset``, or None."""
    return next(
        (i for i, f in enumerate(files) if f.index_count > 1 and f.end_phy_offset >= phy_offset), None
    )
