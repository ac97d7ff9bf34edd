"""Reading records out of the CommitLog's segments by physical offset (spec sheet §1).

A consumer's pull turns into (offset, size) ranges from a ConsumeQueue (:func:`read_records`),
a query by key or message id into one offset (:func:`read_record`, :func:`decode_record_at`),
and RocketMQ's ``pickupStoreTimestamp`` into a single field (:func:`store_timestamp_of`). A
transient message's stub reads as the whole record the TransientMessageStore holds for it
(libstore.durability), or as missing once the store no longer holds it.

Segments can be deleted (retention) or cut (a SLAVE's truncation) while a read runs: a read of
an unmapped segment reads as missing, never as garbage. The functions take the segment queue
and the transient store, and lock nothing (reads never block puts).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence

from libstore.durability import STUB_FLAG_BIT, STUB_FLAG_BYTE, is_stub
from libstore.errors import CorruptRecordError, InvalidArgumentError, OffsetOutOfRangeError
from libstore.mapped_file import MappedFile
from libstore.mapped_file_queue import MappedFileQueue
from libstore.message import MessageRecord
from libstore.record_codec import (
    RECORD_OVERHEAD_V1_IPV4,
    decode_record,
    native,
    record_size_of,
    store_timestamp_at,
)
from libstore.record_framing import field_header, frame_records
from libstore.transient_messages import TransientMessageStore

_TOTAL_SIZE = struct.Struct(">i")  # TOTALSIZE, the first field of a record


def read_record(queue: MappedFileQueue, phy_offset: int, size: int) -> bytes:
    """The raw ``size`` bytes at ``phy_offset`` (a stub is returned as it is stored).

    Raises OffsetOutOfRangeError when the range is not inside one segment's readable bytes.
    """
    if size <= 0:
        raise OffsetOutOfRangeError(f"size must be > 0, got {size}")
    mf = queue.find_mapped_file_by_offset(phy_offset)
    if mf is None:
        low, high = max(queue.get_min_offset(), 0), queue.get_max_offset()
        raise OffsetOutOfRangeError(f"offset {phy_offset} is outside the log [{low}, {high})")
    try:
        return mf.read(phy_offset - mf.file_from_offset, size)
    except ValueError as exc:  # segment unmapped concurrently
        raise OffsetOutOfRangeError(f"offset {phy_offset} is no longer in the log") from exc


def read_records(
    queue: MappedFileQueue,
    transient: TransientMessageStore,
    ranges: Sequence[tuple[int, int]],
    *,
    max_bytes: int = 0,
    max_record_size: int = 0,
) -> list[bytes | None]:
    """Whole records at (offset, size) ranges, None where the log no longer holds one; size 0
    reads the whole record at the offset. One segment lookup per run of ranges in the same
    segment (a pull reads many records close together).

    ``max_record_size`` (0: none): a range, or a size-0 record's TOTALSIZE, larger than this
    reads as None (no record is larger: an offset that is not a record's start). Raises
    InvalidArgumentError, having copied at most ``max_bytes``, when the records would come
    to more than ``max_bytes`` (0: no bound)."""
    out: list[bytes | None] = []
    append = out.append
    mf: MappedFile | None = None
    base = tail = readable = 0
    buf: mmap.mmap | bytes = b""  # the segment's mapping once one is found
    total = 0
    for offset, size in ranges:
        if mf is None or not base <= offset < tail:
            mf = queue.find_mapped_file_by_offset(offset)
            if mf is None or mf.closed:
                mf = None
                append(None)
                continue
            base, tail, buf = mf.file_from_offset, mf.file_tail_offset, mf.buffer
            readable = base + mf.readable_position
        try:
            if size == 0:
                size = _TOTAL_SIZE.unpack_from(buf, offset - base)[0] if offset + 8 <= readable else 0
            if size <= 0 or offset + size > readable or (max_record_size and size > max_record_size):
                append(None)
                continue
            pos = offset - base
            if size > STUB_FLAG_BYTE and buf[pos + STUB_FLAG_BYTE] & STUB_FLAG_BIT:
                record = transient.get(offset)
                if record is None:
                    append(None)
                    continue
                size = len(record)
            else:
                record = buf[pos : pos + size]
            total += size
            if max_bytes and total > max_bytes:
                raise _too_many_bytes(max_bytes)
            append(record)
        except ValueError:  # segment unmapped concurrently
            mf = None
            append(None)
    return out


def _too_many_bytes(max_bytes: int) -> InvalidArgumentError:
    return InvalidArgumentError(f"a read returns at most {max_bytes} bytes; these ranges hold more")


def read_records_framed(
    queue: MappedFileQueue,
    transient: TransientMessageStore,
    ranges: Sequence[tuple[int, int]],
    tag: int,
    *,
    max_bytes: int = 0,
    max_record_size: int = 0,
) -> bytes:
    """What :func:`read_records` returns, framed as a protobuf ``repeated bytes`` field with the
    one-byte ``tag`` (libstore.record_framing; a missing record framed empty): byte for byte
    ``frame_records(read_records(...), tag)``, which is what runs without the C module. With
    it, each run of ranges in one segment is framed by ``_codec.frame_run`` straight out of
    the mapping (no bytes object a record); what it leaves (a segment change, a transient
    stub, size 0, a record past the bounds) goes through :func:`read_records` one range at a
    time. Raises InvalidArgumentError past ``max_bytes`` as :func:`read_records` does."""
    if not 0 <= tag < 0x80:
        raise ValueError(f"a tag is one byte below 0x80, got {tag}")
    ext = native()
    if ext is None:
        records = read_records(queue, transient, ranges, max_bytes=max_bytes, max_record_size=max_record_size)
        return frame_records(records, tag)
    ranges = ranges if isinstance(ranges, list) else list(ranges)
    chunks: list[bytes] = []
    total = 0
    i, n = 0, len(ranges)
    while i < n:
        start = i
        mf = queue.find_mapped_file_by_offset(ranges[i][0])
        if mf is not None and not mf.closed:
            base = mf.file_from_offset
            try:
                chunk, i, total = ext.frame_run(
                    mf.buffer,
                    base,
                    base + mf.readable_position,
                    ranges,
                    i,
                    tag,
                    STUB_FLAG_BYTE,
                    STUB_FLAG_BIT,
                    max_record_size,
                    max_bytes,
                    total,
                )
            except ValueError:  # segment unmapped concurrently: read_records says what is left
                chunk = b""
            if chunk:
                chunks.append(chunk)
        if i == start:  # the C run left this range to the general path
            record = read_records(queue, transient, ranges[i : i + 1], max_record_size=max_record_size)[0]
            if record:
                total += len(record)
                if max_bytes and total > max_bytes:
                    raise _too_many_bytes(max_bytes)
                chunks += (field_header(tag, len(record)), record)
            else:
                chunks.append(field_header(tag, 0))
            i += 1
    return b"".join(chunks)


def decode_record_at(
    queue: MappedFileQueue, transient: TransientMessageStore, phy_offset: int, size: int | None = None
) -> MessageRecord:
    """Decode the record at ``phy_offset`` (``size`` bytes, or as its TOTALSIZE says; a
    transient message's whole record for its stub). Raises OffsetOutOfRangeError (also for a
    transient message no longer held) or CorruptRecordError."""
    if size is None:
        size = record_size_of(read_record(queue, phy_offset, 8), 0)
        if size <= 0:
            raise CorruptRecordError(f"no record starts at offset {phy_offset}")
    raw = read_record(queue, phy_offset, size)
    if len(raw) > STUB_FLAG_BYTE and is_stub(raw):
        held = transient.get(phy_offset)
        if held is None:
            raise OffsetOutOfRangeError(f"the transient message at {phy_offset} is no longer held")
        raw = held
    record = decode_record(raw, 0)
    if record.phy_offset != phy_offset:
        raise CorruptRecordError(f"record at {phy_offset} claims offset {record.phy_offset}")
    return record


def store_timestamp_of(queue: MappedFileQueue, phy_offset: int, size: int) -> int:
    """STORETIMESTAMP (ms) of the ``size``-byte record at ``phy_offset``, or -1 when the log no
    longer holds it (RocketMQ's ``pickupStoreTimestamp``)."""
    mf = queue.find_mapped_file_by_offset(phy_offset)
    if mf is None or size < RECORD_OVERHEAD_V1_IPV4:
        return -1
    pos = phy_offset - mf.file_from_offset
    try:
        if pos + size > mf.readable_position:
            return -1
        return store_timestamp_at(mf.buffer, pos)
    except ValueError:  # segment unmapped concurrently
        return -1
