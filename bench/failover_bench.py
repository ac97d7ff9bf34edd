"""``python -m bench --suite failover``: how long a broker group that elects its master through
etcd (services.commitlog.election) goes without acknowledging after its master is SIGKILLed.

A single-member etcd (Debian's etcd-server, ``make bench-deps``) and three commitlog members on
127.0.0.1 (SYNC_MASTER when elected, ASYNC_FLUSH, the default lease of 3 s), a gateway over them,
and two producer threads sending batches of 8 through the gateway and remembering every
acknowledged message (tests/fault/workload). Each round: wait for acknowledgements, SIGKILL the
master, time until the first batch is acknowledged again (by the new master, once the remaining
slave joined its SyncStateSet) and until a member says it is the master; then start the killed
member again and wait until it is back in the SyncStateSet. At the end every acknowledged message
must be in the final master's log where its put said (a round that lost one fails the suite).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from services.client import Admin
from tests.etcd_cluster import EtcdServers
from tests.fault.cluster import assert_acked_held
from tests.fault.workload import Producers
from tests.service.harness import BrokerGroupCluster

TOPIC = "Failover"
MEMBERS = ("a", "b", "c")


@dataclass
class FailoverResult:
    """Per round: seconds from the SIGKILL to the first acknowledged produce, and to a member
    reporting itself the master; and how many acknowledged messages were checked at the end."""

    ack_s: list[float] = field(default_factory=list)
    elected_s: list[float] = field(default_factory=list)
    acknowledged: int = 0

    @property
    def median_ack_s(self) -> float:
        return statistics.median(self.ack_s)

    @property
    def worst_ack_s(self) -> float:
        return max(self.ack_s)


def _sync_state(etcd: EtcdServers) -> list[int]:
    raw = etcd.read("/mqstore/broker-a/syncStateSet")
    return sorted(json.loads(raw)["brokerIds"]) if raw else []


def _wait_full_set(etcd: EtcdServers, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _sync_state(etcd) != list(range(len(MEMBERS))):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the SyncStateSet did not fill up: {_sync_state(etcd)}")
        time.sleep(0.1)


def run(root: Path, rounds: int = 20) -> FailoverResult:
    """``rounds`` SIGKILLs of the master under load (module docstring)."""
    etcd = EtcdServers(root / "etcd", 1)
    etcd.start()
    cluster = BrokerGroupCluster(root / "group", MEMBERS, master_role="SYNC_MASTER", etcd=etcd.endpoints)
    producers = None
    out = FailoverResult()
    try:
        for name in MEMBERS:
            cluster.start_commitlog(name)
        cluster.start_gateway()
        cluster.wait_serving()
        _wait_full_set(etcd)
        with Admin(cluster.gateway) as admin:
            admin.create_topic(TOPIC, 4)
        producers = Producers(cluster.gateway, TOPIC).start()
        for _ in range(rounds):
            producers.first_ack_after(time.monotonic())
            master = cluster.master()
            others = [n for n in MEMBERS if n != master]
            killed_at = time.monotonic()
            cluster.kill(f"{master}-commitlog")
            cluster.master(among=others, timeout_s=60)
            out.elected_s.append(time.monotonic() - killed_at)
            out.ack_s.append(producers.first_ack_after(killed_at, timeout_s=60))
            cluster.start_commitlog(master)
            _wait_full_set(etcd)
        producers.stop()
        acked = producers.snapshot()
        assert_acked_held(cluster.address(cluster.master()), acked)
        out.acknowledged = len(acked)
        return out
    finally:
        if producers is not None:
            producers.stop()
        cluster.stop_all()
        etcd.stop()
