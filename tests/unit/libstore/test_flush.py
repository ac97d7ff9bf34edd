"""Flush policies: group commit batching, FLUSH_DISK_TIMEOUT, fail-stop on fsync errors,
ASYNC_FLUSH thoroughness and draining at shutdown."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest

from libstore import (
    CommitLog,
    FlushDiskType,
    Message,
    PutMessageStatus,
    ServiceNotAvailableError,
    StoreConfig,
)
from libstore import mapped_file as mapped_file_module


@pytest.fixture
def slow_fsync(monkeypatch):
    """Count fdatasync calls on CommitLog segments and make each take ``delay_s``."""
    state = {"calls": 0, "delay_s": 0.002, "fail": False}
    real = os.fdatasync

    def fake(fd: int) -> None:
        state["calls"] += 1
        if state["fail"]:
            raise OSError(errno.EIO, "Input/output error")
        time.sleep(state["delay_s"])
        real(fd)

    monkeypatch.setattr(mapped_file_module.os, "fdatasync", fake)
    return state


def test_group_commit_serves_many_producers_with_few_fsyncs(open_log, slow_fsync):
    cl: CommitLog = open_log(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    producers, per_producer = 32, 15
    statuses: list[PutMessageStatus] = []
    lock = threading.Lock()

    def produce(p: int) -> None:
        for i in range(per_producer):
            (r,) = cl.put_messages([Message("TopicG", f"{p}-{i}".encode(), p % 8)])
            with lock:
                statuses.append(r.status)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [PutMessageStatus.PUT_OK] * (producers * per_producer)
    assert cl.flushed_offset == cl.max_offset
    # 480 acknowledged puts; with a 2 ms fsync, waiters pile up and one flush frees many.
    assert slow_fsync["calls"] < producers * per_producer / 4


def test_flush_disk_timeout_when_the_disk_is_slower_than_the_timeout(open_log, slow_fsync):
    slow_fsync["delay_s"] = 0.4
    cl = open_log(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout=50)
    (r,) = cl.put_messages([Message("TopicG", b"late", 0)])
    assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
    assert r.status.appended and r.phy_offset == 0
    assert cl.read_message(0).body == b"late"  # appended, only durability unconfirmed


def test_fsync_failure_is_fail_stop(store_config: StoreConfig, slow_fsync):
    cl = CommitLog.open(store_config.replace(flush_disk_type=FlushDiskType.SYNC_FLUSH))
    assert cl.put_messages([Message("TopicG", b"ok", 0)])[0].ok
    slow_fsync["fail"] = True
    (r,) = cl.put_messages([Message("TopicG", b"unlucky", 0)])
    assert r.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
    assert not cl.writeable
    with pytest.raises(ServiceNotAvailableError):
        cl.put_messages([Message("TopicG", b"refused", 0)])
    cl.shutdown()
    slow_fsync["fail"] = False
    assert (Path(store_config.store_path_root_dir) / "abort").exists(), "next start must be abnormal"
    cl = CommitLog.open(store_config)
    try:
        assert not cl.last_exit_ok
        assert [r.commit_log_offset for r in cl.iter_records(0)][:1] == [0]
    finally:
        cl.shutdown()


def test_async_flush_flushes_small_writes_at_the_thorough_interval(open_log):
    cl = open_log(flush_interval_commit_log=5, flush_commit_log_thorough_interval=50)
    (r,) = cl.put_messages([Message("TopicG", b"tiny", 0)])
    deadline = time.monotonic() + 10
    while cl.flushed_offset < r.next_offset:
        assert time.monotonic() < deadline, "thorough flush never happened"
        time.sleep(0.01)
    assert cl.confirm_offset == cl.max_offset  # ASYNC_FLUSH: consumers see written bytes


def test_async_flush_drains_at_shutdown(store_config: StoreConfig):
    cfg = store_config.replace(flush_interval_commit_log=60_000, flush_commit_log_thorough_interval=600_000)
    cl = CommitLog.open(cfg)
    res = cl.put_messages([Message("TopicG", b"x" * 500, i % 2) for i in range(100)])
    assert cl.flushed_offset == 0
    cl.shutdown()
    cl = CommitLog.open(cfg)
    try:
        assert cl.last_exit_ok and cl.max_offset == res[-1].next_offset
    finally:
        cl.shutdown()


def test_sync_flush_with_transient_store_pool_commits_then_flushes(open_log):
    cl = open_log(
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
        transient_store_pool_enable=True,
        transient_store_pool_size=3,
    )
    res = cl.put_messages([Message("TopicG", b"p" * 3000, i % 4) for i in range(200)])
    assert all(r.ok for r in res)
    assert cl.flushed_offset >= res[-1].next_offset
    assert cl.read_message(res[-1].phy_offset).body == b"p" * 3000


def test_flush_and_wait_blocks_until_the_round_or_the_timeout(store_config: StoreConfig, slow_fsync):
    """CommitLog.flush_and_wait (GroupCommitService): True once the flushed offset reached the
    target; False after the timeout (the round goes on), which also marks the rounds as slow;
    False at once when the flush failed or the service stopped."""
    cl = CommitLog.open(store_config.replace(flush_disk_type=FlushDiskType.SYNC_FLUSH))
    try:
        end = cl.append_messages([Message("TopicW", b"w", 0)]).results.next_offset
        assert cl.flushed_offset < end
        assert cl.flush_and_wait(end, 5.0) and cl.flushed_offset >= end
        slow_fsync["delay_s"] = 0.3
        end = cl.append_messages([Message("TopicW", b"slow", 0)]).results.next_offset
        started = time.monotonic()
        assert not cl.flush_and_wait(end, 0.05)
        assert time.monotonic() - started < 0.25  # the timeout, not the 0.3 s fdatasync
        flush_ms = cl.group_commit_flush_ms
        assert flush_ms is not None and flush_ms >= 50.0
        deadline = time.monotonic() + 5
        while cl.flushed_offset < end and time.monotonic() < deadline:  # the round went on
            time.sleep(0.01)
        assert cl.flushed_offset >= end
        slow_fsync["delay_s"], slow_fsync["fail"] = 0.0, True
        end = cl.append_messages([Message("TopicW", b"lost", 0)]).results.next_offset
        assert not cl.flush_and_wait(end, 5.0) and cl.flush_failed
        started = time.monotonic()
        assert not cl.flush_and_wait(end, 5.0)  # failed already: at once
        assert time.monotonic() - started < 1.0
    finally:
        cl.shutdown()
    assert not cl.flush_and_wait(end + 1, 5.0)  # stopped: at once


def test_flush_and_wait_is_false_under_async_flush(open_log):
    cl: CommitLog = open_log()
    end = cl.append_messages([Message("TopicW", b"a", 0)]).results.next_offset
    assert not cl.flush_and_wait(end, 1.0) and cl.group_commit_flush_ms is None
