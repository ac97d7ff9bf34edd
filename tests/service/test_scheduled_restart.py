"""Held messages and open transactions are store state: they survive a restart of the suite
(the timer's work list and the transaction check list are rebuilt from the timer, half and op
queues; services.dispatch.timer and services.dispatch.transaction)."""

from __future__ import annotations

import time
from pathlib import Path

import grpc

from services.client import Admin, Producer, PullConsumer
from services.gateway.rocketmq.pb import Code, definition, service, service_grpc
from tests.service.conftest import embedded_options
from tests.service.harness import InProcessSuites, poll_until


def _half(addr: str, topic: str, message_id: str) -> str:
    """Send a transactional (half) message over the RocketMQ 5 protocol; its transaction id."""
    with grpc.insecure_channel(addr) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        msg = definition.Message(
            topic=definition.Resource(name=topic),
            body=b"pending-payment",
            system_properties=definition.SystemProperties(
                message_id=message_id, message_type=definition.TRANSACTION
            ),
        )
        reply = stub.SendMessage(service.SendMessageRequest(messages=[msg]), timeout=10)
        assert reply.status.code == Code.OK, reply.status
        return reply.entries[0].transaction_id


def _end(addr: str, topic: str, message_id: str, transaction_id: str) -> int:
    with grpc.insecure_channel(addr) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        request = service.EndTransactionRequest(
            topic=definition.Resource(name=topic),
            message_id=message_id,
            transaction_id=transaction_id,
            resolution=definition.COMMIT,
            source=definition.SOURCE_CLIENT,
        )
        return stub.EndTransaction(request, timeout=10).status.code


def test_held_messages_and_open_transactions_survive_a_restart(tmp_path: Path) -> None:
    suites = InProcessSuites()
    # SYNC_FLUSH: appends wait for the group commit, so racing ends really interleave.
    options = embedded_options(tmp_path / "data", flushDiskType="SYNC_FLUSH")
    try:
        suite = suites.start(options)
        suites.wait_ready(suite)
        addr = suite.address
        with Admin(addr) as admin:
            admin.create_topic("Reminders", 2)
            admin.create_topic("Payments", 2, message_type="TRANSACTION")
        due_ms = time.time_ns() // 1_000_000 + 4000  # 3 s after "early": room for a slow machine
        with Producer(addr) as producer:
            assert producer.send("Reminders", b"early", deliver_at_ms=due_ms - 3000).all_ok
            assert producer.send("Reminders", b"after-restart", deliver_at_ms=due_ms).all_ok
        mid = "01AC00000000000000000000000000F1"
        tid = _half(addr, "Payments", mid)
        with PullConsumer(addr, "r", "Reminders") as consumer:
            assert [m.body for m in poll_until(consumer, 1, timeout_s=10)] == [b"early"]
            consumer.commit()
        suites.stop(suite)

        suite = suites.start(options)
        suites.wait_ready(suite)
        addr = suite.address
        with PullConsumer(addr, "r", "Reminders") as consumer:
            got = poll_until(consumer, 1, timeout_s=15)
            assert [m.body for m in got] == [b"after-restart"]
            assert got[0].store_timestamp >= due_ms
            assert consumer.poll(1500) == []  # delivered once: "early" is not delivered again
        assert _end(addr, "Payments", mid, tid) == Code.OK  # the half message is still there
        assert _end(addr, "Payments", mid, tid) == Code.OK  # ending twice is harmless
        with PullConsumer(addr, "p", "Payments") as consumer:
            paid = poll_until(consumer, 1, timeout_s=10)
            assert [m.body for m in paid] == [b"pending-payment"]
            assert consumer.poll(1000) == []  # committed once
        assert _end(addr, "Payments", mid, "t1:99:0:40") == Code.INVALID_TRANSACTION_ID
        assert _end(addr, "Payments", "", tid) == Code.INVALID_TRANSACTION_ID  # the message id is required

        # Ends racing each other (a retry, a late checker answer) resolve a transaction once.
        mid2 = "01AC00000000000000000000000000F2"
        tid2 = _half(addr, "Payments", mid2)
        assert _end(addr, "Other", mid2, tid2) == Code.INVALID_TRANSACTION_ID  # not that topic's
        with grpc.insecure_channel(addr) as channel:
            stub = service_grpc.MessagingServiceStub(channel)
            calls = [
                stub.EndTransaction.future(
                    service.EndTransactionRequest(
                        topic=definition.Resource(name="Payments"),
                        message_id=mid2,
                        transaction_id=tid2,
                        resolution=definition.ROLLBACK if i % 2 else definition.COMMIT,
                        source=definition.SOURCE_CLIENT,
                    ),
                    timeout=10,
                )
                for i in range(6)
            ]
            assert [c.result().status.code for c in calls] == [Code.OK] * 6
        with PullConsumer(addr, "ops", "RMQ_SYS_TRANS_OP_HALF_TOPIC") as ops:
            resolutions = poll_until(ops, None, timeout_s=5, idle_s=1.5)
        half_offsets = [int(m.body) for m in resolutions]
        assert len(half_offsets) == len(set(half_offsets)) == 2  # one op record per transaction
    finally:
        suites.close()
