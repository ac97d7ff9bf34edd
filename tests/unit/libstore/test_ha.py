"""Replication in libstore: epoch histories and the consistent point (checked against a byte-level
model under hypothesis), the log generation, the master's replica bookkeeping (SYNC_MASTER
statuses), and a SLAVE CommitLog taking its master's bytes, cutting a divergent tail and being
promoted."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from libstore import (
    BrokerRole,
    CommitLog,
    ConfigError,
    CorruptRecordError,
    FlushDiskType,
    Message,
    NotMasterError,
    OffsetOutOfRangeError,
    PutMessageStatus,
    ServiceNotAvailableError,
    StoreConfig,
)
from libstore.ha_service import HAService
from libstore.ha_state import EpochEntry, HAState, find_consistent_point
from libstore.log_generation import MAX_CUTS, LogGeneration
from tests.conftest import SEGMENT

E = EpochEntry
REPO = Path(__file__).resolve().parents[3]


# -- consistent point -------------------------------------------------------------------------------
def test_consistent_point_cases():
    one = [E(1, 0)]
    switched = [E(1, 0), E(2, 500)]
    assert find_consistent_point(one, 800, one, 800) == 800  # identical
    assert find_consistent_point(one, 300, one, 800) == 300  # slave behind in the same epoch
    assert find_consistent_point(one, 900, one, 800) == 800  # the master lost a tail: cut the slave
    assert find_consistent_point(one, 900, switched, 1200) == 500  # old master vs its successor
    assert find_consistent_point(switched, 1200, one, 900) == 500
    assert find_consistent_point([E(3, 0)], 100, switched, 1200) == -1  # no shared epoch
    assert find_consistent_point([], 0, one, 10) == -1
    # Same epoch number with another start offset is another history.
    assert find_consistent_point([E(1, 0), E(2, 400)], 700, switched, 1200) == 400


class _Node:
    """A store in the model: its bytes (unique ids), how many of them are fsynced, and its real
    HAState."""

    def __init__(self, root: Path, name: str) -> None:
        self.ids: list[str] = []
        self.durable = 0
        self.state = HAState(root / name / "haState.json")
        self.synced = True  # a slave that already did its handshake with the current master
        self.pending: list[EpochEntry] = []

    def lose_tail(self, n: int) -> int:
        """A power loss: up to ``n`` of the bytes not yet fsynced are gone; returns the new end."""
        keep = max(self.durable, len(self.ids) - n)
        del self.ids[keep:]
        self.durable = keep
        return keep


@settings(max_examples=300, deadline=None)
@example([("write", 10), ("copy", 10), ("master_crash", 5), ("write", 3), ("rejoin", 1)])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["write", "flush", "copy", "switch", "rejoin", "master_crash", "slave_crash"]),
            st.integers(1, 40),
        ),
        max_size=40,
    )
)
def test_consistent_point_matches_a_byte_model(ops):
    """Two stores swap mastership and lose unflushed tails in crashes; at every handshake the
    consistent point computed from the epoch histories equals the longest common prefix of the
    two logs' bytes. A crashed master restarts as the master: it clamps its epochs to its
    recovered end and begins a new term there (what HAController.start does), then keeps
    writing; the slave may hold bytes of the old term that the master lost."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        master, slave = _Node(root, "a"), _Node(root, "b")
        master.state.begin_term(0)
        slave.state.adopt(master.state.epochs, 0)  # a fresh slave's welcome
        serial = itertools.count()
        for op, n in ops:
            if op == "write":
                master.ids += [f"{master.state.last_epoch}.{next(serial)}" for _ in range(n)]
            elif op == "flush":
                master.durable = len(master.ids)
                slave.durable = len(slave.ids)
            elif op == "copy" and slave.synced:
                take = master.ids[len(slave.ids) : len(slave.ids) + n]
                slave.ids += take
                slave.pending = slave.state.extend_to(slave.pending, len(slave.ids))
            elif op == "switch":  # the slave is promoted; the old master is cut off
                slave.state.begin_term(
                    len(slave.ids), max(master.state.last_epoch, slave.state.last_epoch) + 1
                )
                master, slave = slave, master
                slave.synced = False
            elif op == "master_crash":  # power loss, then a restart as the master
                end = master.lose_tail(n)
                master.state.clamp(end)
                master.state.begin_term(end, slave.state.last_epoch + 1)
                slave.synced = False
            elif op == "slave_crash":  # power loss; the slave's recovery forgets epochs past its end
                slave.state.truncate(slave.lose_tail(n))
                slave.synced = False
            elif op == "rejoin" or (op == "copy" and not slave.synced):
                point = find_consistent_point(
                    slave.state.epochs, len(slave.ids), master.state.epochs, len(master.ids)
                )
                common = next(
                    (i for i, (x, y) in enumerate(zip(slave.ids, master.ids, strict=False)) if x != y),
                    min(len(slave.ids), len(master.ids)),
                )
                if point < 0:  # no shared epoch: the slave starts over (only right when nothing is shared)
                    assert common == 0, (common, slave.state.epochs, master.state.epochs)
                    point = 0
                assert point == common, (point, common, slave.state.epochs, master.state.epochs)
                del slave.ids[point:]
                slave.durable = min(slave.durable, point)
                slave.state.truncate(point)
                slave.state.adopt(master.state.epochs, point)
                slave.pending = [e for e in master.state.epochs if e.start_offset > point]
                slave.synced = True
            assert master.ids[: len(slave.ids)] == slave.ids or not slave.synced


def test_ha_state_persists_epochs_and_role(tmp_path: Path):
    path = tmp_path / "haState.json"
    state = HAState(path)
    assert state.last_epoch == 0 and state.role is None
    state.start_epoch(1, 0)
    state.start_epoch(3, 4096)
    with pytest.raises(ValueError):
        state.start_epoch(2, 8192)  # not newer
    state.save_role(BrokerRole.SLAVE, "10.0.0.1:10912")
    again = HAState(path)
    assert again.epochs == [E(1, 0), E(3, 4096)]
    assert (again.role, again.master_address) == (BrokerRole.SLAVE, "10.0.0.1:10912")
    again.clamp(4000)  # a master that lost its tail keeps its newest epoch number
    assert HAState(path).epochs == [E(1, 0), E(3, 4000)]
    again.truncate(3000)  # a slave cut below an epoch's start forgets it
    assert HAState(path).epochs == [E(1, 0)]
    path.write_text('{"epochs": [[2, 0], [1, 10]]}')
    with pytest.raises(ConfigError):
        HAState(path)


# -- log generation ---------------------------------------------------------------------------------
def test_log_generation_divergence_points(tmp_path: Path):
    gen = LogGeneration(tmp_path / "g.json")
    log_id = gen.log_id
    assert gen.generation == 1 and gen.divergence_point(log_id, 1) is None
    assert gen.divergence_point(log_id, 0) is None  # unknown: no check
    gen.bump(5000)
    gen.bump(7000)
    assert gen.divergence_point(log_id, 1) == 5000
    assert gen.divergence_point(log_id, 2) == 7000
    assert gen.divergence_point(log_id, 3) is None
    assert gen.divergence_point("another-log", 3) == 0
    assert gen.divergence_point(log_id, 9) == 0  # from a future this log never had
    reopened = LogGeneration(tmp_path / "g.json")
    assert (reopened.log_id, reopened.generation, reopened.divergence_point(log_id, 1)) == (log_id, 3, 5000)
    for i in range(MAX_CUTS + 5):
        reopened.bump(100_000 + i)
    assert reopened.divergence_point(log_id, 1) == 5000  # merged history cuts at least as far back
    (tmp_path / "g.json").write_text("not json")
    assert LogGeneration(tmp_path / "g.json").log_id != log_id  # unreadable: a new identity


# -- master bookkeeping -----------------------------------------------------------------------------
def test_sync_master_requests_and_in_sync_rules():
    top = [10_000]
    moved: list[int] = []
    ha = HAService(lambda: top[0], max_gap=5_000, housekeeping_ms=200, on_replicated=moved.append)
    assert ha.submit_replica_request(100).result(0) is PutMessageStatus.SLAVE_NOT_AVAILABLE  # no slave
    conn = ha.register("s1", 1, start_offset=0)
    assert ha.submit_replica_request(100).result(0) is PutMessageStatus.SLAVE_NOT_AVAILABLE  # no report yet
    ha.report(conn, 6_000)  # nothing was sent to it yet: its own log's end counts for nothing
    assert conn.ack_offset == 0 and ha.replicated_offset == 0
    conn.sent_offset = 10_000  # the stream sent everything
    ha.report(conn, 4_000)  # behind by 6000 >= max gap: not in sync
    assert ha.in_sync_count() == 0
    assert ha.submit_replica_request(100).result(0) is PutMessageStatus.SLAVE_NOT_AVAILABLE
    ha.report(conn, 6_000)
    assert ha.submit_replica_request(5_000).result(0) is PutMessageStatus.PUT_OK  # already held
    waiting = [ha.submit_replica_request(off) for off in (8_000, 7_000, 9_500)]
    assert not any(f.done() for f in waiting)
    ha.report(conn, 8_000)
    assert [f.done() for f in waiting] == [True, True, False]
    assert ha.replicated_offset == 8_000 and moved[-1] == 8_000
    ha.report(conn, 7_000)  # acks never move back
    assert ha.replicated_offset == 8_000
    assert ha.fail_waiters(PutMessageStatus.SLAVE_NOT_AVAILABLE) == 1
    assert waiting[2].result(0) is PutMessageStatus.SLAVE_NOT_AVAILABLE
    (lag,) = ha.lag()
    assert (lag.ack_offset, lag.lag_bytes, lag.in_sync) == (8_000, 2_000, True)
    time.sleep(0.25)
    assert ha.expire() == [conn] and ha.connections == []
    assert ha.replicated_offset == 8_000  # what the slave held stays held


def test_in_sync_replicas_counts_the_master():
    ha = HAService(lambda: 1_000, in_sync_replicas=3)
    a, b = ha.register("a", 1, start_offset=1_000), ha.register("b", 2, start_offset=1_000)
    ha.report(a, 900)
    assert ha.submit_replica_request(900).result(0) is PutMessageStatus.SLAVE_NOT_AVAILABLE  # one of two
    ha.report(b, 500)
    fut = ha.submit_replica_request(900)
    assert not fut.done()
    ha.report(b, 950)
    assert fut.result(0) is PutMessageStatus.PUT_OK and ha.replicated_offset == 900


def test_a_sync_state_set_makes_every_put_wait_for_each_of_its_slaves():
    """With a SyncStateSet (an elected master) a put waits for every slave the set names, not
    any ``required_slaves`` of them; a set with too few slaves refuses at once; dropping a slave
    from the set releases what the others hold; None goes back to counting acks."""
    moved: list[int] = []
    ha = HAService(lambda: 1_000, on_replicated=moved.append)
    a, b = ha.register("a", 1, start_offset=1_000), ha.register("b", 2, start_offset=1_000)
    ha.set_sync_state_set(frozenset())
    assert ha.submit_replica_request(100).result(0) is PutMessageStatus.SLAVE_NOT_AVAILABLE  # no slave in it
    ha.set_sync_state_set(frozenset({1, 2}))
    assert ha.in_sync_count() == 2
    put = ha.submit_replica_request(500)
    ha.report(a, 600)
    assert not put.done() and ha.replicated_offset == 0  # b has not reported: nothing is replicated
    ha.report(b, 400)
    assert not put.done() and ha.replicated_offset == 400
    ha.report(b, 500)
    assert put.result(0) is PutMessageStatus.PUT_OK and ha.replicated_offset == 500
    later = ha.submit_replica_request(600)
    ha.set_sync_state_set(frozenset({1}))  # b left the set: a alone holds 600
    assert later.result(0) is PutMessageStatus.PUT_OK and ha.replicated_offset == 600
    ha.set_sync_state_set(frozenset({1, 2}))
    assert ha.replicated_offset == 600  # never moves back
    last = ha.submit_replica_request(700)
    ha.report(a, 800)
    assert not last.done()  # b, back in the set, is behind
    ha.set_sync_state_set(None)  # any one slave (required_slaves 1) again
    assert last.result(0) is PutMessageStatus.PUT_OK and moved == [400, 500, 600, 800]


def test_lag_ms_counts_from_the_first_missing_append():
    top = [0]
    ha = HAService(lambda: top[0])
    conn = ha.register("s", 1)
    conn.sent_offset = 200
    ha.report(conn, 0)
    top[0] = 100
    ha.on_append(100)
    time.sleep(0.05)
    top[0] = 200
    ha.on_append(200)
    (lag,) = ha.lag()
    assert lag.lag_bytes == 200 and lag.lag_ms >= 45
    ha.report(conn, 200)
    assert ha.lag()[0].lag_ms == 0


# -- a SLAVE CommitLog ------------------------------------------------------------------------------
def _msgs(n: int, start: int = 0, size: int = 900) -> list[Message]:
    return [Message("T", b"%06d" % i + b"x" * size, i % 3, keys=f"k{i}") for i in range(start, start + n)]


def _replicate(master: CommitLog, slave: CommitLog, batch: int = 32 * 1024) -> int:
    """Copy everything the slave lacks, chunk by chunk, as the HA stream does."""
    offset = slave.max_offset
    while offset < master.max_offset:
        data, nxt = master.read_chunk(offset, master.max_offset, batch)
        slave.append_replica(offset, data)
        offset = nxt
    return offset


def _files(log: CommitLog) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(log.config.commit_log_dir.iterdir())}


def test_slave_copies_bytes_at_the_same_offsets_and_is_promoted(open_log, tmp_path: Path):
    master = open_log()
    slave = open_log(store_path_root_dir=str(tmp_path / "slave"), broker_role=BrokerRole.SLAVE)
    with pytest.raises(NotMasterError):
        slave.put_messages(_msgs(1))
    for start in range(0, 1200, 100):  # ~1.1 MB: several 256 KiB segments, blank END records
        master.put_messages(_msgs(100, start))
        _replicate(master, slave, batch=20_000)
    assert slave.max_offset == master.max_offset and len(master.queue.mapped_files) >= 4
    master.queue.flush(0)
    slave.queue.flush(0)
    mine, theirs = _files(master), _files(slave)
    for name in set(mine) & set(theirs):
        if int(name) < master.max_offset:
            assert mine[name] == theirs[name], f"segment {name} differs"
    assert all(int(n) >= master.max_offset for n in set(mine) ^ set(theirs))

    with pytest.raises(OffsetOutOfRangeError):
        slave.append_replica(slave.max_offset + 8, b"\0" * 64)
    with pytest.raises(CorruptRecordError):
        slave.append_replica(slave.max_offset, b"\x00\x00\x01\x00garbage" * 40)
    with pytest.raises(ServiceNotAvailableError):
        master.append_replica(master.max_offset, b"")  # a master takes no replica bytes

    slave.set_broker_role(BrokerRole.ASYNC_MASTER)
    expected = [master.queue_offset_of("T", q) for q in range(3)]
    (r,) = slave.put_messages([Message("T", b"after the switch", 1)])
    assert r.status is PutMessageStatus.PUT_OK and r.queue_offset == expected[1]
    assert r.phy_offset == master.max_offset


def test_truncate_to_cuts_a_divergent_tail_and_bumps_the_generation(open_log, tmp_path: Path):
    master = open_log()
    slave = open_log(store_path_root_dir=str(tmp_path / "slave"), broker_role=BrokerRole.SLAVE)
    first = master.put_messages(_msgs(300))
    _replicate(master, slave)
    cut = first[150].phy_offset
    gen = slave.generation.generation
    slave.ha_state.start_epoch(1, 0)
    slave.ha_state.start_epoch(2, first[200].phy_offset)
    slave.truncate_to(cut)
    assert slave.max_offset == cut and slave.generation.generation == gen + 1
    assert slave.generation.divergence_point(slave.generation.log_id, gen) == cut
    assert [e.epoch for e in slave.ha_state.epochs] == [1]  # epoch 2 started past the cut
    assert slave.read_many([(first[200].phy_offset, 0)]) == [None]
    # The queue-offset table was rebuilt at the cut: a promotion continues from there.
    slave.set_broker_role(BrokerRole.ASYNC_MASTER)
    (r,) = slave.put_messages([Message("T", b"x", 0)])
    assert r.queue_offset == 50 and r.phy_offset == cut  # messages 0, 3, ..., 147 were kept in queue 0


def test_sync_master_put_waits_for_a_slave_and_bounds_the_confirm_offset(open_log):
    cl = open_log(broker_role=BrokerRole.SYNC_MASTER, slave_timeout=300)
    (r,) = cl.put_messages(_msgs(1))
    assert r.status is PutMessageStatus.SLAVE_NOT_AVAILABLE  # written, not acknowledged
    assert cl.confirm_offset == 0 < cl.max_offset  # consumers do not see it yet
    conn = cl.ha_service.register("slave", 1)
    conn.sent_offset = 1 << 40  # the test plays the stream: everything was sent
    cl.ha_service.report(conn, cl.max_offset)
    assert cl.confirm_offset == cl.max_offset
    timeout = cl.put_messages(_msgs(1, 1))[0]
    assert timeout.status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT  # the slave acknowledged nothing more
    ticker = threading.Timer(0.05, lambda: cl.ha_service.report(conn, cl.max_offset))
    ticker.start()
    ok = cl.put_messages(_msgs(1, 2))[0]
    ticker.join()
    assert ok.status is PutMessageStatus.PUT_OK and cl.confirm_offset == cl.max_offset
    cl.set_broker_role(BrokerRole.SLAVE)
    with pytest.raises(NotMasterError):
        cl.put_messages(_msgs(1, 3))


def test_role_and_epochs_survive_a_restart(open_log, store_config):
    cl = open_log()
    cl.ha_state.start_epoch(1, 0)
    cl.ha_state.save_role(BrokerRole.SLAVE, "127.0.0.1:10912")
    cl.shutdown()
    again = open_log()  # configured ASYNC_MASTER, but the last role switch said SLAVE
    assert again.broker_role is BrokerRole.SLAVE and again.ha_state.master_address == "127.0.0.1:10912"


def test_truncate_to_refuses_an_offset_inside_a_record(open_log, tmp_path: Path):
    master = open_log()
    slave = open_log(store_path_root_dir=str(tmp_path / "slave"), broker_role=BrokerRole.SLAVE)
    first = master.put_messages(_msgs(400))  # > one 256 KiB segment: a blank END record in between
    _replicate(master, slave)
    end, gen = slave.max_offset, slave.generation.generation
    for bad in (first[5].phy_offset + 17, first[5].phy_offset + 8, first[399].phy_offset - 1):
        with pytest.raises(OffsetOutOfRangeError):
            slave.truncate_to(bad)
    assert slave.max_offset == end and slave.generation.generation == gen  # nothing was cut
    blank_at = next(
        r.phy_offset + r.size
        for r, nxt in itertools.pairwise(first)
        if nxt.phy_offset != r.phy_offset + r.size
    )
    slave.truncate_to(blank_at)  # where the first segment's blank END record starts
    assert slave.max_offset == blank_at
    slave.truncate_to(first[100].phy_offset)
    assert slave.max_offset == first[100].phy_offset


def test_every_master_term_begins_a_new_epoch_at_the_log_end(open_log, tmp_path: Path):
    cl = open_log()
    assert cl.start_master_term(BrokerRole.ASYNC_MASTER) == E(1, 0)
    cl.put_messages(_msgs(10))
    end = cl.max_offset
    assert cl.start_master_term(BrokerRole.ASYNC_MASTER) == E(2, end)  # a restart: a new term
    slave = open_log(store_path_root_dir=str(tmp_path / "slave"), broker_role=BrokerRole.SLAVE)
    _replicate(cl, slave)
    with pytest.raises(ValueError):
        slave.start_master_term(BrokerRole.SLAVE)
    assert slave.start_master_term(BrokerRole.SYNC_MASTER, min_epoch=7) == E(7, end)  # a promotion
    assert slave.broker_role is BrokerRole.SYNC_MASTER
    (r,) = slave.put_messages([Message("T", b"x", 0)])
    assert r.queue_offset == 4 and r.phy_offset == end  # queue 0 held messages 0, 3, 6, 9


def test_a_queue_offset_snapshot_taken_before_a_cut_is_not_trusted(open_log, tmp_path: Path):
    """The periodic snapshot is read under the put lock and written after it; a cut in between
    lands a pre-cut table on disk. Once the log grew past the snapshot's offset again (other
    records, from a new master), recovery must not take that table: a promoted slave would
    hand out queue offsets already taken."""
    old_master = open_log()
    first = old_master.put_messages(_msgs(100, size=600))  # queues 0, 1, 2 round robin
    cut = first[50].phy_offset
    slave_root = tmp_path / "slave"
    slave = open_log(store_path_root_dir=str(slave_root), broker_role=BrokerRole.SLAVE)
    _replicate(old_master, slave)
    slave.save_queue_offset_snapshot()
    table_file = slave_root / "config" / "queueOffsetTable.json"
    stale = table_file.read_bytes()  # the table at the old end, as a late write would land it

    new_master = open_log(store_path_root_dir=str(tmp_path / "new"), broker_role=BrokerRole.SLAVE)
    offset = 0
    while offset < cut:  # the new master held the first 50 records only
        data, offset = old_master.read_chunk(offset, cut, 64 * 1024)
        new_master.append_replica(new_master.max_offset, data)
    new_master.set_broker_role(BrokerRole.ASYNC_MASTER)
    new_master.put_messages([Message("T", b"y" * 1500, 1) for _ in range(100)])  # all in queue 1
    assert new_master.max_offset > first[99].phy_offset + first[99].size

    slave.truncate_to(cut)  # the handshake with the new master
    _replicate(new_master, slave)
    table_file.write_bytes(stale)
    slave.abandon()  # killed: the abort file stays

    again = open_log(store_path_root_dir=str(slave_root), broker_role=BrokerRole.SLAVE)
    again.set_broker_role(BrokerRole.ASYNC_MASTER)  # promoted
    expected = {q: new_master.queue_offset_of("T", q) for q in range(3)}
    assert expected == {0: 17, 1: 117, 2: 16}  # records 0..49 round robin, then 100 in queue 1
    assert {q: again.queue_offset_of("T", q) for q in range(3)} == expected
    assert not again.recovery_report.queue_offset_snapshot_used
    (r,) = again.put_messages([Message("T", b"z", 1)])
    assert r.queue_offset == 117


_CUT_THEN_KILL = """
import os, signal, sys
from libstore import BrokerRole, CommitLog, Message, StoreConfig
root, mode = sys.argv[1], sys.argv[2]
def cfg(name, role):
    return StoreConfig(store_path_root_dir=f"{root}/{name}", mapped_file_size_commit_log=256 * 1024,
                       max_message_size=64 * 1024, broker_role=role)
def copy(src, dst, start=0):
    offset = start
    while offset < src.max_offset:
        data, offset = src.read_chunk(offset, src.max_offset, 64 * 1024)
        dst.append_replica(dst.max_offset, data)
master = CommitLog.open(cfg("master", BrokerRole.ASYNC_MASTER))
firsts = master.put_messages([Message("T", b"m" * 900, 0) for _ in range(800)])  # ~3 segments
slave = CommitLog.open(cfg("slave", BrokerRole.SLAVE))
copy(master, slave)
if mode == "truncate":
    slave.truncate_to(firsts[100].phy_offset)
else:  # a new master that shares nothing with this slave: start over at 0
    other = CommitLog.open(cfg("other", BrokerRole.ASYNC_MASTER))
    other.put_messages([Message("T", b"o" * 500, 0) for _ in range(100)])
    slave.reset_to(0)
    copy(other, slave)
print(slave.max_offset, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.crash
@pytest.mark.parametrize("mode", ["truncate", "reset"])
def test_a_log_cut_back_then_killed_starts_again(tmp_path: Path, mode: str):
    """Segments created ahead of the writer (AllocateMappedFileService) for offsets past a cut
    must go with the cut: left behind, they sit after a gap once the process dies, and the
    store refuses to start."""
    proc = subprocess.run(
        [sys.executable, "-c", _CUT_THEN_KILL, str(tmp_path), mode],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    end = int(proc.stdout.split()[0])
    # A segment being pre-allocated at the kill is left as <name>.tmp: load deletes those.
    folder = tmp_path / "slave" / "commitlog"
    names = sorted(p.name for p in folder.iterdir() if not p.name.endswith(".tmp"))
    assert [int(n) for n in names] == [i * 256 * 1024 for i in range(len(names))], names  # no gap
    slave = CommitLog.open(
        StoreConfig(
            store_path_root_dir=str(tmp_path / "slave"),
            mapped_file_size_commit_log=256 * 1024,
            max_message_size=64 * 1024,
            broker_role=BrokerRole.SLAVE,
        )
    )
    try:
        assert slave.max_offset == end
    finally:
        slave.shutdown()


def test_an_append_for_another_master_term_is_fenced(open_log):
    """append_messages(expected_epoch=e) writes only while this store is the master of epoch e:
    a writer whose state belongs to one term (the pop journal) cannot write into the next."""
    cl = open_log()
    cl.start_master_term(BrokerRole.ASYNC_MASTER)
    cl.append_messages(_msgs(1), expected_epoch=1)
    end = cl.max_offset
    cl.start_master_term(BrokerRole.ASYNC_MASTER)  # a restart: epoch 2
    with pytest.raises(NotMasterError, match="epoch 2, not 1"):
        cl.append_messages(_msgs(1), expected_epoch=1)
    assert cl.max_offset == end
    assert cl.append_messages(_msgs(1), expected_epoch=2).results.appended == 1


def test_a_slave_shows_no_more_than_its_master_confirmed(open_log, tmp_path: Path):
    """Under SYNC_FLUSH the master confirms only what it flushed, but streams what it wrote: a
    slave may hold bytes its master can still lose. The slave's consumers (dispatch, slave
    reads) see up to the master's confirm offset only, also after the slave restarts."""
    master = open_log(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    first = master.put_messages(_msgs(10))
    slave_cfg = {"store_path_root_dir": str(tmp_path / "slave"), "broker_role": BrokerRole.SLAVE}
    slave = open_log(**slave_cfg)
    _replicate(master, slave)
    assert slave.max_offset == master.max_offset and slave.confirm_offset == 0  # nothing heard yet
    slave.set_master_confirm(first[5].phy_offset)
    assert slave.confirm_offset == first[5].phy_offset
    assert [r.commit_log_offset for r in slave.iter_records(0)] == [r.phy_offset for r in first[:5]]
    slave.shutdown()
    again = open_log(**slave_cfg)
    assert again.confirm_offset == first[5].phy_offset  # kept in the checkpoint
    again.start_master_term(BrokerRole.ASYNC_MASTER)  # promoted: its whole log is its own now
    assert again.confirm_offset == again.max_offset


def test_epochs_begun_by_different_members_never_collide():
    """A master restarting during a partition and the slave promoted meanwhile each begin a term
    past the newest they know; numbered with their broker ids, the two never share an epoch, so
    the handshake that follows cannot take one's bytes for the other's."""
    from libstore.ha_state import next_epoch

    assert next_epoch(0, 0) == 1000 and next_epoch(1000, 1) == 2001 and next_epoch(2001, 0) == 3000
    restarted, promoted = next_epoch(1000, 0), next_epoch(1000, 1)  # neither heard of the other
    assert restarted != promoted and min(restarted, promoted) > 1000
    old = [E(1000, 0)]
    # Both began at the same offset 500 with other bytes: only term 1000 is shared.
    assert find_consistent_point([*old, E(restarted, 500)], 900, [*old, E(promoted, 500)], 800) == 500
    with pytest.raises(ConfigError):
        StoreConfig(broker_id=1000)


def test_a_slave_behind_the_masters_deleted_head_starts_over_at_its_min_offset(open_log, tmp_path: Path):
    """Retention deleted the master's head while a slave lagged: reading there is out of range
    (what ends the HA session), and the slave, reset to the master's min offset as the welcome
    says, copies the rest byte for byte and restarts from it."""
    master = open_log()
    slave = open_log(store_path_root_dir=str(tmp_path / "slave"), broker_role=BrokerRole.SLAVE)
    master.put_messages(_msgs(100))
    _replicate(master, slave, batch=20_000)
    lagged_at = slave.max_offset
    for start in range(100, 1200, 100):
        master.put_messages(_msgs(100, start))
    master.queue.flush_to(master.max_offset)
    segments = len(master.queue.mapped_files)
    assert len(master.delete_expired_segments(time.time() + 3600, force=True, batch_max=segments - 1)) > 2
    assert lagged_at < master.min_offset
    with pytest.raises(OffsetOutOfRangeError):
        master.read_chunk(lagged_at, master.max_offset, 20_000)
    slave.reset_to(master.min_offset)
    assert slave.min_offset == slave.max_offset == master.min_offset
    _replicate(master, slave, batch=20_000)
    assert slave.max_offset == master.max_offset
    slave.queue.flush_to(slave.max_offset)
    mine, theirs = _files(master), _files(slave)
    assert set(mine) == set(theirs)
    assert all(mine[name] == theirs[name] for name in mine if int(name) + SEGMENT <= master.max_offset)
    config = slave.config
    slave.shutdown()
    again = CommitLog.open(config)
    try:
        assert (again.min_offset, again.max_offset) == (master.min_offset, master.max_offset)
    finally:
        again.shutdown()
