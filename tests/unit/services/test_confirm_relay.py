"""ConfirmRelay (services.commitlog.confirm_relay): SYNC_FLUSH puts answered from the group
commit's rounds on the event loop, tails woken once per move, fail-stop on an fdatasync error;
on a loop with select hooks, an idle loop blocking (boundedly) on a lone put's round."""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import threading
import time
from collections.abc import Callable

import pytest

from libstore import CommitLog, FlushDiskType, Message, PutMessageStatus, StoreIOError
from libstore import mapped_file as mapped_file_module
from services._common import event_loop
from services.commitlog.confirm_relay import ConfirmRelay


class _HeldDisk:
    """fdatasync of CommitLog segments held until released, taking ``delay_s`` longer, or
    failing with EIO; ``threads`` lists the thread of each call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.release.set()
        self.fail = False
        self.delay_s = 0.0
        self.threads: list[int] = []
        real = os.fdatasync

        def fdatasync(fd: int) -> None:
            self.threads.append(threading.get_ident())
            self.release.wait(30)
            time.sleep(self.delay_s)
            if self.fail:
                raise OSError(errno.EIO, "Input/output error")
            real(fd)

        monkeypatch.setattr(mapped_file_module.os, "fdatasync", fdatasync)


@pytest.fixture
def held(open_log: Callable[..., CommitLog], monkeypatch: pytest.MonkeyPatch) -> tuple[CommitLog, _HeldDisk]:
    """A SYNC_FLUSH CommitLog whose fdatasyncs a _HeldDisk controls (a put's own timeout,
    syncFlushTimeout, set far beyond any wait here; the loop's bound on a lone put's round,
    idleLoopFlushWaitMs, 1 s: a real fdatasync on a busy CI disk takes longer than the default
    2 ms, and a round slower than the bound stops the waits this tests)."""
    log = open_log(
        flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout=60_000, idle_loop_flush_wait_ms=1000
    )
    return log, _HeldDisk(monkeypatch)


def _append(log: CommitLog, body: bytes) -> int:
    """Append one message without waiting; the offset just past it."""
    return log.append_messages([Message("TopicR", body, 0)]).results.next_offset


def test_puts_are_answered_in_offset_order_once_the_flush_covers_them(
    held: tuple[CommitLog, _HeldDisk],
) -> None:
    log, disk = held

    async def run() -> None:
        relay = ConfirmRelay(log)
        woken: list[int] = []

        def wake() -> None:
            woken.append(log.flushed_offset)

        relay.subscribe(wake)
        disk.release.clear()
        first = _append(log, b"a")
        second = _append(log, b"b")
        waits = [relay.flushed(second), relay.flushed(first)]  # out of order on purpose
        assert log.request_flush(second)
        await asyncio.sleep(0.2)
        assert not any(w.done() for w in waits) and relay.waiting == 2  # the disk is held
        disk.release.set()
        statuses = await asyncio.wait_for(asyncio.gather(*waits), 10)
        assert statuses == [PutMessageStatus.PUT_OK] * 2
        assert log.flushed_offset >= second and woken and woken[-1] >= second
        assert relay.flushed(first).result() is PutMessageStatus.PUT_OK  # covered: at once
        assert relay.waiting == 0
        relay.unsubscribe(wake)
        seen = len(woken)
        log.request_flush(_append(log, b"c"))
        await asyncio.wait_for(relay.flushed(log.max_offset), 10)
        assert len(woken) == seen  # no longer woken
        relay.close()

    asyncio.run(run())


def test_an_fdatasync_failure_answers_every_waiting_put_at_once(held: tuple[CommitLog, _HeldDisk]) -> None:
    log, disk = held

    async def run() -> None:
        relay = ConfirmRelay(log)
        disk.fail = True
        end = _append(log, b"lost")
        waiting = relay.flushed(end)
        log.request_flush(end)
        # long before syncFlushTimeout (60 s): the failure itself answers
        assert await asyncio.wait_for(waiting, 10) is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert relay.failed and not log.writeable
        assert relay.flushed(end).result() is PutMessageStatus.FLUSH_DISK_TIMEOUT
        relay.close()

    asyncio.run(run())


def test_closing_the_relay_answers_what_still_waits(held: tuple[CommitLog, _HeldDisk]) -> None:
    log, disk = held

    async def run() -> None:
        relay = ConfirmRelay(log)
        disk.release.clear()
        waiting = relay.flushed(_append(log, b"x"))
        relay.close()
        assert waiting.result() is PutMessageStatus.FLUSH_DISK_TIMEOUT
        disk.release.set()

    asyncio.run(run())


def test_an_io_error_outside_the_flush_leaves_puts_waiting_for_it(held: tuple[CommitLog, _HeldDisk]) -> None:
    """A failed append or checkpoint write stops new puts, but the group commit still flushes
    what was appended: the puts waiting for it get PUT_OK, as the group commit says."""
    log, disk = held

    async def run() -> None:
        relay = ConfirmRelay(log)
        disk.release.clear()
        end = _append(log, b"kept")
        waiting = relay.flushed(end)
        log.request_flush(end)
        log._on_io_error(
            StoreIOError("cannot write checkpoint: No space left on device")
        )  # as a checkpoint write does
        await asyncio.sleep(0.1)
        assert not waiting.done() and not relay.failed and not log.writeable
        disk.release.set()
        assert await asyncio.wait_for(waiting, 10) is PutMessageStatus.PUT_OK
        relay.close()

    asyncio.run(run())


class _WaitSpy:
    """Results of every CommitLog.flush_and_wait the relay makes."""

    def __init__(self, log: CommitLog, monkeypatch: pytest.MonkeyPatch) -> None:
        self.results: list[bool] = []
        real = log.flush_and_wait

        def spy(target: int, timeout_s: float) -> bool:
            result = real(target, timeout_s)
            self.results.append(result)
            return result

        monkeypatch.setattr(log, "flush_and_wait", spy)


def _lone_put(log: CommitLog, relay: ConfirmRelay, body: bytes) -> asyncio.Future[PutMessageStatus]:
    """Append one message and wait for its flush as a put does (LocalCommitLog._wait_durable)."""
    end = _append(log, body)
    waiting = relay.flushed(end)
    assert relay.request_flush(end)
    return waiting


def test_an_idle_loop_blocks_on_a_lone_puts_round_and_answers_at_once(
    held: tuple[CommitLog, _HeldDisk],
) -> None:
    log, _ = held

    async def run() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, event_loop.HookedEventLoop)
        relay = ConfirmRelay(log)
        waiting: asyncio.Future[PutMessageStatus] | None = None
        seen = [0, 0]  # (waited rounds, of which the put was answered before the select)

        def check(idle: bool) -> bool:  # runs right after the relay's hook, in the same select
            if relay.waited_flushes > seen[0]:
                seen[0] = relay.waited_flushes
                seen[1] += waiting is not None and waiting.done()
            return False

        loop.add_select_hook(check)
        crossings = relay.crossings
        for i in range(10):
            end = _append(log, b"alone %d" % i)
            waiting = relay.flushed(end)
            relay.request_flush(end)
            assert await asyncio.wait_for(waiting, 10) is PutMessageStatus.PUT_OK
            assert log.flushed_offset >= end and log.checkpoint.flushed_phy_offset >= end
        # The flush thread's own 10 ms round may cover a put first; most are the loop's, and
        # each of those was answered before the loop polled again.
        assert relay.waited_flushes >= 5 and seen == [relay.waited_flushes] * 2, seen
        # A round the loop waited for is delivered by the loop alone: nothing crossed for it.
        assert relay.crossings - crossings <= 10 - relay.waited_flushes
        loop.remove_select_hook(check)
        relay.close()

    event_loop.run(run())


def test_the_loop_does_not_block_when_busy_when_more_puts_wait_or_the_disk_is_slow(
    held: tuple[CommitLog, _HeldDisk], monkeypatch: pytest.MonkeyPatch
) -> None:
    log, disk = held
    waits = _WaitSpy(log, monkeypatch)

    async def run() -> None:
        relay = ConfirmRelay(log)
        loop = asyncio.get_running_loop()
        # Two puts waiting: their callers may send more while the thread flushes.
        ends = [_append(log, b"one"), _append(log, b"two")]
        both = [relay.flushed(end) for end in ends]
        for end in ends:
            relay.request_flush(end)
        assert await asyncio.wait_for(asyncio.gather(*both), 10) == [PutMessageStatus.PUT_OK] * 2
        assert waits.results == []
        # A busy loop (a callback ready at every select) does not block either.
        spinning = True

        def spin() -> None:
            if spinning:
                loop.call_soon(spin)

        spin()
        waiting = _lone_put(log, relay, b"busy")
        assert await asyncio.wait_for(waiting, 10) is PutMessageStatus.PUT_OK
        spinning = False
        assert waits.results == [] and relay.waited_flushes == 0
        # A slow disk: after a 1.2 s round (past idleLoopFlushWaitMs), a lone put is not
        # waited for by the loop until the slowest recent round is back under the bound.
        disk.delay_s = 1.2
        await asyncio.wait_for(_lone_put(log, relay, b"slow"), 10)
        flush_ms = log.group_commit_flush_ms
        assert flush_ms is not None and flush_ms > log.config.idle_loop_flush_wait_ms
        calls = len(waits.results)
        await asyncio.wait_for(_lone_put(log, relay, b"slow, alone"), 10)
        assert len(waits.results) == calls
        relay.close()

    event_loop.run(run())


def test_a_hung_fdatasync_holds_the_loop_no_longer_than_the_bound(
    open_log: Callable[..., CommitLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk hangs in the fdatasync of a lone put's round: the loop blocks for
    idleLoopFlushWaitMs (50 ms here) at most, runs everything else meanwhile, and the put is
    answered when the fdatasync returns."""
    disk = _HeldDisk(monkeypatch)
    log = open_log(
        flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout=60_000, idle_loop_flush_wait_ms=50
    )
    waits = _WaitSpy(log, monkeypatch)

    async def run() -> tuple[float, float]:
        relay = ConfirmRelay(log)
        disk.release.clear()
        waiting = _lone_put(log, relay, b"hung")
        started = time.monotonic()
        await asyncio.sleep(0.2)  # nothing else on the loop: its next select is idle
        slept = time.monotonic() - started
        assert not waiting.done()
        assert waits.results == [False]  # the loop blocked on the round, then gave up
        ticks: list[float] = []

        async def ticker() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0.8)  # the round still hangs: the loop goes on
        assert not waiting.done() and waits.results == [False]
        disk.release.set()
        assert await asyncio.wait_for(waiting, 10) is PutMessageStatus.PUT_OK
        ticking.cancel()
        relay.close()
        return slept, max(b - a for a, b in itertools.pairwise(ticks))

    # A loop held by the hung round would not come back from its 0.2 s sleep until the
    # fdatasync returned (_HeldDisk: 30 s), nor tick every 10 ms meanwhile.
    slept, gap = event_loop.run(run())
    assert slept < 0.6 and gap < 0.5


def test_a_move_made_while_the_loop_waits_is_delivered_when_the_wait_ends(
    open_log: Callable[..., CommitLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread moves the confirm offset (as a slave's acknowledgement does) while the
    loop blocks on a lone put's round, and the round then outlasts the bound: the move was left
    to the loop, which delivers it (wakes the tails) as soon as it gives up waiting."""
    disk = _HeldDisk(monkeypatch)
    log = open_log(
        flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout=60_000, idle_loop_flush_wait_ms=1000
    )
    waits = _WaitSpy(log, monkeypatch)

    async def run() -> None:
        relay = ConfirmRelay(log)
        woken = asyncio.Event()
        relay.subscribe(woken.set)
        disk.release.clear()

        def move() -> None:  # once the round's fdatasync hangs and the idle loop waits on it
            deadline = time.monotonic() + 5
            while not disk.threads and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.05)
            log._notify_confirm(log.confirm_offset)

        mover = threading.Thread(target=move)
        waiting = _lone_put(log, relay, b"held")
        mover.start()
        await asyncio.sleep(1.5)  # nothing else on the loop: its next select is idle
        mover.join()
        assert waits.results == [False] and not waiting.done()  # waited, gave up: still held
        assert woken.is_set() and relay.crossings == 0  # delivered by the loop, nothing crossed
        disk.release.set()
        assert await asyncio.wait_for(waiting, 10) is PutMessageStatus.PUT_OK
        relay.close()

    event_loop.run(run())


def test_a_move_left_to_a_wait_that_fails_is_still_delivered(
    held: tuple[CommitLog, _HeldDisk], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's wait on a round raises after another thread's move was left to it: the move
    is delivered all the same, the put's flush is still asked for, and the error goes to the
    loop's exception handler."""
    log, disk = held

    def failing(target: int, timeout_s: float) -> bool:
        mover = threading.Thread(target=log._notify_confirm, args=(log.confirm_offset,))
        mover.start()
        mover.join()
        raise RuntimeError("the wait failed")

    monkeypatch.setattr(log, "flush_and_wait", failing)

    async def run() -> list[BaseException | None]:
        loop = asyncio.get_running_loop()
        errors: list[BaseException | None] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context.get("exception")))
        relay = ConfirmRelay(log)
        woken = asyncio.Event()
        relay.subscribe(woken.set)
        disk.release.clear()  # no round of the flush thread's own moves anything meanwhile
        waiting = _lone_put(log, relay, b"failing wait")
        await asyncio.sleep(0.3)  # nothing else on the loop: its next select is idle
        assert woken.is_set() and relay.crossings == 0  # delivered by the loop, not crossed
        assert not waiting.done()
        disk.release.set()
        assert await asyncio.wait_for(waiting, 10) is PutMessageStatus.PUT_OK
        relay.close()
        return errors

    errors = event_loop.run(run())
    assert any(isinstance(e, RuntimeError) and str(e) == "the wait failed" for e in errors), errors


def test_a_failed_fdatasync_answers_a_lone_put_at_once(held: tuple[CommitLog, _HeldDisk]) -> None:
    log, disk = held

    async def run() -> None:
        relay = ConfirmRelay(log)
        disk.fail = True
        waiting = _lone_put(log, relay, b"lost")
        assert await asyncio.wait_for(waiting, 10) is PutMessageStatus.FLUSH_DISK_TIMEOUT
        assert relay.failed and not log.writeable and log.flush_failed
        relay.close()

    event_loop.run(run())


@pytest.mark.parametrize(
    "overrides",
    [{}, {"flush_disk_type": FlushDiskType.SYNC_FLUSH, "idle_loop_flush_wait_ms": 0}],
    ids=["async_flush", "bound_at_zero"],
)
def test_no_hook_under_async_flush_or_with_the_bound_at_zero(
    open_log: Callable[..., CommitLog], overrides: dict[str, object]
) -> None:
    log = open_log(**overrides)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, event_loop.HookedEventLoop)
        relay = ConfirmRelay(log)
        end = _append(log, b"x")
        sync_flush = relay.request_flush(end)  # False under ASYNC_FLUSH: nothing to flush for it
        assert sync_flush is (log.group_commit_flush_ms is not None)
        assert not loop._hooked_selector.hooks
        if sync_flush:
            assert await asyncio.wait_for(relay.flushed(end), 10) is PutMessageStatus.PUT_OK
            assert relay.waited_flushes == 0
        relay.close()

    event_loop.run(run())


def test_moves_made_on_the_loop_wake_the_tails_once_after_the_step_that_made_them(
    open_log: Callable[..., CommitLog],
) -> None:
    """ASYNC_FLUSH appends on the loop: the tails are not woken inside the append (the put's
    reply goes first), and the appends of one loop step wake each tail once."""
    log = open_log()

    async def run() -> None:
        relay = ConfirmRelay(log)
        wakes: list[int] = []
        relay.subscribe(lambda: wakes.append(log.confirm_offset))
        ends = [_append(log, b"x") for _ in range(3)]
        assert wakes == []  # nothing ran inside the appends
        await asyncio.sleep(0)
        assert wakes == [ends[-1]]  # one delivery, after the step, seeing all three
        end = _append(log, b"y")
        await asyncio.sleep(0)
        assert wakes == [ends[-1], end]
        relay.close()

    event_loop.run(run())


def test_a_relay_left_open_past_its_loop_neither_raises_nor_sticks(
    open_log: Callable[..., CommitLog], caplog: pytest.LogCaptureFixture
) -> None:
    """Appends on the loop's thread after the loop closed (a relay never closed): nothing is
    waiting, so nothing is scheduled, no listener fails, and no delivery stays marked pending."""
    log = open_log()
    box: dict[str, ConfirmRelay] = {}

    async def run() -> None:
        box["relay"] = ConfirmRelay(log)

    event_loop.run(run())
    for _ in range(3):
        _append(log, b"x")
    assert not box["relay"]._crossing
    assert "listener failed" not in caplog.text
