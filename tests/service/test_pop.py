"""The pop model on the dispatch service (services.dispatch.pop), through its port in an
embedded suite: a held receive wakes when a change of invisible time makes a message visible
sooner; a receive whose caller goes away after messages were taken for it gives them back
(retries and the DLQ are covered through the official client, test_rocketmq_client)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import grpc

from libstore.errors import ServiceNotAvailableError
from libstore.pop_state import ReceiptHandle
from libstore.system_topics import POP_JOURNAL_TOPIC
from services.client import Producer
from services.gateway.rocketmq.pb import Code, service_grpc
from services.serve import Suite
from tests.service.harness import InProcessSuites, v2_receive_request


@contextlib.contextmanager
def _replaced(owner: Any, name: str, stand_in: Any) -> Iterator[None]:
    """``owner.<name>`` is ``stand_in`` inside the block, its class's method again after."""
    setattr(owner, name, stand_in)
    try:
        yield
    finally:
        delattr(owner, name)


async def _cancel_once(started: asyncio.Event, call: Coroutine[Any, Any, Any]) -> None:
    """Run ``call`` as a task, cancel it once ``started`` is set and wait until it has ended."""
    task = asyncio.create_task(call)
    await started.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


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

        with _replaced(journal, "commit", slow_commit):
            await _cancel_once(committed, port.pop("g", "Cut", -1, invisible_ms=60_000))
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


def _journal_with_messages(embedded: Suite, topic: str, count: int) -> tuple[Any, Any]:
    """(the dispatch port, its pop journal) after ``count`` messages were sent to queue 0 of
    ``topic``."""
    with Producer(embedded.address) as producer:
        for i in range(count):
            assert producer.send(topic, f"m{i}".encode(), queue_id=0).all_ok
    assert embedded.dispatch_app is not None
    port = embedded.dispatch_app.port
    return port, port.pop_service.journal


def test_a_lone_operation_journals_from_its_own_task_and_concurrent_ones_in_one_batch(
    suites: InProcessSuites, embedded: Suite
) -> None:
    """An ack that finds the journal's appender idle appends its record itself (no hand-over
    to the appender task); acks made while an append is under way queue and go in one later
    append by the appender, after it, in the order they were made."""
    port, journal = _journal_with_messages(embedded, "Lone", 6)
    commitlog = journal.commitlog
    original = commitlog.append

    async def scenario() -> list[tuple[str, list[int]]]:
        appends: list[tuple[str, list[int]]] = []
        release = asyncio.Event()

        async def watched(messages: Any, **kwargs: Any) -> Any:
            task = asyncio.current_task()
            name = task.get_name() if task is not None else ""
            appends.append((name, [int(m.properties["POP_SEQ"]) for m in messages]))
            if len(appends) == 1:  # the first ack's own append: hold it while others queue
                await release.wait()
            return await original(messages, **kwargs)

        popped = (await port.pop("g", "Lone", -1, invisible_ms=60_000, max_count=6)).messages
        assert len(popped) == 6
        with _replaced(commitlog, "append", watched):
            first = asyncio.create_task(port.ack("g", "Lone", [popped[0].receipt_handle]), name="ack-0")
            while not appends:
                await asyncio.sleep(0.001)
            rest = [
                asyncio.create_task(port.ack("g", "Lone", [p.receipt_handle]), name=f"ack-{i}")
                for i, p in enumerate(popped[1:], 1)
            ]
            await asyncio.sleep(0.05)
            release.set()
            results = await asyncio.gather(first, *rest)
        assert all(r == [None] for r in results)
        return appends

    appends = suites.loop.run(scenario(), 60)
    (first_task, first_seqs), (later_task, later_seqs) = appends
    assert first_task == "ack-0" and len(first_seqs) == 1  # appended from its own task
    assert later_task == "pop-journal-append" and len(later_seqs) == 5  # queued, one batch
    assert later_seqs == sorted(later_seqs) and later_seqs[0] > first_seqs[0]


def test_an_ack_cancelled_inside_its_own_journal_append_reloads_the_state(
    suites: InProcessSuites, embedded: Suite
) -> None:
    """An ack whose caller goes away while it appends its own journal record leaves it unknown
    whether the record is in the log: the state is reloaded from the log, so an ack the log
    does not hold is not taken as done, and the message can be acked again."""
    with Producer(embedded.address) as producer:
        assert producer.send("Gone", b"ack me twice", queue_id=0).all_ok
    assert embedded.dispatch_app is not None
    port = embedded.dispatch_app.port
    journal = port.pop_service.journal
    commitlog = journal.commitlog

    async def scenario() -> tuple[int, list[object], int]:
        (popped,) = (await port.pop("g", "Gone", -1, invisible_ms=60_000)).messages
        entered = asyncio.Event()

        async def never(messages: Any, **kwargs: Any) -> Any:  # the record never reaches the log
            entered.set()
            await asyncio.sleep(60)

        with _replaced(commitlog, "append", never):
            await _cancel_once(entered, port.ack("g", "Gone", [popped.receipt_handle]))
        await journal.ready()  # reloads the state from the log
        service = port.pop_service
        handle = ReceiptHandle.decode(service.signer.verify("g", "Gone", popped.receipt_handle))
        held = service.state.in_flight("g", "Gone", handle, int(time.time() * 1000))
        again = await port.ack("g", "Gone", [popped.receipt_handle])
        left = await port.pop("g", "Gone", -1, invisible_ms=60_000, wait_ms=0)
        return held.queue_offset, again, len(left.messages)

    offset, again, left = suites.loop.run(scenario(), 60)
    # The lost ack is not in the state: the delivery is still in flight, and acked again.
    assert offset == 0 and again == [None] and left == 0


def test_own_journal_records_are_passed_over_on_arrival_without_waking_the_reader(
    suites: InProcessSuites, embedded: Suite
) -> None:
    """Every ack journals a record that the state already holds: dispatch passes it over as
    it arrives in the journal's queue, instead of waking the reader task for each one (which
    then read the queue again to find nothing to read)."""
    port, journal = _journal_with_messages(embedded, "Own", 20)

    async def scenario() -> tuple[int, int, int, int]:
        popped = (await port.pop("g", "Own", -1, invisible_ms=60_000, max_count=20)).messages
        assert len(popped) == 20
        reads = 0
        original = journal._read_once

        async def counting() -> int:
            nonlocal reads
            reads += 1
            return await original()

        with _replaced(journal, "_read_once", counting):
            for p in popped:  # one at a time, as a client acks: dispatch keeps up in between
                assert await port.ack("g", "Own", [p.receipt_handle]) == [None]
                await asyncio.sleep(0.005)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # until dispatch put the 21 records in the queue
                cq = journal.queues.find(POP_JOURNAL_TOPIC, 0)
                if cq is not None and cq.max_offset_in_queue >= 21:
                    break
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.01)
            left = await port.pop("g", "Own", -1, invisible_ms=60_000, wait_ms=0)
        assert cq is not None
        return reads, journal.state.position.next_unit, cq.max_offset_in_queue, len(left.messages)

    reads, position, end, left = suites.loop.run(scenario(), 60)
    assert position == end  # every record passed over: the pop's and the acks'
    assert left == 0
    # The reader still wakes on its own every few hundred ms; not once per record.
    assert reads <= 3, reads


def test_a_pop_given_back_while_the_state_catches_up_waits_until_it_is_ready(
    suites: InProcessSuites, embedded: Suite
) -> None:
    """A pop's caller goes away while the pop state, reloaded after a failed journal append,
    is still folding in the journal: what the pop took is given back only once the state is
    ready. Given back at once, the change took a seq past the journal records still to fold
    (another delivery, here), which were then passed over as held already: that message was
    delivered a second time while its first delivery was in flight."""
    port, journal = _journal_with_messages(embedded, "Reloaded", 2)
    service = port.pop_service
    original_commit = journal.commit
    original_read = journal._read_once

    async def scenario() -> tuple[list[int], list[tuple[int, int]]]:
        committed = asyncio.Event()

        async def slow_commit(**kwargs: Any) -> None:
            await original_commit(**kwargs)
            committed.set()  # journaled, but its caller is still waiting
            await asyncio.sleep(60)

        with _replaced(journal, "commit", slow_commit):
            dropped = asyncio.create_task(port.pop("g", "Reloaded", -1, invisible_ms=60_000, max_count=1))
            await committed.wait()
        await journal._snapshot()  # holds the first delivery (queue offset 0)
        (second,) = (await port.pop("g", "Reloaded", -1, invisible_ms=60_000, max_count=1)).messages
        release = asyncio.Event()

        async def stalled() -> int:
            await release.wait()
            return await original_read()

        generation = journal._generation
        with _replaced(journal, "_read_once", stalled):
            journal._lost([], ServiceNotAvailableError("an append failed"))  # reload from the snapshot
            readying = asyncio.create_task(journal.ready())
            while journal._generation == generation:  # reloaded; the second delivery not folded yet
                await asyncio.sleep(0.01)
            dropped.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await dropped
            await asyncio.sleep(0.1)
            release.set()
            await asyncio.wait_for(readying, 30)
        while service._background:  # the give-back
            await asyncio.sleep(0.01)
        handle = ReceiptHandle.decode(service.signer.verify("g", "Reloaded", second.receipt_handle))
        service.state.in_flight("g", "Reloaded", handle, int(time.time() * 1000))  # raises if lost
        at_once = await port.pop("g", "Reloaded", -1, invisible_ms=60_000, wait_ms=0)
        back = await port.pop("g", "Reloaded", -1, invisible_ms=60_000, wait_ms=20_000)
        return [m.queue_offset for m in at_once.messages], [
            (m.queue_offset, m.attempt) for m in back.messages
        ]

    at_once, back = suites.loop.run(scenario(), 90)
    assert at_once == [], "a delivery still in flight was delivered again"
    assert back == [(0, 2)]  # the dropped one, given back after the nack's 1 s
