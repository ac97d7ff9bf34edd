"""Automatic failover through etcd (services.commitlog.election), with real processes: etcd
(Debian's etcd-server) and commitlog members on 127.0.0.1, a gateway over the members, and
producers through the gateway that remember every acknowledged message (tests/fault/workload).

What must hold: a killed master is replaced by an in-sync member within 10 s and nothing a
SYNC_MASTER acknowledged is lost, nor a queue offset given twice; a master paused past its lease
acknowledges nothing afterwards; the furthest in-sync slave wins; with no in-sync member the group
waits (unless told to elect an unclean one); etcd losing one of three members changes nothing,
losing all of them makes the master step down; operators' promote and demote go through the
election.
"""

from __future__ import annotations

import json
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.client import Admin
from services.proto import commitlog_pb
from tests.etcd_cluster import EtcdServers
from tests.fault.cluster import assert_acked_held, queue_offsets_in_log
from tests.fault.workload import Acked, Producers
from tests.service.harness import BrokerGroupCluster, CommitLogAdmin

TOPIC = "Elected"
PREFIX = "/mqstore/broker-a"
SEGMENT = 8 * 1024 * 1024  # SMALL_STORE's mappedFileSizeCommitLog
TTL_S = 3.0  # electionLeaseTtlMillis's default


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServers]:
    servers = EtcdServers(tmp_path / "etcd", 1)
    servers.start()
    try:
        yield servers
    finally:
        servers.stop()


def _group(
    tmp_path: Path, etcd: EtcdServers, names: tuple[str, ...] = ("a", "b", "c"), role: str = "SYNC_MASTER"
) -> BrokerGroupCluster:
    cluster = BrokerGroupCluster(tmp_path / "group", names, master_role=role, etcd=etcd.endpoints)
    for name in names:
        cluster.start_commitlog(name)
    cluster.start_gateway()
    return cluster


def _sync_state(etcd: EtcdServers) -> tuple[int, list[int]]:
    raw = etcd.read(f"{PREFIX}/syncStateSet")
    if raw is None:
        return 0, []
    d = json.loads(raw)
    return int(d["epoch"]), sorted(d["brokerIds"])


def _synced_epoch(etcd: EtcdServers, broker_id: int) -> int:
    raw = etcd.read(f"{PREFIX}/members/{broker_id}")
    return int(json.loads(raw)["syncedEpoch"]) if raw else -1


def _wait_sync_state(etcd: EtcdServers, broker_ids: list[int], timeout_s: float = 30.0) -> int:
    """Wait until the published SyncStateSet is ``broker_ids`` and each of them says it caught
    up with that epoch's master (so each may be elected); returns the set's epoch."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        epoch, ids = _sync_state(etcd)
        if ids == sorted(broker_ids) and all(_synced_epoch(etcd, b) == epoch for b in ids):
            return epoch
        time.sleep(0.1)
    raise AssertionError(f"SyncStateSet {_sync_state(etcd)}, expected {broker_ids}, caught up with its epoch")


def _wait_acks(producers: Producers, more: int = 50, timeout_s: float = 30.0) -> None:
    start = len(producers.snapshot())
    deadline = time.monotonic() + timeout_s
    while len(producers.snapshot()) < start + more:
        assert time.monotonic() < deadline, f"no acknowledgements: {producers.statuses}"
        time.sleep(0.05)


def _role(cluster: BrokerGroupCluster, name: str) -> str:
    with CommitLogAdmin(cluster.address(name)) as admin:
        return str(admin.state().broker_role)


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return int(reply.status)


def _assert_history(cluster: BrokerGroupCluster, master: str, acked: dict[str, Acked]) -> None:
    """Every acknowledged message is on ``master`` where its put said, and each queue's offsets
    in its log run 0, 1, 2, ... (none given twice, none skipped)."""
    with CommitLogAdmin(cluster.address(master)) as admin:
        end = admin.state().max_offset
    assert_acked_held(cluster.address(master), acked)
    for (topic, queue_id), offsets in queue_offsets_in_log(
        cluster.commitlog_files(master), end, SEGMENT
    ).items():
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), (topic, queue_id, offsets[:20])


@pytest.mark.crash
def test_a_killed_master_is_replaced_within_seconds_and_nothing_acknowledged_is_lost(
    tmp_path: Path, etcd: EtcdServers
) -> None:
    cluster = _group(tmp_path, etcd)
    producers = None
    try:
        cluster.wait_serving()
        _wait_sync_state(etcd, [0, 1, 2])
        with Admin(cluster.gateway) as admin:
            admin.create_topic(TOPIC, 4)
        producers = Producers(cluster.gateway, TOPIC).start()
        waits = []
        for _ in range(2):
            _wait_acks(producers)
            master = cluster.master()
            others = [n for n in cluster.names if n != master]
            killed_at = time.monotonic()
            cluster.kill(f"{master}-commitlog")
            waits.append(producers.first_ack_after(killed_at, timeout_s=30))
            assert cluster.master(among=others) in others
            cluster.start_commitlog(master)  # comes back as a slave of the new master
            _wait_sync_state(etcd, [0, 1, 2], timeout_s=60)
        _wait_acks(producers)
        producers.stop()
        print(f"failover: first acknowledgement after the kill in {[round(w, 2) for w in waits]} s")
        assert max(waits) < 10.0, waits
        master = cluster.master()
        _assert_history(cluster, master, producers.snapshot())
        assert statistics.median(waits) < 10.0
    finally:
        if producers is not None:
            producers.stop()
        cluster.stop_all()


def test_a_master_paused_past_its_lease_acknowledges_nothing_after_it(
    tmp_path: Path, etcd: EtcdServers
) -> None:
    cluster = _group(tmp_path, etcd)
    producers = None
    try:
        cluster.wait_serving()
        _wait_sync_state(etcd, [0, 1, 2])
        with Admin(cluster.gateway) as admin:
            admin.create_topic(TOPIC, 4)
        producers = Producers(cluster.gateway, TOPIC).start()
        _wait_acks(producers)
        old = cluster.master()
        direct: dict[str, Acked] = {}
        refused: list[str] = []

        def append_to_the_old_master() -> None:
            """Puts sent straight to the paused master: they wait in its socket and are
            answered when it runs again, after its lease ran out."""
            with CommitLogAdmin(cluster.address(old)) as admin:
                for i in range(3):
                    key = f"direct-{i}"
                    try:
                        results = admin.append_keyed(TOPIC, [key])
                    except grpc.RpcError as err:
                        refused.append(f"{key}: {err.code().name}")
                        continue
                    if results.all_ok:
                        direct[key] = Acked(
                            results.phy_offsets[0], results.sizes[0], results.queue_offsets[0]
                        )
                    else:
                        refused.append(f"{key}: {results.status.name}")

        cluster.signal(f"{old}-commitlog", signal.SIGSTOP)
        paused_at = time.monotonic()
        appender = threading.Thread(target=append_to_the_old_master)
        appender.start()
        producers.first_ack_after(paused_at + TTL_S, timeout_s=30)  # the group goes on without it
        time.sleep(max(0.0, paused_at + TTL_S + 2 - time.monotonic()))
        cluster.signal(f"{old}-commitlog", signal.SIGCONT)
        appender.join(60)
        _wait_sync_state(etcd, [0, 1, 2], timeout_s=60)  # the old master rejoined as a slave
        _wait_acks(producers)
        producers.stop()
        assert _role(cluster, old) == "SLAVE"
        assert not direct, f"the paused master acknowledged {sorted(direct)} after its lease ran out"
        assert len(refused) == 3, refused
        _assert_history(cluster, cluster.master(), producers.snapshot())
    finally:
        if producers is not None:
            producers.stop()
        cluster.stop_all()


def test_the_furthest_in_sync_slave_wins(tmp_path: Path, etcd: EtcdServers) -> None:
    """ASYNC_MASTER: a slave paused for a moment falls behind the other (both stay in the
    SyncStateSet); the master dies meanwhile. The slave holding more of the log must win."""
    cluster = _group(tmp_path, etcd, role="ASYNC_MASTER")
    producers = None
    try:
        cluster.wait_serving()
        _wait_sync_state(etcd, [0, 1, 2])
        with Admin(cluster.gateway) as admin:
            admin.create_topic(TOPIC, 4)
        producers = Producers(cluster.gateway, TOPIC).start()
        _wait_acks(producers)
        master = cluster.master()
        ahead, behind = [n for n in cluster.names if n != master]
        cluster.signal(f"{behind}-commitlog", signal.SIGSTOP)
        time.sleep(1.0)
        cluster.kill(f"{master}-commitlog")
        time.sleep(0.5)
        cluster.signal(f"{behind}-commitlog", signal.SIGCONT)
        producers.stop()
        with CommitLogAdmin(cluster.address(ahead)) as a, CommitLogAdmin(cluster.address(behind)) as b:
            ends = (a.state().max_offset, b.state().max_offset)
        assert ends[0] > ends[1], ends  # the pause left it behind
        assert cluster.master(among=[ahead, behind]) == ahead
        assert _role(cluster, behind) == "SLAVE"
    finally:
        if producers is not None:
            producers.stop()
        cluster.stop_all()


def test_with_no_in_sync_member_the_group_waits_unless_told_to_elect_an_unclean_one(
    tmp_path: Path, etcd: EtcdServers
) -> None:
    cluster = _group(tmp_path, etcd, names=("a", "b"), role="ASYNC_MASTER")
    try:
        cluster.wait_serving()
        _wait_sync_state(etcd, [0, 1])
        master = cluster.master()
        slave = next(n for n in cluster.names if n != master)
        cluster.kill(f"{slave}-commitlog")
        _wait_sync_state(etcd, [cluster.names.index(master)])  # it left the set on disconnect
        with CommitLogAdmin(cluster.address(master)) as admin:
            only_on_master = admin.append_keyed(TOPIC, ["only-on-master"])
            assert only_on_master.all_ok
        cluster.kill(f"{master}-commitlog")
        cluster.start_commitlog(slave)
        time.sleep(TTL_S + 3)
        assert _role(cluster, slave) == "SLAVE"  # not in the set: it may not be elected
        assert etcd.read(f"{PREFIX}/leader") is None
        assert _health(cluster.address(slave)) == health_pb2.HealthCheckResponse.NOT_SERVING
        log = (cluster.root / f"{slave}-commitlog.log").read_text(errors="replace")
        assert "has no master and no member that may become one" in log

        # The old master comes back: it is electable (it was the master of the set's epoch).
        cluster.start_commitlog(master)
        assert cluster.master(among=[master, slave], timeout_s=30) == master
        _wait_sync_state(etcd, [0, 1])
        with CommitLogAdmin(cluster.address(slave)) as admin:
            admin.wait_for(lambda s: s.max_offset >= only_on_master.next_offset, what="the slave to catch up")
            assert _health(cluster.address(slave)) == health_pb2.HealthCheckResponse.SERVING

        # Unclean: the master dies while the slave is away; the slave is elected anyway when told.
        cluster.kill(f"{slave}-commitlog")
        _wait_sync_state(etcd, [cluster.names.index(master)])
        cluster.kill(f"{master}-commitlog")
        cluster.store["enableElectUncleanMaster"] = "true"
        cluster.start_commitlog(slave)
        assert cluster.master(among=[slave], timeout_s=30) == slave
    finally:
        cluster.stop_all()


def test_losing_one_etcd_member_changes_nothing_losing_all_makes_the_master_step_down(tmp_path: Path) -> None:
    servers = EtcdServers(tmp_path / "etcd", 3)
    servers.start()
    cluster = BrokerGroupCluster(
        tmp_path / "group", ("a", "b"), master_role="ASYNC_MASTER", etcd=servers.endpoints
    )
    producers = None
    try:
        for name in cluster.names:
            cluster.start_commitlog(name)
        cluster.start_gateway()
        cluster.wait_serving()
        master = cluster.master()
        with Admin(cluster.gateway) as admin:
            admin.create_topic(TOPIC, 4)
        producers = Producers(cluster.gateway, TOPIC).start()
        _wait_acks(producers)
        servers.kill("e0")  # the members' clients start on the first endpoint
        lost_at = time.monotonic()
        _wait_acks(producers, more=200)
        assert cluster.master() == master  # no failover: the lease was renewed through e1 or e2
        gaps = [
            b - a for a, b in zip(producers.acked_at, producers.acked_at[1:], strict=False) if a > lost_at
        ]
        assert max(gaps, default=0.0) < TTL_S, f"acknowledgements stopped for {max(gaps):.1f} s"

        servers.kill("e1")
        servers.kill("e2")
        gone_at = time.monotonic()
        with CommitLogAdmin(cluster.address(master)) as admin:
            admin.wait_for(
                lambda s: s.broker_role == "SLAVE", timeout_s=TTL_S + 5, what="the master to step down"
            )
        stepped_down = time.monotonic() - gone_at
        last_ack = producers.acked_at[-1]
        assert last_ack - gone_at < TTL_S, f"acknowledged {last_ack - gone_at:.1f} s after etcd went away"
        print(f"etcd gone: the master stepped down after {stepped_down:.1f} s")

        for name in ("e0", "e1", "e2"):  # etcd is back: the group elects again
            servers.start_member(name)
        servers.wait_healthy()
        back_at = time.monotonic()
        producers.first_ack_after(back_at, timeout_s=60)
        producers.stop()
        _assert_history(cluster, cluster.master(), producers.snapshot())
    finally:
        if producers is not None:
            producers.stop()
        cluster.stop_all()
        servers.stop()


def test_operators_promote_and_demote_through_the_election(tmp_path: Path, etcd: EtcdServers) -> None:
    cluster = _group(tmp_path, etcd, names=("a", "b"), role="ASYNC_MASTER")
    try:
        cluster.wait_serving()
        _wait_sync_state(etcd, [0, 1])
        master = cluster.master()
        slave = next(n for n in cluster.names if n != master)
        with CommitLogAdmin(cluster.address(slave)) as admin:
            with pytest.raises(grpc.RpcError) as refused:
                admin.promote()
            assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "through the election" in refused.value.details()
        with CommitLogAdmin(cluster.address(master)) as admin:
            admin.stub.Demote(
                commitlog_pb.DemoteRequest(master_address=cluster.address(slave, "ha")), timeout=30
            )
        assert cluster.master(among=[slave], timeout_s=30) == slave
        with CommitLogAdmin(cluster.address(master)) as admin:
            admin.wait_for(
                lambda s: s.broker_role == "SLAVE" and s.master_address == cluster.address(slave, "ha"),
                what="the old master to follow the new one",
            )
    finally:
        cluster.stop_all()


def test_a_member_started_before_etcd_waits_for_it(tmp_path: Path) -> None:
    """In a new deployment etcd may come up after the members: they wait for it (a while)
    instead of exiting, then elect as usual."""
    servers = EtcdServers(tmp_path / "etcd", 1)
    cluster = BrokerGroupCluster(
        tmp_path / "group", ("a",), master_role="ASYNC_MASTER", etcd=servers.endpoints
    )
    try:
        cluster.start_commitlog("a")
        time.sleep(3.0)
        assert cluster.procs["a-commitlog"].proc.poll() is None, cluster.procs["a-commitlog"].tail_log()
        servers.start()
        assert cluster.master(timeout_s=30) == "a"
        assert "etcd not reachable yet" in (cluster.root / "a-commitlog.log").read_text(errors="replace")
    finally:
        cluster.stop_all()
        servers.stop()
