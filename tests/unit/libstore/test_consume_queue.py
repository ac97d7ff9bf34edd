"""ConsumeQueue: 20-byte units, segments, recovery, truncation, time lookup (spec §3)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from libstore.consume_queue import (
    BLANK_UNIT_SIZE,
    CQ_STORE_UNIT_SIZE,
    BoundaryType,
    ConsumeQueue,
    consume_queue_file_size,
)

UNITS_PER_FILE = 5
FILE_SIZE = UNITS_PER_FILE * CQ_STORE_UNIT_SIZE


def _cq(tmp_path: Path, size: int = FILE_SIZE) -> ConsumeQueue:
    cq = ConsumeQueue("TopicA", 3, tmp_path / "consumequeue", size)
    cq.load()
    cq.recover()
    return cq


def _fill(cq: ConsumeQueue, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        assert cq.put_message_position_info(1000 + 100 * i, 100, i * 7, i)


def test_unit_layout_and_file_names(tmp_path: Path):
    cq = _cq(tmp_path)
    assert cq.put_message_position_info(96, 250, -5, 0)
    path = tmp_path / "consumequeue" / "TopicA" / "3" / "00000000000000000000"
    raw = path.read_bytes()
    assert len(raw) == FILE_SIZE
    assert raw[:20] == (96).to_bytes(8, "big") + (250).to_bytes(4, "big") + (-5).to_bytes(
        8, "big", signed=True
    )
    _fill(cq, 6, start=1)  # 7 units: a second segment named by its first byte offset
    assert (path.parent / f"{FILE_SIZE:020d}").exists()
    assert (cq.min_offset_in_queue, cq.max_offset_in_queue) == (0, 7)
    cq.shutdown()


def test_segment_size_rounds_up_to_whole_units():
    assert consume_queue_file_size(6_000_000) == 6_000_000
    assert consume_queue_file_size(101) == 120


def test_read_units_crosses_segments(tmp_path: Path):
    cq = _cq(tmp_path)
    _fill(cq, 12)
    units = cq.read_units(3, 6)
    assert [u.queue_offset for u in units] == [3, 4, 5, 6, 7, 8]
    assert [u.phy_offset for u in units] == [1000 + 100 * i for i in range(3, 9)]
    assert [u.tags_code for u in units] == [7 * i for i in range(3, 9)]
    assert cq.read_units(10, 100)[-1].queue_offset == 11 and cq.read_units(12, 5) == []
    assert cq.last_unit().queue_offset == 11 and cq.max_physic_offset == 1000 + 1100 + 100
    cq.shutdown()


def test_replays_and_taken_offsets_are_skipped(tmp_path: Path):
    cq = _cq(tmp_path)
    _fill(cq, 4)
    assert not cq.put_message_position_info(1000, 100, 0, 0)  # replay: ends before max physic
    assert not cq.put_message_position_info(50_000, 100, 0, 2)  # queue offset 2 is taken
    assert cq.max_offset_in_queue == 4
    cq.shutdown()


def test_a_queue_starting_past_zero_is_prefilled_with_blank_units(tmp_path: Path):
    cq = _cq(tmp_path)
    assert cq.put_message_position_info(9000, 90, 1, 7)  # first unit is queue offset 7
    assert (cq.min_offset_in_queue, cq.max_offset_in_queue) == (7, 8)
    blank = cq.read_unit(5)
    assert blank is not None and blank.size == BLANK_UNIT_SIZE and blank.phy_offset == 0
    assert cq.read_unit(7).phy_offset == 9000
    cq.shutdown()
    cq = _cq(tmp_path)  # recovery keeps the blanks and finds the min again
    assert (cq.min_offset_in_queue, cq.max_offset_in_queue, cq.max_physic_offset) == (7, 8, 9090)
    cq.shutdown()


def test_recovery_keeps_the_valid_prefix(tmp_path: Path):
    cq = _cq(tmp_path)
    _fill(cq, 13)
    cq.shutdown()
    # Unit 11 is torn (size 0) and unit 12 follows: recovery ends the queue at 11.
    last = tmp_path / "consumequeue" / "TopicA" / "3" / f"{2 * FILE_SIZE:020d}"
    raw = bytearray(last.read_bytes())
    struct.pack_into(">qiq", raw, CQ_STORE_UNIT_SIZE, 2100, 0, 0)
    last.write_bytes(bytes(raw))
    cq = _cq(tmp_path)
    assert cq.max_offset_in_queue == 11 and cq.max_physic_offset == 1000 + 100 * 10 + 100
    assert cq.put_message_position_info(2100, 100, 77, 11)  # the slot is free again
    assert cq.read_unit(11).tags_code == 77
    cq.shutdown()


def test_truncate_drops_units_past_a_commit_log_offset(tmp_path: Path):
    cq = _cq(tmp_path)
    _fill(cq, 13)  # messages at 1000, 1100, ... 2200
    assert cq.truncate_dirty_logic_files(1650) == 6  # units 7..12 point at >= 1700
    assert cq.max_offset_in_queue == 7 and cq.max_physic_offset == 1700
    assert len(cq.queue.mapped_files) == 2
    assert cq.truncate_dirty_logic_files(0) == 7
    assert cq.max_offset_in_queue == 0 and cq.max_physic_offset == -1
    cq.shutdown()


def test_offset_by_time_lower_and_upper(tmp_path: Path):
    cq = _cq(tmp_path)
    times = [100, 200, 200, 300, 500, 500, 800]  # store time of each message, by its offset
    for i in range(len(times)):
        cq.put_message_position_info(1000 + 100 * i, 100, 0, i)

    def store_time_of(phy: int, size: int) -> int:
        return times[(phy - 1000) // 100]

    lower = [cq.get_offset_in_queue_by_time(t, store_time_of) for t in (50, 100, 150, 200, 500, 600, 900)]
    assert lower == [0, 0, 1, 1, 4, 6, 7]
    upper = [
        cq.get_offset_in_queue_by_time(t, store_time_of, BoundaryType.UPPER)
        for t in (50, 100, 200, 250, 500, 799, 900)
    ]
    assert upper == [0, 0, 2, 2, 5, 5, 6]
    cq.shutdown()


def test_correct_min_offset_skips_units_of_deleted_log_segments(tmp_path: Path):
    cq = _cq(tmp_path)
    _fill(cq, 8)
    cq.correct_min_offset(1450)  # the log now starts at 1450: units 0..4 point below it
    assert cq.min_offset_in_queue == 5
    cq.correct_min_offset(10_000)  # everything gone
    assert cq.min_offset_in_queue == cq.max_offset_in_queue == 8
    cq.shutdown()


@pytest.mark.parametrize("size", [0, -1])
def test_units_with_bad_sizes_end_recovery(tmp_path: Path, size: int):
    cq = _cq(tmp_path)
    _fill(cq, 3)
    cq.shutdown()
    first = tmp_path / "consumequeue" / "TopicA" / "3" / f"{0:020d}"
    raw = bytearray(first.read_bytes())
    struct.pack_into(">qiq", raw, 20, 1100, size, 0)
    first.write_bytes(bytes(raw))
    cq = _cq(tmp_path)
    assert cq.max_offset_in_queue == 1
    cq.shutdown()


def test_after_a_crash_units_past_the_checkpoint_are_rebuilt(tmp_path: Path):
    """Units past the dispatch checkpoint were never flushed: a power loss may leave one torn
    (here its tags code half old zeros) with a valid size, and dispatch passes over records its
    queue already holds. After a crash they are cut and dispatched again from the log."""
    from libstore.consume_queue_store import ConsumeQueueStore
    from libstore.dispatch import DispatchCheckpoint, recover_consume_queues

    def opened() -> ConsumeQueueStore:
        store = ConsumeQueueStore(tmp_path / "consumequeue", 64 * CQ_STORE_UNIT_SIZE)
        store.load()
        return store

    store = opened()
    cq = store.find_or_create("TopicA", 0)
    for i in range(10):  # messages at CommitLog offsets 1000, 1100, ... 1900
        assert cq.put_message_position_info(1000 + 100 * i, 100, 0x1_0000_0000 + i, i)
    store.flush_all()
    checkpoint = DispatchCheckpoint(tmp_path / "dispatchOffset.json")
    checkpoint.save(1500)  # dispatched and flushed: the records before 1500
    store.shutdown()
    segment = tmp_path / "consumequeue" / "TopicA" / "0" / f"{0:020d}"
    raw = bytearray(segment.read_bytes())
    struct.pack_into(">i", raw, 7 * CQ_STORE_UNIT_SIZE + 16, 0)  # unit 7's tags code: low half lost
    segment.write_bytes(bytes(raw))

    store = opened()
    resume, cut = recover_consume_queues(store, checkpoint, 0, 2000, last_exit_ok=False)
    cq = store.find("TopicA", 0)
    assert (resume, cut, cq.max_offset_in_queue) == (1500, 5, 5)
    for i in range(5, 10):  # dispatch again from the checkpoint
        assert cq.put_message_position_info(1000 + 100 * i, 100, 0x1_0000_0000 + i, i)
    assert [u.tags_code for u in cq.read_units(0, 10)] == [0x1_0000_0000 + i for i in range(10)]
    store.shutdown()


def _queue_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_dispatched_chunk_writes_what_record_by_record_puts_write(tmp_path: Path):
    """ConsumeQueueStore.dispatch_batch writes each queue's units of a chunk as runs
    (ConsumeQueue.put_packed): the files must equal what one put_message_position_info per record
    writes, across segment rolls, replays of dispatched records, a hole in a queue's offsets
    and records that take no unit (PREPARED, ROLLBACK)."""
    import random

    from libstore.consume_queue_store import ConsumeQueueStore
    from libstore.dispatch_request import DispatchRequest
    from libstore.message import MessageSysFlag

    rng = random.Random(7)
    prepared = MessageSysFlag.TRANSACTION_PREPARED_TYPE
    rollback = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
    next_qoff: dict[tuple[str, int], int] = {}
    records: list[DispatchRequest] = []
    phy = 0
    for i in range(600):
        topic, qid = rng.choice([("TopicA", 0), ("TopicA", 1), ("TopicB", 0)])
        flag = rng.choices([0, prepared, rollback], weights=[20, 1, 1])[0]
        size = rng.randrange(50, 300)
        qoff = next_qoff.get((topic, qid), 0)
        if i == 300 and topic == "TopicB":
            qoff += 3  # a hole: three queue offsets that never got a record
        records.append(
            DispatchRequest(True, size, topic, qid, phy, qoff, flag, tags_code=rng.randrange(-(2**40), 2**40))
        )
        if not flag:
            next_qoff[(topic, qid)] = qoff + 1
        phy += size

    def store_at(root: Path) -> ConsumeQueueStore:
        store = ConsumeQueueStore(root, 40 * CQ_STORE_UNIT_SIZE)
        store.load()
        return store

    one_by_one = store_at(tmp_path / "one")
    for req in records:
        one_by_one.dispatch_batch([req])
    chunked = store_at(tmp_path / "chunked")
    i = 0
    while i < len(records):
        n = rng.choice([1, 2, 5, 16, 64])
        chunked.dispatch_batch(records[i : i + n])
        if rng.random() < 0.2:  # a replay of what was just dispatched (a follower resuming)
            chunked.dispatch_batch(records[max(0, i - 10) : i + n])
        i += n
    for store in (one_by_one, chunked):
        store.flush_all()
        store.shutdown()
    files = _queue_files(tmp_path / "one")
    assert len(files) > 10  # several segments per queue
    assert _queue_files(tmp_path / "chunked") == files


def test_put_packed_copies_a_run_or_leaves_it_to_record_by_record(tmp_path: Path):
    cq = _cq(tmp_path)

    def put(phys: list[int], codes: list[int], qoff: int) -> bool:
        units = b"".join(struct.pack(">qiq", p, 100, c) for p, c in zip(phys, codes, strict=True))
        if cq.put_packed(units, qoff, phys[0] + 100, phys[-1] + 100):
            return True
        for i, (p, c) in enumerate(zip(phys, codes, strict=True)):
            cq.put_message_position_info(p, 100, c, qoff + i)
        return False

    assert not put([1000], [1], 0)  # no segment yet: by record, which makes it
    assert put([1100, 1200], [2, 3], 1)  # fits segment 0: one copy
    assert not put([1300, 1400, 1500, 1600], [4, 5, 6, 7], 3)  # rolls: by record
    assert not put([1000, 1100], [9, 9], 0)  # a replay: skipped
    units = cq.read_units(0, 10)
    assert [(u.queue_offset, u.phy_offset, u.tags_code) for u in units] == [
        (i, 1000 + 100 * i, i + 1) for i in range(7)
    ]
    assert cq.max_physic_offset == 1700
    cq.shutdown()


def test_a_chunk_repeating_a_queue_offset_is_written_record_by_record(tmp_path: Path):
    """Queue offsets 0, 0, 2 span three units but are not a run: the repeat is skipped and 1
    becomes a blank unit, as record-by-record dispatch does."""
    from libstore.consume_queue_store import ConsumeQueueStore
    from libstore.dispatch_request import DispatchRequest

    records = [DispatchRequest(True, 100, "TopicA", 0, 100 * i, qoff) for i, qoff in enumerate([0, 0, 2])]
    stores = []
    for name, chunks in (("one", [[r] for r in records]), ("chunked", [records])):
        store = ConsumeQueueStore(tmp_path / name, 40 * CQ_STORE_UNIT_SIZE)
        store.load()
        for chunk in chunks:
            store.dispatch_batch(chunk)
        store.flush_all()
        store.shutdown()
        stores.append(_queue_files(tmp_path / name))
    assert stores[0] == stores[1]
    unit = struct.Struct(">qiq")
    raw = (tmp_path / "chunked" / "TopicA" / "0" / f"{0:020d}").read_bytes()
    assert [unit.unpack_from(raw, 20 * i)[:2] for i in range(3)] == [
        (0, 100),
        (0, BLANK_UNIT_SIZE),
        (200, 100),
    ]
