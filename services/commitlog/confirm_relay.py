"""ConfirmRelay: the CommitLog's confirm-offset moves, brought onto the event loop once each.

The log calls its confirm listeners on whichever thread moved the offset: the event loop itself
(an ASYNC_FLUSH append), the group-commit thread (SYNC_FLUSH) or the thread that took a slave's
acknowledgement (SYNC_MASTER). Two kinds of code on the loop wait for those moves:

* tails (in-process followers, Tail streams): woken to read what became visible;
* puts under SYNC_FLUSH: answered once the flushed offset covers their records.

Each of them crossing from the flush thread on its own cost a wake-up of the loop per waiter
(a concurrent future per put wrapped into an asyncio one, a ``call_soon_threadsafe`` per tail)
and held the flush thread on the GIL for all of it while the loop waited to take it back. The
relay crosses once per move, however many wait: one callback scheduled on the loop (none while
one is already pending), which there answers the puts the new flushed offset covers, oldest
first, and then wakes every tail, so acknowledgements go out before followers take the loop.
A move made on the loop itself (an ASYNC_FLUSH append) is delivered by a callback the loop runs
next (none while one is pending), not inside the put: the put's reply goes out first, and the
appends of one loop step wake the tails once. One producer sending one message at a time
(interleaved A/B, 8 rounds, a slow spell of the host): the gateway's Produce handler took 212 us
(p50) against 230, at 1.02x the msgs/s and the same server CPU.

Under SYNC_FLUSH the relay also chooses how a put's flush is waited for
(:meth:`ConfirmRelay.request_flush`). On a loop with select hooks (services._common.event_loop),
when the loop is about to sleep and one put is all that waits for the flush, the loop hands the
round to the group-commit thread and blocks until it ends, at most ``idleLoopFlushWaitMs``
(CommitLog.flush_and_wait), then answers at once, instead of sleeping in its selector until
the flush thread's wake-up arrives through it. One producer sending one message at a time:
1.10x the msgs/s, p50 153 us lower (interleaved A/B). A move made on another thread while the
loop waits is left to the loop, which delivers it when the wait ends: no wake-up crosses, which
would only have made its next select return at once to drain it. Running the fdatasync on the
loop itself gave 1.15x, but a hung fdatasync then held the whole loop (reads, WAIT=false puts, health,
an election's lease) for as long as it hung. The loop does not block while it has other work,
when more puts wait (their callers send more meanwhile, which the loop appends while the thread
flushes), or while a recent round took longer than that bound (a slow disk); a round that
outlasts the bound is delivered the usual way. So the loop never stops for longer than
``idleLoopFlushWaitMs``, even while an fdatasync hangs.

A failed group-commit fdatasync (the store stops taking writes) answers every waiting put the
flushed offset does not cover with FLUSH_DISK_TIMEOUT: not confirmed durable. Other I/O errors
(an append, a checkpoint write) leave the group commit flushing and the puts waiting for it.
Create the relay on the loop it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
from collections.abc import Callable

from libstore import CommitLog, PutMessageStatus, StoreIOError
from services._common.event_loop import HookedEventLoop


class ConfirmRelay:
    """Confirm-offset moves of ``log`` delivered on the running event loop (module docstring)."""

    def __init__(self, log: CommitLog) -> None:
        self._log = log
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wakers: list[Callable[[], None]] = []
        # Puts waiting for the flushed offset: (offset to cover, arrival order, future).
        self._waiters: list[tuple[int, int, asyncio.Future[PutMessageStatus]]] = []
        self._arrivals = itertools.count()
        self._crossing = False  # a delivery is scheduled on the loop and has not run yet
        self.failed = False  # a group-commit fdatasync failed: no put waiting here will be confirmed
        self._wanted = 0  # the highest offset to flush that the loop has not dealt with yet
        self.waited_flushes = 0  # puts answered right after a round this loop blocked on
        self._wait_ms = log.config.idle_loop_flush_wait_ms
        # The loop whose selects this relay hooks (SYNC_FLUSH on a HookedEventLoop), else None.
        self._hooked: HookedEventLoop | None = None
        if (
            isinstance(self._loop, HookedEventLoop)
            and log.group_commit_flush_ms is not None
            and self._wait_ms > 0
        ):
            self._hooked = self._loop
            self._hooked.add_select_hook(self._on_select)
        self._delivery: asyncio.Handle | None = None  # the delivery a crossing scheduled
        # While the loop blocks on a round (_on_select), a move made on another thread is left
        # to the loop, which delivers right after the wait: no wake-up through its selector,
        # which would only make the next select return at once to drain it.
        self._wait_lock = threading.Lock()
        self._loop_waits = False
        self._missed = False  # a move came while the loop waited (read under _wait_lock)
        self.crossings = 0  # deliveries scheduled on the loop from another thread
        log.add_confirm_listener(self._on_confirm)
        log.add_io_error_listener(self._on_io_error)

    def close(self) -> None:
        """Stop listening to the log; puts still waiting get PUT_OK when the flushed offset
        covers them, else FLUSH_DISK_TIMEOUT."""
        self._log.remove_confirm_listener(self._on_confirm)
        self._log.remove_io_error_listener(self._on_io_error)
        if self._hooked is not None:
            self._hooked.remove_select_hook(self._on_select)
            self._hooked = None
            if self._wanted:  # nothing will come back for it here, but the log must hold it
                self._log.request_flush(self._wanted)
        self._fail_waiters()

    # -- tails ------------------------------------------------------------------------------------
    def subscribe(self, wake: Callable[[], None]) -> None:
        """Call ``wake()`` on the loop after every confirm-offset move (it must not block)."""
        self._wakers.append(wake)

    def unsubscribe(self, wake: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._wakers.remove(wake)

    # -- SYNC_FLUSH puts -----------------------------------------------------------------------
    def flushed(self, offset: int) -> asyncio.Future[PutMessageStatus]:
        """A future resolved with PUT_OK once the log's flushed offset reaches ``offset``
        (bytes), or FLUSH_DISK_TIMEOUT when a group-commit fdatasync fails first. Already
        resolved when the offset is covered (or the flush failed). The caller has the group
        commit flush that far (CommitLog.request_flush, before or after this: the answer comes
        on the loop either way) and bounds the wait (``syncFlushTimeout``); a cancelled future
        is dropped when the flushed offset passes it."""
        future: asyncio.Future[PutMessageStatus] = self._loop.create_future()
        if self._log.flushed_offset >= offset:
            future.set_result(PutMessageStatus.PUT_OK)
        elif self.failed:
            future.set_result(PutMessageStatus.FLUSH_DISK_TIMEOUT)
        else:
            heapq.heappush(self._waiters, (offset, next(self._arrivals), future))
        return future

    def request_flush(self, offset: int) -> bool:
        """SYNC_FLUSH: have the group commit flush at least up to ``offset`` (bytes), woken at
        the end of this loop's iteration (which may then block on the round: module docstring).
        False (nothing to do) under ASYNC_FLUSH. Call it on the loop."""
        if self._hooked is None:
            return self._log.request_flush(offset)
        if offset > self._wanted:
            self._wanted = offset
        return True

    def _on_select(self, idle: bool) -> bool:
        wanted = self._wanted
        if not wanted:
            return False
        self._wanted = 0
        log = self._log
        if wanted <= log.flushed_offset:
            return False
        flush_ms = log.group_commit_flush_ms
        if idle and len(self._waiters) == 1 and flush_ms is not None and flush_ms <= self._wait_ms:
            with self._wait_lock:
                self._loop_waits, self._missed = True, False
            try:
                flushed = log.flush_and_wait(wanted, self._wait_ms / 1000.0)
            except BaseException:
                if self._end_wait():  # a move was left to this wait: deliver it all the same
                    self._loop.call_soon(self._deliver)
                log.request_flush(wanted)
                raise
            missed = self._end_wait()
            if not flushed:
                log.request_flush(wanted)  # (asked already, unless it did not run at all)
                if not missed:
                    return False  # the round goes on; its end is delivered the usual way
            else:
                self.waited_flushes += 1
            delivery, self._delivery = self._delivery, None
            if delivery is not None:
                delivery.cancel()  # delivered here instead
            self._deliver()
            return True
        log.request_flush(wanted)
        return False

    def _end_wait(self) -> bool:
        """The loop's wait on a round is over: moves cross to it again. True when one came
        while it waited (it is the loop's to deliver)."""
        with self._wait_lock:
            self._loop_waits = False
            return self._missed

    @property
    def waiting(self) -> int:
        """Puts waiting for the flush (cancelled ones not yet dropped included)."""
        return len(self._waiters)

    # -- delivery ---------------------------------------------------------------------------------
    def _on_confirm(self, _offset: int) -> None:
        if threading.get_ident() == self._loop_thread:
            if not self._crossing:  # delivered right after the put that moved it (module docstring)
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
                    self._delivery = self._loop.call_soon(self._deliver)
                    self._crossing = True
            return
        with self._wait_lock:
            if self._loop_waits:  # the loop delivers when its wait ends (_on_select)
                self._missed = True
                return
        if self._crossing:  # the pending delivery reads the offsets when it runs
            return
        self._crossing = True
        self.crossings += 1
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            self._delivery = self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        # Cleared before the offsets are read: a move after this point schedules another run.
        self._crossing = False
        self._delivery = None
        waiters = self._waiters
        if waiters:
            flushed = self._log.flushed_offset
            while waiters and waiters[0][0] <= flushed:
                future = heapq.heappop(waiters)[2]
                if not future.done():
                    future.set_result(PutMessageStatus.PUT_OK)
        for wake in self._wakers:
            wake()

    def _on_io_error(self, _exc: StoreIOError) -> None:
        if threading.get_ident() == self._loop_thread:
            self._on_failure()
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._on_failure)

    def _on_failure(self) -> None:
        if self._log.flush_failed:  # else (an append or a checkpoint failed) the flush goes on
            self._fail_waiters()

    def _fail_waiters(self) -> None:
        """Answer every waiting put: PUT_OK where the flushed offset covers it (a delivery may
        still be on its way), FLUSH_DISK_TIMEOUT for the rest; later puts fail at once."""
        self.failed = True
        waiters, self._waiters = self._waiters, []
        flushed = self._log.flushed_offset
        for offset, _, future in waiters:
            if not future.done():
                covered = offset <= flushed
                future.set_result(PutMessageStatus.PUT_OK if covered else PutMessageStatus.FLUSH_DISK_TIMEOUT)
