"""TimerService: delivers scheduled messages when they are due (libstore.scheduled_message).

Held messages sit in the timer queue (``rmq_sys_wheel_timer`` queue 0), whose units carry the
delivery time as tags code. The service reads new units as dispatch adds them into a min-heap by
delivery time (memory: one small tuple per pending message), and every tick (at most
``TICK_S`` apart, sooner when the next message is due sooner) appends the due ones to their real
topic through the CommitLog, each in the same append as a timer-done record naming its unit
(``rmq_sys_timer_done``, libstore.system_topics). Those records are the durable progress: every
replica's dispatch reads them, so neither a restart nor a promoted slave's timer delivers a
message twice; ``timer/timerCheckpoint.json`` (libstore.timer_checkpoint) caches how far they and
the timer queue were read. Precision: ~``TICK_S`` (RocketMQ's timer wheel: 1 s). On a slave the
appends get NOT_MASTER and the service only follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Callable
from pathlib import Path

from libstore.aio_deadline import wait_within
from libstore.consume_queue import BLANK_UNIT_SIZE
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.errors import (
    CorruptRecordError,
    MessageIllegalError,
    NotMasterError,
    ServiceNotAvailableError,
    StoreError,
    TopicNotFoundError,
)
from libstore.record_codec import decode_record
from libstore.scheduled_message import done_record, due_copy
from libstore.system_topics import TIMER_DONE_TOPIC, TIMER_TOPIC
from libstore.timer_checkpoint import TimerCheckpoint
from services._common.telemetry import tracer
from services.ports import CommitLogPort

log = logging.getLogger(__name__)

TICK_S = 0.1
SCAN_BATCH = 4096
DELIVER_BATCH = 256


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class TimerService:
    """Scheduled delivery over ``queues`` (the timer queue) and ``commitlog``; state under
    ``root/timer``. ``clock()`` gives ms since the epoch."""

    def __init__(
        self,
        root: Path,
        queues: ConsumeQueueStore,
        commitlog: CommitLogPort,
        *,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        self.queues = queues
        self.commitlog = commitlog
        self.clock = clock
        self.checkpoint = TimerCheckpoint(Path(root) / "timer" / "timerCheckpoint.json")
        self._heap: list[tuple[int, int, int, int]] = []  # (deliver ms, queue offset, phy, size)
        self._scanned = 0
        self._tracer = tracer("mqstore.dispatch")

    def load(self) -> None:
        self.checkpoint.load()
        self._heap.clear()
        self._scanned = self.checkpoint.watermark

    @property
    def pending(self) -> int:
        """Held messages known to the service (not yet delivered)."""
        return len(self._heap)

    def oldest_held_offset(self) -> int | None:
        """CommitLog offset of the oldest record still held for later delivery (None when none
        is): retention must keep it (libstore.commit_log_cleaner's hold). Safe from another
        thread (the heap is copied at once)."""
        held = list(self._heap)
        return min(entry[2] for entry in held) if held else None

    def next_due(self) -> int | None:
        """Delivery time (ms) of the earliest held message, None when none is held."""
        return self._heap[0][0] if self._heap else None

    def _scan(self) -> None:
        cq = self.queues.find(TIMER_TOPIC, 0)
        if cq is None:
            return
        end = cq.max_offset_in_queue
        if end < self._scanned:  # the queue was cut (log truncated): start over from the units left
            log.warning("timer queue shrank to %d (scanned %d); rescanning", end, self._scanned)
            self._heap.clear()
            self.checkpoint.forget_from(end)  # offsets past the end will name new units
            self._scanned = self.checkpoint.watermark
        self._scan_done()
        low = cq.min_offset_in_queue
        if self._scanned < low:
            self.checkpoint.skip_below(low)
            self._scanned = low
        while self._scanned < end:
            units = cq.read_units(self._scanned, SCAN_BATCH)
            if not units:
                break
            blanks = []
            for i, u in enumerate(units):
                offset = self._scanned + i
                if u.size == BLANK_UNIT_SIZE:
                    blanks.append(offset)
                elif not self.checkpoint.is_done(offset):
                    heapq.heappush(self._heap, (u.tags_code, offset, u.phy_offset, u.size))
            if blanks:
                self.checkpoint.mark(blanks)
            self._scanned += len(units)

    def _scan_done(self) -> None:
        """Mark the units the timer-done queue (deliveries recorded in the log, by any replica's
        timer) says were delivered."""
        cq = self.queues.find(TIMER_DONE_TOPIC, 0)
        if cq is None:
            return
        cp = self.checkpoint
        end = cq.max_offset_in_queue
        cp.done_queue_offset = min(max(cp.done_queue_offset, cq.min_offset_in_queue), end)
        while cp.done_queue_offset < end:
            units = cq.read_units(cp.done_queue_offset, SCAN_BATCH)
            if not units:
                break
            cp.mark(u.tags_code for u in units if u.size != BLANK_UNIT_SIZE)
            cp.done_queue_offset += len(units)

    async def tick(self) -> int:
        """Scan new units and deliver what is due; returns how many were delivered. Raises
        ServiceNotAvailableError when the append failed (those stay held and are retried)."""
        self._scan()
        now = self.clock()
        due: list[tuple[int, int, int, int]] = []
        while self._heap and self._heap[0][0] <= now and len(due) < DELIVER_BATCH:
            entry = heapq.heappop(self._heap)
            if not self.checkpoint.is_done(entry[1]):  # another replica's timer may have delivered it
                due.append(entry)
        if not due:
            self.checkpoint.save()
            return 0
        with self._tracer.start_as_current_span("dispatch.timer_deliver") as span:
            span.set_attribute("mqstore.messages", len(due))
            try:
                raws = await self.commitlog.read([(phy, size) for _, _, phy, size in due])
            except BaseException:
                for entry in due:  # the log is unreachable: held again, retried next tick
                    heapq.heappush(self._heap, entry)
                raise
            messages, sent, gone = [], [], []
            for entry, raw in zip(due, raws, strict=True):
                try:
                    if not raw:
                        raise CorruptRecordError("no longer in the CommitLog")
                    messages.append(due_copy(decode_record(raw, check_crc=False), now))
                    sent.append(entry)
                except (CorruptRecordError, MessageIllegalError) as exc:
                    log.warning("timer unit %d cannot be delivered: %s", entry[1], exc)
                    gone.append(entry[1])
            ok: list[tuple[int, int, int, int]] = []
            try:
                try:
                    # Each copy goes with its timer-done record in one append: the log says what
                    # was delivered, for this process after a crash and for the slaves' timers.
                    batch = messages + [done_record(e[1]) for e in sent]
                    results = await self.commitlog.append(batch) if messages else []
                    ok = [e for e, r in zip(sent, results, strict=False) if r.status.appended]
                except (TopicNotFoundError, MessageIllegalError):
                    # One bad message (its topic deleted, say) must not hold up the others:
                    # deliver one by one and drop what the store refuses for good.
                    for entry, message in zip(sent, messages, strict=True):
                        try:
                            pair = [message, done_record(entry[1])]
                            if (await self.commitlog.append(pair))[0].status.appended:
                                ok.append(entry)
                        except (TopicNotFoundError, MessageIllegalError) as exc:
                            log.warning("timer unit %d dropped: %s", entry[1], exc)
                            gone.append(entry[1])
                if gone:  # dropped for good: recorded too, so no replica tries them again
                    with contextlib.suppress(StoreError):
                        await self.commitlog.append([done_record(u) for u in gone])
            finally:
                done = {e[1] for e in ok} | set(gone)
                retry = [e for e in sent if e[1] not in done]
                for entry in retry:  # not appended: held again, retried next tick
                    heapq.heappush(self._heap, entry)
                self.checkpoint.mark(done)
                self.checkpoint.save()
            if retry:
                raise ServiceNotAvailableError(f"{len(retry)} due messages could not be appended")
            delivered = len(ok)
            return delivered

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until ``stop`` is set; failures are logged and retried on the next tick."""
        while not stop.is_set():
            wait = TICK_S
            try:
                if await self.tick() >= DELIVER_BATCH:
                    wait = 0  # more may be due already
            except NotMasterError:
                wait = 1.0  # a slave's dispatch: the master's delivers (this one takes over if promoted)
            except Exception:
                log.exception("timer delivery failed; retrying")
                wait = 1.0
            nxt = self.next_due()
            if nxt is not None and wait:
                wait = min(wait, max(0.0, (nxt - self.clock()) / 1000.0))
            with contextlib.suppress(TimeoutError):
                await wait_within(stop.wait(), wait)
