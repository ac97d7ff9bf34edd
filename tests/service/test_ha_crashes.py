"""A broker group's members crash, lose what they had not fsynced, and come back (real commitlog
processes on 127.0.0.1): the group converges on one history and keeps every acknowledged message.

Power loss is played by hand here: the member is SIGKILLed, then the bytes a power loss could
take (written, never fsynced: these members flush once an hour) are zeroed in its files before
it restarts. tests/fault runs the same faults at random, through a layer that records what each
fdatasync made durable.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import grpc
import pytest

from libstore import PutMessageStatus, decode_record
from services.client import Admin
from tests.rocketmq.harness import run_driver
from tests.service.harness import BrokerGroupCluster, CommitLogAdmin, assert_logs_identical

pytestmark = pytest.mark.crash

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
            assert (
                epochs == [(1000, 0), (2000, lost_from)] == [(e.epoch, e.start_offset) for e in state.epochs]
            )
    finally:
        cluster.stop_all()


def test_a_slave_with_a_damaged_record_mid_log_fetches_the_rest_again(tmp_path: Path):
    """Recovery on a slave stops at a damaged record in the middle of its log: what follows is
    moved to quarantine/, and the handshake streams it again from the master, so the slave ends
    byte-identical to it."""
    cluster = BrokerGroupCluster(
        tmp_path,
        master_role="ASYNC_MASTER",
        store={"mappedFileSizeCommitLog": 1 << 20, "maxMessageSize": 256 * 1024},
    )
    try:
        cluster.start_commitlog("a")
        cluster.start_commitlog("b")
        cluster.wait_serving()
        with CommitLogAdmin(cluster.address("a")) as master:
            written = []
            for start in range(0, 3000, 500):
                written += list(master.append_keyed("T", [f"k{i}" for i in range(start, start + 500)], 1000))
        end = _wait_same_end(cluster.address("a"), cluster.address("b"))
        assert end > 2 * (1 << 20)
        cluster.kill("b-commitlog")
        bad = next(r for r in written if r.phy_offset > (1 << 20) + 5000)  # in the second segment
        segments = cluster.commitlog_files("b")
        with open(segments / f"{1 << 20:020d}", "r+b") as fh:
            fh.seek(bad.phy_offset - (1 << 20) + 200)
            fh.write(b"\xff\xfe")  # in the body: the CRC no longer matches
        (segments.parent / "checkpoint").unlink()  # recovery validates from the first segment
        cluster.start_commitlog("b")
        cluster.wait_serving(["b-commitlog"])

        assert _wait_same_end(cluster.address("a"), cluster.address("b")) == end
        assert_logs_identical(cluster.commitlog_files("a"), segments, end)
        quarantine = segments.parent / "quarantine"
        (event,) = quarantine.iterdir()
        assert sorted(int(p.name) for p in event.iterdir())[0] == bad.phy_offset
    finally:
        cluster.stop_all()


def test_promotion_refuses_a_slave_that_holds_less_than_another(tmp_path: Path):
    """SYNC_MASTER with two slaves and inSyncReplicas=2 (the master and one slave) acknowledges a
    put once either slave holds it; when the master is lost, promoting the slave that lagged
    would lose acknowledged messages, so it is refused and names the slave to promote."""
    cluster = BrokerGroupCluster(
        tmp_path, ("a", "b", "c"), master_role="SYNC_MASTER", store={"inSyncReplicas": 2}
    )
    try:
        for name in cluster.names:
            cluster.start_commitlog(name)
        cluster.wait_serving()
        with CommitLogAdmin(cluster.address("a")) as master:
            master.wait_for(
                lambda s: len(s.slaves) == 2 and all(x.in_sync for x in s.slaves), what="2 slaves"
            )
            master.append_keyed("T", [f"early{i}" for i in range(100)])
            _wait_same_end(cluster.address("a"), cluster.address("c"))
            cluster.signal("c-commitlog", signal.SIGSTOP)  # c falls behind; b keeps acknowledging
            acked = []  # more than the socket buffers and HTTP/2 windows hold for the stopped slave
            for start in range(0, 8000, 500):
                results = master.append_keyed("T", [f"late{i}" for i in range(start, start + 500)], 2000)
                assert results.status is PutMessageStatus.PUT_OK
                acked += list(results)
        cluster.kill("a-commitlog")
        cluster.signal("c-commitlog", signal.SIGCONT)
        with CommitLogAdmin(cluster.address("c")) as c:
            c.wait_for(lambda s: not s.master_connected, what="c to notice the master is gone")
            with pytest.raises(grpc.RpcError) as refused:
                c.promote()
            assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert cluster.address("b") in refused.value.details() and "holds more" in refused.value.details()
        with CommitLogAdmin(cluster.address("b")) as b:
            b.wait_for(lambda s: not s.master_connected, what="b to notice the master is gone")
            assert b.promote().broker_role == "SYNC_MASTER"
        end = _wait_same_end(cluster.address("b"), cluster.address("c"))  # c follows the new master
        with CommitLogAdmin(cluster.address("c")) as c:
            keys = []
            for start in range(0, len(acked), 1000):
                raws = c.read([(r.phy_offset, r.size) for r in acked[start : start + 1000]])
                keys += [decode_record(raw).keys for raw in raws]
            assert keys == [[f"late{i}"] for i in range(8000)]
            assert c.state().max_offset == end
    finally:
        cluster.stop_all()


@pytest.mark.rocketmq
@pytest.mark.slow
def test_acks_survive_a_failover_through_the_official_client(tmp_path: Path):
    """Pop state (receipts, acks) is journaled in the CommitLog and replicated with it: after
    the master is killed and its slave promoted, a SimpleConsumer of the official RocketMQ 5
    client gets every message it had not acked, and none it had (beyond those received but not
    yet acked at the kill, which come again once their invisible time passes)."""
    cluster = BrokerGroupCluster(tmp_path / "g", master_role="SYNC_MASTER")
    try:
        cluster.start_all(derived=True)
        with CommitLogAdmin(cluster.address("a")) as a:
            a.wait_for(lambda s: len(s.slaves) == 1 and s.slaves[0].in_sync, what="the slave in sync")
        with Admin(cluster.gateway) as admin:
            admin.create_topic("Pay", 4)
        sent = run_driver(
            "send_many",
            {"endpoint": cluster.gateway, "topic": "Pay", "count": 2000, "size": 256},
            tmp_path / "p",
        )
        assert not sent["errors"] and len(set(sent["ids"])) == 2000
        before = run_driver(
            "receive_many",
            {
                "endpoint": cluster.gateway,
                "group": "payers",
                "topic": "Pay",
                "count": 1000,
                "invisible_s": 5,
                "ids": True,
            },
            tmp_path / "c1",
        )
        assert before["acked"] == 1000 and len(set(before["acked_ids"])) == 1000
        in_flight = {mid for mid, _ in before["received"]} - set(before["acked_ids"])

        for svc in ("commitlog", "dispatch", "index"):  # the whole master member goes away
            cluster.kill(f"a-{svc}")
        with CommitLogAdmin(cluster.address("b")) as b:
            b.wait_for(lambda s: not s.master_connected, what="b to notice the master is gone")
            # A lone promoted slave runs ASYNC_MASTER: SYNC_MASTER would refuse acks without a slave.
            assert b.promote("ASYNC_MASTER").broker_role == "ASYNC_MASTER"

        after = run_driver(
            "receive_many",
            {
                "endpoint": cluster.gateway,
                "group": "payers",
                "topic": "Pay",
                "count": 1000 + len(in_flight),
                "invisible_s": 5,
                "idle_s": 10,
                "ids": True,
                "timeout_s": 120,
            },
            tmp_path / "c2",
            timeout_s=180,
        )
        again = {mid for mid, _ in after["received"]}
        redelivered_acked = again & set(before["acked_ids"])
        assert not redelivered_acked, (
            f"{len(redelivered_acked)} acked messages delivered again after the failover"
        )
        assert again | set(before["acked_ids"]) == set(sent["ids"])  # nothing lost either
        assert in_flight <= again
    finally:
        cluster.stop_all()
