"""CommitLog recovery after a restart (spec sheet §5) and the queue-offset table rebuild.

* Normal recovery (the abort file is absent: the last shutdown was clean): when the clean
  shutdown recorded the log's end and its last record (``config/cleanEnd.json``), validate that
  record, CRC included, check that nothing was written past it, and take that end as it is
  (mqstore: a clean restart costs the same whatever the log's size). Otherwise validate
  records from the third-to-last segment to the end (RocketMQ 4.9); older segments are not read.
* Abnormal recovery (the abort file is present: a crash): validate every record, CRC
  included, from the checkpoint's ``flushedPhyOffset`` (mqstore: below it the flush service
  had fdatasync'ed everything) or, when the checkpoint has none, from the newest segment whose
  first record is valid and was stored at or before its ``commit_log_recover_timestamp`` (so
  it was flushed); none qualifies → segment 0.

Either way the first bytes that are not a valid record (a torn write, zeros) end the log at E:
segments past E are deleted, the tail of E's segment is zeroed (so stale records can never be
mistaken for valid ones later; finding non-zero bytes there skips the holes the file system
reports), the segments recovery read are fdatasynced (a killed process may
have left records only in the page cache) and the flush/commit watermarks are set to E. When that drops
bytes that are not zeros (a torn last write, or a damaged record in the middle of the log with
every later record behind it), they are moved to the quarantine folder first
(libstore.quarantine), and the log generation is bumped before the cut (``before_cut``): a
follower may have read them. A normal recovery that drops nothing leaves the generation alone.

Then the queue-offset table is rebuilt from the last snapshot plus a header scan of the records
after it (see :mod:`libstore.queue_offset_table`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from libstore._files import atomic_write, read_json
from libstore.dispatch_request import DispatchRequest
from libstore.errors import StoreIOError
from libstore.log_scanner import scan_log
from libstore.mapped_file import MappedFile
from libstore.mapped_file_queue import MappedFileQueue
from libstore.message import MessageSysFlag
from libstore.quarantine import Quarantine, nonzero_end
from libstore.queue_offset_table import QueueKey, QueueOffsetSnapshot
from libstore.record_codec import check_record

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    """What recovery did: where it started, how much it read, where the log ends.

    ``files_scanned`` counts segments whose records were validated; ``truncated_at`` is the
    offset of the first invalid, non-zero bytes (a torn or corrupt record) when the scan stopped
    on them (None when the log simply ends); ``queue_offset_records_scanned`` counts records read to
    rebuild the queue-offset table (0 after a clean shutdown). ``quarantined`` lists the files
    the cut bytes were moved to (empty when only zeros were cut), ``quarantined_bytes`` their size.
    ``queue_offsets_seen`` holds, for the records the scan validated (``[start_offset,
    end_offset)``), each queue's next offset past them, so the queue-offset table need not read
    those records a second time (:func:`rebuild_queue_offsets`).
    """

    normal: bool
    start_offset: int = 0
    files_scanned: int = 0
    records_validated: int = 0
    end_offset: int = 0
    truncated_at: int | None = None
    files_deleted: int = 0
    queue_offset_records_scanned: int = 0
    queue_offset_snapshot_used: bool = False
    duration_ms: float = 0.0
    scanned_file_names: list[str] = field(default_factory=list)
    quarantined: list[Path] = field(default_factory=list)
    quarantined_bytes: int = 0
    queue_offsets_seen: dict[QueueKey, int] = field(default_factory=dict)
    last_record_offset: int = -1


def recover_commit_log(
    queue: MappedFileQueue,
    *,
    normal: bool,
    recover_timestamp: int,
    check_crc: bool = True,
    before_cut: Callable[[int], object] | None = None,
    quarantine: Quarantine | None = None,
    clean_end: tuple[int, int] | None = None,
    flushed_offset: int = 0,
) -> RecoveryReport:
    """Find the end of the valid log, cut everything after it, set the watermarks.

    ``clean_end`` = (end offset, last record's offset) as the last clean shutdown left them
    (:func:`read_clean_end`): normal recovery then validates that record (CRC included), that it
    ends the log there and that nothing was written past it, instead of the last three
    segments, so a clean restart takes the same time whatever the log's size. When any check
    fails it validates the segments as usual. ``flushed_offset`` (> 0: the checkpoint's
    flushedPhyOffset, a record boundary below which everything was durable) is where abnormal
    recovery starts validating; without it, at the newest segment older than ``recover_timestamp``.

    ``normal``: the last shutdown was clean. ``recover_timestamp``: store time (ms) at or before
    which records are known flushed (checkpoint). ``before_cut(end)`` is called once the end is
    known and before anything is cut there, e.g. to bump the log generation first: always after
    a crash (an empty log: with 0), after a clean shutdown only when non-zero bytes are cut.
    ``quarantine``: where those bytes go (deleted without one). Returns a RecoveryReport;
    raises StoreIOError when the cut or the quarantine cannot be written.
    """
    started = time.monotonic()
    report = RecoveryReport(normal=normal)
    files = queue.mapped_files
    if not files:
        if before_cut is not None:
            before_cut(report.end_offset)
        report.duration_ms = (time.monotonic() - started) * 1000
        return report
    fast = _verified_clean_end(queue, clean_end, check_crc) if normal and clean_end is not None else None
    if fast is not None:
        report.start_offset, req, end = fast
        report.records_validated = report.files_scanned = 1
        report.last_record_offset = req.commit_log_offset
        report.scanned_file_names = [queue.file_name_of(queue.segment_start_of(req.commit_log_offset))]
        if MessageSysFlag.gets_queue_offset(req.sys_flag):
            report.queue_offsets_seen[(req.topic, req.queue_id)] = req.consume_queue_offset + 1
        queue.trust_end(end)  # verified: nothing to read past it, nothing to cut or force
        return _done(queue, report, end, normal, started)
    flushed_in = queue.find_mapped_file_by_offset(flushed_offset) if flushed_offset > 0 else None
    if normal:
        start = files[max(0, len(files) - 3)].file_from_offset
    elif flushed_in is not None and flushed_offset >= queue.get_min_offset():
        start = flushed_offset
    else:
        start_index = 0
        for i in range(len(files) - 1, -1, -1):
            if _is_mapped_file_matched_recover(files[i], recover_timestamp, check_crc):
                start_index = i
                break
        start = files[start_index].file_from_offset
    report.start_offset = start
    end = start
    seen_files: set[int] = set()
    stopped_on_invalid = False
    seen = report.queue_offsets_seen
    gets_offset = MessageSysFlag.gets_queue_offset
    for req in scan_log(queue, start, None, check_crc=check_crc, decode_properties=False):
        seen_files.add(queue.segment_start_of(req.commit_log_offset))
        if not req.success:
            stopped_on_invalid = True
            end = req.commit_log_offset
            if not _is_zeros(queue, end):
                report.truncated_at = end
            break
        report.records_validated += 1
        report.last_record_offset = req.commit_log_offset
        end = req.commit_log_offset + req.msg_size
        if gets_offset(req.sys_flag):  # what rebuild_queue_offsets would read again
            key = (req.topic, req.queue_id)
            nxt = req.consume_queue_offset + 1
            if nxt > seen.get(key, 0):
                seen[key] = nxt
    if not stopped_on_invalid:
        # Ran off the end: a last segment ending in a blank ends at its tail.
        end = _last_scanned_segment_end(queue, end)
    report.files_scanned = len(seen_files) or 1
    report.scanned_file_names = [queue.file_name_of(s) for s in sorted(seen_files)]
    return _finish(queue, report, end, normal, started, before_cut, quarantine)


def _finish(
    queue: MappedFileQueue,
    report: RecoveryReport,
    end: int,
    normal: bool,
    started: float,
    before_cut: Callable[[int], object] | None,
    quarantine: Quarantine | None,
) -> RecoveryReport:
    """Cut the log at ``end`` (quarantining non-zero bytes), flush and set the watermarks."""
    head, cut_from, cut_to, later = _dropped(queue, end)
    lost = cut_to > cut_from or any(later)
    if before_cut is not None and (not normal or lost):
        before_cut(end)
    before = len(queue.mapped_files)
    if lost and quarantine is not None:
        folder = quarantine.new_event(end)
        if head is not None and cut_to > cut_from:
            report.quarantined.append(quarantine.keep_bytes(folder, head, cut_from, cut_to))
        report.quarantined += queue.truncate_dirty_files(end, move_to=folder)
        report.quarantined_bytes = sum(p.stat().st_size for p in report.quarantined)
        log.warning(
            "recovery cut the CommitLog at %d: %d bytes past it (%d files) moved to %s",
            end,
            report.quarantined_bytes,
            len(report.quarantined),
            folder,
        )
    else:
        queue.truncate_dirty_files(end)
    report.files_deleted = before - len(queue.mapped_files)
    # What a killed process wrote may sit only in the page cache: make the kept records durable
    # before the watermarks say they are (SYNC_FLUSH shows consumers only flushed bytes).
    first = queue.segment_start_of(report.start_offset)
    for mf in queue.mapped_files:
        if mf.file_from_offset >= first:
            mf.force()
    return _done(queue, report, end, normal, started)


def _done(
    queue: MappedFileQueue, report: RecoveryReport, end: int, normal: bool, started: float
) -> RecoveryReport:
    """Set the watermarks at ``end`` and log what recovery did."""
    queue.flushed_where = end
    queue.committed_where = end
    report.end_offset = end
    report.duration_ms = (time.monotonic() - started) * 1000
    log.info(
        "%s recovery: log ends at %d after %d records in %d segments, %d bytes from offset %d (%.1f ms)%s",
        "normal" if normal else "abnormal",
        end,
        report.records_validated,
        report.files_scanned,
        end - report.start_offset,
        report.start_offset,
        report.duration_ms,
        f", torn bytes at {report.truncated_at} cut" if report.truncated_at is not None else "",
    )
    return report


def _dropped(queue: MappedFileQueue, end: int) -> tuple[MappedFile | None, int, int, list[bool]]:
    """What cutting the log at ``end`` drops: the segment holding ``end`` (None when none does),
    the positions in it from which it is cut and just past its last non-zero byte, and for each
    later segment whether it holds any non-zero byte."""
    head = queue.find_mapped_file_by_offset(end)
    cut_from = cut_to = 0
    if head is not None:
        cut_from = end - head.file_from_offset
        cut_to = nonzero_end(head, cut_from)
    later = [nonzero_end(mf, 0) > 0 for mf in queue.mapped_files if mf.file_from_offset > end]
    return head, cut_from, cut_to, later


def _last_scanned_segment_end(queue: MappedFileQueue, end: int) -> int:
    """When the scan stopped cleanly: if the segment holding ``end`` ends in a blank at ``end``, the
    log ends at that segment's tail; otherwise at ``end``."""
    mf = queue.find_mapped_file_by_offset(end)
    if mf is None:
        return end
    pos = end - mf.file_from_offset
    req = check_record(mf.buffer, pos, mf.file_size, check_crc=False, decode_properties=False)
    if req.success and req.msg_size == 0:
        return mf.file_tail_offset
    return end


def read_clean_end(path: Path) -> tuple[int, int] | None:
    """(end offset, last record's offset) from the clean-end file, or None (none, unreadable)."""
    try:
        data = read_json(path, "clean end")
        return None if data is None else (int(data["end"]), int(data["lastRecord"]))
    except (StoreIOError, ValueError, KeyError, TypeError):
        return None


def write_clean_end(path: Path, end: int, last_record: int) -> None:
    """Record where a cleanly shut down log ends and where its last record starts. Raises
    StoreIOError."""
    atomic_write(path, json.dumps({"end": end, "lastRecord": last_record}).encode("utf-8"))


def _verified_clean_end(
    queue: MappedFileQueue, clean_end: tuple[int, int], check_crc: bool
) -> tuple[int, DispatchRequest, int] | None:
    """(the last record's offset, the record, end) when the record at ``clean_end``'s offset is valid
    and the log ends right after it (or after the blank closing its segment) with never-written
    bytes, else None."""
    end, last = clean_end
    mf = queue.find_mapped_file_by_offset(last)
    if mf is None or last < 0 or end <= last:
        return None
    pos = last - mf.file_from_offset
    req = check_record(
        mf.buffer, pos, mf.file_size, check_crc=check_crc, expected_phy_offset=last, decode_properties=False
    )
    if not req.success or req.msg_size == 0:
        return None
    req.commit_log_offset = last
    after = last + req.msg_size
    if _last_scanned_segment_end(queue, after) != end or not _is_zeros(queue, end):
        return None
    if any(mf.file_from_offset < f.file_from_offset < end for f in queue.mapped_files):
        return None
    return last, req, end


def _is_zeros(queue: MappedFileQueue, offset: int) -> bool:
    """True when the 8 bytes at ``offset`` are zero: never-written space, not a torn record."""
    mf = queue.find_mapped_file_by_offset(offset)
    if mf is None:
        return True
    pos = offset - mf.file_from_offset
    return not any(mf.buffer[pos : min(pos + 8, mf.file_size)])


def _is_mapped_file_matched_recover(mf: MappedFile, recover_timestamp: int, check_crc: bool) -> bool:
    req = check_record(
        mf.buffer,
        0,
        mf.file_size,
        check_crc=check_crc,
        expected_phy_offset=mf.file_from_offset,
        decode_properties=False,
    )
    if not req.success or req.msg_size == 0:
        return False
    return req.store_timestamp != 0 and req.store_timestamp <= recover_timestamp


def rebuild_queue_offsets(
    queue: MappedFileQueue,
    snapshot: QueueOffsetSnapshot | None,
    end_offset: int,
    seen: tuple[int, dict[QueueKey, int]] | None = None,
) -> tuple[dict[QueueKey, int], int, bool]:
    """The queue-offset table for the log ``[min, end_offset)``.

    Uses ``snapshot`` when it lies within the log, else scans from the log's first byte.
    ``seen`` = (offset, table): the next offsets of the records in ``[offset, end_offset)``,
    already read (RecoveryReport.queue_offsets_seen); only what lies before ``offset`` is then
    scanned. Tables merge by taking each queue's larger next offset, so ``seen`` may also
    cover records the snapshot does. Returns (table, records scanned, whether the snapshot was
    used).
    """
    min_offset = max(queue.get_min_offset(), 0)
    if snapshot is not None and min_offset <= snapshot.phy_offset <= end_offset:
        offsets = dict(snapshot.offsets)
        start = snapshot.phy_offset
        used = True
    else:
        if snapshot is not None:
            log.info(
                "queue offset snapshot at %d is outside the log [%d, %d]; rescanning",
                snapshot.phy_offset,
                min_offset,
                end_offset,
            )
        offsets = {}
        start = min_offset
        used = False
    scanned = 0
    stop = end_offset
    if seen is not None and seen[0] <= end_offset:
        stop = max(start, seen[0])
    gets_offset = MessageSysFlag.gets_queue_offset
    if start < stop:
        for req in scan_log(queue, start, stop, check_crc=False, decode_properties=False):
            if not req.success:
                break
            scanned += 1
            if gets_offset(req.sys_flag):
                key = (req.topic, req.queue_id)
                nxt = req.consume_queue_offset + 1
                if nxt > offsets.get(key, 0):
                    offsets[key] = nxt
    if seen is not None and seen[0] <= end_offset:
        for key, nxt in seen[1].items():
            if nxt > offsets.get(key, 0):
                offsets[key] = nxt
    return offsets, scanned, used
