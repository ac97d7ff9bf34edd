"""Recovery: normal recovery reads only the last segments; abnormal recovery validates from the
checkpoint and cuts the log at the first damaged record, leaving the exact surviving prefix."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libstore import BrokerRole, CommitLog, Message, PutMessageResult, StoreConfig
from libstore.mapped_file import offset_to_file_name
from libstore.store_checkpoint import StoreCheckpoint
from tests.conftest import SEGMENT


def _fill(cl: CommitLog, n: int, size: int = 1000, queues: int = 4) -> list[PutMessageResult]:
    out: list[PutMessageResult] = []
    for start in range(0, n, 50):
        msgs = [
            Message("TopicR", bytes([i % 256]) * size, i % queues) for i in range(start, min(n, start + 50))
        ]
        out += cl.put_messages(msgs)
    assert all(r.ok for r in out)
    return out


def _crash_marker(config: StoreConfig, flushed_to: int | None = None) -> None:
    """Leave the store as a crash would: the abort file present; with ``flushed_to``, the
    checkpoint vouching only for the bytes before it (the damage a test makes lies past it)."""
    (Path(config.store_path_root_dir) / "abort").touch()
    if flushed_to is not None:
        ckpt = StoreCheckpoint(Path(config.store_path_root_dir) / "checkpoint")
        ckpt.flushed_phy_offset = flushed_to
        ckpt.shutdown()


def _segment_path(config: StoreConfig, offset: int) -> Path:
    return config.commit_log_dir / offset_to_file_name(offset - offset % SEGMENT)


def _patch_file(config: StoreConfig, offset: int, data: bytes) -> None:
    with open(_segment_path(config, offset), "r+b") as fh:
        fh.seek(offset % SEGMENT)
        fh.write(data)


def test_normal_recovery_reads_only_the_last_three_segments(store_config: StoreConfig):
    cl = CommitLog.open(store_config)
    res = _fill(cl, 2000)  # ~2.1 MB: 8+ segments of 256 KiB
    table = cl.queue_offset_table()
    cl.shutdown()
    segments = sorted(p.name for p in store_config.commit_log_dir.iterdir())
    assert len(segments) >= 8
    cl = CommitLog.open(store_config)
    try:
        rep = cl.recovery_report
        assert rep is not None and rep.normal
        assert rep.files_scanned <= 3 and rep.scanned_file_names == segments[-len(rep.scanned_file_names) :]
        assert rep.records_validated < len(res) / 2
        assert rep.queue_offset_records_scanned == 0 and rep.queue_offset_snapshot_used
        assert rep.end_offset == res[-1].next_offset == cl.max_offset
        assert cl.queue_offset_table() == table
    finally:
        cl.shutdown()


def test_abnormal_recovery_cuts_a_torn_tail(store_config: StoreConfig):
    cl = CommitLog.open(store_config)
    res = _fill(cl, 100)
    cl.shutdown()
    end = res[-1].next_offset
    torn = bytearray(cl_record_bytes(store_config, res[-1]))
    torn[0:4] = bytes(4)  # TOTALSIZE is stored last: a killed writer leaves it zero
    _patch_file(store_config, end, bytes(torn[: len(torn) // 2]))
    _crash_marker(store_config)
    cl = CommitLog.open(store_config)
    try:
        rep = cl.recovery_report
        assert rep is not None and not rep.normal
        assert rep.end_offset == end and rep.truncated_at == end
        assert cl.max_offset == end
        assert not any(cl.queue.mapped_files[-1].buffer[end % SEGMENT : end % SEGMENT + len(torn)])
        assert cl.read_message(res[-1].phy_offset).body == bytes([99]) * 1000
        assert cl.put_messages([Message("TopicR", b"next", 0)])[0].phy_offset == end
    finally:
        cl.shutdown()


def cl_record_bytes(config: StoreConfig, r: PutMessageResult) -> bytes:
    with open(_segment_path(config, r.phy_offset), "rb") as fh:
        fh.seek(r.phy_offset % SEGMENT)
        return fh.read(r.size)


def test_abnormal_recovery_stops_at_a_corrupt_record_and_rebuilds_queue_offsets(store_config: StoreConfig):
    cl = CommitLog.open(store_config)
    res = _fill(cl, 120)
    cl.shutdown()
    bad = res[100]
    _patch_file(store_config, bad.phy_offset + 100, b"\xff")  # inside the body: CRC mismatch
    _crash_marker(store_config, flushed_to=res[90].phy_offset)
    cl = CommitLog.open(store_config)
    try:
        rep = cl.recovery_report
        assert rep is not None and rep.truncated_at == bad.phy_offset and rep.end_offset == bad.phy_offset
        survivors = list(cl.iter_records(0))
        assert [r.commit_log_offset for r in survivors] == [r.phy_offset for r in res[:100]]
        # The saved snapshot described 120 records; it is past the new end, so offsets come from
        # the log: the 10 records validated past the flushed offset, the 90 before it read once.
        assert rep.records_validated == 10
        assert not rep.queue_offset_snapshot_used and rep.queue_offset_records_scanned == 90
        assert cl.queue_offset_table() == {("TopicR", q): 25 for q in range(4)}
        assert cl.put_messages([Message("TopicR", b"x", 0)])[0].queue_offset == 25
    finally:
        cl.shutdown()


def test_abnormal_recovery_starts_from_the_checkpoint_segment(store_config: StoreConfig):
    cl = CommitLog.open(store_config)
    res = _fill(cl, 2000)
    cl.shutdown()
    first_of = {}
    for r in res:
        first_of.setdefault(r.phy_offset - r.phy_offset % SEGMENT, r)
    starts = sorted(first_of)
    limit = first_of[starts[-2]].store_timestamp
    ckpt = StoreCheckpoint(Path(store_config.store_path_root_dir) / "checkpoint")
    ckpt.physic_msg_timestamp = limit + 3000  # recovery trusts records stored ≤ physic − 3 s
    ckpt.flushed_phy_offset = 0  # unknown (a checkpoint written without it): the timestamp decides
    ckpt.shutdown()
    _crash_marker(store_config)
    # The newest segment whose first record is at or before the limit (records are fast, so the
    # last segment may share the millisecond).
    expected = max(s for s in starts if first_of[s].store_timestamp <= limit)
    cl = CommitLog.open(store_config)
    try:
        rep = cl.recovery_report
        assert rep is not None and not rep.normal
        assert rep.start_offset == expected >= starts[-2]
        assert rep.files_scanned == len([s for s in starts if s >= expected])
        assert rep.end_offset == res[-1].next_offset
    finally:
        cl.shutdown()


def test_abnormal_recovery_without_checkpoint_scans_from_the_first_segment(store_config: StoreConfig):
    cl = CommitLog.open(store_config)
    res = _fill(cl, 1000)
    cl.shutdown()
    (Path(store_config.store_path_root_dir) / "checkpoint").unlink()
    _crash_marker(store_config)
    cl = CommitLog.open(store_config)
    try:
        rep = cl.recovery_report
        assert rep is not None and rep.start_offset == 0 and rep.records_validated == len(res)
        assert rep.files_scanned == len(cl.queue.mapped_files)
    finally:
        cl.shutdown()


def test_stale_records_past_a_truncation_are_never_resurrected(store_config: StoreConfig):
    cl = CommitLog.open(store_config)
    res = _fill(cl, 60, size=2000)
    cl.shutdown()
    cut = res[40]
    _patch_file(store_config, cut.phy_offset + 4, b"\x00\x00\x00\x00")  # break record 40's magic
    _crash_marker(store_config, flushed_to=res[30].phy_offset)
    cl = CommitLog.open(store_config)
    # New, smaller records now end in the middle of where old records 40..59 were.
    new = cl.put_messages([Message("TopicR", b"n" * 10, 0) for _ in range(3)])
    cl.shutdown()
    _crash_marker(store_config, flushed_to=res[30].phy_offset)
    cl = CommitLog.open(store_config)
    try:
        assert cl.max_offset == new[-1].next_offset
        offsets = [r.commit_log_offset for r in cl.iter_records(0)]
        assert offsets == [r.phy_offset for r in res[:40]] + [r.phy_offset for r in new]
    finally:
        cl.shutdown()


def test_queue_offsets_rebuilt_from_the_log_when_the_snapshot_is_lost(store_config: StoreConfig):
    cl = CommitLog.open(store_config)
    _fill(cl, 500, queues=7)
    table = cl.queue_offset_table()
    cl.shutdown()
    (Path(store_config.store_path_root_dir) / "config" / "queueOffsetTable.json").unlink()
    cl = CommitLog.open(store_config)
    try:
        rep = cl.recovery_report
        # A clean restart validates the last record only; the table is rebuilt from the others.
        assert rep is not None and rep.records_validated == 1 and not rep.queue_offset_snapshot_used
        assert rep.queue_offset_records_scanned == 499
        assert cl.queue_offset_table() == table
    finally:
        cl.shutdown()


def test_queue_offsets_before_the_validated_segments_are_scanned_once_and_merged(store_config: StoreConfig):
    """Normal recovery validates the last three segments; without a snapshot the table needs the
    records before them too: those alone are read again, and the two halves merge."""
    cl = CommitLog.open(store_config)
    res = _fill(cl, 1500, queues=5)
    table = cl.queue_offset_table()
    cl.shutdown()
    (Path(store_config.store_path_root_dir) / "config" / "queueOffsetTable.json").unlink()
    cl = CommitLog.open(store_config)
    try:
        rep = cl.recovery_report
        assert rep is not None and rep.start_offset > 0 and not rep.queue_offset_snapshot_used
        before = sum(1 for r in res if r.phy_offset < rep.start_offset)
        assert rep.queue_offset_records_scanned == before and before + rep.records_validated == 1500
        assert cl.queue_offset_table() == table
    finally:
        cl.shutdown()


def test_empty_store_recovers_to_zero(store_config: StoreConfig):
    CommitLog.open(store_config).shutdown()
    _crash_marker(store_config)
    cl = CommitLog.open(store_config)
    try:
        assert cl.max_offset == 0 and cl.recovery_report is not None and cl.recovery_report.end_offset == 0
    finally:
        cl.shutdown()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_garbage_anywhere_leaves_the_exact_prefix_before_it(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("garbage")
    config = StoreConfig(
        store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT, max_message_size=64 * 1024
    )
    cl = CommitLog.open(config)
    res = _fill(cl, data.draw(st.integers(5, 300)), size=data.draw(st.integers(1, 3000)))
    cl.shutdown()
    end = res[-1].next_offset
    pos = data.draw(st.integers(0, end - 1))
    garbage = data.draw(st.binary(min_size=1, max_size=64).filter(lambda g: any(g)))
    garbage = garbage[: SEGMENT - pos % SEGMENT]
    with open(_segment_path(config, pos), "r+b") as fh:
        fh.seek(pos % SEGMENT)
        old = fh.read(len(garbage))
        fh.seek(pos % SEGMENT)
        fh.write(garbage)
    _crash_marker(config)
    os.unlink(root / "checkpoint")  # full validation from the first segment
    cl = CommitLog.open(config)
    try:
        survivors = [r.commit_log_offset for r in cl.iter_records(0)]
        # Every record that ends before the damage survives, and the log is a prefix of what was
        # written. The damaged record itself may still validate when only unchecked fields
        # changed (timestamps, hosts, properties), as in RocketMQ.
        intact = 0 if old != garbage else len(res)
        if old != garbage:
            intact = next((i for i, r in enumerate(res) if r.next_offset > pos), len(res))
        assert len(survivors) >= intact
        assert survivors == [r.phy_offset for r in res[: len(survivors)]]
        if survivors:
            last = res[len(survivors) - 1]
            assert cl.max_offset in (last.next_offset, last.phy_offset - last.phy_offset % SEGMENT + SEGMENT)
        else:
            assert cl.max_offset == 0
    finally:
        cl.shutdown()


def test_a_damaged_record_mid_log_moves_what_follows_to_quarantine(store_config: StoreConfig):
    """A CRC mismatch in the middle of the log ends it there; the records behind the damage (the
    rest of that segment and every later segment, all topics) are moved to quarantine/, byte for
    byte, not deleted, and the log generation moves on: followers may have read them."""
    cl = CommitLog.open(store_config)
    res = _fill(cl, 2000)
    generation = cl.generation.generation
    cl.shutdown()
    originals = {p.name: p.read_bytes() for p in store_config.commit_log_dir.iterdir()}
    bad = next(r for r in res if r.phy_offset >= 2 * SEGMENT + 1000)  # inside the third segment
    _patch_file(store_config, bad.phy_offset + 100, b"\xff")  # in the body: CRC mismatch
    (Path(store_config.store_path_root_dir) / "checkpoint").unlink()  # validate from segment 0
    _crash_marker(store_config)
    cl = CommitLog.open(store_config)
    try:
        rep = cl.recovery_report
        assert rep is not None and rep.end_offset == bad.phy_offset == cl.max_offset
        assert cl.generation.generation == generation + 1
        assert cl.generation.divergence_point(cl.generation.log_id, generation) == bad.phy_offset
        head = offset_to_file_name(bad.phy_offset)
        later = sorted(n for n in originals if int(n) > bad.phy_offset)
        assert len(later) >= 5
        assert sorted(p.name for p in rep.quarantined) == sorted([head, *later])
        folder = rep.quarantined[0].parent
        assert folder.parent == Path(store_config.store_path_root_dir) / "quarantine"
        segment = originals[offset_to_file_name(2 * SEGMENT)]
        damaged_rest = (folder / head).read_bytes()
        assert damaged_rest[:100] == segment[bad.phy_offset % SEGMENT :][:100]  # up to the flipped byte
        assert len(damaged_rest) == len(segment[bad.phy_offset % SEGMENT :].rstrip(b"\0"))
        assert all((folder / n).read_bytes() == originals[n] for n in later)
        assert rep.quarantined_bytes == len(damaged_rest) + len(later) * SEGMENT
        assert cl.quarantine.summary().files == len(later) + 1
        assert [mf.file_name for mf in cl.queue.mapped_files][-1] == offset_to_file_name(2 * SEGMENT)
    finally:
        cl.shutdown()


def test_normal_recovery_moves_the_generation_only_when_it_cuts_records(store_config: StoreConfig):
    cl = CommitLog.open(store_config)
    res = _fill(cl, 100)
    generation = cl.generation.generation
    cl.shutdown()
    cl = CommitLog.open(store_config)  # clean shutdown, nothing cut
    assert cl.generation.generation == generation and not cl.recovery_report.quarantined
    cl.shutdown()
    _patch_file(store_config, res[90].phy_offset + 100, b"\xff")  # damaged while the store was down
    # Without the clean-end file (a store stopped by an older version) normal recovery validates
    # the last segments and finds the damage.
    (Path(store_config.store_path_root_dir) / "config" / "cleanEnd.json").unlink()
    cl = CommitLog.open(store_config)
    try:
        rep = cl.recovery_report
        assert rep.normal and rep.end_offset == res[90].phy_offset
        assert cl.generation.generation == generation + 1
        assert [p.name for p in rep.quarantined] == [offset_to_file_name(res[90].phy_offset)]
    finally:
        cl.shutdown()


def test_a_record_torn_in_its_properties_is_cut(store_config: StoreConfig):
    """A power loss can keep a record's first sectors and lose its last one: when only the
    properties lie there, the body CRC still matches. Recovery checks what the properties look
    like and cuts the torn record instead of keeping it with its keys zeroed out."""
    cl = CommitLog.open(store_config)
    res = cl.put_messages([Message("TopicR", b"b" * 200, 0, keys=f"key-{i}", tags="t") for i in range(20)])
    cl.shutdown()
    torn = res[19]
    tail = 12  # the end of its properties, up to the record's end
    _patch_file(store_config, torn.phy_offset + torn.size - tail, bytes(tail))
    _crash_marker(store_config, flushed_to=res[10].phy_offset)
    cl = CommitLog.open(store_config)
    try:
        assert cl.max_offset == torn.phy_offset
        assert cl.recovery_report.truncated_at == torn.phy_offset
    finally:
        cl.shutdown()


def test_a_clean_restart_validates_only_the_last_record_and_distrusts_a_stale_end(store_config: StoreConfig):
    """The clean-end file lets normal recovery check one record instead of three segments; when
    it no longer describes the log (the log grew, or the record there is damaged), recovery
    validates the segments as before and finds the same end."""
    root = Path(store_config.store_path_root_dir)
    cl = CommitLog.open(store_config)
    res = _fill(cl, 300, queues=3)
    table = cl.queue_offset_table()
    cl.shutdown()
    clean_end = root / "config" / "cleanEnd.json"
    saved = clean_end.read_bytes()
    cl = CommitLog.open(store_config)
    try:
        rep = cl.recovery_report
        assert rep is not None and rep.normal and rep.records_validated == 1
        assert rep.start_offset == res[-1].phy_offset and cl.max_offset == res[-1].next_offset
        assert cl.queue_offset_table() == table
        more = cl.put_messages([Message("TopicR", b"m" * 20, 1) for _ in range(5)])
    finally:
        cl.shutdown()
    clean_end.write_bytes(saved)  # stale: the log has grown past it
    cl = CommitLog.open(store_config)
    try:
        rep = cl.recovery_report
        assert rep is not None and rep.records_validated > 1
        assert cl.max_offset == more[-1].next_offset
    finally:
        cl.shutdown()
    last = more[-1].phy_offset
    seg = store_config.mapped_file_size_commit_log
    path = root / "commitlog" / f"{last - last % seg:020d}"
    raw = bytearray(path.read_bytes())
    raw[last % seg + 90] ^= 0xFF  # damage the last record's body: its CRC fails
    path.write_bytes(bytes(raw))
    cl = CommitLog.open(store_config)
    try:
        rep = cl.recovery_report
        assert rep is not None and rep.records_validated > 1 and cl.max_offset == last
    finally:
        cl.shutdown()


def test_abnormal_recovery_starts_at_the_checkpoints_flushed_offset(store_config: StoreConfig):
    """The flush service records how far the log was fdatasync'ed; a crash then validates only
    what lies past it, whatever the segment sizes, and the queue offsets still come out right."""
    cl = CommitLog.open(store_config)
    res = _fill(cl, 600, queues=5)
    table = cl.queue_offset_table()
    cl.shutdown()
    _crash_marker(store_config, flushed_to=res[550].phy_offset)
    cl = CommitLog.open(store_config)
    try:
        rep = cl.recovery_report
        assert rep is not None and not rep.normal and rep.start_offset == res[550].phy_offset
        assert rep.records_validated == 50 and rep.end_offset == res[-1].next_offset
        assert cl.queue_offset_table() == table
        assert cl.checkpoint is not None and cl.checkpoint.flushed_phy_offset == rep.end_offset
    finally:
        cl.shutdown()


def test_a_cut_lowers_the_flushed_offset_before_the_bytes_go(store_config: StoreConfig):
    cl = CommitLog.open(store_config)
    res = _fill(cl, 100)
    cl.shutdown()
    cl = CommitLog.open(store_config)  # recovery leaves the flushed offset at the log's end
    try:
        assert cl.checkpoint is not None and cl.checkpoint.flushed_phy_offset == res[-1].next_offset
        cl.set_broker_role(BrokerRole.SLAVE)  # a slave cutting what a returning master wrote
        cl.truncate_to(res[60].phy_offset)
        assert cl.checkpoint is not None and cl.checkpoint.flushed_phy_offset <= res[60].phy_offset
        on_disk = StoreCheckpoint(Path(store_config.store_path_root_dir) / "checkpoint")
        assert on_disk.flushed_phy_offset <= res[60].phy_offset
        on_disk.shutdown()
    finally:
        cl.shutdown()
