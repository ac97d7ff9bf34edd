"""CommitLog flush services (spec sheet §6): group commit, periodic flush, transient-pool commit.

* :class:`GroupCommitService` (SYNC_FLUSH): producers hand in (next offset, deadline) requests;
  each round swaps the request list, flushes once up to the highest requested offset and frees
  every waiter that the new ``flushed_where`` covers. One fdatasync serves many producers.
  Requests not covered by their deadline get FLUSH_DISK_TIMEOUT.
* :class:`FlushRealTimeService` (ASYNC_FLUSH): every ``flushIntervalCommitLog`` ms flush when at
  least ``flushCommitLogLeastPages`` pages are dirty, and everything every
  ``flushCommitLogThoroughInterval`` ms; at shutdown flush everything.
* :class:`CommitRealTimeService` (transient store pool): every ``commitIntervalCommitLog`` ms
  write at least ``commitCommitLogLeastPages`` buffered pages into the file (all of them every
  ``commitCommitLogThoroughInterval`` ms), then wake the flusher.

Waiters get a ``concurrent.futures.Future`` resolved with a PutMessageStatus; asyncio callers
wrap it with ``asyncio.wrap_future``. Crash policy: an fdatasync error is fail-stop: pending
requests get FLUSH_DISK_TIMEOUT (not confirmed durable) and ``on_io_error`` marks the store
unwriteable; nothing on this path logs and carries on as if the flush succeeded.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError

from libstore.errors import StoreIOError
from libstore.mapped_file_queue import MappedFileQueue
from libstore.results import PutMessageStatus
from libstore.service_thread import ServiceThread

log = logging.getLogger(__name__)

# GroupCommitService.flush_ms: the slowest recent round, each round's figure the larger of its
# own time and this share of the figure before (a slow round is forgotten over tens of rounds).
FLUSH_MS_DECAY = 0.9


class GroupCommitRequest:
    """A waiter: durable once ``flushed_where >= next_offset``; fails after ``deadline`` (monotonic s)."""

    __slots__ = ("deadline", "future", "next_offset")

    def __init__(self, next_offset: int, timeout_ms: int) -> None:
        self.next_offset = next_offset
        self.deadline = time.monotonic() + timeout_ms / 1000.0
        self.future: Future[PutMessageStatus] = Future()

    def wakeup_customer(self, status: PutMessageStatus) -> None:
        if not self.future.done():
            with contextlib.suppress(InvalidStateError):  # a concurrent completion won the race
                self.future.set_result(status)


class _FlushServiceBase(ServiceThread):
    def __init__(
        self,
        name: str,
        queue: MappedFileQueue,
        on_flushed: Callable[[int], None],
        on_io_error: Callable[[StoreIOError], None],
    ) -> None:
        super().__init__(name)
        self.queue = queue
        self.on_flushed = on_flushed
        self.on_io_error = on_io_error
        self.io_failed = False

    def _fail(self, exc: StoreIOError) -> None:
        if not self.io_failed:
            log.error("%s: %s; the store stops accepting writes", self.name, exc)
        self.io_failed = True
        self.on_io_error(exc)


class GroupCommitService(_FlushServiceBase):
    """SYNC_FLUSH group commit. ``commit_first``: commit transient-pool buffers before flushing."""

    def __init__(
        self,
        queue: MappedFileQueue,
        on_flushed: Callable[[int], None],
        on_io_error: Callable[[StoreIOError], None],
        *,
        commit_first: bool = False,
    ) -> None:
        super().__init__("GroupCommitService", queue, on_flushed, on_io_error)
        self.commit_first = commit_first
        self._lock = threading.Lock()
        self._requests_write: list[GroupCommitRequest] = []
        self._requests_read: list[GroupCommitRequest] = []
        self._pending: list[GroupCommitRequest] = []
        self._target = 0  # the highest offset asked for through request_flush
        self.flush_rounds = 0
        self._finished = threading.Event()  # set after every round (flush_and_wait)
        self.flush_ms = 0.0  # the slowest recent round's flush (ms, decaying)

    def put_request(self, request: GroupCommitRequest) -> None:
        with self._lock:
            self._requests_write.append(request)
        self.wakeup()

    def request_flush(self, next_offset: int) -> None:
        """Flush at least up to ``next_offset`` (bytes) in the next round, with no waiter here:
        the caller learns of it from ``on_flushed`` (e.g. through the log's confirm listeners)."""
        if next_offset > self._target:  # one caller thread (the event loop): no lock needed
            self._target = next_offset
        self.wakeup()

    def on_wait_end(self) -> None:
        with self._lock:
            self._requests_write, self._requests_read = self._requests_read, self._requests_write

    def run_loop(self) -> None:
        self.wait_for_running(10)
        self._do_commit()

    def _do_commit(self) -> None:
        requests = self._pending + self._requests_read
        self._pending = []
        self._requests_read = []
        target = max(max((r.next_offset for r in requests), default=0), self._target)
        if not requests and target <= self.queue.flushed_where:
            target = self.queue.get_max_offset()  # nobody waits: flush what was written
        moved = self._flush(target)
        flushed = self.queue.flushed_where
        self._answer(requests, flushed)
        if moved:
            # After the producers' wake-ups: their acknowledgements go out first, the followers
            # (dispatch, index, replication readers) this wakes come next.
            self.flush_rounds += 1
            self.on_flushed(flushed)
        self._finished.set()

    def flush_and_wait(self, target: int, timeout_s: float) -> bool:
        """Have this thread flush up to ``target`` (bytes) at once and block the caller until it
        did, for at most ``timeout_s`` seconds: True when the flushed offset reached ``target``
        (``on_flushed`` may still be running on this thread). An event loop with nothing else to do waits
        so, for a put that waits alone, instead of being woken through its selector when
        ``on_flushed`` calls back (that wake-up cost ~100 us a put). False after the timeout, or
        at once when the service stopped or failed; the round goes on and ``on_flushed`` calls
        back as usual."""
        if self.stopped or self.io_failed or not self.alive:
            return False
        deadline = time.monotonic() + timeout_s
        self._finished.clear()
        self.request_flush(target)
        while self.queue.flushed_where < target:
            left = deadline - time.monotonic()
            if left <= 0 or self.io_failed or not self._finished.wait(left):
                # As slow as the bound at least: the caller does not wait again until
                # rounds are back under it (flush_ms decays).
                self.flush_ms = max(self.flush_ms, timeout_s * 1000.0)
                return False
            self._finished.clear()  # a round that ended short of it: wait for the next
        return not self.io_failed

    def _flush(self, target: int) -> bool:
        """Flush up to ``target``; True when the flushed offset moved."""
        if self.io_failed:
            return False
        started = time.perf_counter()  # the commit of a transient-pool buffer counts too
        try:
            if self.commit_first:
                self.queue.commit_to(self.queue.get_max_wrote_position(), 0)
            before = self.queue.flushed_where
            moved = self.queue.flush_to(target, 0) != before
        except StoreIOError as exc:
            self._fail(exc)
            return False
        if moved:
            took_ms = (time.perf_counter() - started) * 1000.0
            self.flush_ms = max(took_ms, self.flush_ms * FLUSH_MS_DECAY)
        return moved

    def _answer(self, requests: list[GroupCommitRequest], flushed: int) -> None:
        now = time.monotonic()
        for req in requests:
            if req.future.done():
                continue
            if not self.io_failed and flushed >= req.next_offset:
                req.wakeup_customer(PutMessageStatus.PUT_OK)
            elif self.io_failed or now >= req.deadline:
                req.wakeup_customer(PutMessageStatus.FLUSH_DISK_TIMEOUT)
            else:
                self._pending.append(req)

    def on_shutdown(self) -> None:
        # Serve what was queued before shutdown: producers must not hang.
        for _ in range(3):
            self.on_wait_end()
            self._do_commit()
        for req in self._pending + self._requests_read + self._requests_write:
            req.wakeup_customer(PutMessageStatus.FLUSH_DISK_TIMEOUT)


class FlushRealTimeService(_FlushServiceBase):
    """ASYNC_FLUSH periodic flush; ``config_getter`` supplies the current intervals (ms, pages)."""

    def __init__(
        self,
        queue: MappedFileQueue,
        on_flushed: Callable[[int], None],
        on_io_error: Callable[[StoreIOError], None],
        *,
        interval_ms: int,
        least_pages: int,
        thorough_interval_ms: int,
        timed: bool,
    ) -> None:
        super().__init__("FlushRealTimeService", queue, on_flushed, on_io_error)
        self.interval_ms = interval_ms
        self.least_pages = least_pages
        self.thorough_interval_ms = thorough_interval_ms
        self.timed = timed
        self._last_thorough = time.monotonic()

    def run_loop(self) -> None:
        least = self.least_pages
        now = time.monotonic()
        if (now - self._last_thorough) * 1000 >= self.thorough_interval_ms:
            self._last_thorough = now
            least = 0
        if self.timed:
            self._stopped.wait(self.interval_ms / 1000.0)
        else:
            self.wait_for_running(self.interval_ms)
        if self.stopped:
            return
        self._flush(least)

    def _flush(self, least_pages: int) -> None:
        if self.io_failed:
            return
        try:
            before = self.queue.flushed_where
            flushed = self.queue.flush_to(self.queue.get_max_offset(), least_pages)
            if flushed != before:
                self.on_flushed(flushed)
        except StoreIOError as exc:
            self._fail(exc)

    def on_shutdown(self) -> None:
        for _ in range(10):
            if self.queue.flushed_where >= self.queue.get_max_offset():
                break
            self._flush(0)


class CommitRealTimeService(_FlushServiceBase):
    """Transient store pool: move buffered bytes into the file, then wake ``flusher``."""

    def __init__(
        self,
        queue: MappedFileQueue,
        flusher: ServiceThread,
        on_io_error: Callable[[StoreIOError], None],
        *,
        interval_ms: int,
        least_pages: int,
        thorough_interval_ms: int,
        on_committed: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__("CommitRealTimeService", queue, on_committed or (lambda _o: None), on_io_error)
        self.flusher = flusher
        self.interval_ms = interval_ms
        self.least_pages = least_pages
        self.thorough_interval_ms = thorough_interval_ms
        self._last_thorough = time.monotonic()

    def run_loop(self) -> None:
        least = self.least_pages
        now = time.monotonic()
        if (now - self._last_thorough) * 1000 >= self.thorough_interval_ms:
            self._last_thorough = now
            least = 0
        self._commit(least)
        self.wait_for_running(self.interval_ms)

    def _commit(self, least_pages: int) -> None:
        if self.io_failed:
            return
        try:
            before = self.queue.committed_where
            committed = self.queue.commit_to(self.queue.get_max_wrote_position(), least_pages)
        except StoreIOError as exc:
            self._fail(exc)
            return
        if committed != before:
            self.on_flushed(committed)
            self.flusher.wakeup()

    def on_shutdown(self) -> None:
        for _ in range(10):
            if self.queue.committed_where >= self.queue.get_max_wrote_position():
                break
            self._commit(0)
