"""IndexFile: a hash index from message keys to CommitLog offsets (spec sheet §4).

One file, named by its creation time (``yyyyMMddHHmmssSSS``, local time), laid out as::

    +--------------------+---------------------------+------------------------------+
    | header (40 bytes)  | hash slots (4 B x slots)  | entries (20 B x indexNum)    |
    +--------------------+---------------------------+------------------------------+

    header: beginTimestamp int64 | endTimestamp int64 | beginPhyOffset int64 |
            endPhyOffset int64 | hashSlotCount int32 | indexCount int32
    slot:   int32 number of the newest entry of the bucket (0: empty)
    entry:  keyHash int32 | phyOffset int64 | timeDiff int32 (s after beginTimestamp) |
            prevIndex int32 (older entry of the bucket, 0: none)

Entry 0 is never used (``indexCount`` starts at 1), so a file holds ``indexNum - 1`` entries and
is full when ``indexCount >= indexNum``. Keys hash with Java's ``String.hashCode`` made
non-negative; lookups compare hashes only (the caller checks the message's real keys).

One departure from RocketMQ's writer, on purpose: RocketMQ takes the first entry's time
difference against the begin timestamp seeded from the previous file and only then replaces it
with the entry's own store time, so that entry reads back as (gap to the previous file) seconds
too late and can fall outside a query's time window. Here the first entry sets the begin
timestamp first (time difference 0). Layout and lookup are unchanged, so files written by either
read the same way.

Thread-safety: one writer; lookups may run concurrently (they read whole entries).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import numpy as np

from libstore import durability_hooks, record_codec
from libstore.errors import StoreIOError
from libstore.mapped_file import MappedFile
from libstore.tags import java_string_hash

INDEX_HEADER_SIZE: Final = 40
HASH_SLOT_SIZE: Final = 4
INDEX_SIZE: Final = 20
INVALID_INDEX: Final = 0
_HEADER = struct.Struct(">qqqqii")
_SLOT = struct.Struct(">i")
_ENTRY = struct.Struct(">iqii")
_ENTRY_DTYPE = np.dtype([("hash", ">i4"), ("phy", ">i8"), ("diff", ">i4"), ("prev", ">i4")])
_INT_MAX = 0x7FFFFFFF


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    """Bytes of one IndexFile (420,000,040 with the defaults)."""
    return INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_SIZE


def index_key_hash_code(key: str) -> int:
    """abs(Java ``String.hashCode``), with Integer.MIN_VALUE mapped to 0 (RocketMQ's rule)."""
    return index_hash_of(java_string_hash(key))


def index_hash_of(java_hash: int) -> int:
    """The IndexFile hash of a key whose Java ``String.hashCode`` is ``java_hash``."""
    h = abs(java_hash)
    return 0 if h > _INT_MAX else h


class IndexFile:
    """One IndexFile (see module docstring) in a MappedFile (its creation, mapping, close and
    deletion). Create with :meth:`create`, map with :meth:`open`."""

    def __init__(self, file: MappedFile, hash_slot_num: int, index_num: int) -> None:
        self._file = file
        self.path = file.path
        self.file_name = self.path.name
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.file_size = index_file_size(hash_slot_num, index_num)
        self._mmap = file.buffer
        # The header (RocketMQ's IndexHeader): times in ms, CommitLog offsets, counts.
        self.begin_timestamp: int
        self.end_timestamp: int
        self.begin_phy_offset: int
        self.end_phy_offset: int
        self.hash_slot_count: int
        self.index_count: int
        (
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        ) = _HEADER.unpack_from(self._mmap, 0)
        if self.index_count <= 0:
            self.index_count = 1
        self._entries_at = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE

    @classmethod
    def create(
        cls,
        path: Path,
        hash_slot_num: int,
        index_num: int,
        *,
        end_phy_offset: int = 0,
        end_timestamp: int = 0,
    ) -> IndexFile:
        """A new zeroed file whose header is seeded with the previous file's end offset and time
        (MappedFile.create: allocated through a temporary name, the folder synced).

        Raises StoreIOError (DiskFull included) when the file cannot be allocated.
        """
        f = cls(
            MappedFile.create(path, index_file_size(hash_slot_num, index_num), file_from_offset=0),
            hash_slot_num,
            index_num,
        )
        if end_phy_offset > 0:
            f.begin_phy_offset = f.end_phy_offset = end_phy_offset
        if end_timestamp > 0:
            f.begin_timestamp = f.end_timestamp = end_timestamp
        f._write_header()
        return f

    @classmethod
    def open(cls, path: Path, hash_slot_num: int, index_num: int) -> IndexFile:
        """Map an existing file; raises StoreIOError when it cannot be opened or its size does
        not match the config."""
        expected = index_file_size(hash_slot_num, index_num)
        try:
            actual = os.stat(path).st_size
        except OSError as exc:
            raise StoreIOError(f"cannot open index file {path}: {exc.strerror}") from exc
        if actual != expected:
            raise StoreIOError(
                f"{path} is {actual} bytes but IndexFiles of {hash_slot_num} slots and {index_num} "
                f"entries are {expected}; was the store built with other maxHashSlotNum/maxIndexNum?"
            )
        return cls(MappedFile.open(path, expected, file_from_offset=0), hash_slot_num, index_num)

    def _write_header(self) -> None:
        _HEADER.pack_into(
            self._mmap,
            0,
            self.begin_timestamp,
            self.end_timestamp,
            self.begin_phy_offset,
            self.end_phy_offset,
            self.hash_slot_count,
            self.index_count,
        )

    # -- write ----------------------------------------------------------------------------------
    def is_write_full(self) -> bool:
        return self.index_count >= self.index_num

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Add one entry; False when the file is full (the caller rolls to a new file)."""
        return self.put_many((index_key_hash_code(key),), (phy_offset,), (store_timestamp,)) == 1

    def put_hashed(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """:meth:`put_key` with the key's :func:`index_key_hash_code` already computed."""
        return self.put_many((key_hash,), (phy_offset,), (store_timestamp,)) == 1

    def put_many(
        self, key_hashes: Sequence[int], offsets: Sequence[int], timestamps: Sequence[int], start: int = 0
    ) -> int:
        """Add entries ``start..`` of the three parallel sequences (index hashes, CommitLog offsets,
        store times) until the file is full; returns how many were added.

        The header is written first with the batch's final count and end offset, then the
        entries, then the header again: a crash in between leaves a header that claims the
        batch, so recovery (which drops files past the dispatch checkpoint) rebuilds this file
        instead of trusting slots that point past a stale entry count.
        """
        count = self.index_count
        n = min(len(key_hashes) - start, self.index_num - count)
        if n <= 0:
            return 0
        stop = start + n
        if count <= 1:  # the first entry defines the file's begin (see module docstring)
            self.begin_phy_offset = offsets[start]
            self.begin_timestamp = timestamps[start]
        self.index_count = count + n
        self.end_phy_offset = offsets[stop - 1]
        self.end_timestamp = timestamps[stop - 1]
        self._write_header()
        mm = self._mmap
        slot_num = self.hash_slot_num
        entries_at = self._entries_at
        begin = self.begin_timestamp
        ext = record_codec.native()
        if (
            ext is not None
            and type(key_hashes) is list
            and type(offsets) is list
            and type(timestamps) is list
        ):
            # The same loop in C (libstore._codec.index_put_run); the code below is its reference.
            self.hash_slot_count += ext.index_put_run(
                mm, key_hashes, offsets, timestamps, start, stop, count, slot_num, entries_at, begin
            )
            self._write_header()
            return n
        unpack_slot = _SLOT.unpack_from
        pack_slot = _SLOT.pack_into
        pack_entry = _ENTRY.pack_into
        new_slots = 0
        for k in range(start, stop):
            key_hash = key_hashes[k]
            slot_pos = INDEX_HEADER_SIZE + (key_hash % slot_num) * HASH_SLOT_SIZE
            slot_value = unpack_slot(mm, slot_pos)[0]
            if slot_value <= INVALID_INDEX or slot_value > count:
                slot_value = INVALID_INDEX
                new_slots += 1
            if begin <= 0:
                time_diff = 0
            else:
                time_diff = (timestamps[k] - begin) // 1000
                time_diff = 0 if time_diff < 0 else _INT_MAX if time_diff > _INT_MAX else time_diff
            pack_entry(mm, entries_at + count * INDEX_SIZE, key_hash, offsets[k], time_diff, slot_value)
            pack_slot(mm, slot_pos, count)
            count += 1
        self.hash_slot_count += new_slots
        self._write_header()
        return n

    def roll_back(self, phy_offset: int, durable_count: int) -> int:
        """Keep only the entries for records before ``phy_offset`` among the first
        ``durable_count`` entry numbers (those known written, and after a crash known flushed):
        later entries are zeroed, the hash slots rebuilt from the kept entries, the header set to
        match, and the file fdatasync'ed. The result equals a file built from those records
        alone (spec sheet §4's layout). Entries must be in CommitLog order (dispatch writes them
        so). Returns the new ``index_count`` (1: no entry kept). Raises StoreIOError.
        """
        durable = max(1, min(durable_count, self.index_num))
        entries_at = self._entries_at
        raw = self._mmap[entries_at : entries_at + durable * INDEX_SIZE]
        entries = np.frombuffer(raw, dtype=_ENTRY_DTYPE)
        keep = 1 + int(np.searchsorted(entries["phy"][1:], phy_offset, side="left"))
        # Zero what follows the kept entries, as far as anything may have been written.
        written = max(durable, min(self.index_count, self.index_num))
        tail_from = entries_at + keep * INDEX_SIZE
        self._mmap[tail_from : entries_at + written * INDEX_SIZE] = bytes((written - keep) * INDEX_SIZE)
        slots = np.zeros(self.hash_slot_num, dtype=np.int64)
        if keep > 1:
            kept = entries[1:keep]
            np.maximum.at(slots, kept["hash"].astype(np.int64) % self.hash_slot_num, np.arange(1, keep))
        self._mmap[INDEX_HEADER_SIZE:entries_at] = slots.astype(">i4").tobytes()
        self.hash_slot_count = int(np.count_nonzero(slots))
        self.index_count = keep
        if keep > 1:
            last = entries[keep - 1]
            self.end_phy_offset = int(last["phy"])
            # The entry holds seconds after the begin time: the end is known to the second, and
            # taken at that second's end so that time-window lookups still reach the entry.
            self.end_timestamp = self.begin_timestamp + int(last["diff"]) * 1000 + 999
        else:
            self.end_phy_offset = self.begin_phy_offset
            self.end_timestamp = self.begin_timestamp
        self.flush()
        return keep

    # -- read -----------------------------------------------------------------------------------
    def is_time_matched(self, begin: int, end: int) -> bool:
        """Whether [begin, end] (ms) overlaps this file's [beginTimestamp, endTimestamp]."""
        b, e = self.begin_timestamp, self.end_timestamp
        return (begin < b and end > e) or (b <= begin <= e) or (b <= end <= e)

    def select_phy_offsets(self, key: str, max_num: int, begin: int, end: int) -> list[int]:
        """CommitLog offsets of entries whose key hash matches ``key`` and whose store time is in
        [begin, end] (ms), newest first, at most ``max_num``."""
        out: list[int] = []
        if max_num <= 0 or self._file.closed:
            return out
        key_hash = index_key_hash_code(key)
        mm = self._mmap
        index_count = self.index_count
        slot_value = _SLOT.unpack_from(
            mm, INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE
        )[0]
        if slot_value <= INVALID_INDEX or slot_value > index_count or index_count <= 1:
            return out
        begin_ts = self.begin_timestamp
        entries_at = self._entries_at
        current = slot_value
        while len(out) < max_num:
            key_hash_read, phy, time_diff, prev = _ENTRY.unpack_from(mm, entries_at + current * INDEX_SIZE)
            if time_diff < 0:
                break
            time_read = begin_ts + time_diff * 1000
            if key_hash_read == key_hash and begin <= time_read <= end:
                out.append(phy)
            if prev <= INVALID_INDEX or prev > index_count or prev == current or time_read < begin:
                break
            current = prev
        return out

    # -- lifecycle ------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the header and fdatasync the file. Raises StoreIOError."""
        self._write_header()
        try:  # the whole file: slots and entries anywhere in it
            durability_hooks.fdatasync(self._file.fd, self.path)
        except OSError as exc:
            raise StoreIOError(f"fdatasync of index file {self.file_name} failed: {exc.strerror}") from exc

    def close(self) -> None:
        """Unmap and close; idempotent."""
        self._file.close()

    def destroy(self) -> None:
        """Close and delete the file (MappedFile.destroy)."""
        self._file.destroy()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def __repr__(self) -> str:
        return (
            f"IndexFile({self.file_name}, entries={self.index_count - 1}, "
            f"phy=[{self.begin_phy_offset}, {self.end_phy_offset}])"
        )
