"""wait_within (libstore.aio_deadline): a bounded await whose caller's cancellation is never
lost, unlike Python 3.11's asyncio.wait_for when the awaited thing completes in the same loop
iteration as the cancellation."""

from __future__ import annotations

import asyncio

import pytest

from libstore.aio_deadline import wait_within
from libstore.long_polling import LongPollingService


def test_returns_the_result_or_times_out() -> None:
    async def scenario() -> None:
        assert await wait_within(asyncio.sleep(0, "done"), 5) == "done"
        assert await wait_within(asyncio.sleep(0, "unbounded"), None) == "unbounded"
        with pytest.raises(TimeoutError):
            await wait_within(asyncio.sleep(10), 0.05)
        with pytest.raises(TimeoutError):  # a non-positive bound: only what is ready at once
            await wait_within(asyncio.sleep(10), -1)

    asyncio.run(scenario())


def test_a_cancellation_meeting_a_finished_wait_still_cancels() -> None:
    """The future is resolved, then the waiting task is cancelled before it runs again:
    asyncio.wait_for on 3.11 returns normally here; wait_within must raise CancelledError."""

    async def waiter(future: asyncio.Future[None]) -> str:
        await wait_within(future, 30)
        return "went on"

    async def scenario() -> None:
        future = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(waiter(future))
        await asyncio.sleep(0)  # the task waits on the future
        future.set_result(None)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())


def test_a_held_receive_woken_and_cancelled_together_is_cancelled() -> None:
    """A receive held on a topic (the pop model's long polling) is woken by a change of
    invisible time in the same loop iteration as its client's disconnect cancels it: it must
    end cancelled, not go on to pop messages for a client that is gone."""
    service = LongPollingService(lambda topic, queue_id: 0)

    async def scenario() -> None:
        held = asyncio.create_task(service.wait_for_topic_async("T", 30_000))
        while service.waiting == 0:
            await asyncio.sleep(0)
        service.wake_topic("T")
        await asyncio.sleep(0)  # the wake-up resolved the waiter's future
        held.cancel()
        with pytest.raises(asyncio.CancelledError):
            await held
        assert service.waiting == 0

    asyncio.run(scenario())
