"""wait_within: await something for at most a number of seconds, without losing a cancellation.

Python 3.11's ``asyncio.wait_for`` hands back the awaited result when the caller's task is
cancelled in the same loop iteration as the awaited thing completes (a long-polling wake-up and
a client's disconnect, a stop event and a shutdown): the cancellation is swallowed and the
caller goes on as if it had not been asked to stop (a receive of a departed client pops
messages for nobody; a loop never ends). 3.12 rebuilt ``wait_for`` on ``asyncio.timeout``;
this module gives every caller here that behaviour on 3.11 already.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_within(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """Await ``awaitable`` for at most ``timeout_s`` seconds (None: no limit; <= 0: only what
    is ready without waiting) and return its result.

    Raises TimeoutError when the time runs out (the awaitable is cancelled, as ``wait_for``
    does); CancelledError whenever the calling task is cancelled, even if the awaitable finished
    in the same iteration of the loop."""
    if timeout_s is None:
        return await awaitable
    async with asyncio.timeout(max(timeout_s, 0.0)):
        return await awaitable
