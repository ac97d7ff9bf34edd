"""Per-topic retention and topic deletion in the CommitLog (libstore.segment_summary,
libstore.retention_policy, libstore.commit_log_cleaner) over real CommitLogs with 256 KiB
segments: the summaries kept at append, saved, rebuilt after a crash and on a slave; and which
segments a cleanup round deletes as the (injected) clock moves on."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from libstore import BrokerRole, CommitLog, Message, StoreConfig
from libstore.commit_log_cleaner import CleanCommitLogService
from libstore.retention_policy import NEVER, RetentionPolicy
from libstore.segment_summary import UNQUEUED, SegmentSummary
from libstore.topic_config import TopicConfig

HOUR_S = 3600.0
NOW = time.time()


def _put_until(log: CommitLog, topics: list[str], end: int) -> None:
    """Append 4 KB messages, cycling through ``topics``, until the log reaches ``end``."""
    i = 0
    while log.max_offset < end:
        topic = topics[i % len(topics)]
        assert log.put_messages([Message(topic, bytes([i % 251]) * 4000, 0)]).all_ok
        i += 1


def _replicate(master: CommitLog, slave: CommitLog) -> None:
    """Copy the master's whole log to the slave as replication does."""
    offset = slave.max_offset
    while offset < master.max_offset:
        data, next_offset = master.read_chunk(offset, master.max_offset, 64 * 1024)
        slave.append_replica(offset, data)
        offset = next_offset


def _segments(log: CommitLog) -> list[str]:
    return [mf.file_name for mf in log.queue.mapped_files]


def _cleaner(
    log: CommitLog, *, hours_later: float, hour: int = 12, usage: float = 0.5
) -> CleanCommitLogService:
    cfg = log.config.replace(
        disk_max_used_space_ratio=75,
        disk_space_clean_forcibly_ratio=85,
        disk_space_warning_level_ratio=90,
        delete_commit_log_files_interval=0,
    )
    return CleanCommitLogService(
        log,
        cfg,
        clock=lambda: NOW + hours_later * HOUR_S,
        local_hour=lambda: hour,
        disk_usage=lambda _p: usage,
    )


def _retain(log: CommitLog, topic: str, hours: float) -> None:
    log.topic_config.create_or_update(TopicConfig(topic, 1, 1, retention_hours=hours))


def _deleted(log: CommitLog, cleaner: CleanCommitLogService) -> list[str]:
    log.queue.flush_to(log.max_offset)  # deletion never takes unflushed bytes
    return [name for name, _ in cleaner.clean_once().deleted]


def _summaries(log: CommitLog) -> dict[int, dict[str, list[int]]]:
    out = {}
    for mf in log.queue.mapped_files:
        summary = log.summaries.get(mf.file_from_offset)
        assert summary is not None and summary.complete
        out[mf.file_from_offset] = summary.topics
    return out


def _scanned(log: CommitLog) -> dict[int, dict[str, list[int]]]:
    """The same summaries computed by reading every record (the reference)."""
    out: dict[int, dict[str, list[int]]] = {}
    for req in log.iter_records(0, log.max_offset, decode_properties=False):
        start = log.queue.segment_start_of(req.commit_log_offset)
        entry = out.setdefault(start, {}).setdefault(req.topic, [0, 0])
        entry[0] = max(entry[0], req.store_timestamp)
        entry[1] = max(entry[1], req.commit_log_offset)
    return out


def test_summaries_kept_at_append_match_the_records_and_survive_a_restart(
    open_log: Callable[..., CommitLog],
) -> None:
    log = open_log()
    size = log.config.mapped_file_size_commit_log
    _put_until(log, ["A", "B"], 2 * size + 1000)
    _put_until(log, ["C"], 3 * size + 1000)
    assert _summaries(log) == _scanned(log)
    assert "C" in _summaries(log)[2 * size] and len(_summaries(log)[2 * size]) >= 2
    assert log.refresh_summaries() == 0  # nothing to scan: every append was noted
    config = log.config
    log.shutdown()
    again = CommitLog.open(config)
    try:
        assert again.refresh_summaries() == 0  # the saved files cover the whole log
        assert _summaries(again) == _scanned(again)
    finally:
        again.shutdown()


def test_after_a_crash_the_unsaved_part_is_scanned_again(store_config: StoreConfig, tmp_path: Path) -> None:
    log = CommitLog.open(store_config)
    size = store_config.mapped_file_size_commit_log
    _put_until(log, ["A", "B"], size + 1000)
    log.summaries.save_dirty()  # what a cleanup round writes
    _put_until(log, ["C", "A"], 3 * size + 5000)
    before = _summaries(log)
    log.queue.flush_to(log.max_offset)
    log.abandon()  # no shutdown: nothing more is saved, the abort file stays
    again = CommitLog.open(store_config)
    try:
        assert not again.last_exit_ok
        assert again.refresh_summaries() >= 3  # the segments written after the save
        assert _summaries(again) == before == _scanned(again)
    finally:
        again.shutdown()


def test_a_slave_summarises_replicated_bytes_in_the_cleanup_thread(
    open_log: Callable[..., CommitLog], store_config: StoreConfig, tmp_path: Path
) -> None:
    master = open_log()
    size = master.config.mapped_file_size_commit_log
    _put_until(master, ["A", "B"], 2 * size + 3000)
    slave = open_log(store_path_root_dir=str(tmp_path / "slave"), broker_role=BrokerRole.SLAVE)
    _replicate(master, slave)
    summary = slave.summaries.get(0)
    assert summary is not None and not summary.complete  # not read on the replication path
    assert slave.refresh_summaries() == 3
    assert _summaries(slave) == _summaries(master)


def test_a_cut_keeps_the_cut_segment_summary_and_forgets_the_segments_past_it(
    open_log: Callable[..., CommitLog], tmp_path: Path
) -> None:
    slave = open_log(broker_role=BrokerRole.SLAVE)
    master = open_log(store_path_root_dir=str(tmp_path / "m"))
    size = master.config.mapped_file_size_commit_log
    _put_until(master, ["A"], size + 1000)
    cut_at = master.max_offset
    _put_until(master, ["B"], 2 * size + 1000)
    _replicate(master, slave)
    slave.refresh_summaries()
    slave.truncate_to(cut_at)
    assert slave.summaries.get(2 * size) is None
    kept = slave.summaries.get(size)
    assert kept is not None and kept.complete and kept.noted_to == cut_at
    assert set(kept.topics) == {"A", "B"}  # a superset: retention can only keep it longer
    assert len(list((Path(slave.config.root_dir) / "segmentsummary").glob("*.json"))) <= 2


def test_per_topic_retention_deletes_at_any_hour_and_a_longer_topic_holds_its_segment(
    open_log: Callable[..., CommitLog],
) -> None:
    log = open_log()
    size = log.config.mapped_file_size_commit_log
    _retain(log, "Short", 1)
    _retain(log, "Long", 10)
    _put_until(log, ["Short"], 2 * size)  # segments 0, 1
    _put_until(log, ["Short", "Long"], 3 * size)  # segment 2
    _put_until(log, ["Short"], 4 * size)  # segment 3
    _put_until(log, ["Global", "Short"], 5 * size)  # segment 4: a topic under fileReservedTime
    _put_until(log, ["Short"], 5 * size + 1000)  # segment 5, being written
    names = _segments(log)
    assert _deleted(log, _cleaner(log, hours_later=0.5)) == []  # nothing is an hour old yet
    cleaner = _cleaner(log, hours_later=2)
    assert _deleted(log, cleaner) == names[:2]  # not the deleteWhen hour: per-topic alone decides
    assert cleaner.last_round is not None and cleaner.last_round.reason == "topic retention"
    assert _deleted(log, _cleaner(log, hours_later=5)) == []  # "Long" holds segment 2 (and 3 behind it)
    cleaner = _cleaner(log, hours_later=11, hour=4)
    assert _deleted(log, cleaner) == names[2:4]
    # The deleteWhen hour let nothing more go: the round names what decided, not the hour.
    assert cleaner.last_round is not None and cleaner.last_round.reason == "topic retention"
    # Segment 4 holds "Global": 72 h after its last modification, and only at the hour or
    # under disk pressure, as RocketMQ.
    assert _deleted(log, _cleaner(log, hours_later=11, hour=4)) == []
    assert _deleted(log, _cleaner(log, hours_later=73)) == []
    cleaner = _cleaner(log, hours_later=73, hour=4)
    assert _deleted(log, cleaner) == names[4:5]
    assert cleaner.last_round is not None and cleaner.last_round.reason == "deleteWhen hour 04"
    assert _segments(log) == names[5:]  # the newest segment stays whatever it holds


def test_disk_pressure_overrides_a_long_topic_retention(open_log: Callable[..., CommitLog]) -> None:
    log = open_log()
    size = log.config.mapped_file_size_commit_log
    _retain(log, "Long", 1000)
    _put_until(log, ["Long"], 3 * size + 1000)
    names = _segments(log)
    assert _deleted(log, _cleaner(log, hours_later=100, hour=4, usage=0.80)) == []
    assert _deleted(log, _cleaner(log, hours_later=0, usage=0.87)) == names[:3]


def test_a_deleted_topic_frees_the_segments_only_it_held_at_the_next_round(
    open_log: Callable[..., CommitLog],
) -> None:
    log = open_log()
    size = log.config.mapped_file_size_commit_log
    _retain(log, "Stay", 10)
    _put_until(log, ["Gone"], 2 * size)  # segments 0, 1
    _put_until(log, ["Gone", "Stay"], 3 * size)  # segment 2
    _put_until(log, ["Gone"], 4 * size)  # segment 3
    names = _segments(log)
    assert log.delete_topic("Gone") and not log.delete_topic("Gone")
    tombstone = log.topic_config.tombstones()["Gone"]
    assert tombstone == log.max_offset
    _put_until(log, ["Gone"], 5 * size + 1000)  # created again: its new messages are live
    assert log.topic_config.get("Gone") is not None
    assert _deleted(log, _cleaner(log, hours_later=0)) == names[:2]  # no clock, no hour needed
    assert _deleted(log, _cleaner(log, hours_later=11)) == names[2:4]  # once "Stay" expired
    assert _deleted(log, _cleaner(log, hours_later=11)) == []  # the new "Gone" follows the store's rules
    assert log.topic_config.tombstones() == {"Gone": tombstone}  # the log still reaches below it
    assert _deleted(log, _cleaner(log, hours_later=0, usage=0.87)) != []
    assert log.min_offset >= tombstone and log.topic_config.tombstones() == {}


def test_the_policy_reads_a_summary() -> None:
    policy = RetentionPolicy.of(
        [TopicConfig("R", retention_hours=2), TopicConfig("G")], {"D": 5000}, file_reserved_hours=72
    )
    hour = 3_600_000
    summary = SegmentSummary(0)
    summary.topics = {"R": [1_000, 900]}
    assert policy.segment_expiry(summary, modified_ms=50_000) == (1_000 + 2 * hour, True)
    summary.topics["D"] = [2_000, 4_000]  # deleted after it was stored: expired already
    assert policy.segment_expiry(summary, modified_ms=50_000) == (1_000 + 2 * hour, True)
    summary.topics["D"] = [2_000, 6_000]  # stored after the deletion: the store's rule
    assert policy.segment_expiry(summary, modified_ms=50_000) == (50_000 + 72 * hour, False)
    summary.topics = {"D": [2_000, 4_000]}
    assert policy.segment_expiry(summary, modified_ms=50_000) == (NEVER, True)
    summary.topics = {UNQUEUED: [2_000, 100], "R": [1_000, 900]}  # tx half messages: the store's rule
    assert policy.segment_expiry(summary, modified_ms=50_000)[1] is False
    summary.gap = (0, 10)  # not summarised yet: judged by mtime, as RocketMQ
    assert policy.segment_expiry(summary, modified_ms=50_000) == (50_000 + 72 * hour, False)
    assert policy.queue_cutoff_ms("R", 10 * hour) == 8 * hour and policy.queue_cutoff_ms("G", 0) is None


def test_a_cut_or_a_new_master_below_a_tombstone_moves_it_back(
    open_log: Callable[..., CommitLog], tmp_path: Path
) -> None:
    """A tombstone past the log's end would expire the messages appended from there on (a
    topic created again after a failover to a member that held less): a cut, and a member
    that becomes the master, bring tombstones back to the log's end."""
    master = open_log(store_path_root_dir=str(tmp_path / "m"))
    slave = open_log(broker_role=BrokerRole.SLAVE)
    size = master.config.mapped_file_size_commit_log
    _put_until(master, ["Gone"], size // 2)
    cut_at = master.max_offset
    _put_until(master, ["Gone"], size + 1000)
    assert master.delete_topic("Gone")
    _replicate(master, slave)
    slave.topic_config.replace_all(master.topic_config.list(), master.topic_config.tombstones())
    assert slave.topic_config.tombstones() == {"Gone": master.max_offset}
    slave.truncate_to(cut_at)
    assert slave.topic_config.tombstones() == {"Gone": cut_at}
    # A member promoted while its log ends below a tombstone it copied.
    slave.topic_config.replace_all([], {"Gone": cut_at + 10_000})
    slave.start_master_term(BrokerRole.ASYNC_MASTER)
    assert slave.topic_config.tombstones() == {"Gone": cut_at}
    assert slave.put_messages([Message("Gone", b"new life", 0)]).all_ok
    summary = slave.summaries.get(0)
    assert summary is not None
    at = slave.retention_policy().expires_at("Gone", summary.topics["Gone"][0], summary.topics["Gone"][1])
    assert at is None  # the new message is not expired by the old deletion


def test_a_scan_overtaken_by_a_cut_is_thrown_away(tmp_path: Path) -> None:
    """A slave cuts its log while the cleanup thread scans a gap, then takes new bytes there:
    what the scan read is gone, so the gap must stay for the next scan (a summary marked
    complete without the new records' topics could let their segment go early)."""
    from libstore.segment_summary import SegmentSummaries

    summaries = SegmentSummaries(tmp_path / "s")
    summaries.reconcile([(0, 1000)])  # nothing saved: the whole segment is a gap

    def scan(start: int, end: int) -> Iterator[tuple[str, int, int]]:
        yield "Old", 1, 100
        summaries.cut(400)  # meanwhile: the log is cut and new bytes come in
        summaries.note_replicated(0, 400, 700)
        yield "Old", 1, 500

    assert summaries.fill_gaps(scan) == 0
    summary = summaries.get(0)
    assert summary is not None and not summary.complete
    assert summaries.fill_gaps(lambda a, b: iter([("New", 2, a)])) == 1  # the next scan reads them
    summary = summaries.get(0)
    assert summary is not None and summary.complete and "New" in summary.topics
