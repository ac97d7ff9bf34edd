"""ConsumeQueue: the per (topic, queue id) index of the CommitLog (spec sheet §3).

One 20-byte unit per message, in queue-offset order; queue offset *i* sits at byte *i* × 20 of
the queue's logical file space, split into segments of 300,000 units (6,000,000 bytes) named by
their first byte's offset under ``consumequeue/<topic>/<queueId>/``::

    +--------------------------+-------------+--------------------------+
    | CommitLog offset (int64) | size (int32) | tags code (int64)        |
    +--------------------------+-------------+--------------------------+
      0                          8              12                        20

A unit is valid when its offset is >= 0 and its size > 0. Blank units (0, Integer.MAX_VALUE, 0)
fill the slots before a queue's first real unit when the queue starts past offset 0 (its older
messages are gone from the CommitLog); readers skip them.

Derived state: everything here can be rebuilt from the CommitLog. Appends are idempotent (a
unit whose message ends at or before the queue's ``max_physic_offset`` is a replay and is
skipped), recovery keeps the valid prefix, and :meth:`ConsumeQueue.truncate_dirty_logic_files`
cuts units that point past the CommitLog's end.

Thread-safety: one dispatcher thread appends; any thread may read (readers see units up to the
write position, which moves after a unit is complete).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import struct
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Final, NamedTuple

import numpy as np

from libstore.errors import StoreIOError
from libstore.mapped_file import MappedFile
from libstore.mapped_file_queue import MappedFileQueue

log = logging.getLogger(__name__)

CQ_STORE_UNIT_SIZE: Final = 20
_UNIT = struct.Struct(">qiq")  # CommitLog offset, size, tags code
BLANK_UNIT_SIZE: Final = 0x7FFFFFFF  # size field of a pre-fill unit (Integer.MAX_VALUE)
_UNIT_DTYPE = np.dtype([("phy", ">i8"), ("size", ">i4"), ("tag", ">i8")])  # _UNIT, for whole files


def _units_of(mf: MappedFile, count: int) -> np.ndarray:
    """The first ``count`` units of ``mf`` as a numpy view of its mapping (recovery scans them
    at once, not one by one); the caller drops the view before the file may be unmapped."""
    return np.frombuffer(mf.buffer, dtype=_UNIT_DTYPE, count=count)


_BLANK_UNIT = _UNIT.pack(0, BLANK_UNIT_SIZE, 0)


def _out_of_order(offsets: np.ndarray, sizes: np.ndarray, end_before: int) -> np.ndarray:
    """Mask of the real units that start before the end of the real unit ahead of them
    (``end_before``: the end of the last real unit before these, -1 for none). A queue's
    records are in CommitLog order, so such a unit was torn: a 20-byte unit can straddle two
    512-byte sectors, and a power loss can take back the sector with its offset field alone
    (which then reads zero, or a part of the right value: always smaller)."""
    real: np.ndarray = sizes != BLANK_UNIT_SIZE
    if not len(real):
        return real
    ends = np.where(real, offsets.astype(np.int64) + sizes.astype(np.int64), -1)
    ahead = np.concatenate(([end_before], np.maximum.accumulate(ends)[:-1]))
    torn: np.ndarray = real & (offsets < ahead)
    return torn


def consume_queue_file_size(configured: int) -> int:
    """Segment size in bytes: the configured size rounded up to a whole number of units."""
    return -(-configured // CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE


_new_unit = tuple.__new__


class CqUnit(NamedTuple):
    """One unit: its queue offset, the message's CommitLog offset and size (bytes), tags code."""

    queue_offset: int
    phy_offset: int
    size: int
    tags_code: int


class UnitColumns(NamedTuple):
    """Consecutive units from ``queue_offset``, column by column: the messages' CommitLog
    offsets, their sizes (bytes; BLANK_UNIT_SIZE for a pre-fill unit) and tags codes."""

    queue_offset: int
    phy_offsets: list[int]
    sizes: list[int]
    tags_codes: list[int]


class BoundaryType(enum.Enum):
    """Which queue offset a time lookup returns (RocketMQ 5 ``BoundaryType``).

    LOWER: the first message stored at or after the time. UPPER: the last one stored at or before.
    """

    LOWER = "LOWER"
    UPPER = "UPPER"


class ConsumeQueue:
    """The units of one (topic, queue id); see the module docstring.

    ``store_path`` is the ``consumequeue`` folder; ``mapped_file_size`` the configured segment
    size in bytes (rounded up to whole units).
    """

    def __init__(self, topic: str, queue_id: int, store_path: Path, mapped_file_size: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.mapped_file_size = consume_queue_file_size(mapped_file_size)
        self.queue = MappedFileQueue(Path(store_path) / topic / str(queue_id), self.mapped_file_size)
        self.max_physic_offset = -1  # end (offset + size) of the last unit's message
        self.min_logic_offset = 0  # bytes: first real unit
        self._loaded = False

    # -- lifecycle ------------------------------------------------------------------------------
    def load(self) -> None:
        """Map the segments on disk; raises StoreIOError (wrong size, gap)."""
        self.queue.load()
        self._loaded = True

    def recover(self) -> int:
        """Keep the valid prefix of units (from the third-to-last segment on, as RocketMQ does);
        set positions and ``max_physic_offset``. Returns the number of units kept past the scan
        start."""
        files = self.queue.mapped_files
        if not files:
            self.max_physic_offset = -1
            return 0
        start = max(0, len(files) - 3)
        end_logic = files[start].file_from_offset
        max_phy = self._end_of_real_units_before(start)
        kept = 0
        for mf in files[start:]:
            size = mf.file_size
            count = size // CQ_STORE_UNIT_SIZE
            units = _units_of(mf, count)
            offsets, sizes = units["phy"], units["size"]
            # A unit that was never written (zeros: size 0) ends the valid prefix, and so does
            # one torn by a power loss (its offset field taken back: out of log order).
            bad = np.flatnonzero((offsets < 0) | (sizes <= 0) | _out_of_order(offsets, sizes, max_phy))
            valid = int(bad[0]) if len(bad) else count
            real = np.flatnonzero(sizes[:valid] != BLANK_UNIT_SIZE)
            if len(real):
                last = int(real[-1])
                max_phy = int(offsets[last]) + int(sizes[last])
            del units, offsets, sizes  # views of the mapping: gone before it may be unmapped
            pos = valid * CQ_STORE_UNIT_SIZE
            kept += valid
            end_logic = mf.file_from_offset + pos
            if pos < size:
                break
        self.queue.truncate_dirty_files(end_logic)
        self.queue.flushed_where = self.queue.committed_where = end_logic
        if max_phy < 0:
            max_phy = self._scan_back_for_max_physic_offset()
        self.max_physic_offset = max_phy
        self._fix_min_logic_offset()
        return kept

    def _end_of_real_units_before(self, index: int) -> int:
        """End (CommitLog offset + size) of the last real unit in the segments before
        ``self.queue.mapped_files[index]``; -1 when there is none."""
        for mf in reversed(self.queue.mapped_files[:index]):
            pos = mf.wrote_position - CQ_STORE_UNIT_SIZE
            while pos >= 0:
                phy: int
                size: int
                phy, size, _ = _UNIT.unpack_from(mf.buffer, pos)
                if size != BLANK_UNIT_SIZE:
                    return phy + size
                pos -= CQ_STORE_UNIT_SIZE
        return -1

    def _scan_back_for_max_physic_offset(self) -> int:
        """End of the last real unit, searching back over blank units (rare: a queue of blanks)."""
        for mf in reversed(self.queue.mapped_files):
            pos = mf.wrote_position - CQ_STORE_UNIT_SIZE
            while pos >= 0:
                offset: int
                size: int
                offset, size, _ = _UNIT.unpack_from(mf.buffer, pos)
                if size != BLANK_UNIT_SIZE and offset >= 0 and size > 0:
                    return offset + size
                pos -= CQ_STORE_UNIT_SIZE
        return -1

    def _fix_min_logic_offset(self) -> None:
        first = self.queue.get_first_mapped_file()
        if first is None:
            self.min_logic_offset = 0
            return
        pos = 0
        while pos < first.wrote_position:
            _, size, _ = _UNIT.unpack_from(first.buffer, pos)
            if size != BLANK_UNIT_SIZE:
                break
            pos += CQ_STORE_UNIT_SIZE
        self.min_logic_offset = first.file_from_offset + pos

    def flush(self, least_pages: int = 0) -> bool:
        """Flush the segment holding the flushed watermark; True when it moved."""
        return self.queue.flush(least_pages)

    def flush_all(self) -> None:
        """Flush every written byte (segment after segment)."""
        self.queue.flush_to(self.queue.get_max_wrote_position(), 0)

    def shutdown(self) -> None:
        self.queue.shutdown()

    def destroy(self) -> None:
        """Delete every segment and the queue's folder."""
        self.queue.reset_to_empty(0)
        self.max_physic_offset = -1
        self.min_logic_offset = 0
        for folder in (self.queue.store_path, self.queue.store_path.parent):
            with contextlib.suppress(OSError):  # not empty: someone else's files; leave it
                folder.rmdir()

    # -- offsets ---------------------------------------------------------------------------------
    @property
    def min_offset_in_queue(self) -> int:
        """First queue offset that holds a real unit."""
        return self.min_logic_offset // CQ_STORE_UNIT_SIZE

    @property
    def max_offset_in_queue(self) -> int:
        """Queue offset the next unit will take (units are 0..max-1)."""
        return self.queue.get_max_wrote_position() // CQ_STORE_UNIT_SIZE

    # -- append ----------------------------------------------------------------------------------
    def put_message_position_info(
        self, phy_offset: int, size: int, tags_code: int, queue_offset: int
    ) -> bool:
        """Append the unit of the message at ``phy_offset`` (``size`` bytes) as ``queue_offset``.

        Returns False when skipped: a replay (the message ends at or before ``max_physic_offset``)
        or a queue offset that already holds a unit. A queue offset past the end (a gap) is
        filled with blank units first and logged, so unit *i* always is queue offset *i*.
        Raises StoreIOError when a segment cannot be created or written.
        """
        if phy_offset + size <= self.max_physic_offset:
            return False
        expect = queue_offset * CQ_STORE_UNIT_SIZE
        files = self.queue.mapped_files
        if files:  # the common case: the next unit of a segment with room
            mf = files[-1]
            pos = mf.wrote_position
            if expect == mf.file_from_offset + pos and pos + CQ_STORE_UNIT_SIZE <= mf.file_size:
                mf.append_raw(_UNIT.pack(phy_offset, size, tags_code))
                self.max_physic_offset = phy_offset + size
                return True
        current = self.queue.get_max_wrote_position()
        if not self.queue.mapped_files:
            current = expect - expect % self.mapped_file_size
            if expect:
                log.info(
                    "%s-%d starts at queue offset %d: filling %d blank units",
                    self.topic,
                    self.queue_id,
                    queue_offset,
                    (expect - current) // CQ_STORE_UNIT_SIZE,
                )
            self.min_logic_offset = expect
        if expect < current:
            log.warning(
                "%s-%d already has queue offset %d (max %d); unit skipped",
                self.topic,
                self.queue_id,
                queue_offset,
                current // CQ_STORE_UNIT_SIZE,
            )
            return False
        if expect > current and self.queue.mapped_files:
            log.error(
                "%s-%d: gap before queue offset %d (max %d); filling blank units",
                self.topic,
                self.queue_id,
                queue_offset,
                current // CQ_STORE_UNIT_SIZE,
            )
        while current < expect:
            self._append(_BLANK_UNIT, current)
            current += CQ_STORE_UNIT_SIZE
        self._append(_UNIT.pack(phy_offset, size, tags_code), current)
        self.max_physic_offset = phy_offset + size
        return True

    def put_packed(self, units: bytes, queue_offset: int, first_end: int, last_end: int) -> bool:
        """Copy ``units`` (packed units of records at consecutive queue offsets from
        ``queue_offset``; the first record ends at CommitLog offset ``first_end``, the last at
        ``last_end``) at once when they continue the queue inside its current segment (the
        common case) and are not a replay; False, writing nothing, otherwise (the caller then
        writes them record by record). Raises StoreIOError."""
        files = self.queue.mapped_files
        if not units or not files or first_end <= self.max_physic_offset:
            return False
        mf = files[-1]
        pos = mf.wrote_position
        if queue_offset * CQ_STORE_UNIT_SIZE != mf.file_from_offset + pos or pos + len(units) > mf.file_size:
            return False
        mf.append_raw(units)
        self.max_physic_offset = last_end
        return True

    def _append(self, unit: bytes, logic_offset: int) -> None:
        mf = self.queue.get_last_mapped_file()
        if mf is None or mf.is_full():
            mf = self.queue.get_last_mapped_file_or_create(logic_offset)
            if mf is None:  # pragma: no cover - synchronous creation returns or raises
                raise StoreIOError(f"cannot create a segment for {self.topic}-{self.queue_id}")
        mf.append_raw(unit)

    # -- read ------------------------------------------------------------------------------------
    def read_units(self, queue_offset: int, max_count: int) -> list[CqUnit]:
        """Up to ``max_count`` units from ``queue_offset`` (blank units included, marked by
        size BLANK_UNIT_SIZE), crossing segments. Empty when the offset is outside the queue."""
        out: list[CqUnit] = []
        for offset, raw in self._unit_runs(queue_offset, max_count):
            # tuple.__new__ straight away: a pull decodes hundreds of units, and the namedtuple's
            # own constructor is one more Python call for each
            out.extend(
                _new_unit(CqUnit, (offset + i, phy, size, code))
                for i, (phy, size, code) in enumerate(_UNIT.iter_unpack(raw))
            )
        return out

    def read_columns(self, queue_offset: int, max_count: int) -> UnitColumns:
        """The units :meth:`read_units` would return, as columns (one numpy pass per segment
        instead of a Python object per unit: what a pull of hundreds of units reads)."""
        phys: list[int] = []
        sizes: list[int] = []
        codes: list[int] = []
        for _, raw in self._unit_runs(queue_offset, max_count):
            units = np.frombuffer(raw, dtype=_UNIT_DTYPE)
            phys += units["phy"].tolist()
            sizes += units["size"].tolist()
            codes += units["tag"].tolist()
        return UnitColumns(queue_offset, phys, sizes, codes)

    def _unit_runs(self, queue_offset: int, max_count: int) -> Iterator[tuple[int, bytes]]:
        """(first queue offset, raw units) per segment crossed, ``max_count`` units in all."""
        offset = queue_offset
        end = self.max_offset_in_queue
        left = max_count
        while left > 0 and offset < end:
            mf, pos, limit = self._locate(offset)
            if mf is None:
                return
            n = min(left, (limit - pos) // CQ_STORE_UNIT_SIZE)
            if n <= 0:
                return
            try:
                raw = mf.buffer[pos : pos + n * CQ_STORE_UNIT_SIZE]
            except ValueError:  # segment closed under us
                return
            yield offset, raw
            offset += n
            left -= n

    def read_unit(self, queue_offset: int) -> CqUnit | None:
        units = self.read_units(queue_offset, 1)
        return units[0] if units else None

    def _locate(self, queue_offset: int) -> tuple[MappedFile | None, int, int]:
        logic = queue_offset * CQ_STORE_UNIT_SIZE
        mf = self.queue.find_mapped_file_by_offset(logic)
        if mf is None or mf.closed:
            return None, 0, 0
        return mf, logic - mf.file_from_offset, mf.wrote_position

    def last_unit(self) -> CqUnit | None:
        end = self.max_offset_in_queue
        return self.read_unit(end - 1) if end > self.min_offset_in_queue else None

    def get_offset_in_queue_by_time(
        self,
        timestamp_ms: int,
        store_time_of: Callable[[int, int], int],
        boundary: BoundaryType = BoundaryType.LOWER,
    ) -> int:
        """Queue offset by store time, by binary search over the units (spec §3).

        ``store_time_of(phy_offset, size)`` returns a message's store timestamp (ms), or -1 when
        the CommitLog no longer holds it (those units count as older than any time). LOWER: the
        first offset stored at or after ``timestamp_ms`` (the max offset when none is); UPPER: the
        last offset stored at or before it (the min offset when none is).
        """
        search = self.search_by_time(timestamp_ms, boundary)
        try:
            probe = next(search)
            while True:
                probe = search.send(store_time_of(*probe))
        except StopIteration as done:
            return int(done.value)

    def search_by_time(
        self, timestamp_ms: int, boundary: BoundaryType = BoundaryType.LOWER
    ) -> Generator[tuple[int, int], int, int]:
        """:meth:`get_offset_in_queue_by_time` as a generator, for callers that read store times
        asynchronously: it yields (phy_offset, size) of each message to probe, is sent that
        message's store time (-1: gone), and returns the queue offset."""
        lo, hi = self.min_offset_in_queue, self.max_offset_in_queue
        if lo >= hi:
            return lo
        first = lo
        upper = boundary is BoundaryType.UPPER
        # LOWER: first index with time >= ts. UPPER: first index with time > ts, minus one.
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self.read_unit(mid)
            if unit is None or unit.size == BLANK_UNIT_SIZE:
                t = -1
            else:
                t = yield (unit.phy_offset, unit.size)
            if (t > timestamp_ms) if upper else (t >= timestamp_ms):
                hi = mid
            else:
                lo = mid + 1
        return max(first, lo - 1) if upper else lo

    # -- truncation ------------------------------------------------------------------------------
    def truncate_dirty_logic_files(self, phy_offset: int) -> int:
        """Drop units whose message starts at or after ``phy_offset`` (the CommitLog's end, or
        after a crash the dispatch checkpoint: dispatch replays the log from there), from the
        first such unit on; a unit torn by a power loss (out of log order, see
        :func:`_out_of_order`) counts as one: its offset field can no longer say where it
        points, and the replay writes it again.

        Returns how many units were removed.
        """
        before = self.max_offset_in_queue
        files = self.queue.mapped_files
        cut = None
        for index in range(len(files) - 1, -1, -1):
            mf = files[index]
            if mf.wrote_position == 0:
                cut = mf.file_from_offset
                continue
            first_phy, first_size, _ = _UNIT.unpack_from(mf.buffer, 0)
            if first_size != BLANK_UNIT_SIZE and first_phy >= phy_offset:
                cut = mf.file_from_offset
                continue
            count = mf.wrote_position // CQ_STORE_UNIT_SIZE
            units = _units_of(mf, count)
            offsets, sizes = units["phy"], units["size"]
            past = np.flatnonzero(
                (sizes != BLANK_UNIT_SIZE) & ((offsets < 0) | (sizes <= 0) | (offsets >= phy_offset))
                | _out_of_order(offsets, sizes, self._end_of_real_units_before(index))
            )
            pos = (int(past[0]) if len(past) else count) * CQ_STORE_UNIT_SIZE
            del units, offsets, sizes
            if pos >= count * CQ_STORE_UNIT_SIZE:
                pos = mf.wrote_position  # every unit kept (a partial unit at the end stays as it was)
            cut = mf.file_from_offset + pos
            break
        if cut is None or cut >= self.queue.get_max_wrote_position():
            return 0
        self.queue.truncate_dirty_files(cut)
        if not self.queue.mapped_files:
            self.min_logic_offset = 0
        self.max_physic_offset = self._scan_back_for_max_physic_offset()
        removed = before - self.max_offset_in_queue
        if removed:
            log.info(
                "%s-%d: %d units past CommitLog offset %d cut", self.topic, self.queue_id, removed, phy_offset
            )
        return removed

    def delete_expired_files(
        self, commit_log_min_offset: int, *, pause: Callable[[], bool] | None = None
    ) -> int:
        """Delete segments whose every unit points below ``commit_log_min_offset`` (their
        messages left the CommitLog: RocketMQ's ``deleteExpiredFileByOffset``), oldest first,
        never the newest; then move the min offset past the units left pointing below it.
        Returns how many segments were deleted. Raises StoreIOError."""

        def doomed(mf: MappedFile) -> str:
            if mf.wrote_position < mf.file_size:
                return ""
            try:
                phy, _, _ = _UNIT.unpack_from(mf.buffer, mf.file_size - CQ_STORE_UNIT_SIZE)
            except ValueError:  # closed under us
                return ""
            return (
                f"its last unit points below the CommitLog's min offset {commit_log_min_offset}"
                if (phy < commit_log_min_offset)
                else ""
            )

        deleted = self.queue.delete_head_files(doomed, batch_max=1 << 30, pause=pause)
        self.correct_min_offset(commit_log_min_offset)
        return len(deleted)

    def correct_min_offset(self, commit_log_min_offset: int) -> None:
        """Move the min offset past units whose messages the CommitLog no longer holds."""
        first = self.queue.get_first_mapped_file()
        if first is None:
            return
        last = self.last_unit()
        if last is not None and last.phy_offset < commit_log_min_offset:
            self.min_logic_offset = self.queue.get_max_wrote_position()
            return
        lo = max(self.min_logic_offset, first.file_from_offset) // CQ_STORE_UNIT_SIZE
        hi = self.max_offset_in_queue
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self.read_unit(mid)
            if unit is not None and unit.size != BLANK_UNIT_SIZE and unit.phy_offset >= commit_log_min_offset:
                hi = mid
            else:
                lo = mid + 1
        self.min_logic_offset = max(self.min_logic_offset, lo * CQ_STORE_UNIT_SIZE)

    def __repr__(self) -> str:
        return (
            f"ConsumeQueue({self.topic}-{self.queue_id}, min={self.min_offset_in_queue}, "
            f"max={self.max_offset_in_queue}, max_physic_offset={self.max_physic_offset})"
        )
