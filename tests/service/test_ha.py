"""Replication between real commitlog processes on 127.0.0.1 (spec sheet §7): byte-identical
slaves, SYNC_MASTER losing no acknowledged message across master kills and a role switch,
SLAVE_NOT_AVAILABLE / FLUSH_SLAVE_TIMEOUT, and consumers reading from the slave while the master
is down."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from pathlib import Path

import grpc
import pytest

from libstore import (
    NotMasterError,
    PutMessageStatus,
    ServiceNotAvailableError,
    decode_message_id,
    decode_record,
)
from services.client import Admin, OutgoingMessage, Producer, PullConsumer
from tests.service.harness import BrokerGroupCluster, CommitLogAdmin, assert_logs_identical, poll_until
from tests.service.test_cli import mqstore


def _slave_in_sync(master: str) -> None:
    with CommitLogAdmin(master) as m:
        m.wait_for(lambda s: len(s.slaves) == 1 and s.slaves[0].in_sync, what="the slave to be in sync")


def _caught_up(master: str, slave: str, timeout_s: float = 60.0) -> int:
    """Wait until the slave holds the master's whole log; return that end offset."""
    with CommitLogAdmin(master) as m, CommitLogAdmin(slave) as s:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            end = m.state().max_offset
            if s.state().max_offset == end:
                return end
            time.sleep(0.1)
        raise AssertionError(f"slave at {s.state().max_offset}, master at {m.state().max_offset}")


class Load:
    """Producer threads on the gateway; keeps every acknowledged (PUT_OK) message's key and
    CommitLog offset, and counts the other outcomes."""

    def __init__(self, gateway: str, topic: str, threads: int = 3, batch: int = 32) -> None:
        self.gateway = gateway
        self.topic = topic
        self.batch = batch
        self.acked: dict[str, tuple[int, int]] = {}
        self.stored_by: dict[str, str] = {}  # key -> "ip:port" of the member that acknowledged it
        self.statuses: dict[str, int] = {}
        self.errors = 0
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._seq = 0
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def _run(self, n: int) -> None:
        with Producer(self.gateway, timeout_s=5, retries=2) as producer:
            i = 0
            while not self._stop.is_set():
                keys = [f"t{n}-{i + j}" for j in range(self.batch)]
                i += self.batch
                try:
                    results = producer.send_batch(
                        [OutgoingMessage(self.topic, k.encode() * 20, keys=[k]) for k in keys]
                    )
                except Exception:
                    with self._lock:
                        self.errors += 1
                    time.sleep(0.05)
                    continue
                with self._lock:
                    name = results.status.name
                    self.statuses[name] = self.statuses.get(name, 0) + 1
                    if results.status is PutMessageStatus.PUT_OK:
                        parts = decode_message_id(results[0].msg_id)
                        for k, off, size in zip(keys, results.phy_offsets, results.sizes, strict=False):
                            self.acked[k] = (off, size)
                            self.stored_by[k] = f"{parts.ip}:{parts.port}"
                    self._lock.notify_all()

    def wait_acked(self, more: int, timeout_s: float = 30.0) -> None:
        with self._lock:
            target = len(self.acked) + more
            assert self._lock.wait_for(lambda: len(self.acked) >= target, timeout_s), (
                f"no progress: {len(self.acked)} acked, statuses {self.statuses}, {self.errors} errors"
            )

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def snapshot(self) -> dict[str, tuple[int, int]]:
        with self._lock:
            return dict(self.acked)


def _assert_held(address: str, acked: dict[str, tuple[int, int]]) -> None:
    """Every acknowledged message is in the log at ``address`` at its offset."""
    keys = sorted(acked)
    with CommitLogAdmin(address) as log:
        for start in range(0, len(keys), 2000):
            chunk = keys[start : start + 2000]
            raws = log.read([acked[k] for k in chunk])
            for key, raw in zip(chunk, raws, strict=True):
                assert raw, f"acknowledged message {key} at {acked[key]} is not on {address}"
                assert decode_record(raw).keys == [key], f"{address} holds another message at {acked[key]}"


def test_slave_is_byte_identical_after_load(tmp_path: Path):
    cluster = BrokerGroupCluster(tmp_path / "g", master_role="ASYNC_MASTER")
    try:
        cluster.start_all()
        with Admin(cluster.gateway) as admin:
            admin.create_topic("Copied", 4, retention_hours=100)
            admin.create_topic("Gone", 1)
        with Producer(cluster.gateway) as producer:
            assert producer.send_batch([OutgoingMessage("Gone", b"x" * 100) for _ in range(10)]).all_ok
        with Admin(cluster.gateway) as admin:
            assert admin.delete_topic("Gone")
        load = Load(cluster.gateway, "Copied", threads=4, batch=64).start()
        deadline = time.monotonic() + 60
        with CommitLogAdmin(cluster.address("a")) as master:
            while master.state().max_offset < 3 * 8 * 1024 * 1024 and time.monotonic() < deadline:
                time.sleep(0.2)  # at least three segments (8 MiB each in tests)
        load.stop()
        end = _caught_up(cluster.address("a"), cluster.address("b"))
        with CommitLogAdmin(cluster.address("b")) as slave:
            state = slave.state()
            assert state.broker_role == "SLAVE" and state.master_connected and state.epoch == 1000
            assert [(e.epoch, e.start_offset) for e in state.epochs] == [(1000, 0)]  # term 1, broker 0
        with CommitLogAdmin(cluster.address("a")) as master:
            (seen,) = master.state().slaves
            assert seen.ack_offset == end and seen.lag_bytes == 0 and seen.in_sync
        _assert_held(cluster.address("b"), load.snapshot())
        cluster.stop_all()
        assert assert_logs_identical(cluster.commitlog_files("a"), cluster.commitlog_files("b"), end) >= 3
        topics = json.loads((tmp_path / "g" / "b" / "commitlog" / "config" / "topics.json").read_text())
        assert [t["topic_name"] for t in topics["topics"]] == ["Copied"], "the slave has the master's topics"
        master_topics = json.loads(
            (tmp_path / "g" / "a" / "commitlog" / "config" / "topics.json").read_text()
        )
        assert topics["topics"][0]["retention_hours"] == 100
        assert topics["deleted"] == master_topics["deleted"] and topics["deleted"]["Gone"] > 0
        summaries = tmp_path / "g" / "b" / "commitlog" / "segmentsummary"
        assert len(list(summaries.glob("*.json"))) >= 3  # the slave keeps its own, for its own cleanup
    finally:
        cluster.stop_all()


@pytest.mark.crash
@pytest.mark.slow
def test_sync_master_survives_kills_and_a_role_switch(tmp_path: Path):
    cluster = BrokerGroupCluster(tmp_path / "g", master_role="SYNC_MASTER", flush="ASYNC_FLUSH")
    rng = random.Random(7)
    try:
        cluster.start_all()
        _slave_in_sync(cluster.address("a"))
        with Admin(cluster.gateway) as admin:
            admin.create_topic("Safe", 4)
        load = Load(cluster.gateway, "Safe").start()
        for _ in range(5):
            load.wait_acked(300)
            time.sleep(rng.uniform(0.0, 0.8))
            cluster.kill("a-commitlog")  # SIGKILL at a random moment under load
            _assert_held(cluster.address("b"), load.snapshot())
            cluster.start_commitlog("a")
            cluster.wait_serving(["a-commitlog"])
        load.wait_acked(300)

        # The slave stalls, the master keeps appending what it cannot acknowledge, then dies.
        cluster.signal("b-commitlog", signal.SIGSTOP)
        time.sleep(1.5)
        cluster.kill("a-commitlog")
        cluster.signal("b-commitlog", signal.SIGCONT)
        acked_before_switch = load.snapshot()
        _assert_held(cluster.address("b"), acked_before_switch)
        with CommitLogAdmin(cluster.address("b")) as b:
            b.wait_for(lambda s: not s.master_connected, what="b to notice the master is gone")
            promoted = b.promote("ASYNC_MASTER")
            assert promoted.broker_role == "ASYNC_MASTER"
            # Term 1 at the first start, a new one at each of the 5 restarts (broker 0), one for the
            # promotion (broker 1): epoch = term * 1000 + broker id.
            assert [e.epoch for e in promoted.epochs] == [1000, 2000, 3000, 4000, 5000, 6000, 7001]
            assert promoted.epoch == 7001
            switch_offset = promoted.epochs[-1].start_offset
            history = [(e.epoch, e.start_offset) for e in promoted.epochs]
        load.wait_acked(500, timeout_s=60)  # producing goes on, on the new master

        cluster.start_commitlog("a")  # configured SYNC_MASTER: finds the newer master, rejoins as SLAVE
        with CommitLogAdmin(cluster.address("a")) as a:
            state = a.wait_for(
                lambda s: s.broker_role == "SLAVE" and s.master_connected and s.epoch == 7001,
                timeout_s=60,
                what="the old master to rejoin as a slave",
            )
            assert [(e.epoch, e.start_offset) for e in state.epochs] == history
        load.wait_acked(300)
        load.stop()
        end = _caught_up(cluster.address("b"), cluster.address("a"))
        acked = load.snapshot()
        _assert_held(cluster.address("b"), acked)
        _assert_held(cluster.address("a"), acked)
        generation = json.loads(
            (tmp_path / "g" / "a" / "commitlog" / "config" / "logGeneration.json").read_text()
        )
        assert any(offset == switch_offset for _, offset in generation["cuts"]), (
            f"the old master did not cut its tail back to {switch_offset}: {generation}"
        )
        assert load.statuses.get("FLUSH_SLAVE_TIMEOUT", 0) > 0, load.statuses
        cluster.stop_all()
        assert_logs_identical(cluster.commitlog_files("a"), cluster.commitlog_files("b"), end)
    finally:
        cluster.stop_all()


def test_slave_not_available_and_flush_slave_timeout(tmp_path: Path):
    cluster = BrokerGroupCluster(
        tmp_path / "g", master_role="SYNC_MASTER", store={"haHousekeepingInterval": 3000}
    )
    msg = [OutgoingMessage("Waits", b"x" * 512)]
    try:
        cluster.start_all()
        _slave_in_sync(cluster.address("a"))
        shown = mqstore("ha", "state", "-c", cluster.address("a"))
        assert (
            shown.returncode == 0 and "SYNC_MASTER" in shown.stdout and cluster.address("b") in shown.stdout
        )
        with Producer(cluster.gateway, retries=0) as producer:
            assert producer.send_batch(msg).status is PutMessageStatus.PUT_OK

            cluster.signal("b-commitlog", signal.SIGSTOP)  # connected, but acknowledges nothing
            t0 = time.monotonic()
            assert producer.send_batch(msg).status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
            assert 0.9 <= time.monotonic() - t0 < 5, "slaveTimeout is 1000 ms in this test"
            with CommitLogAdmin(cluster.address("a")) as a:  # silent for haHousekeepingInterval: dropped
                a.wait_for(lambda s: not s.slaves, timeout_s=15, what="the master to drop the silent slave")
            assert producer.send_batch(msg).status is PutMessageStatus.SLAVE_NOT_AVAILABLE
            cluster.signal("b-commitlog", signal.SIGCONT)  # it reconnects by itself
            _slave_in_sync(cluster.address("a"))
            assert producer.send_batch(msg).status is PutMessageStatus.PUT_OK

            cluster.kill("b-commitlog")  # no slave at all
            with CommitLogAdmin(cluster.address("a")) as a:
                a.wait_for(lambda s: not s.slaves, what="the master to drop the slave")
            t0 = time.monotonic()
            assert producer.send_batch(msg).status is PutMessageStatus.SLAVE_NOT_AVAILABLE
            assert time.monotonic() - t0 < 0.9, "SLAVE_NOT_AVAILABLE is immediate"

            cluster.start_commitlog("b")
            _slave_in_sync(cluster.address("a"))
            assert producer.send_batch(msg).status is PutMessageStatus.PUT_OK
        with CommitLogAdmin(cluster.address("b")) as slave, pytest.raises(NotMasterError):
            slave.append("Waits", b"refused")  # a slave's commitlog refuses writes
    finally:
        cluster.stop_all()


@pytest.mark.crash
def test_consumers_read_from_the_slave_while_the_master_is_down(tmp_path: Path):
    cluster = BrokerGroupCluster(tmp_path / "g", master_role="SYNC_MASTER")
    try:
        cluster.start_all(derived=True)
        _slave_in_sync(cluster.address("a"))
        with Admin(cluster.gateway) as admin:
            admin.create_topic("Readable", 4)
        with Producer(cluster.gateway) as producer:
            for start in range(0, 4000, 200):
                batch = [
                    OutgoingMessage("Readable", b"m%d" % i, keys=[f"m{i}"]) for i in range(start, start + 200)
                ]
                assert producer.send_batch(batch).status is PutMessageStatus.PUT_OK
        with PullConsumer(cluster.gateway, "readers", "Readable", batch_size=256) as consumer:
            got = poll_until(consumer, 1500, timeout_s=60)
            assert len(got) >= 1500, f"only {len(got)} of 1500 messages consumed from the master in 60 s"
            consumer.commit()
        for svc in ("commitlog", "dispatch", "index"):
            cluster.kill(f"a-{svc}")  # the whole master member is gone
        with PullConsumer(cluster.gateway, "readers", "Readable", batch_size=256) as consumer:
            got += poll_until(consumer, 4000 - len(got), timeout_s=60)
            consumer.commit()
        bodies = sorted(r.body for r in got)
        assert len(bodies) >= 4000 and set(bodies) == {b"m%d" % i for i in range(4000)}
        with Admin(cluster.gateway) as admin:
            assert [h.body for h in admin.query_by_key("Readable", "m3999")] == [b"m3999"]
            progress = admin.consumer_progress("readers", "Readable")
            assert progress.total_lag == 0, "offsets committed while the master is down are kept"
            with pytest.raises(ServiceNotAvailableError, match="no master of this broker group") as refused:
                admin.create_topic("NoMaster", 1)
            assert type(refused.value) is ServiceNotAvailableError
    finally:
        cluster.stop_all()


def test_forced_promotion_fences_the_old_master(tmp_path: Path):
    cluster = BrokerGroupCluster(tmp_path / "g", master_role="ASYNC_MASTER")
    try:
        cluster.start_all()
        _slave_in_sync(cluster.address("a"))
        load = Load(cluster.gateway, "Fenced", threads=2).start()
        load.wait_acked(300)
        cluster.signal("a-commitlog", signal.SIGSTOP)  # the master hangs: alive, but silent
        before = load.snapshot()
        with CommitLogAdmin(cluster.address("b")) as b:
            with pytest.raises(grpc.RpcError) as refused:
                b.promote()  # still connected to its master: a switch needs --force
            assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            promoted = b.promote(force=True)
            assert promoted.broker_role == "ASYNC_MASTER" and promoted.epoch == 2001
            switch_offset = promoted.epochs[-1].start_offset
        cluster.signal("a-commitlog", signal.SIGCONT)
        with CommitLogAdmin(cluster.address("a")) as a:
            a.wait_for(
                lambda s: s.broker_role == "SLAVE" and s.master_connected and s.epoch == 2001,
                timeout_s=30,
                what="the old master to see the newer epoch and step down",
            )
        load.wait_acked(300)  # the gateway found the new master
        load.stop()
        end = _caught_up(cluster.address("b"), cluster.address("a"))
        acked = load.snapshot()
        by_b = {k: v for k, v in acked.items() if load.stored_by[k] == cluster.address("b")}
        by_a = {k: v for k, v in acked.items() if k not in by_b}
        assert by_b and set(before) <= set(by_a)
        # ASYNC_MASTER: what the old master acknowledged but never shipped (past the switch
        # offset, including what it took after it resumed and before it saw the new epoch) is
        # gone, as in RocketMQ; everything it had shipped, and all the new master took, is kept.
        _assert_held(cluster.address("b"), {k: v for k, v in by_a.items() if v[0] < switch_offset})
        _assert_held(cluster.address("b"), by_b)
        _assert_held(cluster.address("a"), by_b)
        cluster.stop_all()
        assert_logs_identical(cluster.commitlog_files("a"), cluster.commitlog_files("b"), end)
    finally:
        cluster.stop_all()
