"""RocketMQ 5 SendMessage on the gateway (spec sheet rocketmq-grpc-v2 §3).

v2 messages become store messages (services.gateway.rocketmq.convert); a message group picks its
queue by hash (FIFO), other messages are placed round robin by the commitlog; one entry per
message. A delivery time is held by the commitlog's timer topic; TRANSACTION messages become half
messages (libstore.transaction_message), ended by EndTransaction or by a check-back pushed to a
producer over Telemetry (services.gateway.rocketmq.transaction). Messages and bytes per send are
bounded (services.gateway.limits) and a send the gateway cannot keep up with is refused before
anything is written (TOO_MANY_REQUESTS, services.gateway.admission).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import grpc

from libstore.errors import MessageIllegalError
from libstore.message import Message
from libstore.producer_input import check_producer_topic
from libstore.record_framing import varint
from libstore.results import PutMessageResults, PutMessageStatus
from libstore.system_topics import HALF_TOPIC
from libstore.topic_config import TopicConfig
from libstore.transaction_message import TransactionId, half_message
from services._common import convert as common_convert
from services.gateway.acl import PUB
from services.gateway.rocketmq import convert
from services.gateway.rocketmq.activity import GatewayContext, metadata, now_ms, overall
from services.gateway.rocketmq.convert import V2Error
from services.gateway.rocketmq.pb import Code, definition, service

# The parts of a reply in which every message was stored, encoded once by protobuf: the top
# status (OK, "OK") and each entry's (OK, "PUT_OK").
_OK_CODE_NAME = Code.Name(Code.OK)
_TOP_OK = service.SendMessageResponse(status=convert.status()).SerializeToString()
_ENTRY_OK = service.SendResultEntry(
    status=convert.status(Code.OK, PutMessageStatus.PUT_OK.name)
).SerializeToString()
_MESSAGE_ID = 2  # SendResultEntry.message_id
_OFFSET_TAG = bytes((4 << 3,))  # SendResultEntry.offset, a varint


def encode_ok_reply(message_ids: list[str], queue_offsets: list[int]) -> bytes:
    """The SendMessageResponse of a send whose messages were all stored (PUT_OK, no half
    message), encoded as protobuf encodes what :func:`send_reply` builds for them: status OK,
    then per message its status (OK, "PUT_OK"), id and queue offset (a negative one as 0),
    without building it (convert.entries_reply; tests hold the two byte for byte)."""
    return convert.entries_reply(
        _TOP_OK,
        (
            _ENTRY_OK
            + convert.string_field(_MESSAGE_ID, message_id)
            + (_OFFSET_TAG + varint(queue_offset) if queue_offset > 0 else b"")
            for message_id, queue_offset in zip(message_ids, queue_offsets, strict=True)
        ),
    )


def send_reply(
    results: PutMessageResults, messages: Sequence[Message], message_ids: Sequence[str]
) -> service.SendMessageResponse:
    """The SendMessageResponse for ``results`` of ``messages`` (as appended: half messages in
    HALF_TOPIC get a transaction id) sent with ``message_ids``: an entry per message with its
    status, id and queue offset (0 for none), and the overall status."""
    response = service.SendMessageResponse()
    entries = response.entries
    for r, msg, mid in zip(results, messages, message_ids, strict=True):
        entry = entries.add()  # filled in place: no entry built and then copied in
        convert.set_status(
            entry.status,
            convert.PUT_STATUS_TO_CODE.get(r.status, Code.INTERNAL_SERVER_ERROR),
            r.status.name,
        )
        entry.message_id = mid
        entry.offset = max(r.queue_offset, 0)
        if msg.topic == HALF_TOPIC and r.status.appended:
            entry.transaction_id = TransactionId(r.queue_offset, r.phy_offset, r.size).encode()
    response.status.CopyFrom(overall([e.status for e in entries], "messages"))
    return response


class SendActivity:
    """SendMessage over ``ctx`` (module docstring). Raises V2Error."""

    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    async def send_message(
        self, request: service.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> service.SendMessageResponse | bytes:
        """The reply; when every message was stored, already encoded (:func:`encode_ok_reply`)."""
        if not request.messages:
            raise V2Error(Code.BAD_REQUEST, "no message to send")
        problem = self.ctx.limits.request_problem(len(request.messages), 0)
        if problem:
            raise V2Error(Code.BAD_REQUEST, problem)
        size = request.ByteSize()
        problem = self.ctx.limits.request_problem(0, size)
        if problem:
            raise V2Error(Code.MESSAGE_BODY_TOO_LARGE, problem)
        with self.ctx.admission.admit(size), self.ctx.tracer.start_as_current_span("gateway.v2.send") as span:
            span.set_attribute("mqstore.messages", len(request.messages))
            peer_ip, _ = common_convert.peer_host(context.peer())
            now = now_ms()
            configs: dict[str, TopicConfig] = {}
            for name in {m.topic.name for m in request.messages}:
                try:
                    check_producer_topic(name)
                except MessageIllegalError as exc:
                    raise V2Error(Code.ILLEGAL_TOPIC, str(exc)) from None
                self.ctx.authorize(context, PUB, name)
                config = configs[name] = await self.ctx.topic(name)
                if not config.writeable:
                    raise V2Error(Code.FORBIDDEN, f"topic {config.topic_name} is not writeable")
            messages, ids = [], []
            half_topics: set[str] = set()
            for m in request.messages:
                config = configs[m.topic.name]
                msg, mtype, group = convert.store_message(m, peer_ip=peer_ip, now_ms=now)
                allowed = convert.ACCEPT_TYPES[config.message_type]
                if mtype not in allowed:
                    raise V2Error(
                        Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                        f"topic {config.topic_name} takes {config.message_type.value} messages, "
                        f"not {definition.MessageType.Name(mtype)}",
                    )
                msg.queue_id = self._queue_for(config, group)
                if mtype == definition.TRANSACTION:
                    # Held as a half message until EndTransaction (or a check-back) resolves it;
                    # a delay (DELAY/TIMER_* properties) is held by the commitlog's timer topic.
                    msg = half_message(msg)
                    half_topics.add(m.topic.name)
                messages.append(msg)
                ids.append(m.system_properties.message_id)
            if half_topics:
                self.ctx.sessions.add_topics(metadata(context, "x-mq-client-id"), half_topics)
            results = await self.ctx.commitlog.append(messages)
            if results.all_ok and not half_topics:
                span.set_attribute("mqstore.status", _OK_CODE_NAME)
                return encode_ok_reply(ids, results.queue_offsets)
            response = send_reply(results, messages, ids)
            span.set_attribute("mqstore.status", Code.Name(response.status.code))
            return response

    @staticmethod
    def _queue_for(config: TopicConfig, group: str) -> int:
        """A message group's queue (its order is the queue's order); -1 (the commitlog places
        it round robin) without one."""
        if not group:
            return -1
        return int.from_bytes(hashlib.sha256(group.encode()).digest()[:8], "big") % max(
            config.write_queue_nums, 1
        )
