"""LocalDispatch: the DispatchPort over this process's ConsumeQueues, consumer offsets and long
polling. Unit selection is libstore's (select_units: offset statuses, tags-code filter, count
and byte limits); a pull that finds nothing new is held on the long-polling service until
dispatch reports the queue grew or ``wait_ms`` passes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from libstore import InvalidArgumentError, OffsetOutOfRangeError
from libstore.consume_queue import BoundaryType, ConsumeQueue
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.consumer_offset_manager import ConsumerOffsetManager, QueueProgress
from libstore.errors import StoreError
from libstore.get_message import select_units
from libstore.long_polling import LongPollingService
from libstore.message_filter import TagFilter
from libstore.results import GetMessageStatus
from libstore.subscription_group import SubscriptionGroupConfig
from services._common.telemetry import tracer
from services.dispatch.pop import PopService
from services.dispatch.transaction import TransactionService
from services.ports import DerivedStatus, Entries, PopResult, QueueInfo, TransactionCheck

_WAITING = (GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.NO_MESSAGE_IN_QUEUE)


class CodeFilter(TagFilter):
    """A tag filter known only by tags codes (what a GetEntries request carries)."""

    def __init__(self, codes: Sequence[int]) -> None:
        super().__init__("*")
        if codes:
            self.codes = frozenset(codes)
            self.tags = frozenset()  # exact tags are checked where the records are read
            self.expression = f"codes {sorted(self.codes)}"


class LocalDispatch:
    """DispatchPort over local objects; the pop model is ``pop_service``'s. ``store_time_of(phy,
    size)`` reads a message's store time from the CommitLog (a remote read in the split
    topology); ``status_of`` reports progress."""

    def __init__(
        self,
        queues: ConsumeQueueStore,
        offsets: ConsumerOffsetManager,
        long_polling: LongPollingService,
        pop_service: PopService,
        transactions: TransactionService,
        store_time_of: Callable[[int, int], Awaitable[int]],
        status_of: Callable[[], DerivedStatus],
        *,
        max_batch: int = 1024,
        max_bytes: int = 256 * 1024,
    ) -> None:
        self.queues = queues
        self.offsets = offsets
        self.long_polling = long_polling
        self._store_time_of = store_time_of
        self._status_of = status_of
        self.max_batch = max_batch
        self.max_bytes = max_bytes
        self.pop_service = pop_service
        self.transactions = transactions
        self._tracer = tracer("mqstore.dispatch")

    def _select(
        self, cq: ConsumeQueue | None, offset: int, max_count: int, max_bytes: int, filt: TagFilter
    ) -> Entries:
        if cq is None:
            return Entries(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        sel = select_units(
            offset,
            max_count,
            cq.min_offset_in_queue,
            cq.max_offset_in_queue,
            cq.read_columns,
            filt,
            max_bytes,
        )
        status = sel.status if sel.status is not None else GetMessageStatus.FOUND
        if sel.status is None and not sel.sizes:
            status = GetMessageStatus.NO_MATCHED_MESSAGE
        return Entries(
            status,
            sel.next_offset,
            sel.min_offset,
            sel.max_offset,
            sel.queue_offsets,
            sel.phy_offsets,
            sel.sizes,
        )

    def _check_range(self, queue_id: int, offset: int, max_count: int) -> None:
        """A pull's queue, offset and count, as GetEntries takes them; InvalidArgumentError else."""
        if queue_id < 0 or offset < 0:
            raise InvalidArgumentError(
                f"queue id and offset must be >= 0, got queue {queue_id}, offset {offset}"
            )
        if not 1 <= max_count <= self.max_batch:
            raise InvalidArgumentError(f"max_count must be within 1..{self.max_batch}, got {max_count}")

    async def get_entries(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        *,
        max_bytes: int = 0,
        tag_codes: Sequence[int] = (),
        wait_ms: int = 0,
    ) -> Entries:
        if not topic:
            raise InvalidArgumentError("topic must be non-empty")
        self._check_range(queue_id, offset, max_count)
        if max_bytes < 0 or wait_ms < 0:
            raise InvalidArgumentError("max_bytes and wait_ms must be >= 0")
        filt = CodeFilter(tag_codes)
        limit = max_bytes or self.max_bytes
        with self._tracer.start_as_current_span("dispatch.get_entries") as span:
            entries = self._select(self.queues.find(topic, queue_id), offset, max_count, limit, filt)
            if wait_ms > 0 and _nothing_new(entries, offset):
                span.add_event("long polling")
                if await self.long_polling.wait_for_messages_async(topic, queue_id, offset, wait_ms):
                    entries = self._select(self.queues.find(topic, queue_id), offset, max_count, limit, filt)
            span.set_attribute("mqstore.units", len(entries.phy_offsets))
            return entries

    async def get_entries_many(
        self,
        topic: str,
        queries: Sequence[tuple[int, int, int]],
        *,
        max_bytes: int = 0,
        total_bytes: int = 0,
        tag_codes: Sequence[int] = (),
        wait_ms: int = 0,
    ) -> list[Entries]:
        """:meth:`get_entries` for ``queries`` ((queue id, offset, max count), distinct queue
        ids) of ``topic``, in their order, until ``total_bytes`` of units are selected (0: no
        bound; the queue that crosses it is answered whole, later ones are left out: the result
        is a prefix). With ``wait_ms``, held while no queue has a unit at its offset."""
        if not topic or not queries:
            raise InvalidArgumentError("topic and queues must be non-empty")
        if len({q for q, _, _ in queries}) != len(queries):
            raise InvalidArgumentError("queue ids must be distinct")
        for queue_id, offset, max_count in queries:
            self._check_range(queue_id, offset, max_count)
        if max_bytes < 0 or total_bytes < 0 or wait_ms < 0:
            raise InvalidArgumentError("max_bytes, total_bytes and wait_ms must be >= 0")
        filt = CodeFilter(tag_codes)
        limit = max_bytes or self.max_bytes

        def select() -> list[Entries]:
            out: list[Entries] = []
            selected = 0
            for queue_id, offset, max_count in queries:
                if total_bytes and selected >= total_bytes:
                    break
                entries = self._select(self.queues.find(topic, queue_id), offset, max_count, limit, filt)
                out.append(entries)
                selected += sum(entries.sizes)
            return out

        def waiting(answers: list[Entries]) -> bool:  # nothing new at any queue's offset
            return all(_nothing_new(e, offset) for e, (_, offset, _) in zip(answers, queries, strict=False))

        with self._tracer.start_as_current_span("dispatch.get_entries_many") as span:
            answers = select()
            deadline = time.monotonic() + wait_ms / 1000.0
            while wait_ms > 0 and waiting(answers) and (left := deadline - time.monotonic()) > 0:
                span.add_event("long polling")
                held = await self.long_polling.wait_for_topic_async(
                    topic, int(left * 1000), lambda: not waiting(select())
                )
                answers = select()
                if not held:  # maxHeldPolls reached: answered at once, as a single queue's pull
                    break
            span.set_attribute("mqstore.units", sum(len(e.sizes) for e in answers))
            return answers

    async def queue_info(self, topic: str, queue_id: int = -1) -> list[QueueInfo]:
        if queue_id < 0:
            return [
                QueueInfo(cq.queue_id, cq.min_offset_in_queue, cq.max_offset_in_queue)
                for cq in self.queues.queues_of(topic)
            ]
        cq = self.queues.find(topic, queue_id)
        return [
            QueueInfo(queue_id, cq.min_offset_in_queue, cq.max_offset_in_queue)
            if cq
            else QueueInfo(queue_id, 0, 0)
        ]

    async def offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, boundary: BoundaryType = BoundaryType.LOWER
    ) -> int:
        cq = self.queues.find(topic, queue_id)
        if cq is None:
            return 0
        search = cq.search_by_time(timestamp_ms, boundary)
        try:
            probe = next(search)
            while True:
                probe = search.send(await self._store_time_of(*probe))
        except StopIteration as done:
            return int(done.value)

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        max_offset = self.queues.max_offset_of(topic, queue_id)
        if offset > max_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is past the max offset {max_offset} of {topic}-{queue_id}"
            )
        self.offsets.commit_offset(group, topic, queue_id, offset)

    async def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        return self.offsets.query_offset(group, topic, queue_id)

    async def consumer_progress(self, group: str, topic: str, queue_nums: int) -> list[QueueProgress]:
        committed = self.offsets.offsets_of(group, topic)
        out = []
        for qid in range(queue_nums):
            cq = self.queues.find(topic, qid)
            lo, hi = (cq.min_offset_in_queue, cq.max_offset_in_queue) if cq else (0, 0)
            out.append(QueueProgress(qid, committed.get(qid, -1), lo, hi))
        return out

    async def status(self) -> DerivedStatus:
        return self._status_of()

    # -- the pop model (services.dispatch.pop) ------------------------------------------------------
    async def pop(
        self,
        group: str,
        topic: str,
        queue_id: int,
        *,
        tag_expression: str = "*",
        max_count: int = 32,
        invisible_ms: int = 60_000,
        wait_ms: int = 0,
    ) -> PopResult:
        return await self.pop_service.pop(
            group,
            topic,
            queue_id,
            tag_expression=tag_expression,
            max_count=max_count,
            invisible_ms=invisible_ms,
            wait_ms=wait_ms,
        )

    async def ack(self, group: str, topic: str, receipt_handles: Sequence[str]) -> list[StoreError | None]:
        return await self.pop_service.ack(group, topic, receipt_handles)

    async def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        return await self.pop_service.change_invisible(group, topic, receipt_handle, invisible_ms)

    async def forward_to_dead_letter(self, group: str, topic: str, receipt_handle: str) -> None:
        await self.pop_service.forward_to_dead_letter(group, topic, receipt_handle)

    async def upsert_group(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        return await self.pop_service.upsert_group(config)

    async def get_group(self, group: str) -> SubscriptionGroupConfig:
        return await self.pop_service.get_group(group)

    async def end_transaction(self, transaction_id: str, message_id: str, commit: bool, topic: str) -> None:
        await self.transactions.end(transaction_id, message_id, commit, topic)

    async def claim_transaction_checks(
        self, topics: Sequence[str], max_count: int = 64
    ) -> list[TransactionCheck]:
        return await self.transactions.claim_checks(topics, max_count)


def _nothing_new(entries: Entries, offset: int) -> bool:
    """The queue holds no unit at ``offset`` yet: a pull with a wait is held."""
    return entries.status in _WAITING and offset >= entries.max_offset
