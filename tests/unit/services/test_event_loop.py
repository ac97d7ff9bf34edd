"""HookedEventLoop (services._common.event_loop): select hooks told whether the loop is about to
sleep, and a hook that made callbacks ready keeps it from sleeping."""

from __future__ import annotations

import asyncio
import time

from services._common import event_loop


def test_hooks_hear_whether_the_loop_is_about_to_sleep() -> None:
    seen: list[bool] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, event_loop.HookedEventLoop)

        def hook(idle: bool) -> bool:
            seen.append(idle)
            return False

        loop.add_select_hook(hook)
        loop.call_soon(lambda: None)
        await asyncio.sleep(0)  # callbacks ready: the loop polls and goes on
        assert False in seen
        seen.clear()
        await asyncio.sleep(0.01)  # nothing ready: it sleeps until the timer
        assert True in seen
        loop.remove_select_hook(hook)
        loop.remove_select_hook(hook)  # not registered any more: ignored
        seen.clear()
        await asyncio.sleep(0.01)
        assert seen == []

    event_loop.run(run())


def _resolving_hook() -> tuple[asyncio.Future[None], event_loop.SelectHook]:
    """A future on the running loop and a hook that resolves it at the first idle select
    (returning True: it made a callback ready)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def hook(idle: bool) -> bool:
        if idle and not done.done():
            done.set_result(None)
            return True
        return False

    return done, hook


def test_a_hook_that_readied_callbacks_keeps_the_loop_awake() -> None:
    """The hook resolves a future from inside the select; without a poll instead of the sleep,
    the loop would sleep until its next timer (5 s away) before running the waiter."""

    async def run() -> float:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, event_loop.HookedEventLoop)
        done, hook = _resolving_hook()
        loop.call_later(5.0, lambda: None)  # the loop's next timer: the sleep would end here
        loop.add_select_hook(hook)
        started = time.monotonic()
        await done
        loop.remove_select_hook(hook)
        return time.monotonic() - started

    assert event_loop.run(run()) < 2.5


def test_after_a_hook_readied_callbacks_the_next_hooks_see_a_busy_loop() -> None:
    """Two select hooks (two stores on one loop): once the first made callbacks ready, the
    loop is no longer about to sleep, so the second must not block as if it were."""
    seen: list[tuple[bool, bool]] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, event_loop.HookedEventLoop)
        done, first = _resolving_hook()

        def second(idle: bool) -> bool:
            seen.append((done.done(), idle))
            return False

        loop.add_select_hook(first)
        loop.add_select_hook(second)
        await done
        loop.remove_select_hook(first)
        loop.remove_select_hook(second)

    event_loop.run(run())
    assert (True, True) not in seen and (True, False) in seen


def test_a_hook_that_raises_is_reported_and_the_loop_goes_on() -> None:
    reported: list[str] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, event_loop.HookedEventLoop)
        loop.set_exception_handler(lambda _loop, context: reported.append(context["message"]))

        def broken(idle: bool) -> bool:
            raise ValueError("broken hook")

        loop.add_select_hook(broken)
        await asyncio.sleep(0.02)  # selects with the hook raising each time
        loop.remove_select_hook(broken)

    event_loop.run(run())
    assert reported and all("select hook" in m for m in reported)
