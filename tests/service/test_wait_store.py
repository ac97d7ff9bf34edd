"""A message's WAIT property, honoured per message on every produce path: both forms of our
Produce (client-encoded records and messages), through the embedded suite and the split topology
(the commitlog service's results cross a process boundary), and RocketMQ 5's SendMessage from the
official client. Under SYNC_MASTER without a slave a waiting put is answered SLAVE_NOT_AVAILABLE at
once, so a WAIT=false message beside it shows plainly that it did not wait; under SYNC_FLUSH the
disk is held (a durability observer in this process) so that waiting puts time out."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import prometheus_client
import pytest

from libstore import PutMessageStatus, durability_hooks
from services.client import Admin, OutgoingMessage, Producer
from tests.rocketmq.harness import run_driver
from tests.service.conftest import embedded_options
from tests.service.harness import BrokerGroupCluster, InProcessSuites

OK = PutMessageStatus.PUT_OK


def _mixed(topic: str) -> list[OutgoingMessage]:
    """Three messages: WAIT=false (the client's switch), waiting, and WAIT=FALSE set by hand
    (read as RocketMQ reads booleans: anything but "true" in any case does not wait)."""
    return [
        OutgoingMessage(topic, b"free", wait_store=False),
        OutgoingMessage(topic, b"waits"),
        OutgoingMessage(topic, b"free too", properties={"WAIT": "FALSE"}),
    ]


@pytest.fixture(scope="module", params=["embedded", "split"])
def sync_master(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway over a SYNC_MASTER that has no slave: embedded in this process, or a broker
    group of one member behind a gateway process."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "embedded":
        suites = InProcessSuites()
        try:
            suite = suites.start(embedded_options(root / "data", brokerRole="SYNC_MASTER"))
            suites.wait_ready(suite)
            yield suite.address
        finally:
            suites.close()
    else:
        cluster = BrokerGroupCluster(root / "group", ("a",), master_role="SYNC_MASTER")
        try:
            cluster.start_all()
            yield cluster.gateway
        finally:
            cluster.stop_all()


@pytest.mark.parametrize("encode_records", [True, False], ids=["records", "messages"])
def test_sync_master_answers_each_message_by_its_own_wait(sync_master: str, encode_records: bool) -> None:
    topic = f"WaitMaster{int(encode_records)}"
    with Admin(sync_master) as admin:
        admin.create_topic(topic, 2)
    with Producer(sync_master, encode_records=encode_records, retries=0) as producer:
        res = producer.send_batch(_mixed(topic))
        assert [r.status for r in res] == [OK, PutMessageStatus.SLAVE_NOT_AVAILABLE, OK]
        assert all(r.phy_offset >= 0 and r.msg_id for r in res)  # all three were appended
        alone = producer.send(topic, b"alone", wait_store=False)
        assert alone.all_ok and alone[0].status is OK
        assert producer.send(topic, b"waits")[0].status is PutMessageStatus.SLAVE_NOT_AVAILABLE


@pytest.mark.rocketmq
def test_official_client_sets_wait_as_a_user_property(sync_master: str, tmp_path: Path) -> None:
    """RocketMQ's clients cannot set WAIT as a system property; as a user property it is the
    message's WAIT, as RocketMQ's broker reads it from the properties."""
    topic = "WaitOfficial"
    with Admin(sync_master) as admin:
        admin.create_topic(topic, 2)
    free = run_driver(
        "send",
        {"endpoint": sync_master, "topic": topic, "messages": [{"body": "free", "props": {"WAIT": "false"}}]},
        tmp_path / "free",
    )
    assert not free["errors"] and len(free["ids"]) == 1
    waits = run_driver(
        "send", {"endpoint": sync_master, "topic": topic, "messages": [{"body": "waits"}]}, tmp_path / "waits"
    )
    assert not waits["ids"] and len(waits["errors"]) == 1  # no slave holds it: refused, not silently PUT_OK


def _flush_waits(status: str) -> float:
    """Observations of the SYNC_FLUSH wait histogram with ``status`` in this process so far."""
    count = prometheus_client.REGISTRY.get_sample_value(
        "mqstore_flush_wait_milliseconds_count", {"status": status}
    )
    return count or 0.0


class _HeldSyncs:
    """A durability observer holding every fdatasync of a CommitLog segment until released."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def syncing(self, path: Path, start: int = 0, end: int = -1) -> object:
        if path.parent.name == "commitlog":
            self.release.wait(30)
        return None

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args: None


@pytest.mark.parametrize("encode_records", [True, False], ids=["records", "messages"])
def test_sync_flush_answers_each_message_by_its_own_wait(
    suites: InProcessSuites, tmp_path: Path, encode_records: bool
) -> None:
    options = embedded_options(tmp_path / "data", flushDiskType="SYNC_FLUSH", syncFlushTimeout=400)
    suite = suites.start(options)
    suites.wait_ready(suite)
    topic = "WaitFlush"
    with Admin(suite.address) as admin:
        admin.create_topic(topic, 2)
    held = _HeldSyncs()
    timeouts_before = _flush_waits("FLUSH_DISK_TIMEOUT")
    durability_hooks.install(held)  # type: ignore[arg-type]
    try:
        with Producer(suite.address, encode_records=encode_records, retries=0) as producer:
            res = producer.send_batch(_mixed(topic))
            assert [r.status for r in res] == [OK, PutMessageStatus.FLUSH_DISK_TIMEOUT, OK]
            assert _flush_waits("FLUSH_DISK_TIMEOUT") == timeouts_before + 1  # the flush wait histogram
            started = time.monotonic()
            free = producer.send_batch([OutgoingMessage(topic, b"free", wait_store=False)] * 3)
            assert free.all_ok and time.monotonic() - started < 0.4  # answered with the disk held
    finally:
        held.release.set()
        durability_hooks.install(None)
    with Producer(suite.address, encode_records=encode_records) as producer:
        assert producer.send_batch(_mixed(topic)).all_ok


def test_one_producer_at_a_time_is_answered_right_after_the_round_the_loop_blocked_on(
    suites: InProcessSuites, tmp_path: Path
) -> None:
    """SYNC_FLUSH, one put at a time: the commitlog's event loop, with nothing else to do,
    blocks on the group commit's round and answers at once (ConfirmRelay.waited_flushes), and
    every put answered was flushed by then (the bound raised to 1 s: a busy CI disk's
    fdatasync takes longer than the default 2 ms, and a slower round stops the waits)."""
    options = embedded_options(tmp_path / "data", flushDiskType="SYNC_FLUSH", idleLoopFlushWaitMs=1000)
    suite = suites.start(options)
    suites.wait_ready(suite)
    assert suite.commit_log is not None and suite.commitlog_port is not None
    with Admin(suite.address) as admin:
        admin.create_topic("Alone", 1)
    with Producer(suite.address) as producer:
        for i in range(20):
            res = producer.send_batch([OutgoingMessage("Alone", b"one %d" % i)])
            assert res.all_ok
            assert suite.commit_log.flushed_offset >= res.phy_offsets[0] + res.sizes[0]
    # The flush thread's own 10 ms round may cover a put first; most are the loop's.
    assert suite.commitlog_port.relay.waited_flushes >= 10
