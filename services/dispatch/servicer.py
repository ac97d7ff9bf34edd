"""DispatchServicer: mqstore.v1.DispatchService over a LocalDispatch (thin translation)."""

from __future__ import annotations

import grpc

from libstore.consume_queue import BoundaryType
from services.dispatch.convert import entries_to_pb, group_from_pb, group_to_pb, progress_to_pb
from services.dispatch.local import LocalDispatch
from services.proto import dispatch_grpc, dispatch_pb

SERVICE_NAME = dispatch_pb.DESCRIPTOR.services_by_name["DispatchService"].full_name


class DispatchServicer(dispatch_grpc.DispatchServiceServicer):
    def __init__(self, port: LocalDispatch) -> None:
        self.port = port

    async def GetEntries(
        self, request: dispatch_pb.GetEntriesRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.GetEntriesResponse:
        e = await self.port.get_entries(
            request.topic,
            request.queue_id,
            request.offset,
            request.max_count,
            max_bytes=request.max_bytes,
            tag_codes=list(request.tag_codes),
            wait_ms=request.wait_ms,
        )
        return entries_to_pb(e)

    async def GetEntriesMany(
        self, request: dispatch_pb.GetEntriesManyRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.GetEntriesManyResponse:
        answers = await self.port.get_entries_many(
            request.topic,
            [(q.queue_id, q.offset, q.max_count) for q in request.queues],
            max_bytes=request.max_bytes,
            total_bytes=request.total_bytes,
            tag_codes=list(request.tag_codes),
            wait_ms=request.wait_ms,
        )
        return dispatch_pb.GetEntriesManyResponse(entries=[entries_to_pb(e) for e in answers])

    async def GetQueueInfo(
        self, request: dispatch_pb.GetQueueInfoRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.GetQueueInfoResponse:
        infos = await self.port.queue_info(request.topic, request.queue_id)
        return dispatch_pb.GetQueueInfoResponse(
            queues=[
                dispatch_pb.QueueInfo(queue_id=q.queue_id, min_offset=q.min_offset, max_offset=q.max_offset)
                for q in infos
            ]
        )

    async def GetOffsetByTime(
        self, request: dispatch_pb.GetOffsetByTimeRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.GetOffsetByTimeResponse:
        boundary = BoundaryType.UPPER if request.upper else BoundaryType.LOWER
        offset = await self.port.offset_by_time(
            request.topic, request.queue_id, request.timestamp_ms, boundary
        )
        return dispatch_pb.GetOffsetByTimeResponse(offset=offset)

    async def CommitOffset(
        self, request: dispatch_pb.CommitOffsetRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.CommitOffsetResponse:
        await self.port.commit_offset(request.group, request.topic, request.queue_id, request.offset)
        return dispatch_pb.CommitOffsetResponse()

    async def QueryOffset(
        self, request: dispatch_pb.QueryOffsetRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.QueryOffsetResponse:
        return dispatch_pb.QueryOffsetResponse(
            offset=await self.port.query_offset(request.group, request.topic, request.queue_id)
        )

    async def GetConsumerProgress(
        self, request: dispatch_pb.GetConsumerProgressRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.ConsumerProgress:
        queue_nums = request.queue_nums or 1 + max(
            (q.queue_id for q in await self.port.queue_info(request.topic)), default=-1
        )
        return progress_to_pb(
            request.group,
            request.topic,
            await self.port.consumer_progress(request.group, request.topic, queue_nums),
        )

    async def GetDispatchStatus(
        self, request: dispatch_pb.GetDispatchStatusRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.DispatchStatus:
        s = await self.port.status()
        return dispatch_pb.DispatchStatus(
            reput_offset=s.reput_offset,
            confirm_offset=s.confirm_offset,
            records_dispatched=s.records_dispatched,
            behind_bytes=max(0, s.confirm_offset - s.reput_offset),
        )

    # -- the pop model ------------------------------------------------------------------------------
    async def Pop(
        self, request: dispatch_pb.PopRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.PopResponse:
        r = await self.port.pop(
            request.group,
            request.topic,
            request.queue_id,
            tag_expression=request.tag_expression or "*",
            max_count=request.max_count,
            invisible_ms=request.invisible_ms,
            wait_ms=request.wait_ms,
        )
        return dispatch_pb.PopResponse(
            messages=[
                dispatch_pb.PoppedMessage(
                    queue_id=m.queue_id,
                    queue_offset=m.queue_offset,
                    phy_offset=m.phy_offset,
                    size=m.size,
                    attempt=m.attempt,
                    receipt_handle=m.receipt_handle,
                    visible_at_ms=m.visible_at_ms,
                )
                for m in r.messages
            ],
            fifo=r.fifo,
        )

    async def Ack(
        self, request: dispatch_pb.AckRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.AckResponse:
        errors = await self.port.ack(request.group, request.topic, list(request.receipt_handles))
        return dispatch_pb.AckResponse(
            results=[
                dispatch_pb.AckResult(reason=e.reason, message=str(e)) if e else dispatch_pb.AckResult()
                for e in errors
            ]
        )

    async def ChangeInvisibleTime(
        self, request: dispatch_pb.ChangeInvisibleTimeRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.ChangeInvisibleTimeResponse:
        handle = await self.port.change_invisible(
            request.group, request.topic, request.receipt_handle, request.invisible_ms
        )
        return dispatch_pb.ChangeInvisibleTimeResponse(receipt_handle=handle)

    async def ForwardToDeadLetter(
        self, request: dispatch_pb.ForwardToDeadLetterRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.ForwardToDeadLetterResponse:
        await self.port.forward_to_dead_letter(request.group, request.topic, request.receipt_handle)
        return dispatch_pb.ForwardToDeadLetterResponse()

    async def UpsertSubscriptionGroup(
        self, request: dispatch_pb.SubscriptionGroup, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.SubscriptionGroup:
        return group_to_pb(await self.port.upsert_group(group_from_pb(request)))

    async def GetSubscriptionGroup(
        self, request: dispatch_pb.GetSubscriptionGroupRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.SubscriptionGroup:
        return group_to_pb(await self.port.get_group(request.group))

    async def EndTransaction(
        self, request: dispatch_pb.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.EndTransactionResponse:
        await self.port.end_transaction(
            request.transaction_id, request.message_id, request.commit, request.topic
        )
        return dispatch_pb.EndTransactionResponse()

    async def ClaimTransactionChecks(
        self, request: dispatch_pb.ClaimTransactionChecksRequest, context: grpc.aio.ServicerContext
    ) -> dispatch_pb.ClaimTransactionChecksResponse:
        checks = await self.port.claim_transaction_checks(list(request.topics), request.max_count or 64)
        return dispatch_pb.ClaimTransactionChecksResponse(
            checks=[
                dispatch_pb.TransactionCheck(
                    transaction_id=c.transaction_id, record=c.record, check_times=c.check_times
                )
                for c in checks
            ]
        )


def add_to_server(servicer: DispatchServicer, server: grpc.aio.Server) -> list[str]:
    dispatch_grpc.add_DispatchServiceServicer_to_server(servicer, server)
    return [SERVICE_NAME]
