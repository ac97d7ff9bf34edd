"""Long polling: hold a pull until its queue has messages past its offset, or a timeout passes
(RocketMQ's ``PullRequestHoldService`` + ``NotifyMessageArrivingListener``).

The dispatcher calls :meth:`LongPollingService.notify_message_arriving` with a queue's new max
offset after applying records; every waiter of that queue whose offset is below it is woken at
once. Nothing polls: a blocking waiter sleeps on an Event, an asyncio waiter on a Future resolved
through its loop's ``call_soon_threadsafe``. Each waiter re-checks the queue after registering, so
a message that arrives between the caller's empty pull and the registration is not missed.
At most ``max_waiters`` are held at once (``maxHeldPolls``): past it a wait is not held, it
returns at once with what the queue holds (:attr:`LongPollingService.refused` counts them).

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Mapping

from libstore.aio_deadline import wait_within

QueueKey = tuple[str, int]
ANY_QUEUE = -1  # the queue id of waiters woken by an arrival on any queue of their topic


class _Waiter:
    __slots__ = ("offset", "wake")

    def __init__(self, offset: int, wake: Callable[[], None]) -> None:
        self.offset = offset
        self.wake = wake


class LongPollingService:
    """Waiters per (topic, queue id); ``max_offset_of(topic, queue_id)`` reads a queue's current
    max offset (units 0..max-1 exist); at most ``max_waiters`` held at once (0: no bound)."""

    def __init__(self, max_offset_of: Callable[[str, int], int], *, max_waiters: int = 0) -> None:
        self._max_offset_of = max_offset_of
        self._lock = threading.Lock()
        self._waiters: dict[QueueKey, list[_Waiter]] = {}
        self.max_waiters = max_waiters
        self._count = 0
        self.refused = 0  # waits answered at once because max_waiters were held

    def notify_message_arriving(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Wake the waiters of (topic, queue_id) whose offset is below ``max_offset``, and the
        topic's any-queue waiters (:meth:`wait_for_topic_async`)."""
        if queue_id != ANY_QUEUE:
            self.notify_message_arriving(topic, ANY_QUEUE, max_offset)
        key = (topic, queue_id)
        with self._lock:
            waiters = self._waiters.get(key)
            if not waiters:
                return
            ready = [w for w in waiters if w.offset < max_offset]
            if not ready:
                return
            rest = [w for w in waiters if w.offset >= max_offset]
            self._count -= len(ready)
            if rest:
                self._waiters[key] = rest
            else:
                del self._waiters[key]
        for w in ready:
            w.wake()

    def notify_many(self, max_offsets: Mapping[QueueKey, int]) -> None:
        """:meth:`notify_message_arriving` for every queue in ``max_offsets``."""
        if not self._waiters:
            return
        for (topic, queue_id), max_offset in max_offsets.items():
            self.notify_message_arriving(topic, queue_id, max_offset)

    def wake_topic(self, topic: str) -> None:
        """Wake the topic's any-queue waiters (:meth:`wait_for_topic_async`) without an arrival:
        something else they wait for changed (a message's invisible time was shortened)."""
        self.notify_message_arriving(topic, ANY_QUEUE, 0)

    def wake_all(self) -> None:
        """Release every waiter (shutdown): they return and find what there is."""
        with self._lock:
            waiters = [w for ws in self._waiters.values() for w in ws]
            self._waiters = {}
            self._count = 0
        for w in waiters:
            w.wake()

    def _register(self, key: QueueKey, waiter: _Waiter) -> bool:
        """Hold ``waiter``; False (not held) when ``max_waiters`` are held already."""
        with self._lock:
            if self.max_waiters and self._count >= self.max_waiters:
                self.refused += 1
                return False
            self._waiters.setdefault(key, []).append(waiter)
            self._count += 1
            return True

    def _unregister(self, key: QueueKey, waiter: _Waiter) -> None:
        with self._lock:
            waiters = self._waiters.get(key)
            if waiters and waiter in waiters:
                waiters.remove(waiter)
                self._count -= 1
                if not waiters:
                    del self._waiters[key]

    def wait_for_messages(self, topic: str, queue_id: int, offset: int, timeout_ms: int) -> bool:
        """Block until the queue's max offset passes ``offset`` or ``timeout_ms`` pass.

        Returns True when messages arrived (or were already there).
        """
        key = (topic, queue_id)
        if self._max_offset_of(topic, queue_id) > offset:
            return True
        event = threading.Event()
        waiter = _Waiter(offset, event.set)
        if not self._register(key, waiter):
            return False
        try:
            if self._max_offset_of(topic, queue_id) > offset:
                return True
            event.wait(timeout_ms / 1000.0)
            return self._max_offset_of(topic, queue_id) > offset
        finally:
            self._unregister(key, waiter)

    async def wait_for_messages_async(self, topic: str, queue_id: int, offset: int, timeout_ms: int) -> bool:
        """:meth:`wait_for_messages` for asyncio callers: the event loop is never blocked."""
        key = (topic, queue_id)
        if self._max_offset_of(topic, queue_id) > offset:
            return True
        future, wake = _loop_wakeup()
        waiter = _Waiter(offset, wake)
        if not self._register(key, waiter):
            return self._max_offset_of(topic, queue_id) > offset
        try:
            if self._max_offset_of(topic, queue_id) > offset:
                return True
            with contextlib.suppress(TimeoutError):  # held for the whole time: an empty answer
                await wait_within(future, timeout_ms / 1000.0)
            return self._max_offset_of(topic, queue_id) > offset
        finally:
            self._unregister(key, waiter)

    async def wait_for_topic_async(
        self, topic: str, timeout_ms: int, arrived: Callable[[], bool] | None = None
    ) -> bool:
        """Hold an asyncio caller until a message arrives on any queue of ``topic`` or
        ``timeout_ms`` pass (the pop model's long polling: a receive serves every queue).
        ``arrived()`` is asked once the waiter is registered (return at once when True), so an
        arrival between the caller's empty look and the registration is not missed. A wake-up
        means "look again", not "there is a message for you". Returns False, at once, when
        ``max_waiters`` are held (the caller was not held), else True."""
        future, wake = _loop_wakeup()
        key = (topic, ANY_QUEUE)
        waiter = _Waiter(-1, wake)
        if not self._register(key, waiter):
            return False
        try:
            if arrived is not None and arrived():
                return True
            with contextlib.suppress(TimeoutError):
                await wait_within(future, max(timeout_ms, 0) / 1000.0)
            return True
        finally:
            self._unregister(key, waiter)

    @property
    def waiting(self) -> int:
        """How many pulls are being held."""
        with self._lock:
            return self._count


def _loop_wakeup() -> tuple[asyncio.Future[None], Callable[[], None]]:
    """A future of the running event loop and a wake function, callable from any thread, that
    resolves it through the loop (a no-op once the loop is closed)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            loop.call_soon_threadsafe(_resolve, future)

    return future, wake


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
