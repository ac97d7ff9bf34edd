"""A randomized fault loop over a real broker group (tests/fault/cluster.py) under load.

Producers send through the gateway under SYNC_FLUSH + SYNC_MASTER, a pull group and a pop group
consume. Each round injects one fault at random, heals, then checks:

* every message acknowledged so far is in the master's log and the slave's, at the offset and
  queue offset its put reported, and no queue offset was given to two messages;
* the two CommitLogs hold the same bytes up to their common end.

Faults: SIGKILL and restart of any process; SIGSTOP/SIGCONT of any process; the replication
stream stalled, slowed or cut (FaultProxy); a simulated power loss of a member (every process
of the machine killed, unsynced writes rewound by tests/fault/powerloss.py); a failover (the
master member killed or powered off, its slave promoted, the old master rejoining as slave).

A promotion is only done when the slave holds everything acknowledged, which SYNC_MASTER
promises unless the slave itself lost power since it last caught up (its acknowledgement
covered its page cache, as RocketMQ's does): then the master is restarted instead, as an
operator would.

Half the runs (by seed) elect the master through etcd instead (services.commitlog.election):
nobody promotes; a lost master must be replaced by the slave on its own, except when the slave
lost power since it last caught up, when the slave must *not* be elected; a master paused past
its lease is replaced meanwhile; and etcd itself is killed or frozen for a while.

At the end every consumer group must have seen every acknowledged message, the pop group must
never have been given a message again after the store confirmed its ack, and each queue's
offsets in the master's log must be 0, 1, 2, ... in log order.

The seed is printed; ``MQSTORE_FAULT_SEED`` replays a run's sequence of faults (their timing
differs) and ``MQSTORE_FAULT_ROUNDS`` sets its length (30 by default, ~2.5 minutes; ``make soak``
runs hundreds of rounds).
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from services.client import Admin
from tests.fault.cluster import (
    SERVICES,
    FaultCluster,
    assert_acked_held,
    assert_same_bytes,
    queue_offsets_in_log,
)
from tests.fault.workload import PopGroup, Producers, PullGroup
from tests.service.harness import CommitLogAdmin

TOPIC = "Chaos"
FAULTS = {"kill": 3, "pause": 2, "replication": 2, "power": 2, "failover": 2}
ELECTION_FAULTS = {"etcd": 1}
ELECTION_WAIT_S = 6.0  # a lease (3 s) and then some: what an election would have taken


class FaultLoop:
    """One run: the cluster, the load, the random source and what happened (for the report).
    Half the seeds run the group with an election through etcd (failovers happen by
    themselves, and etcd is one more thing to kill), the other half with manual promotions;
    ``MQSTORE_FAULT_ELECTION=1`` or ``0`` chooses."""

    def __init__(self, root: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        forced = os.environ.get("MQSTORE_FAULT_ELECTION")
        self.election = forced == "1" if forced in ("0", "1") else self.rng.random() < 0.5
        self.cluster = FaultCluster(root, election=self.election)
        self.history: list[str] = []
        self.lost_power_since_sync: set[str] = set()

    def note(self, text: str) -> None:
        self.history.append(text)

    # -- faults ---------------------------------------------------------------------------------------
    def inject(self) -> None:
        faults = {**FAULTS, **(ELECTION_FAULTS if self.election else {})}
        kinds, weights = zip(*faults.items(), strict=True)
        kind = self.rng.choices(kinds, weights)[0]
        getattr(self, f"_{kind}")()

    def _etcd(self) -> None:
        """etcd goes away for a while (killed, or frozen), then comes back: the master keeps its
        lease through a short outage, and steps down (the group waits) through a long one."""
        etcd = self.cluster.etcd
        assert etcd is not None
        (name,) = etcd.names
        hold = self.rng.uniform(0.5, 5.0)
        if self.rng.random() < 0.5:
            self.note(f"etcd killed for {hold:.1f} s")
            etcd.kill(name)
            time.sleep(hold)
            etcd.start_member(name)
        else:
            self.note(f"etcd frozen (SIGSTOP) for {hold:.1f} s")
            etcd.pause(name)
            time.sleep(hold)
            etcd.resume(name)
        etcd.wait_healthy()

    def _any_process(self) -> str:
        return self.rng.choice(sorted(self.cluster.procs))

    def _kill(self) -> None:
        key = self._any_process()
        self.note(f"SIGKILL {key}")
        self.cluster.restart(key)
        self.cluster.wait_serving([key])

    def _pause(self) -> None:
        key = self._any_process()
        hold = self.rng.uniform(0.3, 2.5)
        self.note(f"SIGSTOP {key} for {hold:.1f} s")
        self.cluster.pause(key)
        time.sleep(hold)
        self.cluster.cont(key)

    def _replication(self) -> None:
        master = self.cluster.master()
        proxy = self.cluster.members[master].proxy
        how = self.rng.choice(["stall", "slow", "cut", "cut-refuse"])
        hold = self.rng.uniform(0.3, 2.5)
        self.note(f"replication from {master}: {how} for {hold:.1f} s")
        if how == "stall":
            proxy.stall()
        elif how == "slow":
            proxy.slow(self.rng.uniform(0.02, 0.2))
        else:
            proxy.cut(refuse=how == "cut-refuse")
        time.sleep(hold)
        proxy.resume()

    def _slow_disk(self, name: str) -> str:
        """Half the time, the member's disk gets slow for a while first: writes pile up, are
        replicated and are not yet durable when the power goes."""
        if self.rng.random() < 0.5:
            return ""
        sync_ms = self.rng.choice([50, 200, 500])
        self.cluster.slow_disk(name, sync_ms)
        time.sleep(self.rng.uniform(0.3, 1.5))
        return f"slow disk ({sync_ms} ms syncs), then "

    def _power(self) -> None:
        name = self.rng.choice(sorted(self.cluster.members))
        slow = self._slow_disk(name)
        report = self.cluster.power_loss(name, self.rng)
        self.note(
            f"{slow}power loss of {name}: {report.sectors_old} sectors rewound, {report.sectors_new} kept, "
            f"{report.sectors_garbage} garbage, {len(report.names_lost)} names lost, "
            f"{len(report.names_back)} back"
        )
        self.lost_power_since_sync.add(name)
        self._start_member(name)

    def _failover(self) -> None:
        master = self.cluster.master()
        slave = self.cluster.other(master)
        if self.election:
            self._elected_failover(master, slave)
            return
        powered_off = self.rng.random() < 0.5
        if powered_off:
            slow = self._slow_disk(master)
            report = self.cluster.power_loss(master, self.rng)
            self.lost_power_since_sync.add(master)
            how = f"{slow}power loss ({report.sectors_old} sectors rewound)"
        else:
            for svc in SERVICES:
                self.cluster.kill(f"{master}-{svc}")
            how = "SIGKILL"
        if slave in self.lost_power_since_sync:
            self.note(f"{master} lost ({how}); {slave} lost power since it last caught up: {master} restarts")
            self._start_member(master)
            return
        with CommitLogAdmin(self.cluster.members[slave].address()) as admin:
            admin.wait_for(lambda s: not s.master_connected, timeout_s=30, what=f"{slave} to lose its master")
            state = admin.promote()
        self.note(f"failover: {master} lost ({how}), {slave} promoted (epoch {state.epoch})")
        self._start_member(master)

    def _elected_failover(self, master: str, slave: str) -> None:
        """The master member is killed or powered off; nobody promotes anyone. The slave must
        be elected, unless it lost power since it last caught up (it may lack acknowledged
        messages): then the group must wait for the old master, which is started again."""
        powered_off = self.rng.random() < 0.5
        if powered_off:
            slow = self._slow_disk(master)
            report = self.cluster.power_loss(master, self.rng)
            self.lost_power_since_sync.add(master)
            how = f"{slow}power loss ({report.sectors_old} sectors rewound)"
        else:
            for svc in SERVICES:
                self.cluster.kill(f"{master}-{svc}")
            how = "SIGKILL"
        lost_at = time.monotonic()
        if slave in self.lost_power_since_sync:
            time.sleep(ELECTION_WAIT_S)
            state = self.cluster.state(slave)
            assert state is not None and state.broker_role == "SLAVE", f"{slave} was elected: {state}"
            self.note(f"{master} lost ({how}); {slave} lost power since it last caught up: not elected")
            self._start_member(master)
            return
        while self.cluster.master(timeout_s=30) != slave:
            assert time.monotonic() - lost_at < 30, f"{slave} was not elected"
            time.sleep(0.1)
        state = self.cluster.state(slave)
        self.note(
            f"failover: {master} lost ({how}), {slave} elected after {time.monotonic() - lost_at:.1f} s "
            f"(epoch {state.epoch if state else '?'})"
        )
        self._start_member(master)

    def _start_member(self, name: str) -> None:
        for svc in SERVICES:
            self.cluster.start(name, svc)
        self.cluster.wait_serving([f"{name}-{svc}" for svc in SERVICES])

    # -- checks ---------------------------------------------------------------------------------------
    def check(self, producers: Producers) -> tuple[int, int]:
        """Pause the producers, let the slave catch up, and check (see module docstring);
        returns (acknowledged messages checked, bytes compared)."""
        producers.pause()
        try:
            end = self.cluster.wait_converged()
            self.lost_power_since_sync.clear()
            acked = producers.snapshot()
            master = self.cluster.master()
            for name in (master, self.cluster.other(master)):
                assert_acked_held(self.cluster.members[name].address(), acked)
            compared = assert_same_bytes(self.cluster.segments("a"), self.cluster.segments("b"), end)
            return len(acked), compared
        finally:
            producers.resume()


def _seed() -> int:
    env = os.environ.get("MQSTORE_FAULT_SEED")
    return int(env) if env else random.SystemRandom().randrange(1 << 32)


@pytest.mark.slow
def test_fault_loop(tmp_path: Path) -> None:
    rounds = int(os.environ.get("MQSTORE_FAULT_ROUNDS", "30"))
    seed = _seed()
    loop = FaultLoop(tmp_path, seed)
    cluster = loop.cluster
    mode = "election through etcd" if loop.election else "manual promotions"
    print(f"\nfault loop: seed {seed} ({rounds} rounds, {mode}); replay with MQSTORE_FAULT_SEED={seed}")
    producers: Producers | None = None
    groups: list[PullGroup | PopGroup] = []
    started = time.monotonic()
    try:
        cluster.start_all()
        with CommitLogAdmin(cluster.members[cluster.master()].address()) as a:
            a.wait_for(lambda s: len(s.slaves) == 1 and s.slaves[0].in_sync, what="the slave in sync")
        with Admin(cluster.gateway) as admin:
            admin.create_topic(TOPIC, 4)
        producers = Producers(cluster.gateway, TOPIC).start()
        groups = [
            PullGroup(cluster.gateway, "pullers", TOPIC).start(),
            PopGroup(cluster.gateway, "poppers", TOPIC).start(),
        ]
        for i in range(rounds):
            time.sleep(loop.rng.uniform(0.2, 1.0))  # load between faults
            loop.inject()
            checked, compared = loop.check(producers)
            print(
                f"round {i + 1:3d} ({time.monotonic() - started:5.0f} s, {time.strftime('%H:%M:%S')}): "
                f"{loop.history[-1]}; "
                f"{checked} acknowledged held, {compared:,} bytes identical"
            )
        producers.stop()
        acked = producers.snapshot()
        assert len(acked) > 0, f"nothing was acknowledged: {producers.statuses}, {producers.errors} errors"
        end = cluster.wait_converged()
        master = cluster.master()
        placed = assert_acked_held(cluster.members[master].address(), acked)
        assert len(placed) == len(acked)
        for (topic, qid), offsets in queue_offsets_in_log(cluster.segments(master), end).items():
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), (
                f"queue offsets of {topic}/{qid} are not consecutive in {master}'s log"
            )
        pop = next(g for g in groups if isinstance(g, PopGroup))
        assert not pop.after_ack, (
            f"{len(pop.after_ack)} deliveries after a confirmed ack: {pop.after_ack[:5]}"
        )
        assert pop.acked, "the pop group acknowledged nothing"
        deadline = time.monotonic() + 90
        for group in groups:
            while group.missing(set(acked)) and time.monotonic() < deadline:
                time.sleep(0.5)
            missing = group.missing(set(acked))
            assert not missing, (
                f"group {group.group} never saw {len(missing)} acknowledged messages: {sorted(missing)[:5]}"
            )
        print(
            f"fault loop done in {time.monotonic() - started:.0f} s: {rounds} faults, "
            f"{len(acked)} acknowledged, statuses {producers.statuses}, {producers.errors} producer errors; "
            + ", ".join(f"{g.group} saw {g.deliveries} deliveries" for g in groups)
        )
    except BaseException:
        print(f"fault loop FAILED with seed {seed} (MQSTORE_FAULT_SEED={seed}); faults so far:")
        for line in loop.history:
            print("  ", line)
        raise
    finally:
        for group in groups:
            group.stop()
        if producers is not None:
            producers.stop()
        cluster.stop_all()
