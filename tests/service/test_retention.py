"""Retention in a running embedded suite (real gRPC on 127.0.0.1, real files): once the
CommitLog's head segments are deleted, the dispatch and index services delete the ConsumeQueue
and IndexFile files wholly below the new min offset, consumers start at the first message kept,
and key queries no longer find deleted messages. The decision of what the CommitLog deletes
(clock, hours, disk usage) is tested in tests/unit/libstore/test_commit_log_cleaner.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from libstore import DiskFullError, MessageRecord, PutMessageStatus, decode_record
from libstore.consume_queue import CQ_STORE_UNIT_SIZE, ConsumeQueue
from services._common.telemetry import metrics_snapshot
from services.client import Admin, OutgoingMessage, Producer, PullConsumer
from services.gateway.rocketmq.pb import Code, definition, service, service_grpc
from services.serve import Suite
from tests.service.conftest import embedded_options
from tests.service.harness import InProcessSuites, wait_until

RETENTION_STORE = {
    "mappedFileSizeCommitLog": 128 * 1024,
    "maxMessageSize": 16 * 1024,
    "mappedFileSizeConsumeQueue": 500 * CQ_STORE_UNIT_SIZE,
    "maxIndexNum": 400,
    "maxHashSlotNum": 101,
    "cleanResourceInterval": 100,
    "deleteConsumeQueueFilesInterval": 0,
    "flushIntervalCommitLog": 50,
}
MESSAGES = 3000


def _poll(consumer: PullConsumer, count: int, timeout_s: float = 20.0) -> list[MessageRecord]:
    """Poll ``consumer`` until it gave ``count`` messages or ``timeout_s`` passed; all it gave."""
    got: list[MessageRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll(500)
    return got


def _fill(suite: Suite) -> ConsumeQueue:
    """Topic "Ret" (one queue) with MESSAGES messages numbered in their bodies, dispatched."""
    assert suite.dispatch_app is not None
    with Admin(suite.address) as admin:
        admin.create_topic("Ret", 1)
    with Producer(suite.address) as producer:
        for start in range(0, MESSAGES, 100):
            batch = [
                OutgoingMessage("Ret", b"%06d" % i + bytes(300), keys=[f"k{i}"])
                for i in range(start, start + 100)
            ]
            assert producer.send_batch(batch).all_ok
    cq = suite.dispatch_app.queues.find("Ret", 0)
    assert cq is not None
    wait_until(lambda: cq.max_offset_in_queue == MESSAGES, "dispatch")
    return cq


def test_derived_files_follow_the_commit_log_min_offset(suites: InProcessSuites, tmp_path: Path) -> None:
    suite = suites.start(embedded_options(tmp_path / "data", **RETENTION_STORE))
    suites.wait_ready(suite)
    log, dispatch, index = suite.commit_log, suite.dispatch_app, suite.index_app
    assert log is not None and dispatch is not None and index is not None and log.queue is not None
    cq = _fill(suite)
    with PullConsumer(suite.address, "early", "Ret", batch_size=100, hold_ms=200) as early:
        got = []
        while len(got) < 100:
            got += early.poll(500)
        early.commit()
        committed = int(got[-1].body[:6]) + 1  # the group's position: after what it processed
    wait_until(lambda: index.index.last_indexed_offset >= log.max_offset - 1000, "the index")
    wait_until(lambda: log.flushed_offset >= log.max_offset, "the flush")
    segments = len(log.queue.mapped_files)
    cq_files, index_files = len(cq.queue.mapped_files), len(index.index.files)
    assert segments >= 8 and cq_files >= 6 and index_files >= 6

    # The disk passes the forcible and warning ratios (99% in these suites): a cleanup round
    # deletes unexpired segments from the head and refuses puts; the stats and metrics say so.
    cleaner = log.cleaner
    assert cleaner is not None
    cleaner._disk_usage = lambda _path: 0.995
    round_ = cleaner.clean_once()
    deleted = round_.deleted
    assert len(deleted) == min(segments - 1, log.config.delete_file_batch_max) and log.disk_full
    floor = log.min_offset
    with Admin(suite.address) as admin:
        stats = admin.store_stats()
    assert stats.commit_log_min_offset == floor and "99.5% used" in stats.disk_full
    assert (stats.cleanup_deleted_files, stats.cleanup_deleted_bytes) == (len(deleted), round_.deleted_bytes)
    assert stats.last_cleanup_ms == round_.at_ms and 0 < stats.disk_used_ratio < 1
    metrics = metrics_snapshot()
    assert sum(v for _, v in metrics["mqstore.retention.deleted_segments"]) >= len(deleted)
    assert max(v for _, v in metrics["mqstore.retention.disk_full"]) == 1
    cleaner._disk_usage = lambda _path: 0.5
    cleaner.clean_once()
    assert not log.disk_full

    wait_until(lambda: dispatch.cleaned_to == floor and index.cleaned_to == floor, "derived cleanup")
    first = cq.min_offset_in_queue
    per_file = cq.mapped_file_size // CQ_STORE_UNIT_SIZE
    # Files still being flushed when the head went are deleted in a later round.
    wait_until(
        lambda: (
            cq.queue.mapped_files[0].file_from_offset // CQ_STORE_UNIT_SIZE == first // per_file * per_file
        ),
        "the ConsumeQueue files",
    )
    wait_until(lambda: all(f.end_phy_offset >= floor for f in index.index.files[:-1]), "the IndexFiles")
    assert 0 < first < MESSAGES
    unit = cq.read_unit(first)
    assert unit is not None and unit.phy_offset >= floor  # the first unit kept is a kept message
    before = cq.read_unit(first - 1)
    assert before is None or before.phy_offset < floor
    assert len(cq.queue.mapped_files) < cq_files
    assert all(
        u.phy_offset < floor for u in cq.read_units(cq.queue.mapped_files[0].file_from_offset // 20, 1)
    )
    assert len(index.index.files) < index_files
    assert all(f.end_phy_offset >= floor for f in index.index.files[:-1])
    assert not any(p.name in {n for n, _ in deleted} for p in log.config.commit_log_dir.iterdir())

    # Consumers start at the first message kept; deleted messages are no longer found by key.
    with PullConsumer(suite.address, "after-retention", "Ret", batch_size=256, hold_ms=200) as consumer:
        got = _poll(consumer, MESSAGES - first)
    assert [int(m.body[:6]) for m in got] == list(range(first, MESSAGES))
    # A group whose position was deleted moves on to the first message kept and says so.
    with PullConsumer(suite.address, "early", "Ret", batch_size=256, hold_ms=200) as early:
        resumed = _poll(early, 1)
        assert int(resumed[0].body[:6]) == first
        assert early.skipped == {0: first - committed}
    with Admin(suite.address) as admin:
        assert admin.query_by_key("Ret", f"k{first - 1}") == []
        assert [m.keys for m in admin.query_by_key("Ret", f"k{MESSAGES - 1}")] != []


def test_a_disk_full_store_refuses_both_apis_clearly_until_it_clears(
    suites: InProcessSuites, tmp_path: Path
) -> None:
    suite = suites.start(embedded_options(tmp_path / "data"))
    suites.wait_ready(suite)
    log = suite.commit_log
    assert log is not None
    with Admin(suite.address) as admin:
        admin.create_topic("Full", 1)
    reason = "the disk holding the CommitLog is 93.0% used, above diskSpaceWarningLevelRatio (90%)"
    log.set_disk_full(reason)  # what a cleanup round does past the warning level
    end = log.max_offset
    with Producer(suite.address) as producer, grpc.insecure_channel(suite.address) as channel:
        with pytest.raises(DiskFullError, match="diskSpaceWarningLevelRatio"):
            producer.send("Full", b"refused")
        v2 = service_grpc.MessagingServiceStub(channel).SendMessage(
            service.SendMessageRequest(
                messages=[
                    definition.Message(
                        topic=definition.Resource(name="Full"),
                        body=b"refused",
                        system_properties=definition.SystemProperties(message_id="01FULL" + "0" * 26),
                    )
                ]
            ),
            timeout=10,
        )
        assert v2.status.code == Code.TOO_MANY_REQUESTS and "diskSpaceWarningLevelRatio" in v2.status.message
        assert log.max_offset == end
        log.set_disk_full("")
        assert producer.send("Full", b"accepted").all_ok


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs of its own (mounting needs root; without it the test is skipped)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_small_disk_stays_writable_through_three_times_its_size(
    small_disk: Path,
    suites: InProcessSuites,  # this order: the suite stops before the unmount
) -> None:
    """A suite on a 48 MiB file system takes ~150 MiB of messages: cleanup deletes from the head
    past diskSpaceCleanForciblyRatio (60%), refusals (DISK_FULL past 75%) only ever pause
    producers (how far usage climbs depends on how busy the machine is), nothing fails for want
    of space, every acknowledged message still at or past the
    log's min offset reads back intact, and a group that lagged moves on past what was deleted."""
    store = {
        "mappedFileSizeCommitLog": 1024 * 1024,
        "maxMessageSize": 256 * 1024,
        "mappedFileSizeConsumeQueue": 2000 * CQ_STORE_UNIT_SIZE,
        "maxHashSlotNum": 1009,
        "maxIndexNum": 4000,
        "cleanResourceInterval": 100,
        "deleteCommitLogFilesInterval": 0,
        "deleteConsumeQueueFilesInterval": 0,
        "deleteFileBatchMax": 20,
        "flushIntervalCommitLog": 50,
        "diskMaxUsedSpaceRatio": 50,
        "diskSpaceCleanForciblyRatio": 60,
        "diskSpaceWarningLevelRatio": 75,
    }
    suite = suites.start(embedded_options(small_disk / "data", **store))
    suites.wait_ready(suite)
    log = suite.commit_log
    assert log is not None and log.cleaner is not None
    log.cleaner.wakeup()  # the first round without RocketMQ's minute of grace; then every 100 ms
    with Admin(suite.address) as admin:
        admin.create_topic("Disk", 1)
    with Admin(suite.address) as admin:
        admin.commit_offset("lagging", "Disk", 0, 0)  # a group at the start that stops consuming
    body = bytes(range(256)) * 64  # 16 KiB
    acked: dict[int, tuple[int, int]] = {}  # sequence -> (phy offset, size)
    refused = peak = 0.0
    sent = 0
    with Producer(suite.address, retries=0) as producer:
        while sent * len(body) < 150 * 1024 * 1024:
            batch = [OutgoingMessage("Disk", b"%08d" % (sent + i) + body) for i in range(32)]
            try:
                results = producer.send_batch(batch)
            except DiskFullError:
                refused += 1
                time.sleep(0.05)  # a refusal: wait for cleanup, then send the same batch again
                continue
            n = results.appended
            for i, (phy, size) in enumerate(zip(results.phy_offsets, results.sizes[:n], strict=True)):
                acked[sent + i] = (phy, size)
            sent += n
            if n < len(batch):
                # The disk filled between two cleanup rounds and the next segment could not be created:
                # what was appended is acknowledged, the rest refused (RocketMQ's CREATE_MAPPED_FILE_FAILED);
                # send it again once cleanup has run.
                assert results.status is PutMessageStatus.PUT_OK, results.status
                assert results.failed_status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED, (
                    results.failed_status
                )
                refused += 1
                time.sleep(0.05)
                continue
            usage = shutil.disk_usage(small_disk)
            peak = max(peak, usage.used / (usage.used + usage.free))
    assert peak < 0.99  # some room was always left after an acknowledged batch
    # The disk stays past the forcible ratio, so rounds would go on deleting down to the newest
    # segment: stop them to check what is left.
    log.cleaner.shutdown()
    assert log.cleaner.deleted_files > 50
    floor = log.min_offset
    kept = [seq for seq, (phy, _) in acked.items() if phy >= floor]
    assert len(kept) > 500
    for seq in kept[:: max(1, len(kept) // 200)] + kept[-5:]:
        phy, size = acked[seq]
        record = decode_record(log.get_message(phy, size))
        assert record.body[:8] == b"%08d" % seq and record.body[8:] == body
    with PullConsumer(suite.address, "lagging", "Disk", batch_size=32, hold_ms=100) as lagging:
        first = int(_poll(lagging, 1)[0].body[:8])
    assert first == kept[0] > 0 and lagging.skipped == {0: first}  # queue offsets are sequence numbers


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_the_spark_source_fails_on_data_loss_unless_told_to_skip(
    suites: InProcessSuites, tmp_path: Path, fail_on_data_loss: bool
) -> None:
    """A range planned before retention deleted part of it (a streaming query resuming from an
    old checkpoint): failOnDataLoss (the default) fails the read naming what was lost; false
    reads on from the first message kept."""
    from services.spark.source import QueueRange, _Store

    suite = suites.start(embedded_options(tmp_path / "data", **RETENTION_STORE))
    suites.wait_ready(suite)
    log, dispatch = suite.commit_log, suite.dispatch_app
    assert log is not None and log.queue is not None and dispatch is not None
    cq = _fill(suite)
    wait_until(lambda: log.flushed_offset >= log.max_offset, "the flush")
    log.delete_expired_segments(time.time() + 3600, force=True, batch_max=len(log.queue.mapped_files) // 2)
    wait_until(lambda: dispatch.cleaned_to == log.min_offset, "derived cleanup")
    first = cq.min_offset_in_queue
    assert 0 < first < MESSAGES
    store = _Store(suite.address, "Ret", fail_on_data_loss=fail_on_data_loss)
    planned = QueueRange("Ret", 0, 0, MESSAGES)
    if fail_on_data_loss:
        with pytest.raises(
            RuntimeError, match=f"{first} message\\(s\\) between offsets 0 and {first} were deleted"
        ):
            list(store.read(planned, 256))
        return
    batches = list(store.read(planned, 256))
    offsets = [o for b in batches for o in b.column("queue_offset").to_pylist()]
    assert offsets == list(range(first, MESSAGES))


def test_expiry_keeps_segments_that_hold_undelivered_delayed_messages(
    suites: InProcessSuites, tmp_path: Path
) -> None:
    """A message delayed by an hour sits in the timer topic among others; every segment is
    past fileReservedTime: a round deletes the ones before it and keeps the one holding it,
    so it is still delivered when due."""
    store = {**RETENTION_STORE, "diskMaxUsedSpaceRatio": 50}  # expired segments go at any hour
    suite = suites.start(embedded_options(tmp_path / "data", **store))
    suites.wait_ready(suite)
    log, dispatch = suite.commit_log, suite.dispatch_app
    assert log is not None and log.queue is not None and log.cleaner is not None and dispatch is not None
    with Admin(suite.address) as admin:
        admin.create_topic("Later", 1)
    with Producer(suite.address) as producer:
        filler = [OutgoingMessage("Later", bytes(300)) for _ in range(100)]
        for _ in range(6):
            assert producer.send_batch(filler).all_ok
        due_at = int(time.time() * 1000) + 3_600_000
        held = producer.send("Later", b"in an hour", deliver_at_ms=due_at)
        for _ in range(12):
            assert producer.send_batch(filler).all_ok
    wait_until(lambda: dispatch.timer.pending == 1, "the timer to hold the message")
    wait_until(lambda: log.flushed_offset >= log.max_offset, "the flush")
    old = time.time() - 100 * 3600
    for mf in log.queue.mapped_files:
        os.utime(mf.path, (old, old))
    cleaner = log.cleaner
    cleaner._disk_usage = lambda _path: 0.6  # past diskMaxUsedSpaceRatio, below the forcible ratio
    round_ = cleaner.clean_once()
    assert round_.deleted and "diskMaxUsedSpaceRatio" in round_.reason
    phy = held.phy_offsets[0]
    assert log.min_offset <= phy < log.min_offset + log.config.mapped_file_size_commit_log
    assert log.get_message(phy, held.sizes[0])  # its segment is kept
    assert cleaner.clean_once().deleted == ()  # and stays while the message is held


def _send(address: str, topic: str, count: int, tag: bytes = b"") -> None:
    with Producer(address) as producer:
        for start in range(0, count, 100):
            batch = [
                OutgoingMessage(topic, tag + b"%06d" % i + bytes(300), keys=[f"{topic}-{tag.decode()}{i}"])
                for i in range(start, min(count, start + 100))
            ]
            assert producer.send_batch(batch).all_ok


def test_topic_retention_expires_its_queues_and_lagging_consumers_skip_what_expired(
    suites: InProcessSuites, tmp_path: Path
) -> None:
    """A topic with retentionHours of 2 s: its ConsumeQueue's min offset moves past what
    expired while another topic's stays; a group that had consumed part of it sees how many it
    lost in its progress and skips them; a restart keeps the queue's min offset."""
    options = embedded_options(tmp_path / "data", **RETENTION_STORE)
    suite = suites.start(options)
    suites.wait_ready(suite)
    dispatch = suite.dispatch_app
    assert dispatch is not None
    with Admin(suite.address) as admin:
        created = admin.create_topic("Brief", 1, retention_hours=2 / 3600)
        assert created.retention_hours == 2 / 3600
        admin.create_topic("Other", 1)
    _send(suite.address, "Brief", 300)
    _send(suite.address, "Other", 300)
    with PullConsumer(suite.address, "g", "Brief", batch_size=50, hold_ms=200) as consumer:
        got = []
        while len(got) < 50:
            got += consumer.poll(500)
        consumer.commit()
        committed = int(got[-1].body[:6]) + 1
    brief = dispatch.queues.find("Brief", 0)
    other = dispatch.queues.find("Other", 0)
    assert brief is not None and other is not None
    wait_until(lambda: brief.min_offset_in_queue == 300, "the retention round to expire 'Brief'")
    assert other.min_offset_in_queue == 0 and other.max_offset_in_queue == 300
    # The round counts after its worker thread moved the min offset: wait for the count too.
    wait_until(lambda: dispatch.retention.units_expired == 300, "the round to count what it expired")
    with Admin(suite.address) as admin:
        progress = admin.consumer_progress("g", "Brief")
        assert admin.query_by_key("Brief", "Brief-299") == []  # expired: not found by key either
        assert len(admin.query_by_key("Other", "Other-299")) == 1
    assert (progress.total_expired, progress.total_lag) == (300 - committed, 0)
    _send(suite.address, "Brief", 10, tag=b"new")
    with PullConsumer(suite.address, "g", "Brief", batch_size=50, hold_ms=200) as consumer:
        fresh = _poll(consumer, 10)
        assert [m.body[:3] for m in fresh] == [b"new"] * 10
        assert consumer.skipped == {0: 300 - committed}
    # A restart with no round due for an hour: the saved floor keeps the min offset.
    suites.stop(suite)
    suite = suites.start(
        embedded_options(tmp_path / "data", **{**RETENTION_STORE, "cleanResourceInterval": 3_600_000})
    )
    suites.wait_ready(suite)
    assert suite.dispatch_app is not None
    again = suite.dispatch_app.queues.find("Brief", 0)
    assert again is not None and again.min_offset_in_queue >= 300
    with Admin(suite.address) as admin:
        assert [t.retention_hours for t in admin.list_topics() if t.topic_name == "Brief"] == [2 / 3600]


def test_deleting_a_topic_expires_its_messages_and_frees_the_segments_only_it_held(
    suites: InProcessSuites, tmp_path: Path
) -> None:
    suite = suites.start(embedded_options(tmp_path / "data", **RETENTION_STORE))
    suites.wait_ready(suite)
    log, dispatch = suite.commit_log, suite.dispatch_app
    assert log is not None and log.queue is not None and log.cleaner is not None and dispatch is not None
    with Admin(suite.address) as admin:
        admin.create_topic("Doomed", 1)
        admin.create_topic("Kept", 1)
    _send(suite.address, "Doomed", MESSAGES)
    _send(suite.address, "Kept", 100)
    doomed = dispatch.queues.find("Doomed", 0)
    assert doomed is not None
    wait_until(lambda: doomed.max_offset_in_queue == MESSAGES, "dispatch")
    wait_until(lambda: log.flushed_offset >= log.max_offset, "the flush")
    segments = len(log.queue.mapped_files)
    with Admin(suite.address) as admin:
        assert admin.delete_topic("Doomed") and not admin.delete_topic("Doomed")
        assert "Doomed" not in {t.topic_name for t in admin.list_topics()}
    wait_until(lambda: doomed.min_offset_in_queue == MESSAGES, "the dispatch round to expire 'Doomed'")
    round_ = log.cleaner.clean_once()  # the hour and the disk do not matter: the topic is gone
    assert round_.reason == "topic retention"
    assert len(round_.deleted) >= min(segments - 3, log.config.delete_file_batch_max)
    with PullConsumer(suite.address, "k", "Kept", batch_size=100, hold_ms=200) as consumer:
        got = _poll(consumer, 100)
        assert [int(m.body[:6]) for m in got] == list(range(100))  # the other topic lost nothing
    # Created again: queue offsets go on after the old ones, so no stale offset meets a new message.
    with Admin(suite.address) as admin:
        admin.create_topic("Doomed", 1)
    _send(suite.address, "Doomed", 5, tag=b"new")
    with PullConsumer(suite.address, "fresh", "Doomed", batch_size=10, hold_ms=200) as consumer:
        again = _poll(consumer, 5)
    assert [m.body[:3] for m in again] == [b"new"] * 5
    assert [m.queue_offset for m in again] == list(range(MESSAGES, MESSAGES + 5))
    with Admin(suite.address) as admin:  # keys of the deleted incarnation are gone too
        assert admin.query_by_key("Doomed", f"Doomed-{MESSAGES - 1}") == []  # its segment is kept
        assert len(admin.query_by_key("Doomed", "Doomed-new3")) == 1


def test_the_index_volume_guard_deletes_the_oldest_index_file(
    suites: InProcessSuites, tmp_path: Path
) -> None:
    suite = suites.start(embedded_options(tmp_path / "data", **RETENTION_STORE))
    suites.wait_ready(suite)
    index, log = suite.index_app, suite.commit_log
    assert index is not None and log is not None
    _fill(suite)
    wait_until(lambda: index.index.last_indexed_offset >= log.max_offset - 1000, "the index")
    files = [f.file_name for f in index.index.files]
    assert len(files) >= 3
    index._disk_usage = lambda _path: 0.995  # past the forcible ratio (99% in these suites)
    wait_until(lambda: index.guard_deleted >= 2, "the guard")
    index._disk_usage = lambda _path: 0.5
    kept = [f.file_name for f in index.index.files]
    assert kept == files[len(files) - len(kept) :] and len(kept) < len(files)  # the oldest went
    assert log.min_offset == 0  # the messages themselves stay
    with Admin(suite.address) as admin:
        assert admin.query_by_key("Ret", f"k{MESSAGES - 1}") != []
