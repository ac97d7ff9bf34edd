"""RocketMQ 5 consumption on the gateway: ReceiveMessage, AckMessage, ChangeInvisibleDuration and
ForwardMessageToDeadLetterQueue (spec sheet rocketmq-grpc-v2 §4), over the pop model kept by the
dispatch service (services.dispatch.pop).

Delivery state is not held here, so gateways are interchangeable; the exception is a push
consumer's renewal of invisible time (services.gateway.rocketmq.renewal), which lives with the
gateway that served the receive: after that gateway goes away, an ack with the original handle
is refused and the message comes back after its invisible time (at-least-once). Long polls are
bounded per client and in total (TOO_MANY_REQUESTS past them when nothing is there to deliver).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Sequence

import grpc

from libstore.errors import StoreError
from libstore.message_filter import TagFilter
from libstore.record_codec import decode_record
from services._common import message_trace
from services.gateway.acl import SUB
from services.gateway.rocketmq import convert, namespace
from services.gateway.rocketmq.activity import (
    NAMESPACE_HEADER,
    GatewayContext,
    metadata,
    now_ms,
    overall,
)
from services.gateway.rocketmq.convert import V2Error
from services.gateway.rocketmq.error_status import error_status
from services.gateway.rocketmq.pb import Code, definition, service
from services.ports import NACK_INVISIBLE_MS

log = logging.getLogger(__name__)

MAX_RECEIVE_BATCH = 32
MAX_LONG_POLLING_MS = 20_000
DEADLINE_MARGIN_MS = 800  # end a long poll this long before the client's deadline


# The parts of an ack's reply in which every entry was acked, encoded once by protobuf: the
# top status and each entry's (both OK, "OK").
_ACK_TOP_OK = service.AckMessageResponse(status=convert.status()).SerializeToString()
_ACK_ENTRY_OK = service.AckMessageResultEntry(status=convert.status()).SerializeToString()
_ACK_MESSAGE_ID, _ACK_HANDLE = 1, 2  # AckMessageResultEntry.message_id, .receipt_handle


def ack_reply(
    acked: Sequence[service.AckMessageEntry], errors: Sequence[StoreError | None]
) -> service.AckMessageResponse:
    """The AckMessageResponse for the ``acked`` entries of a request with their outcomes
    (None: acked): each entry's message id, receipt handle and status, and the overall status."""
    response = service.AckMessageResponse()
    entries = response.entries
    for e, err in zip(acked, errors, strict=True):
        entry = entries.add()  # filled in place: no entry built and then copied in
        entry.message_id = e.message_id
        entry.receipt_handle = e.receipt_handle
        if err is None:
            convert.set_status(entry.status)
        else:
            convert.set_status(entry.status, convert.code_of_error(err), str(err))
    response.status.CopyFrom(overall([e.status for e in entries], "acks"))
    return response


def encode_acked_reply(acked: Sequence[service.AckMessageEntry]) -> bytes:
    """:func:`ack_reply` of entries that were all acked, encoded as protobuf encodes it, without
    building it (convert.entries_reply; tests hold the two byte for byte)."""
    return convert.entries_reply(
        _ACK_TOP_OK,
        (
            convert.string_field(_ACK_MESSAGE_ID, e.message_id)
            + convert.string_field(_ACK_HANDLE, e.receipt_handle)
            + _ACK_ENTRY_OK
            for e in acked
        ),
    )


class ConsumeActivity:
    """Receive, ack, change of invisible time and dead-lettering over ``ctx`` (module
    docstring). Raises V2Error (the receive answers it in its responses)."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    async def receive_message(
        self, request: service.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[service.ReceiveMessageResponse, None]:
        """What was popped for a call that does not get it out (the client cancelled or went
        away meanwhile, or the answer failed) is given back: visible again in
        NACK_INVISIBLE_MS, as RocketMQ's proxy nacks a message it could not write, instead of
        hidden for its whole invisible time; messages already sent are not. A cancellation
        while the pop waits or the records are read lands here at once; one while grpc.aio
        sends a yielded response, when the abandoned generator is closed."""
        ns = metadata(context, NAMESPACE_HEADER)
        taken: list[str] = []  # receipt handles popped for this call
        sent: set[str] = set()  # those of messages grpc.aio has sent
        answered = False
        try:
            try:
                if ns:
                    namespace.wrap_request(request)
                responses = await self._receive(request, context, taken)
            except Exception as exc:
                if taken:  # popped, then failed before any of it was answered: not delivered
                    self._give_back(request.group.name, request.message_queue.topic.name, taken)
                    taken = []
                responses = [
                    service.ReceiveMessageResponse(status=error_status(exc, "ReceiveMessage")),
                    service.ReceiveMessageResponse(delivery_timestamp=convert.timestamp_ms(now_ms())),
                ]
            for r in responses:
                if ns:
                    namespace.unwrap_response(r, ns)
                yield r
                if taken and r.HasField("message"):  # resumed: grpc.aio has sent it
                    sent.add(r.message.system_properties.receipt_handle)
            answered = True
        finally:
            if taken and not answered:
                rest = [h for h in taken if h not in sent]
                if rest:
                    self._give_back(request.group.name, request.message_queue.topic.name, rest)

    def _give_back(self, group: str, topic: str, handles: list[str]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(
                self.ctx.renewer.give_back(group, topic, handles, NACK_INVISIBLE_MS)
            )
        except RuntimeError:  # closed with the loop gone (shutdown): back after their invisible time
            return
        self.ctx.releases.add(task)
        task.add_done_callback(self.ctx.releases.discard)

    def _authorize_subscriber(self, context: grpc.aio.ServicerContext, topic: str, group: str) -> None:
        """Refuse an empty consumer group (ILLEGAL_CONSUMER_GROUP), then check that the caller may
        subscribe to ``topic`` as ``group`` (the ACL)."""
        if not group:
            raise V2Error(Code.ILLEGAL_CONSUMER_GROUP, "consumer group is empty")
        self.ctx.authorize(context, SUB, topic, group)

    async def _receive(
        self, request: service.ReceiveMessageRequest, context: grpc.aio.ServicerContext, taken: list[str]
    ) -> list[service.ReceiveMessageResponse]:
        """The responses of one receive; the receipt handles it pops are added to ``taken``
        as soon as the pop returns."""
        group = request.group.name
        resource = request.message_queue.topic
        self._authorize_subscriber(context, resource.name, group)
        config = await self.ctx.topic(resource.name)
        if not config.readable:
            raise V2Error(Code.FORBIDDEN, f"topic {config.topic_name} is not readable")
        expr = request.filter_expression
        if expr.type == definition.SQL:
            raise V2Error(Code.NOT_IMPLEMENTED, "SQL92 filters are not supported; use a TAG expression")
        filt = TagFilter(expr.expression or "*")
        batch = request.batch_size or MAX_RECEIVE_BATCH
        if not 1 <= batch <= MAX_RECEIVE_BATCH:
            raise V2Error(Code.BAD_REQUEST, f"batch size must be within 1..{MAX_RECEIVE_BATCH}")
        invisible_ms = (
            convert.to_ms(request.invisible_duration)
            if request.HasField("invisible_duration")
            else self.ctx.default_invisible_ms
        )
        # A push consumer's receive: hidden for the default time, renewed while it is connected.
        renew = request.auto_renew and not request.HasField("invisible_duration")
        client_id = metadata(context, "x-mq-client-id")
        if not renew:
            self.ctx.check_invisible(invisible_ms, self.ctx.invisible_bounds_ms[0])
        wait_ms = (
            convert.to_ms(request.long_polling_timeout)
            if request.HasField("long_polling_timeout")
            else MAX_LONG_POLLING_MS
        )
        remaining = context.time_remaining()
        if remaining is not None:
            wait_ms = min(wait_ms, int(remaining * 1000) - DEADLINE_MARGIN_MS)
        wait_ms = max(0, min(wait_ms, MAX_LONG_POLLING_MS))
        with self.ctx.tracer.start_as_current_span("gateway.v2.receive") as span:
            hold = self.ctx.held_polls.hold(context.peer()) if wait_ms else contextlib.nullcontext(False)
            with hold as may_hold:
                result = await self.ctx.dispatch.pop(
                    group,
                    resource.name,
                    -1,
                    tag_expression=filt.expression,
                    max_count=batch,
                    invisible_ms=invisible_ms,
                    wait_ms=wait_ms if may_hold else 0,
                )
            taken.extend(m.receipt_handle for m in result.messages)
            if wait_ms and not may_hold and not result.messages:
                limits = self.ctx.limits
                raise V2Error(
                    Code.TOO_MANY_REQUESTS,
                    f"this client already has {limits.max_held_polls_per_client} receives waiting "
                    f"(maxHeldPollsPerClient) or the gateway {limits.max_held_polls} (maxHeldPolls); "
                    "retry after a back-off",
                )
            answered = time.perf_counter()
            raws = (
                await self.ctx.commitlog.read([(m.phy_offset, m.size) for m in result.messages])
                if result.messages
                else []
            )
            out: list[service.ReceiveMessageResponse] = []
            delivered_bytes = 0
            sends: list[str | None] = []  # the delivered messages' trace contexts
            skipped: list[str] = []
            poisoned: list[str] = []
            for popped, raw in zip(result.messages, raws, strict=True):
                if not raw:
                    skipped.append(popped.receipt_handle)  # cleaned up under the group: nothing to deliver
                    continue
                try:
                    rec = decode_record(raw, check_crc=False)
                    if (rec.queue_id, rec.queue_offset) != (popped.queue_id, popped.queue_offset):
                        # The ConsumeQueue unit points at another record (damaged): never hand
                        # that record out as this slot. It stays in flight and comes back after
                        # its invisible time, and says so again, until the queue is repaired.
                        log.error(
                            "group %s: the ConsumeQueue unit %s:%d:%d points at the record of %d:%d "
                            "(CommitLog offset %d); not delivered",
                            group,
                            resource.name,
                            popped.queue_id,
                            popped.queue_offset,
                            rec.queue_id,
                            rec.queue_offset,
                            popped.phy_offset,
                        )
                        continue
                    if not filt.matches_tags(rec.tags):
                        skipped.append(popped.receipt_handle)  # a tags-code collision: not for this group
                        continue
                    response = service.ReceiveMessageResponse()
                    convert.consumer_message(  # filled in place: no copy into the response
                        rec,
                        namespace=resource.resource_namespace,
                        receipt_handle=popped.receipt_handle,
                        attempt=popped.attempt,
                        invisible_ms=invisible_ms,
                        into=response.message,
                    )
                except Exception:  # one bad record must not fail the batch: it is moved aside
                    log.exception(
                        "group %s: message %s:%d:%d cannot be delivered over this protocol",
                        group,
                        resource.name,
                        popped.queue_id,
                        popped.queue_offset,
                    )
                    poisoned.append(popped.receipt_handle)
                    continue
                if renew:
                    self.ctx.renewer.track(
                        client_id, group, resource.name, popped.receipt_handle, popped.visible_at_ms
                    )
                out.append(response)
                delivered_bytes += len(raw)
                sends.append(message_trace.traceparent_of(rec.properties))
            if skipped:
                await self.ctx.dispatch.ack(group, resource.name, skipped)
            for handle in poisoned:  # the dead-letter queue, or quarantine when even that fails
                await self.ctx.dispatch.forward_to_dead_letter(group, resource.name, handle)
            span.set_attribute("mqstore.messages", len(out))
            if span.is_recording():
                span.set_attribute(message_trace.SYSTEM, message_trace.SYSTEM_NAME)
                span.set_attribute(message_trace.OPERATION, "receive")
                span.set_attribute(message_trace.DESTINATION, resource.name)
                span.set_attribute(message_trace.CONSUMER_GROUP, group)
                for link in message_trace.links_to(sends):
                    span.add_link(link.context)
            self.ctx.metrics.record(resource.name, group, len(out), delivered_bytes, answered)
        stamp = service.ReceiveMessageResponse(delivery_timestamp=convert.timestamp_ms(now_ms()))
        if not out:
            return [
                service.ReceiveMessageResponse(
                    status=convert.status(Code.MESSAGE_NOT_FOUND, "no new message")
                ),
                stamp,
            ]
        return [service.ReceiveMessageResponse(status=convert.status()), *out, stamp]

    async def ack_message(
        self, request: service.AckMessageRequest, context: grpc.aio.ServicerContext
    ) -> service.AckMessageResponse | bytes:
        """The reply; when every entry was acked, already encoded (:func:`encode_acked_reply`)."""
        if not request.group.name:
            raise V2Error(Code.ILLEGAL_CONSUMER_GROUP, "consumer group is empty")
        if not request.entries:
            raise V2Error(Code.BAD_REQUEST, "no entry to ack")
        self.ctx.authorize(context, SUB, request.topic.name, request.group.name)
        acked = request.entries
        async with self.ctx.renewer.settling([e.receipt_handle for e in acked]) as handles:
            errors = await self.ctx.dispatch.ack(request.group.name, request.topic.name, handles)
        if not any(errors):
            return encode_acked_reply(acked)
        return ack_reply(acked, errors)

    async def change_invisible_duration(
        self, request: service.ChangeInvisibleDurationRequest, context: grpc.aio.ServicerContext
    ) -> service.ChangeInvisibleDurationResponse:
        self._authorize_subscriber(context, request.topic.name, request.group.name)
        invisible_ms = convert.to_ms(request.invisible_duration)
        self.ctx.check_invisible(invisible_ms, 0)
        # A nack: the client's back-off decides from now on, so renewal stops.
        async with self.ctx.renewer.settling([request.receipt_handle]) as (current,):
            handle = await self.ctx.dispatch.change_invisible(
                request.group.name, request.topic.name, current, invisible_ms
            )
        return service.ChangeInvisibleDurationResponse(status=convert.status(), receipt_handle=handle)

    async def forward_to_dead_letter_queue(
        self, request: service.ForwardMessageToDeadLetterQueueRequest, context: grpc.aio.ServicerContext
    ) -> service.ForwardMessageToDeadLetterQueueResponse:
        self._authorize_subscriber(context, request.topic.name, request.group.name)
        async with self.ctx.renewer.settling([request.receipt_handle]) as (current,):
            await self.ctx.dispatch.forward_to_dead_letter(request.group.name, request.topic.name, current)
        return service.ForwardMessageToDeadLetterQueueResponse(status=convert.status())
