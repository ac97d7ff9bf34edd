"""The services' asyncio event loop: a selector loop that tells hooks when it is about to sleep.

Each iteration of an asyncio selector loop ends in one ``select(timeout)``: ``timeout`` is 0 while
callbacks are ready (the loop is busy), otherwise it is how long the loop may sleep (None: until
something arrives). :class:`HookedEventLoop` calls every registered *select hook* just before that
call, with ``idle=True`` when the loop is about to sleep. A hook can then do blocking work that
would otherwise be handed to a thread and handed back (two wake-ups through the kernel, each
waiting for the GIL): the SYNC_FLUSH group commit's fdatasync, when nothing else is waiting for
the loop (services.commitlog.confirm_relay). A hook returns True when it may have made callbacks
ready; the loop then polls without sleeping, so they run in the same iteration.

Hooks run on the loop's thread and bound their own blocking: while a hook blocks, nothing else on
the loop runs (gRPC keeps receiving on its own threads). An exception a hook raises goes to the
loop's exception handler (logged); the loop goes on.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# A select hook: called with idle=True when the loop is about to sleep, False when it will poll
# and go on; returns True when it may have made callbacks ready.
SelectHook = Callable[[bool], bool]


class _HookedSelector(selectors.EpollSelector):
    """Linux's epoll selector (asyncio's default there), calling the select hooks before each
    select."""

    def __init__(self) -> None:
        super().__init__()
        self.hooks: list[SelectHook] = []
        self.loop: asyncio.AbstractEventLoop | None = None  # for reporting a hook's exception

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        hooks = self.hooks
        if hooks:
            idle = timeout is None or timeout > 0
            ran = False
            for hook in tuple(hooks):
                try:  # after a hook that made callbacks ready, the loop is no longer idle
                    ran = hook(idle and not ran) or ran
                except Exception as exc:  # a broken hook must not stop the loop
                    if self.loop is not None:
                        self.loop.call_exception_handler(
                            {"message": f"select hook {hook!r} failed", "exception": exc}
                        )
                    ran = True  # the handler may have scheduled something
            if ran:
                timeout = 0
        return super().select(timeout)


class HookedEventLoop(asyncio.SelectorEventLoop):
    """An asyncio selector event loop with select hooks (module docstring)."""

    def __init__(self) -> None:
        self._hooked_selector = _HookedSelector()
        super().__init__(self._hooked_selector)
        self._hooked_selector.loop = self

    def add_select_hook(self, hook: SelectHook) -> None:
        """Call ``hook(idle)`` before every select of this loop, on the loop's thread."""
        self._hooked_selector.hooks.append(hook)

    def remove_select_hook(self, hook: SelectHook) -> None:
        """Stop calling ``hook``; a hook not registered is ignored."""
        hooks = self._hooked_selector.hooks
        if hook in hooks:
            hooks.remove(hook)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new :class:`HookedEventLoop` (the loop factory of ``mqstore serve`` and MessageStore)."""
    return HookedEventLoop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a :class:`HookedEventLoop`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
