"""StoreCheckpoint: the 4096-byte layout of spec §5 and its persistence."""

from __future__ import annotations

from pathlib import Path

from libstore.store_checkpoint import CHECKPOINT_FILE_SIZE, StoreCheckpoint


def test_layout_and_round_trip(tmp_path: Path):
    path = tmp_path / "checkpoint"
    ck = StoreCheckpoint(path)
    assert (ck.physic_msg_timestamp, ck.logics_msg_timestamp, ck.index_msg_timestamp) == (0, 0, 0)
    ck.physic_msg_timestamp = 1_700_000_000_000
    ck.logics_msg_timestamp = 1_700_000_000_500
    ck.index_msg_timestamp = 1_699_999_999_000
    ck.master_flushed_offset = 4096
    ck.confirm_phy_offset = 8192
    ck.shutdown()
    raw = path.read_bytes()
    assert len(raw) == CHECKPOINT_FILE_SIZE
    assert raw[0:8] == (1_700_000_000_000).to_bytes(8, "big")
    assert raw[8:16] == (1_700_000_000_500).to_bytes(8, "big")
    assert raw[16:24] == (1_699_999_999_000).to_bytes(8, "big")
    assert raw[24:32] == (4096).to_bytes(8, "big") and raw[32:40] == (8192).to_bytes(8, "big")
    again = StoreCheckpoint(path)
    assert again.min_timestamp == 1_700_000_000_000 - 3000
    assert again.commit_log_recover_timestamp == 1_700_000_000_000 - 3000
    assert again.min_timestamp_index == 1_700_000_000_000 - 3000  # min(min_timestamp, index)
    again.shutdown()


def test_min_timestamp_never_negative(tmp_path: Path):
    ck = StoreCheckpoint(tmp_path / "checkpoint")
    ck.physic_msg_timestamp = 1000
    assert ck.min_timestamp == 0 and ck.commit_log_recover_timestamp == 0
    ck.shutdown()
