"""A ConsumeQueue unit torn by a power loss must not survive recovery.

A unit is 20 bytes and a sector 512, so some units straddle two sectors, and a power loss keeps
or takes back each sector on its own (tests/fault/powerloss.py plays it so). Unit 102 sits at
bytes 2040..2059: its CommitLog offset in sector 3, its size and tags code in sector 4. When
sector 3 goes back to what was durable (the offset field still zero) and sector 4 keeps the new
bytes, the unit reads (CommitLog offset 0, the right size): it points at the queue's first
record, or another topic's. The fault loop found it: a pop consumer got the record at offset 0,
acknowledged long before, again as a first delivery. Recovery must cut such a unit (a queue's
records are in log order, so it is out of order) and the replay from the log write it again.
"""

from __future__ import annotations

from pathlib import Path

from libstore.consume_queue import CQ_STORE_UNIT_SIZE
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.dispatch import DispatchCheckpoint, recover_consume_queues
from libstore.pop_state import PopState

TOPIC, QUEUE = "Chaos", 2
SEGMENT = 300 * CQ_STORE_UNIT_SIZE
WRITTEN = 120
TORN = 102  # 102 * 20 = 2040 = 3 * 512 + 504: straddles sectors 3 and 4
SIZE = 451


def phy(queue_offset: int) -> int:
    return 1000 + SIZE * queue_offset


def write_then_tear(root: Path) -> None:
    """WRITTEN units, flushed; then unit TORN's offset field zeroed, as the power loss left it."""
    store = ConsumeQueueStore(root, SEGMENT)
    store.load()
    store.recover()
    cq = store.find_or_create(TOPIC, QUEUE)
    for i in range(WRITTEN):
        assert cq.put_message_position_info(phy(i), SIZE, 0, i)
    cq.flush_all()
    store.shutdown()
    path = root / TOPIC / str(QUEUE) / f"{0:020d}"
    raw = bytearray(path.read_bytes())
    start = TORN * CQ_STORE_UNIT_SIZE
    assert start // 512 != (start + CQ_STORE_UNIT_SIZE - 1) // 512  # it straddles two sectors
    raw[start : start + 8] = bytes(8)
    path.write_bytes(bytes(raw))


def restart(root: Path, checkpoint_unit: int) -> ConsumeQueueStore:
    """The dispatch service's start after a crash: recovery against its checkpoint (set at
    ``checkpoint_unit``'s record), then the replay of the log from there (units the queue
    already has are skipped, as the follower's replay does)."""
    checkpoint = DispatchCheckpoint(root.parent / "dispatchOffset.json")
    checkpoint.save(phy(checkpoint_unit))
    store = ConsumeQueueStore(root, SEGMENT)
    store.load()
    resume, _ = recover_consume_queues(store, checkpoint, 0, phy(WRITTEN), last_exit_ok=False)
    assert resume == phy(checkpoint_unit)
    cq = store.find(TOPIC, QUEUE)
    assert cq is not None
    for i in range(checkpoint_unit, WRITTEN):
        cq.put_message_position_info(phy(i), SIZE, 0, i)
    return store


def wrong_units(store: ConsumeQueueStore) -> list[tuple[int, int]]:
    cq = store.find(TOPIC, QUEUE)
    assert cq is not None
    units = cq.read_units(0, WRITTEN)
    assert [u.queue_offset for u in units] == list(range(WRITTEN))
    return [(u.queue_offset, u.phy_offset) for u in units if u.phy_offset != phy(u.queue_offset)]


def test_a_torn_unit_past_the_checkpoint_is_cut_and_written_again(tmp_path: Path) -> None:
    root = tmp_path / "consumequeue"
    write_then_tear(root)
    store = restart(root, checkpoint_unit=TORN)  # the torn unit is the first one past it
    try:
        assert wrong_units(store) == []
    finally:
        store.shutdown()


def test_recovery_keeps_the_prefix_before_a_torn_unit(tmp_path: Path) -> None:
    """Without a checkpoint cut (the unit's record lies before the checkpoint as the torn
    field reads it), the valid prefix ends at the torn unit all the same."""
    root = tmp_path / "consumequeue"
    write_then_tear(root)
    store = ConsumeQueueStore(root, SEGMENT)
    store.load()
    store.recover()
    try:
        cq = store.find(TOPIC, QUEUE)
        assert cq is not None and cq.max_offset_in_queue == TORN
        assert [u.phy_offset for u in cq.read_units(0, TORN)] == [phy(i) for i in range(TORN)]
    finally:
        store.shutdown()


def test_a_pop_never_hands_out_a_unit_pointing_back_in_the_log(tmp_path: Path) -> None:
    root = tmp_path / "consumequeue"
    write_then_tear(root)
    store = restart(root, checkpoint_unit=TORN)
    try:
        cq = store.find(TOPIC, QUEUE)
        assert cq is not None
        state = PopState(tmp_path / "pop")
        state.load()
        popped = state.pop(
            "poppers",
            TOPIC,
            QUEUE,
            read_units=cq.read_units,
            min_offset=cq.min_offset_in_queue,
            max_offset=cq.max_offset_in_queue,
            max_count=1024,
            invisible_ms=4000,
            now_ms=1,
            initial_offset=lambda: 0,
        )
        assert [(p.queue_offset, p.phy_offset) for p in popped] == [(i, phy(i)) for i in range(WRITTEN)]
    finally:
        store.shutdown()
