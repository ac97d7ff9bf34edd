"""RemoteDispatch: the DispatchPort over the DispatchService stub (split topology)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from libstore.consume_queue import BoundaryType
from libstore.consumer_offset_manager import QueueProgress
from libstore.errors import StoreError
from libstore.subscription_group import SubscriptionGroupConfig
from services._common.errors import store_error_of
from services._common.mux import carried_stub, channel_mux
from services._common.remote import DEFAULT_TIMEOUT_S, call
from services.dispatch.convert import PULL_STATUS_FROM_PB, group_from_pb, group_to_pb
from services.ports import DerivedStatus, Entries, PoppedMessage, PopResult, QueueInfo, TransactionCheck
from services.proto import dispatch_grpc, dispatch_pb

# The calls made for every pull, pop, ack and offset commit go on one stream
# (services._common.mux); the rest (admin, status) stay unary.
CARRIED = (
    "GetEntries",
    "GetEntriesMany",
    "GetQueueInfo",
    "CommitOffset",
    "QueryOffset",
    "Pop",
    "Ack",
    "ChangeInvisibleTime",
    "ForwardToDeadLetter",
    "EndTransaction",
)


class RemoteDispatch:
    """DispatchPort over ``channel``; long-polled calls get their hold time on top of the timeout."""

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        service = dispatch_pb.DESCRIPTOR.services_by_name["DispatchService"]
        stub = dispatch_grpc.DispatchServiceStub(channel)
        self.stub = carried_stub(stub, channel_mux(channel), service, CARRIED)
        self.timeout_s = timeout_s

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
        request = dispatch_pb.GetEntriesRequest(
            topic=topic,
            queue_id=queue_id,
            offset=offset,
            max_count=max_count,
            max_bytes=max_bytes,
            tag_codes=list(tag_codes),
            wait_ms=wait_ms,
        )
        r = await call(
            self.stub.GetEntries, request, idempotent=True, timeout_s=self.timeout_s + wait_ms / 1000.0
        )
        return _entries_from_pb(r)

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
        request = dispatch_pb.GetEntriesManyRequest(
            topic=topic,
            queues=[dispatch_pb.QueueRange(queue_id=q, offset=o, max_count=n) for q, o, n in queries],
            max_bytes=max_bytes,
            total_bytes=total_bytes,
            tag_codes=list(tag_codes),
            wait_ms=wait_ms,
        )
        r = await call(
            self.stub.GetEntriesMany, request, idempotent=True, timeout_s=self.timeout_s + wait_ms / 1000.0
        )
        return [_entries_from_pb(e) for e in r.entries]

    async def queue_info(self, topic: str, queue_id: int = -1) -> list[QueueInfo]:
        r = await call(
            self.stub.GetQueueInfo,
            dispatch_pb.GetQueueInfoRequest(topic=topic, queue_id=queue_id),
            idempotent=True,
            timeout_s=self.timeout_s,
        )
        return [QueueInfo(q.queue_id, q.min_offset, q.max_offset) for q in r.queues]

    async def offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, boundary: BoundaryType = BoundaryType.LOWER
    ) -> int:
        request = dispatch_pb.GetOffsetByTimeRequest(
            topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms, upper=boundary is BoundaryType.UPPER
        )
        r = await call(self.stub.GetOffsetByTime, request, idempotent=True, timeout_s=self.timeout_s)
        return r.offset

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        request = dispatch_pb.CommitOffsetRequest(group=group, topic=topic, queue_id=queue_id, offset=offset)
        await call(self.stub.CommitOffset, request, idempotent=True, timeout_s=self.timeout_s)

    async def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        request = dispatch_pb.QueryOffsetRequest(group=group, topic=topic, queue_id=queue_id)
        return (await call(self.stub.QueryOffset, request, idempotent=True, timeout_s=self.timeout_s)).offset

    async def consumer_progress(self, group: str, topic: str, queue_nums: int) -> list[QueueProgress]:
        request = dispatch_pb.GetConsumerProgressRequest(group=group, topic=topic, queue_nums=queue_nums)
        r = await call(self.stub.GetConsumerProgress, request, idempotent=True, timeout_s=self.timeout_s)
        known = {q.queue_id: q for q in r.queues}
        return [
            QueueProgress(qid, known[qid].committed_offset, known[qid].min_offset, known[qid].max_offset)
            if qid in known
            else QueueProgress(qid, -1, 0, 0)
            for qid in range(queue_nums)
        ]

    async def status(self) -> DerivedStatus:
        r = await call(
            self.stub.GetDispatchStatus,
            dispatch_pb.GetDispatchStatusRequest(),
            idempotent=True,
            timeout_s=self.timeout_s,
        )
        return DerivedStatus(r.reput_offset, r.confirm_offset, r.records_dispatched)

    # -- the pop model ------------------------------------------------------------------------------
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
        request = dispatch_pb.PopRequest(
            group=group,
            topic=topic,
            queue_id=queue_id,
            tag_expression=tag_expression,
            max_count=max_count,
            invisible_ms=invisible_ms,
            wait_ms=wait_ms,
        )
        # Not retried: a pop whose reply was lost leaves its messages in flight; they come back
        # when their invisible time passes.
        r = await call(self.stub.Pop, request, idempotent=False, timeout_s=self.timeout_s + wait_ms / 1000.0)
        return PopResult(
            [
                PoppedMessage(
                    m.queue_id,
                    m.queue_offset,
                    m.phy_offset,
                    m.size,
                    m.attempt,
                    m.receipt_handle,
                    m.visible_at_ms,
                )
                for m in r.messages
            ],
            fifo=r.fifo,
        )

    async def ack(self, group: str, topic: str, receipt_handles: Sequence[str]) -> list[StoreError | None]:
        request = dispatch_pb.AckRequest(group=group, topic=topic, receipt_handles=list(receipt_handles))
        r = await call(self.stub.Ack, request, idempotent=True, timeout_s=self.timeout_s)
        return [store_error_of(x.reason, x.message) if x.reason else None for x in r.results]

    async def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        request = dispatch_pb.ChangeInvisibleTimeRequest(
            group=group, topic=topic, receipt_handle=receipt_handle, invisible_ms=invisible_ms
        )
        r = await call(self.stub.ChangeInvisibleTime, request, idempotent=False, timeout_s=self.timeout_s)
        return r.receipt_handle

    async def forward_to_dead_letter(self, group: str, topic: str, receipt_handle: str) -> None:
        request = dispatch_pb.ForwardToDeadLetterRequest(
            group=group, topic=topic, receipt_handle=receipt_handle
        )
        await call(self.stub.ForwardToDeadLetter, request, idempotent=True, timeout_s=self.timeout_s)

    async def upsert_group(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        r = await call(
            self.stub.UpsertSubscriptionGroup, group_to_pb(config), idempotent=True, timeout_s=self.timeout_s
        )
        return group_from_pb(r)

    async def get_group(self, group: str) -> SubscriptionGroupConfig:
        request = dispatch_pb.GetSubscriptionGroupRequest(group=group)
        return group_from_pb(
            await call(self.stub.GetSubscriptionGroup, request, idempotent=True, timeout_s=self.timeout_s)
        )

    async def end_transaction(self, transaction_id: str, message_id: str, commit: bool, topic: str) -> None:
        request = dispatch_pb.EndTransactionRequest(
            transaction_id=transaction_id, message_id=message_id, commit=commit, topic=topic
        )
        # Idempotent: ending a resolved transaction again is OK and does nothing.
        await call(self.stub.EndTransaction, request, idempotent=True, timeout_s=self.timeout_s)

    async def claim_transaction_checks(
        self, topics: Sequence[str], max_count: int = 64
    ) -> list[TransactionCheck]:
        request = dispatch_pb.ClaimTransactionChecksRequest(topics=list(topics), max_count=max_count)
        # Not retried: a claim counts checks, and the next round claims again anyway.
        r = await call(self.stub.ClaimTransactionChecks, request, idempotent=False, timeout_s=self.timeout_s)
        return [TransactionCheck(c.transaction_id, c.record, c.check_times) for c in r.checks]


def _entries_from_pb(r: dispatch_pb.GetEntriesResponse) -> Entries:
    return Entries(
        PULL_STATUS_FROM_PB[r.status],
        r.next_offset,
        r.min_offset,
        r.max_offset,
        list(r.queue_offsets),
        list(r.phy_offsets),
        list(r.sizes),
    )
