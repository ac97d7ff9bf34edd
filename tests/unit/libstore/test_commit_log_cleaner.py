"""CleanCommitLogService (libstore.commit_log_cleaner, spec §9) over a real CommitLog with
256 KiB segments: the clock, the local hour and the disk usage are injected; the files, their
modification times, the deletions and the reads after them are real."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from libstore import CommitLog, DiskFullError, Message, OffsetOutOfRangeError, PutMessageResults
from libstore.commit_log_cleaner import CleanCommitLogService

HOUR_S = 3600.0
NOW = time.time()


class Disk:
    """An injected disk: the usage a round measures (0..1)."""

    def __init__(self) -> None:
        self.usage = 0.5
        self.paths: list[Path] = []

    def __call__(self, path: Path) -> float:
        self.paths.append(path)
        return self.usage


def _fill(log: CommitLog, segments: int) -> list[PutMessageResults]:
    """Append until the log spans ``segments`` + 1 files (the last one partly written)."""
    results = []
    size = log.config.mapped_file_size_commit_log
    while log.max_offset < segments * size + 1000:
        batch = [Message("T", bytes([i % 251]) * 4000, 0, properties={"KEYS": f"k{i}"}) for i in range(20)]
        results.append(log.put_messages(batch))
        assert results[-1].all_ok
    log.queue.flush_to(log.max_offset)  # deletion never takes unflushed bytes
    return results


def _age(log: CommitLog, first: int, count: int, hours: float) -> None:
    """Set the modification time of segments ``first``..``first + count - 1`` to ``hours`` ago."""
    for mf in log.queue.mapped_files[first : first + count]:
        then = NOW - hours * HOUR_S
        os.utime(mf.path, (then, then))


def _segments(log: CommitLog) -> list[str]:
    return [mf.file_name for mf in log.queue.mapped_files]


def _cleaner(log: CommitLog, disk: Disk, hour: int = 12, **config: object) -> CleanCommitLogService:
    cfg = log.config.replace(
        disk_max_used_space_ratio=75,
        disk_space_clean_forcibly_ratio=85,
        disk_space_warning_level_ratio=90,
        delete_commit_log_files_interval=0,
        **config,
    )
    return CleanCommitLogService(log, cfg, clock=lambda: NOW, local_hour=lambda: hour, disk_usage=disk)


def test_expired_segments_go_at_the_delete_hour_oldest_first_and_reads_follow(
    open_log: Callable[..., CommitLog],
) -> None:
    log = open_log()
    results = _fill(log, 5)
    names = _segments(log)
    _age(log, 0, 3, hours=100)  # the three oldest are past fileReservedTime (72 h)
    _age(log, 4, 1, hours=100)  # an expired segment after a kept one stays: deletion stops there
    disk = Disk()
    assert _cleaner(log, disk, hour=12).clean_once().deleted == ()  # not the hour, disk at 50%
    assert disk.paths == [log.config.commit_log_dir]
    round_ = _cleaner(log, disk, hour=4).clean_once()  # deleteWhen "04"
    size = log.config.mapped_file_size_commit_log
    assert [name for name, _ in round_.deleted] == names[:3]
    assert round_.deleted_bytes == 3 * size and "deleteWhen" in round_.reason
    assert _segments(log) == names[3:] and not any(
        (log.config.commit_log_dir / n).exists() for n in names[:3]
    )
    assert log.min_offset == round_.min_offset == 3 * size
    first_kept = next(r for r in results if r.phy_offsets[0] >= 3 * size)
    assert log.get_message(first_kept.phy_offsets[0], first_kept.sizes[0])
    gone = results[0]
    with pytest.raises(OffsetOutOfRangeError):
        log.get_message(gone.phy_offsets[0], gone.sizes[0])
    assert log.read_many([(gone.phy_offsets[0], gone.sizes[0])]) == [None]
    # A restart recovers a log that no longer starts at 0.
    config = log.config
    log.shutdown()
    again = CommitLog.open(config)
    try:
        assert again.min_offset == 3 * size
        assert again.get_message(first_kept.phy_offsets[0], first_kept.sizes[0])
        assert again.put_messages([Message("T", b"after", 0)]).all_ok
    finally:
        again.shutdown()


def test_usage_past_the_max_ratio_deletes_expired_segments_at_any_hour(
    open_log: Callable[..., CommitLog],
) -> None:
    log = open_log()
    _fill(log, 4)
    names = _segments(log)
    _age(log, 0, 2, hours=80)
    disk = Disk()
    disk.usage = 0.80
    round_ = _cleaner(log, disk, hour=12).clean_once()
    assert [name for name, _ in round_.deleted] == names[:2]  # only the expired ones
    assert "diskMaxUsedSpaceRatio" in round_.reason
    assert _segments(log) == names[2:]


def test_usage_past_the_forcible_ratio_deletes_unexpired_segments_in_batches_but_never_the_newest(
    open_log: Callable[..., CommitLog],
) -> None:
    log = open_log()
    _fill(log, 5)
    names = _segments(log)
    disk = Disk()
    disk.usage = 0.87
    assert _cleaner(log, disk, clean_file_forcibly_enable=False).clean_once().deleted == ()
    cleaner = _cleaner(log, disk, delete_file_batch_max=2)
    assert [name for name, _ in cleaner.clean_once().deleted] == names[:2]
    assert [name for name, _ in cleaner.clean_once().deleted] == names[2:4]
    assert [name for name, _ in cleaner.clean_once().deleted] == names[4:5]
    assert cleaner.clean_once().deleted == ()  # the newest segment (being written) stays
    assert _segments(log) == names[5:]
    assert cleaner.deleted_files == 5 and cleaner.deleted_bytes == 5 * log.config.mapped_file_size_commit_log
    assert log.put_messages([Message("T", b"still writing", 0)]).all_ok


def test_usage_past_the_warning_level_refuses_puts_until_it_drops(open_log: Callable[..., CommitLog]) -> None:
    log = open_log()
    _fill(log, 1)
    disk = Disk()
    disk.usage = 0.93
    cleaner = _cleaner(log, disk)
    cleaner.clean_once()
    end = log.max_offset
    with pytest.raises(DiskFullError, match=r"93\.0% used"):
        log.put_messages([Message("T", b"refused", 0)])
    assert log.max_offset == end  # nothing of it was written
    assert "diskSpaceWarningLevelRatio" in log.disk_full
    disk.usage = 0.60
    cleaner.clean_once()
    assert log.disk_full == ""
    assert log.put_messages([Message("T", b"accepted", 0)]).all_ok


def test_the_service_thread_runs_rounds_and_stops(open_log: Callable[..., CommitLog]) -> None:
    log = open_log()
    _fill(log, 2)
    names = _segments(log)
    disk = Disk()
    disk.usage = 0.95
    cleaner = _cleaner(log, disk, clean_resource_interval=20)
    cleaner._started_rounds = True  # skip the minute RocketMQ waits before the first round
    cleaner.start()
    try:
        deadline = time.monotonic() + 10
        while _segments(log) != names[2:] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _segments(log) == names[2:]
        assert log.disk_full
    finally:
        cleaner.shutdown()
    assert not cleaner.alive


def test_expiry_keeps_what_the_hold_names_but_disk_pressure_does_not(
    open_log: Callable[..., CommitLog],
) -> None:
    """A hold (the timer's oldest undelivered delayed message) keeps every segment from the one
    holding it on, even expired; past the forcible ratio the hold gives way, as expiry does."""
    log = open_log()
    _fill(log, 5)
    names = _segments(log)
    _age(log, 0, 5, hours=100)
    size = log.config.mapped_file_size_commit_log
    disk = Disk()
    cleaner = _cleaner(log, disk, hour=4)
    cleaner.hold = lambda: 2 * size + 100  # inside the third segment
    assert [name for name, _ in cleaner.clean_once().deleted] == names[:2]
    assert cleaner.clean_once().deleted == ()  # expired, but held
    disk.usage = 0.95  # past the forcible ratio: the hold gives way
    assert [name for name, _ in cleaner.clean_once().deleted] == names[2:5]
    assert _segments(log) == names[5:]
