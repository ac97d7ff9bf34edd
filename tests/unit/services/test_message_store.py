"""MessageStore (the embedded suite's objects) dispatch and recovery: rebuilt derived files equal
incrementally built ones, what gets (no) ConsumeQueue unit, checkpoints, and a cut log tail
cutting derived state too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from libstore import Message, MessageSysFlag, StoreConfig, StoreIOError
from libstore.store_checkpoint import StoreCheckpoint
from services.message_store import MessageStore

TX_PREPARED = MessageSysFlag.TRANSACTION_PREPARED_TYPE
TX_ROLLBACK = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
TX_COMMIT = MessageSysFlag.TRANSACTION_COMMIT_TYPE


@pytest.fixture
def config(store_config: StoreConfig) -> StoreConfig:
    # Small derived files so the workload rolls ConsumeQueue segments and IndexFiles too.
    return store_config.replace(
        default_topic_queue_nums=3,
        mapped_file_size_consume_queue=40 * 20,
        max_hash_slot_num=17,
        max_index_num=64,
    )


def _workload(store: MessageStore, rounds: int = 6) -> int:
    """Puts across 2 topics x 3 queues with keys, unique keys and transaction types; rolls the
    CommitLog (256 KiB segments). Returns the number of records that get a ConsumeQueue unit."""
    units = 0
    for r in range(rounds):
        batch = []
        for i in range(60):
            n = r * 60 + i
            sys_flag = [0, 0, 0, TX_PREPARED, TX_ROLLBACK, TX_COMMIT][n % 6]
            props = {"UNIQ_KEY": f"U{n:06d}"} if n % 4 else {}
            batch.append(
                Message(
                    ["Orders", "Audit"][n % 2],
                    bytes([n % 251]) * (200 + n % 900),
                    n % 3,
                    tags=f"t{n % 5}",
                    keys=[f"k{n}", f"g{n % 7}"],
                    properties=props,
                    sys_flag=sys_flag,
                )
            )
            units += sys_flag not in (TX_PREPARED, TX_ROLLBACK)
        assert store.put_messages(batch).all_ok
    assert store.wait_dispatched(20)
    return units


def _derived_files(root: Path) -> dict[str, list[bytes]]:
    """Contents of the derived files; IndexFiles by order (their names are creation times)."""
    cq = {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted((root / "dispatch" / "consumequeue").rglob("*"))
        if p.is_file() and p.name.isdigit()
    }
    index = [p.read_bytes() for p in sorted((root / "index" / "index").iterdir()) if p.name.isdigit()]
    return {"cq_names": sorted(cq), "cq": [cq[k] for k in sorted(cq)], "index": index}


def _mark_crashed(root: Path) -> None:
    """Leave the abort markers a crash leaves (every part of the embedded layout has one)."""
    for part in ("commitlog", "dispatch", "index"):
        (root / part / "abort").touch()


def test_rebuilt_consume_queues_and_index_equal_the_incremental_ones(config: StoreConfig):
    root = Path(config.store_path_root_dir)
    store = MessageStore.open(config)
    _workload(store, rounds=12)
    assert len(store.commit_log.queue.mapped_files) > 1
    assert len(store.index_service.files) > 1
    assert any(len(cq.queue.mapped_files) > 1 for cq in store.consume_queue_store.queues())
    store.shutdown()
    built = _derived_files(root)
    shutil.rmtree(root / "dispatch" / "consumequeue")
    shutil.rmtree(root / "index" / "index")
    store = MessageStore.open(config)
    assert store.derived_recovery.reput_from_offset == 0
    assert store.wait_dispatched(30)
    store.shutdown()
    rebuilt = _derived_files(root)
    assert rebuilt["cq_names"] == built["cq_names"]
    assert rebuilt["cq"] == built["cq"], "ConsumeQueue files differ after the rebuild"
    assert rebuilt["index"] == built["index"], "IndexFiles differ after the rebuild"


def test_only_not_and_commit_records_get_units(config: StoreConfig):
    store = MessageStore.open(config)
    try:
        expected_units = _workload(store, rounds=2)
        total = sum(cq.max_offset_in_queue for cq in store.consume_queue_store.queues())
        assert total == expected_units
        records = list(store.commit_log.iter_records(0))
        for rec in records:
            tx = rec.sys_flag & MessageSysFlag.TRANSACTION_TYPE_MASK
            if tx in (TX_PREPARED, TX_ROLLBACK):
                assert rec.consume_queue_offset == 0
                continue
            unit = store.consume_queue_store.find(rec.topic, rec.queue_id).read_unit(rec.consume_queue_offset)
            assert (unit.phy_offset, unit.size) == (rec.commit_log_offset, rec.msg_size)
        rollback = next(r for r in records if r.sys_flag & 0xC == TX_ROLLBACK)
        key = next(k for k in rollback.keys)
        assert store.query_message(rollback.topic, key) == [], "ROLLBACK records are not indexed"
    finally:
        store.shutdown()


def test_a_clean_restart_resumes_dispatch_where_it_stopped(config: StoreConfig):
    store = MessageStore.open(config)
    _workload(store, rounds=1)
    end = store.commit_log.max_offset
    store.shutdown()
    store = MessageStore.open(config)
    try:
        assert store.derived_recovery.reput_from_offset == end
        assert store.derived_recovery.consume_queue_units_cut == 0
    finally:
        store.shutdown()


def test_a_cut_log_tail_cuts_units_and_index_entries_past_it(config: StoreConfig):
    root = Path(config.store_path_root_dir)
    store = MessageStore.open(config)
    _workload(store, rounds=2)
    records = list(store.commit_log.iter_records(0))
    victim = records[-25]  # tear this record: it and everything after it is cut on restart
    store.shutdown()
    seg = config.mapped_file_size_commit_log
    path = (
        root / "commitlog" / "commitlog" / f"{victim.commit_log_offset - victim.commit_log_offset % seg:020d}"
    )
    raw = bytearray(path.read_bytes())
    pos = victim.commit_log_offset % seg + 100
    raw[pos : pos + 8] = b"\xff" * 8  # body bytes: the CRC check fails
    path.write_bytes(bytes(raw))
    _mark_crashed(root)
    ckpt = StoreCheckpoint(root / "commitlog" / "checkpoint")
    ckpt.flushed_phy_offset = records[0].commit_log_offset  # it vouches for none of the damage
    ckpt.shutdown()
    store = MessageStore.open(config)
    try:
        assert store.commit_log.max_offset == victim.commit_log_offset
        assert store.derived_recovery.consume_queue_units_cut > 0
        assert store.wait_dispatched(20)
        for cq in store.consume_queue_store.queues():
            last = cq.last_unit()
            assert last is None or last.phy_offset + last.size <= victim.commit_log_offset
        survivors = [r for r in records if r.commit_log_offset < victim.commit_log_offset]
        lost = [r for r in records if r.commit_log_offset >= victim.commit_log_offset]
        kept = next(r for r in reversed(survivors) if r.sys_flag & 0xC != TX_ROLLBACK)
        assert [m.phy_offset for m in store.query_message(kept.topic, kept.keys[0])] == [
            kept.commit_log_offset
        ]
        assert all(store.query_message(r.topic, r.keys[0]) == [] for r in lost)
        # The store goes on: new messages take the cut records' queue offsets.
        res = store.put_messages([Message(lost[0].topic, b"again", lost[0].queue_id, keys=["again"])])
        assert res.all_ok and store.wait_dispatched(10)
        assert store.query_message(lost[0].topic, "again")[0].phy_offset == victim.commit_log_offset
    finally:
        store.shutdown()


def test_a_failed_open_persists_nothing_and_releases_the_store(config: StoreConfig):
    root = Path(config.store_path_root_dir)
    store = MessageStore.open(config)
    _workload(store, rounds=1)
    end = store.commit_log.max_offset
    store.shutdown()
    _mark_crashed(root)
    bad = root / "dispatch" / "consumequeue" / "Orders" / "0" / f"{10**12:020d}"
    bad.write_bytes(b"short")  # a segment of the wrong size: loading fails
    table = root / "commitlog" / "config" / "queueOffsetTable.json"
    snapshot = json.loads(table.read_bytes())
    with pytest.raises(StoreIOError, match="bytes but segments are"):
        MessageStore.open(config)
    assert (root / "commitlog" / "abort").exists(), "the next open must still recover abnormally"
    # The master's start began a new epoch (a new log generation, stamped on the snapshot); what
    # the snapshot says of the log is unchanged.
    after = json.loads(table.read_bytes())
    assert (after["phyOffset"], after["offsets"]) == (snapshot["phyOffset"], snapshot["offsets"])
    bad.unlink()
    store = MessageStore.open(config)  # the lock was released
    try:
        assert not store.commit_log.last_exit_ok and store.commit_log.max_offset == end
    finally:
        store.shutdown()
