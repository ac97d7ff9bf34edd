"""ConfirmRelay (services.commitlog.confirm_relay): SYNC_FLUSH puts answered from the group
commit's rounds on the event loop, tails woken once per move, fail-stop on an fdatasync error."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Callable

import pytest

from libstore import CommitLog, FlushDiskType, Message, PutMessageStatus, StoreIOError
from libstore import mapped_file as mapped_file_module
from services.commitlog.confirm_relay import ConfirmRelay


class _HeldDisk:
    """fdatasync of CommitLog segments held until released, or failing with EIO."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.release.set()
        self.fail = False
        real = os.fdatasync

        def fdatasync(fd: int) -> None:
            self.release.wait(30)
            if self.fail:
                raise OSError(errno.EIO, "Input/output error")
            real(fd)

        monkeypatch.setattr(mapped_file_module.os, "fdatasync", fdatasync)


@pytest.fixture
def held(open_log: Callable[..., CommitLog], monkeypatch: pytest.MonkeyPatch) -> tuple[CommitLog, _HeldDisk]:
    """A SYNC_FLUSH CommitLog whose fdatasyncs a _HeldDisk controls (a put's own timeout,
    syncFlushTimeout, set far beyond any wait here)."""
    log = open_log(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout=60_000)
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
