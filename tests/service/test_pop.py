"""The pop model on the dispatch service (services.dispatch.pop), through its port in an
embedded suite: a held receive wakes when a change of invisible time makes a message visible
sooner; a receive whose caller goes away after messages were taken for it gives them back
(retries and the DLQ are covered through the official client, test_rocketmq_client)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import grpc

from services.client import Producer
from services.gateway.rocketmq.pb import Code, service_grpc
from services.serve import Suite
from tests.service.harness import InProcessSuites, v2_receive_request


def test_a_held_pop_wakes_when_a_message_is_made_visible_sooner(
    suites: InProcessSuites, embedded: Suite
) -> None:
    """A receive held on an empty topic computed its hold from the in-flight message's 60 s
    invisible time; a change of that time to 200 ms must wake it (a push consumer's nack)."""
    with Producer(embedded.address) as producer:
        assert producer.send("Nacked", b"retry me", queue_id=0).all_ok
    assert embedded.dispatch_app is not None
    port = embedded.dispatch_app.port
    polling = embedded.dispatch_app.long_polling

    async def scenario() -> tuple[int, int, float]:
        (first,) = (await port.pop("g", "Nacked", -1, invisible_ms=60_000, wait_ms=5_000)).messages
        held = asyncio.create_task(port.pop("g", "Nacked", -1, invisible_ms=60_000, wait_ms=20_000))
        deadline = time.monotonic() + 20
        while polling.waiting < 1:  # until the second pop is held (until 60 s from the first)
            assert time.monotonic() < deadline and not held.done(), "the second pop was not held"
            await asyncio.sleep(0.01)
        changed = time.monotonic()
        await port.change_invisible("g", "Nacked", first.receipt_handle, 200)
        (again,) = (await held).messages
        return first.attempt, again.attempt, time.monotonic() - changed

    first, again, waited_s = suites.loop.run(scenario(), 60)
    assert (first, again) == (1, 2)
    # Woken, not found by the hold's final look: un-woken, it would return after its 20 s.
    assert waited_s < 10, waited_s


def test_a_pop_cancelled_after_taking_messages_gives_them_back(
    suites: InProcessSuites, embedded: Suite
) -> None:
    """The caller of a pop goes away (its receive is cancelled) while the pop waits for its
    journal record, after the messages were taken: they come back after 1 s (RocketMQ's
    proxy's nack of a delivery it could not write), not after their 60 s invisible time."""
    with Producer(embedded.address) as producer:
        assert producer.send("Cut", b"taken then dropped", queue_id=0).all_ok
    assert embedded.dispatch_app is not None
    port = embedded.dispatch_app.port
    journal = port.pop_service.journal
    original = journal.commit

    async def scenario() -> tuple[int, int]:
        committed = asyncio.Event()
        calls = 0

        async def slow_commit(**kwargs: Any) -> None:
            nonlocal calls
            calls += 1
            await original(**kwargs)
            if calls == 1:  # the pop's own record: appended, but its caller is still waiting
                committed.set()
                await asyncio.sleep(60)

        journal.commit = slow_commit  # type: ignore[method-assign]
        try:
            cut = asyncio.create_task(port.pop("g", "Cut", -1, invisible_ms=60_000))
            await committed.wait()
            cut.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await cut
        finally:
            del journal.commit  # back to the class's method
        again = (await port.pop("g", "Cut", -1, invisible_ms=60_000, wait_ms=20_000)).messages
        return len(again), again[0].attempt if again else 0

    count, attempt = suites.loop.run(scenario(), 60)
    assert (count, attempt) == (1, 2), "the dropped delivery stayed hidden for its 60 s"


def test_a_receive_cancelled_by_its_client_while_answering_gives_the_messages_back(
    suites: InProcessSuites, embedded: Suite
) -> None:
    """A RocketMQ 5 receive popped a message and is reading it from the CommitLog when its
    client cancels the call: the gateway gives the message back (visible again in 1 s), so
    the next receive of the group gets it (attempt 2) well before its 60 s invisible time."""
    with Producer(embedded.address) as producer:
        assert producer.send("Dropped", b"never written", queue_id=0).all_ok
    messaging = embedded.messaging
    assert messaging is not None
    reading = threading.Event()
    original = messaging.ctx.commitlog.read

    async def stuck_read(ranges: Any) -> Any:
        reading.set()
        await asyncio.sleep(60)
        return await original(ranges)

    messaging.ctx.commitlog.read = stuck_read  # type: ignore[method-assign]
    try:
        with grpc.insecure_channel(embedded.address) as channel:
            stub = service_grpc.MessagingServiceStub(channel)
            call = stub.ReceiveMessage(
                v2_receive_request("Dropped", "droppers", invisible_ms=60_000, wait_ms=0), timeout=60
            )
            assert reading.wait(30), "the receive never reached its CommitLog read"
            call.cancel()
    finally:
        del messaging.ctx.commitlog.read
    with grpc.insecure_channel(embedded.address) as channel:
        stub = service_grpc.MessagingServiceStub(channel)
        replies = list(
            stub.ReceiveMessage(
                v2_receive_request("Dropped", "droppers", invisible_ms=30_000, wait_ms=20_000), timeout=40
            )
        )
    assert replies[0].status.code == Code.OK, replies[0].status
    delivered = [r.message for r in replies if r.HasField("message")]
    assert [(m.body, m.system_properties.delivery_attempt) for m in delivered] == [(b"never written", 2)]
