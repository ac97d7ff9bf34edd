"""services.commitlog.append_coalescer: concurrent message-form appends of a lane go in one
Append call, each caller answered with its own messages' results; refusals reach only the
caller they concern; what must not wait for others goes alone. Driven by a stand-in for the
Append call that holds each call until the test lets it return."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from libstore import (
    MessageIllegalError,
    PutMessageResults,
    PutMessageStatus,
    ServiceNotAvailableError,
    StoreError,
)
from libstore.errors import SystemBusyError
from services.commitlog.append_coalescer import AppendCoalescer
from services.proto import common_pb


def _msg(topic: str = "T", body: bytes = b"x", **props: str) -> common_pb.Message:
    return common_pb.Message(topic=topic, body=body, queue_id=0, properties=props)


class _Log:
    """Stands in for the Append call: records each call's messages and answers with
    consecutive offsets (records of 100 bytes) once ``release()`` lets it return."""

    def __init__(self) -> None:
        self.calls: list[list[bytes]] = []
        self.gates: list[asyncio.Event] = []
        self.refuse: set[bytes] = set()  # a call holding one of these bodies is refused whole
        self.fail: Exception | None = None
        self.next_offset = 0

    async def send(self, messages: list[common_pb.Message], expected_epoch: int) -> PutMessageResults:
        self.calls.append([m.body for m in messages])
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        if self.fail is not None:
            raise self.fail
        bad = [m.body for m in messages if m.body in self.refuse]
        if bad:
            raise MessageIllegalError(f"bad message {bad[0]!r}")
        n = len(messages)
        start = self.next_offset
        self.next_offset += 100 * n
        results = PutMessageResults(
            n,
            phy_offsets=[start + 100 * i for i in range(n)],
            sizes=[100] * n,
            queue_offsets=[start // 100 + i for i in range(n)],
            store_timestamp=7,
            in_log_order=True,
        )
        return results

    async def release(self, index: int) -> None:
        while len(self.gates) <= index:
            await asyncio.sleep(0)
        self.gates[index].set()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _behind_first(
    co: AppendCoalescer, *calls: list[common_pb.Message]
) -> tuple[asyncio.Future[PutMessageResults], list[asyncio.Future[PutMessageResults]]]:
    """A first append (body b"a") sent at once, then ``calls`` made while it is in flight."""
    first = asyncio.ensure_future(co.append([_msg(body=b"a")]))
    await _settle()
    queued = [asyncio.ensure_future(co.append(c)) for c in calls]
    await _settle()
    return first, queued


def _bodies(*bodies: bytes) -> list[list[common_pb.Message]]:
    return [[_msg(body=b)] for b in bodies]


def test_appends_made_while_one_is_in_flight_go_together_each_answered_with_its_own() -> None:
    async def scenario() -> None:
        log = _Log()
        co = AppendCoalescer(log.send)
        first = asyncio.ensure_future(co.append([_msg(body=b"a")]))
        await _settle()
        assert log.calls == [[b"a"]]  # sent at once, alone
        rest = [asyncio.ensure_future(co.append([_msg(body=b)])) for b in (b"b", b"c")]
        pair = asyncio.ensure_future(co.append([_msg(body=b"d"), _msg(body=b"e")]))
        await _settle()
        assert log.calls == [[b"a"]]  # the others wait for the call in flight
        await log.release(0)
        await _settle()
        assert log.calls == [[b"a"], [b"b", b"c", b"d", b"e"]]  # then go together, in order
        await log.release(1)
        results = [await first, *[await r for r in rest], await pair]
        assert [r.phy_offsets for r in results] == [[0], [100], [200], [300, 400]]
        assert [r.queue_offsets for r in results] == [[0], [1], [2], [3, 4]]
        assert all(r.all_ok and r.store_timestamp == 7 for r in results)
        assert (co.calls, co.coalesced) == (2, 1)
        later = asyncio.ensure_future(co.append([_msg(body=b"f")]))
        await _settle()
        assert log.calls[-1] == [b"f"]  # the lane is free again: sent at once
        await log.release(2)
        assert (await later).phy_offsets == [500]

    asyncio.run(scenario())


def test_a_refused_coalesced_call_is_sent_again_per_caller_so_only_the_bad_one_fails() -> None:
    async def scenario() -> None:
        log = _Log()
        log.refuse = {b"bad"}
        co = AppendCoalescer(log.send)
        first, queued = await _behind_first(co, *_bodies(b"b", b"bad", b"c"))
        for i in range(5):
            await log.release(i)
        await first
        assert log.calls[1] == [b"b", b"bad", b"c"]
        assert sorted(log.calls[2:]) == [[b"b"], [b"bad"], [b"c"]]
        assert (await queued[0]).all_ok and (await queued[2]).all_ok
        with pytest.raises(MessageIllegalError):
            await queued[1]

    asyncio.run(scenario())


def test_a_failure_that_is_not_a_refusal_reaches_every_caller_of_the_call() -> None:
    async def scenario() -> None:
        log = _Log()
        co = AppendCoalescer(log.send)
        first, queued = await _behind_first(co, *_bodies(b"b", b"c"))
        await log.release(0)
        await first
        log.fail = ServiceNotAvailableError("commitlog gone")
        await log.release(1)
        for q in queued:
            with pytest.raises(ServiceNotAvailableError):
                await q
        assert len(log.calls) == 2  # not sent again: it may have been appended

    asyncio.run(scenario())


def test_what_must_not_wait_for_others_goes_alone_and_topics_do_not_wait_for_each_other() -> None:
    async def scenario() -> None:
        log = _Log()
        co = AppendCoalescer(log.send)
        tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(co.append([_msg(body=b"a")]))]
        await _settle()
        alone = [
            [_msg(body=b"nowait", WAIT="false")],
            [_msg(body=b"transient", DURABILITY="1")],
            [_msg(body=b"two-topics"), _msg(topic="U", body=b"u")],
            [_msg(topic="U", body=b"other-topic")],
            [_msg(body=b"delayed", DELAY="3")],  # held in the (persistent) timer topic
        ]
        tasks += [asyncio.ensure_future(co.append(m)) for m in alone]
        await _settle()
        # All sent at once, none behind topic T's call in flight nor with each other.
        assert log.calls == [
            [b"a"],
            [b"nowait"],
            [b"transient"],
            [b"two-topics", b"u"],
            [b"other-topic"],
            [b"delayed"],
        ]
        waits = asyncio.ensure_future(co.append([_msg(body=b"waits", WAIT="true")]))
        await _settle()
        assert len(log.calls) == 6  # WAIT=true is the default: it queues in topic T's lane
        for i in range(7):
            await log.release(i)
        await asyncio.gather(*tasks, waits)
        assert log.calls[6] == [b"waits"]

    asyncio.run(scenario())


def test_a_caller_cancelled_while_queued_is_never_sent_and_bounds_split_the_queue() -> None:
    async def scenario() -> None:
        log = _Log()
        co = AppendCoalescer(log.send, max_messages=3)
        bodies = (b"b", b"gone", b"c", b"d", b"e")
        first, calls = await _behind_first(co, *_bodies(*bodies))
        queued = dict(zip(bodies, calls, strict=True))
        queued[b"gone"].cancel()
        await _settle()
        for i in range(3):
            await log.release(i)
        await first
        for b, q in queued.items():
            if b != b"gone":
                assert (await q).all_ok
        assert log.calls == [[b"a"], [b"b", b"c", b"d"], [b"e"]]
        assert queued[b"gone"].cancelled()

    asyncio.run(scenario())


def test_part_answers_a_slice_of_a_batch_as_a_batch_of_its_own() -> None:
    results = PutMessageResults(
        5,
        phy_offsets=[0, 100, 200],
        sizes=[100, 100, 100],
        queue_offsets=[10, 11, 12],
        store_timestamp=9,
        failed_status=PutMessageStatus.CREATE_MAPPED_FILE_FAILED,
        unwaited=frozenset({1, 2}),
    )
    results.status = PutMessageStatus.FLUSH_DISK_TIMEOUT
    head, middle, tail = results.part(0, 1), results.part(1, 4), results.part(4, 5)
    assert head.appended == 1 and head[0].status is PutMessageStatus.FLUSH_DISK_TIMEOUT
    assert middle.appended == 2 and middle.phy_offsets == [100, 200] and middle.unwaited == {0, 1}
    assert [r.status for r in middle] == [
        PutMessageStatus.PUT_OK,  # not waited for: OK once appended
        PutMessageStatus.PUT_OK,
        PutMessageStatus.CREATE_MAPPED_FILE_FAILED,  # the batch stopped before it
    ]
    assert tail.appended == 0 and len(tail) == 1
    assert tail[0].status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED
    assert middle.store_timestamp == 9 and middle.next_offset == 300
    with pytest.raises(ValueError):
        results.part(3, 6)


def test_a_message_sent_again_while_queued_goes_in_a_later_call_and_push_back_reaches_all() -> None:
    async def scenario() -> None:
        log = _Log()
        co = AppendCoalescer(log.send)
        keyed = ((b"b", "K1"), (b"c", "K2"), (b"b-again", "K1"), (b"d", "K3"))
        first, queued = await _behind_first(co, *[[_msg(body=b, UNIQ_KEY=k)] for b, k in keyed])
        await log.release(0)
        await first
        await _settle()
        # The second K1 would be written twice in one call: it starts the next one instead.
        assert log.calls[1] == [b"b", b"c"]
        log.fail = SystemBusyError("busy", retry_after_ms=10)
        await log.release(1)
        for q in queued[:2]:
            with pytest.raises(SystemBusyError):  # each caller alone would have been pushed back too
                await q
        log.fail = None
        await log.release(2)
        assert log.calls[2] == [b"b-again", b"d"] and len(log.calls) == 3  # nothing sent again
        assert (await queued[2]).all_ok and (await queued[3]).all_ok

    asyncio.run(scenario())


def test_callers_cancelled_before_or_during_a_refused_call_are_not_sent_and_none_hangs() -> None:
    async def scenario() -> None:
        log = _Log()
        log.refuse = {b"bad"}
        co = AppendCoalescer(log.send)
        bodies = (b"b", b"bad", b"gone")
        first, calls = await _behind_first(co, *_bodies(*bodies))
        queued = dict(zip(bodies, calls, strict=True))
        await log.release(0)
        await first
        await _settle()
        assert log.calls[1] == [b"b", b"bad", b"gone"]
        queued[b"gone"].cancel()  # while its call is in flight
        await log.release(1)
        await log.release(2)
        await log.release(3)
        assert (await queued[b"b"]).all_ok
        with pytest.raises(MessageIllegalError):
            await queued[b"bad"]
        assert sorted(log.calls[2:]) == [[b"b"], [b"bad"]]  # the cancelled one is not sent again

        # An answer that does not match the call (a broken peer) fails every caller of it.
        async def short(messages: list[common_pb.Message], epoch: int) -> PutMessageResults:
            await asyncio.sleep(0)
            return PutMessageResults(1, phy_offsets=[0], sizes=[1], queue_offsets=[0])

        co = AppendCoalescer(short)
        tasks = [asyncio.ensure_future(co.append([_msg(body=b)])) for b in (b"x", b"y", b"z")]
        outcomes = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        assert outcomes[0].all_ok  # type: ignore[union-attr]
        assert all(isinstance(o, StoreError) for o in outcomes[1:])

    asyncio.run(scenario())
