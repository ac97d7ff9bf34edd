"""The pull algorithm (RocketMQ ``DefaultMessageStore.getMessage``), over two small callables so
that the embedded store and the split topology's gateway run the same code.

Given a queue's min/max offsets, ``read_columns(queue_offset, count)`` (ConsumeQueue units) and
``read_records([(phy_offset, size), ...])`` (raw CommitLog records, None where the log no longer
holds one), :func:`get_messages`:

1. answers offsets outside the queue with a status and the offset to continue from
   (NO_MESSAGE_IN_QUEUE, OFFSET_TOO_SMALL, OFFSET_OVERFLOW_ONE, OFFSET_OVERFLOW_BADLY);
2. scans up to max(800, max_count) units from the offset (RocketMQ's 16,000-byte filter window),
   skipping blank units and units whose tags code the filter rejects;
3. stops before the unit that would exceed ``max_count`` messages or ``max_bytes`` (at least one
   message is always returned);
4. reads the selected records and drops those whose exact TAGS do not match.

The next begin offset is the queue offset after the last unit scanned, so a consumer never sees a
unit twice and never skips one. Steps 1-3 (:func:`select_units`) run where the ConsumeQueue is,
step 4 (:func:`fetch_messages`) where the records are read: in the split topology, the dispatch
service and the gateway.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, count

from libstore.consume_queue import BLANK_UNIT_SIZE, UnitColumns
from libstore.message import MessageRecord
from libstore.message_filter import ACCEPT_ALL, TagFilter
from libstore.record_codec import check_record, decode_records
from libstore.results import GetMessageStatus

MAX_FILTER_UNITS = 16_000 // 20  # RocketMQ scans at least 16,000 bytes of ConsumeQueue per pull


@dataclass
class GetMessageResult:
    """A pull's outcome: status, where to continue, the queue's bounds, and the messages.

    ``records`` are raw CommitLog records (bytes), with their ``queue_offsets`` and
    ``phy_offsets``; :meth:`decode` turns them into MessageRecords. ``removed``: units passed
    over because the CommitLog no longer holds their records (retention deleted them).
    """

    status: GetMessageStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    records: list[bytes] = field(default_factory=list)
    queue_offsets: list[int] = field(default_factory=list)
    phy_offsets: list[int] = field(default_factory=list)
    removed: int = 0

    @property
    def found(self) -> bool:
        return self.status is GetMessageStatus.FOUND

    @property
    def total_bytes(self) -> int:
        return sum(map(len, self.records))

    def decode(self) -> list[MessageRecord]:
        """The records decoded (CRC checked)."""
        return decode_records(self.records)


@dataclass
class UnitSelection:
    """Phase 1 of a pull, where the ConsumeQueue is: ``status`` is set when the offset holds no
    unit (and the columns are empty); else the selected units, column by column (queue offsets,
    CommitLog offsets, sizes in bytes), passed the tags-code filter and ``next_offset`` follows
    the last unit scanned."""

    status: GetMessageStatus | None
    next_offset: int
    min_offset: int
    max_offset: int
    queue_offsets: list[int] = field(default_factory=list)
    phy_offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)

    def ranges(self) -> list[tuple[int, int]]:
        """The (CommitLog offset, size) of every selected unit: what step 4 reads."""
        return list(zip(self.phy_offsets, self.sizes, strict=True))


def select_units(
    offset: int,
    max_count: int,
    min_offset: int,
    max_offset: int,
    read_columns: Callable[[int, int], UnitColumns],
    tag_filter: TagFilter = ACCEPT_ALL,
    max_bytes: int = 256 * 1024,
) -> UnitSelection:
    """Steps 1-3 of the module docstring: offset checks, then the units to read.
    ``read_columns(queue_offset, count)`` is ConsumeQueue.read_columns."""
    status = _status_for_offset(offset, min_offset, max_offset)
    if status is not None:
        return UnitSelection(status[0], status[1], min_offset, max_offset)
    window = min(max(MAX_FILTER_UNITS, max_count), max_offset - offset)
    sel = UnitSelection(None, offset, min_offset, max_offset)
    total = 0
    scanned = 0
    full = False
    # Read units in chunks: an unfiltered pull needs max_count of them; a filtered one goes on
    # through the window while the filter skips units.
    while not full and scanned < window:
        cols = read_columns(sel.next_offset, min(window - scanned, max(max_count - len(sel.sizes), 32)))
        n = len(cols.sizes)
        if not n:
            if scanned == 0:
                return UnitSelection(GetMessageStatus.OFFSET_FOUND_NULL, offset, min_offset, max_offset)
            break
        scanned += n
        if tag_filter.codes is None and BLANK_UNIT_SIZE not in cols.sizes and min(cols.sizes) > 0:
            full, total = _take_all(sel, cols, max_count, total, max_bytes)
        else:
            full, total = _take_matching(sel, cols, max_count, total, max_bytes, tag_filter)
        if len(sel.sizes) >= max_count:
            full = True
    return sel


def _take_all(
    sel: UnitSelection, cols: UnitColumns, max_count: int, total: int, max_bytes: int
) -> tuple[bool, int]:
    """Every unit of ``cols`` passes (no filter, no blank unit, every size > 0, so the running
    byte total only grows and can be bisected): take the longest prefix that keeps within
    ``max_count`` and ``max_bytes`` (the first unit of a pull always). Returns (stopped on a
    unit, bytes selected). The same outcome as :func:`_take_matching`, in C loops."""
    sizes = cols.sizes[: max_count - len(sel.sizes)]
    ends = list(accumulate(sizes, initial=total))[1:]  # bytes selected after each unit
    k = bisect_right(ends, max_bytes)
    if k == 0 and not sel.sizes:
        k = 1
    if k:
        first = cols.queue_offset
        sel.queue_offsets += range(first, first + k)
        sel.phy_offsets += cols.phy_offsets[:k]
        sel.sizes += sizes[:k]
        sel.next_offset = first + k
        total = ends[k - 1]
    return k < len(cols.sizes), total


def _take_matching(
    sel: UnitSelection, cols: UnitColumns, max_count: int, total: int, max_bytes: int, tag_filter: TagFilter
) -> tuple[bool, int]:
    """Unit by unit: skip blank units and those whose tags code ``tag_filter`` rejects; stop
    before the unit that would pass ``max_count`` or ``max_bytes``. Returns (stopped on a
    unit, bytes selected)."""
    matches = tag_filter.matches_code
    qoffs, phys, sizes = sel.queue_offsets, sel.phy_offsets, sel.sizes
    for queue_offset, phy, size, code in zip(
        count(cols.queue_offset), cols.phy_offsets, cols.sizes, cols.tags_codes
    ):
        if len(sizes) >= max_count or (sizes and total + size > max_bytes):
            return True, total
        sel.next_offset = queue_offset + 1
        if size == BLANK_UNIT_SIZE or not matches(code):
            continue
        qoffs.append(queue_offset)
        phys.append(phy)
        sizes.append(size)
        total += size
    return False, total


def fetch_messages(
    selection: UnitSelection,
    raws: Sequence[bytes | None],
    tag_filter: TagFilter = ACCEPT_ALL,
) -> GetMessageResult:
    """Step 4 of the module docstring: ``raws`` are the records of ``selection``'s units (None
    where the CommitLog no longer holds one); drops those whose exact TAGS do not match."""
    if selection.status is not None:
        return GetMessageResult(
            selection.status, selection.next_offset, selection.min_offset, selection.max_offset
        )
    result = GetMessageResult(
        GetMessageStatus.NO_MATCHED_MESSAGE, selection.next_offset, selection.min_offset, selection.max_offset
    )
    exact = not tag_filter.accepts_all
    if len(raws) != len(selection.sizes):
        raise ValueError(f"{len(raws)} records for {len(selection.sizes)} units")
    if not exact and all(raws):  # every record there, none to filter: the lists as they are
        result.records = list(raws)  # type: ignore[arg-type]
        result.queue_offsets = list(selection.queue_offsets)
        result.phy_offsets = list(selection.phy_offsets)
    else:
        for queue_offset, phy, raw in zip(selection.queue_offsets, selection.phy_offsets, raws, strict=True):
            if not raw:
                result.removed += 1
                continue
            if exact:
                req = check_record(raw, 0, len(raw), check_crc=False)
                if not req.success or not tag_filter.matches_tags(req.tags):
                    continue
            result.records.append(raw)
            result.queue_offsets.append(queue_offset)
            result.phy_offsets.append(phy)
    if result.records:
        result.status = GetMessageStatus.FOUND
    elif result.removed:
        result.status = GetMessageStatus.MESSAGE_WAS_REMOVING
    return result


def get_messages(
    offset: int,
    max_count: int,
    min_offset: int,
    max_offset: int,
    read_columns: Callable[[int, int], UnitColumns],
    read_records: Callable[[list[tuple[int, int]]], Sequence[bytes | None]],
    tag_filter: TagFilter = ACCEPT_ALL,
    max_bytes: int = 256 * 1024,
) -> GetMessageResult:
    """One pull from a queue whose units are ``min_offset..max_offset-1`` (see module docstring)."""
    selection = select_units(offset, max_count, min_offset, max_offset, read_columns, tag_filter, max_bytes)
    raws = read_records(selection.ranges()) if selection.sizes else []
    return fetch_messages(selection, raws, tag_filter)


def _status_for_offset(offset: int, min_offset: int, max_offset: int) -> tuple[GetMessageStatus, int] | None:
    """(status, next offset) when ``offset`` holds no unit; None when it does (RocketMQ's order)."""
    if max_offset == 0:
        return GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0
    if offset < min_offset:
        return GetMessageStatus.OFFSET_TOO_SMALL, min_offset
    if offset == max_offset:
        return GetMessageStatus.OFFSET_OVERFLOW_ONE, offset
    if offset > max_offset:
        return GetMessageStatus.OFFSET_OVERFLOW_BADLY, min_offset if min_offset == 0 else max_offset
    return None
