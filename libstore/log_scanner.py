"""Sequential scan of a CommitLog's records across segments (recovery, rebuilds, dispatch).

A blank end-of-file record moves the scan to the next segment's first byte (RocketMQ
``rollNextFile``). The scan ends at ``end_offset``, at the end of the readable bytes, or at
the first bytes that are not a valid record; in that last case the invalid request is yielded
(``success`` False, ``commit_log_offset`` = where it sits) so the caller knows where and why.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from libstore.dispatch_request import DispatchRequest
from libstore.mapped_file_queue import MappedFileQueue
from libstore.record_codec import check_record, native

# Why libstore._codec.scan_run stopped (its docstring).
_RUN_END, _RUN_BLANK, _RUN_INVALID, _RUN_FALLBACK = 0, 1, 2, 3
_ZERO_WORDS = bytes(8)  # where a file's unwritten tail starts


def scan_log(
    queue: MappedFileQueue,
    from_offset: int,
    end_offset: int | None = None,
    *,
    check_crc: bool = False,
    decode_properties: bool = True,
    yield_blanks: bool = False,
) -> Iterator[DispatchRequest]:
    """Yield the records from ``from_offset`` up to ``end_offset`` (exclusive).

    Both offsets must be record boundaries. Each segment is read up to its ``readable_position``.
    Yields valid records (``success`` True, ``msg_size`` > 0), the blank END records too when
    ``yield_blanks`` (``msg_size`` 0, ``commit_log_offset`` where the blank sits), and, last,
    possibly one invalid request. A segment closed concurrently (deleted) ends the scan.
    """
    offset = from_offset
    while end_offset is None or offset < end_offset:
        mf = queue.find_mapped_file_by_offset(offset)
        if mf is None or mf.closed:
            return
        base = mf.file_from_offset
        pos = offset - base
        limit = mf.readable_position
        if end_offset is not None:
            limit = min(limit, end_offset - base)
        buf = mf.buffer
        # Records never span segments: walk this one until its end, a blank or bad bytes.
        while pos < limit:
            try:
                req = check_record(
                    buf,
                    pos,
                    limit,
                    check_crc=check_crc,
                    expected_phy_offset=base + pos,
                    decode_properties=decode_properties,
                )
            except ValueError:  # mapping closed under us
                return
            if not req.success:
                req.commit_log_offset = base + pos
                yield req
                return
            if req.msg_size == 0:
                if yield_blanks:
                    req.commit_log_offset = base + pos
                    yield req
                break
            yield req
            pos += req.msg_size
        else:
            return  # reached the readable end (or end_offset) inside this segment
        offset = queue.roll_next_file(base + pos)


def scan_buffer(
    buf: bytes | bytearray | memoryview, base_offset: int, *, decode_properties: bool = True
) -> tuple[list[DispatchRequest], int, DispatchRequest | None]:
    """Decode the whole records in ``buf`` (CommitLog bytes starting at ``base_offset``, e.g. a
    Tail chunk). Returns (records, offset just past the last record or blank END record read,
    the invalid request if bytes that are not a record stopped the scan). The loop runs in C
    when libstore._codec is built (``scan_run``: ~2 us a 1 KiB record through check_record one
    call at a time), handing back to the Python below the records only it decodes."""
    out: list[DispatchRequest] = []
    pos = 0
    limit = len(buf)
    ext = native()
    while pos < limit:
        if ext is not None:
            records, pos, state, bad = ext.scan_run(buf, pos, base_offset, decode_properties)
            out += records
            if state == _RUN_END:
                break
            if state == _RUN_BLANK:
                return out, base_offset + limit, None
            if state == _RUN_INVALID:
                return out, base_offset + pos, bad
            # _RUN_FALLBACK: the record at pos is decoded below
        req = check_record(
            buf,
            pos,
            limit,
            check_crc=False,
            expected_phy_offset=base_offset + pos,
            decode_properties=decode_properties,
        )
        if not req.success:
            req.commit_log_offset = base_offset + pos
            return out, base_offset + pos, req
        if req.msg_size == 0:  # blank END record: nothing else in this segment
            return out, base_offset + limit, None
        out.append(req)
        pos += req.msg_size
    return out, base_offset + pos, None


def record_cuts(buf: Any, base_offset: int, every: int) -> tuple[list[int], int]:
    """Where runs of records of about ``every`` bytes (> 0) start in ``buf`` (one CommitLog
    file from ``base_offset``), past its first: walking from its start, each record checked as
    check_record checks it without the CRC (PHYSICALOFFSET included), the first record at or
    past ``every`` bytes from the last cut (0 to begin with). Stops at the unwritten (zero)
    tail, a blank END record or the first bytes that are not such a record, and then also
    returns where (the end of the records); or once the next cut would fall past the end of
    ``buf``, returning where the last cut starts. In C when the extension is built
    (libstore._codec.record_cuts: about 0.3 µs a 1 KiB record of a file in the page cache,
    page faults included, against 2 µs). Raises ValueError for ``every`` <= 0."""
    if every <= 0:
        raise ValueError(f"record_cuts: every must be positive, got {every}")
    ext = native()
    if ext is not None:
        return ext.record_cuts(buf, base_offset, every)  # type: ignore[no-any-return]
    return _record_cuts_py(buf, base_offset, every)


def _record_cuts_py(buf: Any, base_offset: int, every: int) -> tuple[list[int], int]:
    """:func:`record_cuts` in Python (the C version's reference)."""
    cuts: list[int] = []
    pos, length, due = 0, len(buf), every
    while pos + 8 <= length and (buf[pos : pos + 8] != _ZERO_WORDS):
        req = check_record(
            buf, pos, length, check_crc=False, expected_phy_offset=base_offset + pos, decode_properties=False
        )
        if not req.success or req.msg_size == 0:
            break
        if pos >= due:
            cuts.append(pos)
            due = pos + every
            if due >= length:  # no cut left to find
                break
        pos += req.msg_size
    return cuts, pos
