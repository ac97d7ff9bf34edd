"""Segment-level operations of log replication (spec sheet §7), below the CommitLog's locks.

A master reads its log out in chunks of whole records (:func:`read_chunk`); a SLAVE checks the
bytes it receives and appends them at the same offsets (:func:`append_replicated`), and when
its tail diverges from the master's it finds where a cut may go (:func:`is_record_boundary`)
and cuts the segments there (:func:`cut_segments`), or drops them all and starts again at a
segment boundary (:func:`restart_empty_at`).

These functions work on the :class:`~libstore.mapped_file_queue.MappedFileQueue` and the
segment summaries only. The policy around them (roles, the put lock, the log generation bump
before a cut, the queue-offset table, epochs, listeners) stays in
:class:`~libstore.commit_log.CommitLog`, which calls them with its put lock held; RocketMQ keeps
the same split between its HA connection classes and the CommitLog's ``appendData`` and
``truncateDirtyFiles``, Kafka between UnifiedLog and LocalLog.
"""

from __future__ import annotations

import struct

from libstore.errors import CorruptRecordError, OffsetOutOfRangeError, ServiceNotAvailableError, StoreIOError
from libstore.mapped_file_queue import MappedFileQueue
from libstore.record_codec import RECORD_OVERHEAD_V1_IPV4, check_record, record_size_of, store_timestamp_at
from libstore.segment_summary import SegmentSummaries

_TOTAL_SIZE = struct.Struct(">i")  # TOTALSIZE, the first field of a record (free bytes in a blank)


def read_chunk(queue: MappedFileQueue, offset: int, limit: int, max_bytes: int) -> tuple[bytes, int]:
    """Whole records from ``offset`` (a record boundary) up to ``limit``, at most ``max_bytes``
    (but at least one record), never past the segment's end: a blank END record is included
    and ends the chunk. Returns (bytes, offset the next chunk starts at: past a blank, the next
    segment's start). Raises OffsetOutOfRangeError when no segment holds ``offset``,
    CorruptRecordError when the bytes there are not records."""
    mf = queue.find_mapped_file_by_offset(offset)
    if mf is None:
        raise OffsetOutOfRangeError(f"offset {offset} is not in the CommitLog")
    base = mf.file_from_offset
    try:
        start = pos = offset - base
        end = min(mf.readable_position, limit - base)
        buf = mf.buffer
        next_offset = -1
        while pos < end:
            if end - pos < 8:
                raise CorruptRecordError(f"truncated record header at offset {base + pos}")
            size = record_size_of(buf, pos)
            if size == 0:  # blank END record
                pos += 8
                next_offset = queue.roll_next_file(base + pos - 8)
                break
            if size < 0 or pos + size > end:
                raise CorruptRecordError(f"no record at CommitLog offset {base + pos}")
            if pos > start and pos + size - start > max_bytes:
                break
            pos += size
        data = bytes(buf[start:pos])
    except ValueError as exc:  # the segment was deleted (retention) under us
        raise OffsetOutOfRangeError(f"offset {offset} is no longer in the CommitLog") from exc
    if next_offset < 0:
        next_offset = base + pos
    return data, next_offset


def append_replicated(
    queue: MappedFileQueue, summaries: SegmentSummaries, offset: int, data: bytes | memoryview
) -> int:
    """Append bytes a master sent at ``offset`` (non-empty; whole records, maybe closed by the
    8-byte blank END record of their segment, which then fills it) and note them in
    ``summaries``. Returns the new end of the log: past a blank, the next segment's start.

    Raises OffsetOutOfRangeError when ``offset`` is not the log's end (nor, for an empty log, a
    segment boundary), CorruptRecordError when ``data`` is not whole records of one segment,
    ServiceNotAvailableError when no segment can start there; nothing is written then. Raises
    StoreIOError when a segment cannot be created or written (the caller stops taking writes).
    """
    end = queue.get_max_wrote_position()
    if offset != end and not (not queue.mapped_files and offset % queue.mapped_file_size == 0):
        raise OffsetOutOfRangeError(f"replicated bytes start at {offset}, but this log ends at {end}")
    mf = queue.get_last_mapped_file_or_create(offset)
    if mf is None or mf.file_from_offset + mf.wrote_position != offset:
        raise ServiceNotAvailableError(f"no CommitLog segment to append at {offset}")
    n = len(data)
    used, last_ts = _walk_replica(data, offset, mf.remaining)
    try:
        if used:
            mf.append_records(data[:used])
        if used < n:  # the blank END record closes the segment
            mf.fill_to_end(bytes(data[used:]))
    except OSError as exc:
        raise StoreIOError(f"replica append failed: {exc}") from exc
    if last_ts:
        mf.store_timestamp = last_ts
    if used:
        summaries.note_replicated(mf.file_from_offset, offset, offset + used)
    if used < n:
        summaries.seal(mf.file_from_offset, mf.file_tail_offset)
        return mf.file_tail_offset
    return offset + n


def is_record_boundary(queue: MappedFileQueue, offset: int) -> bool:
    """True when a record, or the blank END record that closes a segment, starts at
    ``offset``, or ``offset`` is a segment boundary. A record names its own position
    (PHYSICALOFFSET) and a blank fills its segment to the end, so bytes inside a record body
    are not taken for either."""
    if offset % queue.mapped_file_size == 0:
        return True
    mf = queue.find_mapped_file_by_offset(offset)
    if mf is None:
        return False
    pos = offset - mf.file_from_offset
    req = check_record(
        mf.buffer,
        pos,
        mf.wrote_position,
        check_crc=False,
        expected_phy_offset=offset,
        decode_properties=False,
    )
    if not req.success:
        return False
    return req.msg_size > 0 or _TOTAL_SIZE.unpack_from(mf.buffer, pos)[0] == mf.file_size - pos


def cut_segments(queue: MappedFileQueue, summaries: SegmentSummaries, offset: int, *, drop_all: bool) -> None:
    """Make the segments end at ``offset``: with ``drop_all``, or when ``offset`` is not past
    the log's first byte, every segment goes and the log restarts empty at ``offset``
    (:func:`restart_empty_at`); otherwise the bytes past it go (MappedFileQueue's
    truncate_dirty_files). The summaries follow. Raises StoreIOError."""
    if drop_all or offset <= queue.get_min_offset() or not queue.mapped_files:
        restart_empty_at(queue, offset)
        summaries.reset()
    else:
        queue.truncate_dirty_files(offset)
        summaries.cut(offset)


def restart_empty_at(queue: MappedFileQueue, offset: int) -> None:
    """Drop every segment; the log starts again, empty, at ``offset``: its first segment is
    created there at once (a segment boundary when past 0: retention deleted the master's
    head), so min and max offsets both say ``offset``. Raises StoreIOError."""
    queue.reset_to_empty(offset)
    if offset <= 0:
        return
    mf = queue.get_last_mapped_file_or_create(offset)
    if mf is None:
        raise StoreIOError(f"cannot create the CommitLog segment at {offset}")
    mf.set_positions(offset - mf.file_from_offset)


def _walk_replica(data: bytes | memoryview, offset: int, room: int) -> tuple[int, int]:
    """Check that ``data`` (bytes replicated at ``offset``) is whole records, maybe closed by a
    blank END record, and fits in ``room`` bytes of its segment. Returns (bytes of records
    before any blank, STORETIMESTAMP of the last record or 0). Raises CorruptRecordError."""
    n = len(data)
    pos = 0
    last = -1
    while pos < n:
        if n - pos < 8:
            raise CorruptRecordError(f"replicated bytes end inside a record header at {offset + pos}")
        size = record_size_of(data, pos)
        if size == 0:  # blank END record: it must end the bytes and fill the segment
            if pos + 8 != n or _TOTAL_SIZE.unpack_from(data, pos)[0] != room - pos:
                raise CorruptRecordError(f"misplaced blank END record in replicated bytes at {offset + pos}")
            break
        if size < RECORD_OVERHEAD_V1_IPV4 or pos + size > n:
            raise CorruptRecordError(f"replicated bytes at {offset + pos} are not a record")
        last = pos
        pos += size
    if pos > room:
        raise CorruptRecordError(f"replicated bytes at {offset} overflow their segment")
    return pos, (store_timestamp_at(data, last) if last >= 0 else 0)
