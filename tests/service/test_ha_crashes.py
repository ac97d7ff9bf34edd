"""A broker group's members crash, lose what they had not fsynced, and come back (real commitlog
processes on 127.0.0.1): the group converges on one history and keeps every acknowledged message.

Power loss is played by hand here: the member is SIGKILLed, then the bytes a power loss could
take (written, never fsynced: these members flush once an hour) are zeroed in its files before
it restarts. tests/fault runs the same faults at random, through a layer that records what each
fdatasync made durable.
"""

from __future__ import annotations

import os
from pathlib import Path

from libstore import decode_record
from tests.service.harness import BrokerGroupCluster, CommitLogAdmin, assert_logs_identical

NEVER_FLUSH = {"flushIntervalCommitLog": 3_600_000, "flushCommitLogThoroughInterval": 3_600_000}


def lose_tail(segments: Path, offset: int) -> None:
    """What a power loss does to a log whose bytes from ``offset`` on were never fsynced: the
    segment holding ``offset`` reads zeros from there, later segments are gone."""
    for path in sorted(segments.iterdir()):
        start = int(path.name)
        size = path.stat().st_size
        if start > offset:
            path.unlink()
        elif start + size > offset:
            with open(path, "r+b") as fh:
                fh.seek(offset - start)
                fh.write(bytes(start + size - offset))
                os.fsync(fh.fileno())


def _wait_same_end(master: str, slave: str) -> int:
    with CommitLogAdmin(master) as m, CommitLogAdmin(slave) as s:
        end = m.state().max_offset
        s.wait_for(lambda st: st.max_offset == end, timeout_s=60, what=f"the slave to reach {end}")
        return end


def test_a_master_that_lost_its_unflushed_tail_does_not_diverge_its_slave(tmp_path: Path):
    """The slave received records the master never fsynced; the master loses them in a power
    loss, restarts as the master and writes other records at the same offsets. It must begin a
    new epoch, so the slave cuts back to the master's recovered end instead of keeping its old
    records there (which it would, both sharing epoch 1: the consistent point would be the
    shorter end, not the master's recovered one)."""
    cluster = BrokerGroupCluster(tmp_path, master_role="ASYNC_MASTER", store=NEVER_FLUSH)
    try:
        cluster.start_commitlog("a")
        cluster.start_commitlog("b")
        cluster.wait_serving()
        with CommitLogAdmin(cluster.address("a")) as master:
            old = master.append_keyed("T", [f"old{i}" for i in range(300)], body_size=300)
        _wait_same_end(cluster.address("a"), cluster.address("b"))

        cluster.kill("a-commitlog")
        lost_from = old[200].phy_offset  # the last 100 records were never fsynced
        lose_tail(cluster.commitlog_files("a"), lost_from)
        cluster.start_commitlog("a")
        cluster.wait_serving(["a-commitlog"])
        with CommitLogAdmin(cluster.address("a")) as master:
            state = master.state()
            assert state.max_offset == lost_from
            new_keys = [f"new{i}" for i in range(60)]
            new = master.append_keyed("T", new_keys, body_size=170)  # other sizes: other boundaries
            assert new[0].phy_offset == lost_from

        end = _wait_same_end(cluster.address("a"), cluster.address("b"))
        assert end == new[59].phy_offset + new[59].size
        assert_logs_identical(cluster.commitlog_files("a"), cluster.commitlog_files("b"), end)
        with CommitLogAdmin(cluster.address("b")) as slave:
            raws = slave.read([(r.phy_offset, r.size) for r in new])
            assert [decode_record(raw).keys for raw in raws] == [[k] for k in new_keys]
            epochs = [(e.epoch, e.start_offset) for e in slave.state().epochs]
            assert epochs == [(1, 0), (2, lost_from)] == [(e.epoch, e.start_offset) for e in state.epochs]
    finally:
        cluster.stop_all()
