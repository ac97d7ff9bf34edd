"""The pull algorithm (RocketMQ ``DefaultMessageStore.getMessage``), over two small callables so
that the embedded store and the split topology's gateway run the same code.

Given a queue's min/max offsets, ``read_units(queue_offset, count)`` (ConsumeQueue units) and
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from libstore.consume_queue import BLANK_UNIT_SIZE, CqUnit
from libstore.message import MessageRecord
from libstore.message_filter import ACCEPT_ALL, TagFilter
from libstore.record_codec import check_record, decode_record
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
        return [decode_record(raw) for raw in self.records]


@dataclass
class UnitSelection:
    """Phase 1 of a pull, where the ConsumeQueue is: ``status`` is set when the offset holds no
    unit (and ``units`` is empty); else ``units`` passed the tags-code filter and
    ``next_offset`` follows the last unit scanned."""

    status: GetMessageStatus | None
    next_offset: int
    min_offset: int
    max_offset: int
    units: list[CqUnit] = field(default_factory=list)


def select_units(
    offset: int,
    max_count: int,
    min_offset: int,
    max_offset: int,
    read_units: Callable[[int, int], Sequence[CqUnit]],
    tag_filter: TagFilter = ACCEPT_ALL,
    max_bytes: int = 256 * 1024,
) -> UnitSelection:
    """Steps 1-3 of the module docstring: offset checks, then the units to read."""
    status = _status_for_offset(offset, min_offset, max_offset)
    if status is not None:
        return UnitSelection(status[0], status[1], min_offset, max_offset)
    window = min(max(MAX_FILTER_UNITS, max_count), max_offset - offset)
    selected: list[CqUnit] = []
    total = 0
    next_offset = offset
    scanned = 0
    full = False
    # Read units in chunks: an unfiltered pull needs max_count of them; a filtered one goes on
    # through the window while the filter skips units.
    while not full and scanned < window:
        units = read_units(next_offset, min(window - scanned, max(max_count - len(selected), 32)))
        if not units:
            if scanned == 0:
                return UnitSelection(GetMessageStatus.OFFSET_FOUND_NULL, offset, min_offset, max_offset)
            break
        scanned += len(units)
        for unit in units:
            if len(selected) >= max_count or (selected and total + unit.size > max_bytes):
                full = True
                break
            next_offset = unit.queue_offset + 1
            if unit.size == BLANK_UNIT_SIZE or not tag_filter.matches_code(unit.tags_code):
                continue
            selected.append(unit)
            total += unit.size
        if len(selected) >= max_count:
            full = True
    return UnitSelection(None, next_offset, min_offset, max_offset, selected)


def fetch_messages(
    selection: UnitSelection,
    raws: Sequence[bytes | None],
    tag_filter: TagFilter = ACCEPT_ALL,
) -> GetMessageResult:
    """Step 4 of the module docstring: ``raws`` are the records of ``selection.units`` (None
    where the CommitLog no longer holds one); drops those whose exact TAGS do not match."""
    if selection.status is not None:
        return GetMessageResult(
            selection.status, selection.next_offset, selection.min_offset, selection.max_offset
        )
    result = GetMessageResult(
        GetMessageStatus.NO_MATCHED_MESSAGE, selection.next_offset, selection.min_offset, selection.max_offset
    )
    removed = 0
    exact = not tag_filter.accepts_all
    for unit, raw in zip(selection.units, raws, strict=True):
        if not raw:
            removed += 1
            continue
        if exact:
            req = check_record(raw, 0, len(raw), check_crc=False)
            if not req.success or not tag_filter.matches_tags(req.tags):
                continue
        result.records.append(raw)
        result.queue_offsets.append(unit.queue_offset)
        result.phy_offsets.append(unit.phy_offset)
    result.removed = removed
    if result.records:
        result.status = GetMessageStatus.FOUND
    elif removed:
        result.status = GetMessageStatus.MESSAGE_WAS_REMOVING
    return result


def get_messages(
    offset: int,
    max_count: int,
    min_offset: int,
    max_offset: int,
    read_units: Callable[[int, int], Sequence[CqUnit]],
    read_records: Callable[[list[tuple[int, int]]], Sequence[bytes | None]],
    tag_filter: TagFilter = ACCEPT_ALL,
    max_bytes: int = 256 * 1024,
) -> GetMessageResult:
    """One pull from a queue whose units are ``min_offset..max_offset-1`` (see module docstring)."""
    selection = select_units(offset, max_count, min_offset, max_offset, read_units, tag_filter, max_bytes)
    raws = read_records([(u.phy_offset, u.size) for u in selection.units]) if selection.units else []
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
