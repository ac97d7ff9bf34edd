"""apache.rocketmq.v2 Message <-> libstore messages, and store outcomes -> v2 status codes.

Property names are RocketMQ's (``MessageConst``): the v2 system properties a producer sets map to
TAGS, KEYS (space separated), UNIQ_KEY (the client's message id), ``__SHARDINGKEY`` (message
group), ``TIMER_DELIVER_MS`` (delivery time) and TRAN_MSG/PGROUP (transactions); everything else
travels as user properties. Limits are the proxy's defaults (spec sheet rocketmq-grpc-v2 §8): body
1 byte to 4 MiB, at most 128 user properties and 16 KiB of them, message group under 64 bytes,
no control characters, no system property names among user properties.

Messages delivered to consumers carry an MD5 body digest (uppercase hex, as the proxy sends) and
IDENTITY encoding (GZIP when the record has RocketMQ's COMPRESSED flag).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from libstore import errors as E
from libstore.message import Message, MessageConst, MessageRecord, MessageSysFlag, ascii_int
from libstore.producer_input import STORE_PROPERTIES
from libstore.record_framing import WIRE_LENGTH_DELIMITED, field_header
from libstore.results import PutMessageStatus
from libstore.scheduled_message import MAX_DELAY_MS
from libstore.system_topics import TIMER_DELAY_MS, TIMER_DELAY_SEC, TIMER_DELIVER_MS
from libstore.topic_config import TopicMessageType
from services._common.convert import host_text
from services._common.message_trace import TRACEPARENT
from services.gateway.rocketmq.pb import Code, definition

SHARDING_KEY = "__SHARDINGKEY"
PRODUCER_GROUP = "PGROUP"
MAX_BODY_SIZE = 4 * 1024 * 1024
MAX_USER_PROPERTIES = 128
MAX_USER_PROPERTIES_BYTES = 16 * 1024
MAX_MESSAGE_GROUP_BYTES = 64
MAX_TRACE_CONTEXT = 512  # a W3C traceparent is 55 characters

# What a v2 user property may not be named: the store's own properties (STORE_PROPERTIES) and
# those this protocol sets from the message's system properties. WAIT is not among them: the
# v2 protocol has no system property for it, and a user property WAIT is the message's WAIT, as
# RocketMQ's broker reads it from the properties (RocketMQ's own proxy refuses the name). Nor is
# traceparent: a user property of that name is the message's trace context unless the
# trace_context system property gives one (services._common.message_trace).
SYSTEM_PROPERTY_NAMES = STORE_PROPERTIES | frozenset(
    {
        MessageConst.KEYS,
        MessageConst.TAGS,
        MessageConst.DELAY,
        MessageConst.UNIQ_KEY,
        MessageConst.RECONSUME_TIME,
        MessageConst.MAX_RECONSUME_TIMES,
        SHARDING_KEY,
        TIMER_DELIVER_MS,
        PRODUCER_GROUP,
        "CONSUME_START_TIME",
        "TRACE_ON",
        "TRACE_CONTEXT",
        # Scheduling goes through delivery_timestamp on this protocol: a user property may not
        # delay a message of a NORMAL topic behind the topic type's back.
        TIMER_DELAY_SEC,
        TIMER_DELAY_MS,
    }
)

# Stored properties a v2 consumer does not get among its user properties: the system ones, and
# WAIT and traceparent (the latter comes back as the trace_context system property), as
# RocketMQ's proxy leaves its own names out.
HIDDEN_ON_DELIVERY = SYSTEM_PROPERTY_NAMES | {MessageConst.WAIT, TRACEPARENT}

ACCEPT_TYPES = {
    TopicMessageType.NORMAL: [definition.NORMAL],
    TopicMessageType.FIFO: [definition.FIFO],
    TopicMessageType.DELAY: [definition.DELAY],
    TopicMessageType.TRANSACTION: [definition.TRANSACTION],
    TopicMessageType.MIXED: [definition.NORMAL, definition.FIFO, definition.DELAY, definition.TRANSACTION],
}


class V2Error(Exception):
    """A request the RocketMQ protocol answers with a non-OK ``Status`` (the call stays OK)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def status(code: int = Code.OK, message: str = "OK") -> definition.Status:
    return definition.Status(code=code, message=message)  # type: ignore[arg-type]


def set_status(target: definition.Status, code: int = Code.OK, message: str = "OK") -> None:
    """Fill ``target`` (a response's own Status field) in place: cheaper than building a
    Status and copying it in through a constructor, on every entry of every answer."""
    target.code = code  # type: ignore[assignment]
    target.message = message


# Replies whose every entry succeeded (SendMessage, AckMessage) are encoded by hand: building
# the response message and serializing it cost 9-11 us for one entry, joining bytes about 2.
ENTRIES_FIELD = 2  # SendMessageResponse.entries, AckMessageResponse.entries


def string_field(number: int, text: str) -> bytes:
    """A proto3 string field (``number`` < 16) as protobuf encodes it: nothing when empty."""
    raw = text.encode()
    return field_header(number << 3 | WIRE_LENGTH_DELIMITED, len(raw)) + raw if raw else b""


def entries_reply(top_status: bytes, entries: Iterable[bytes]) -> bytes:
    """A response as protobuf encodes it from ``top_status`` (its ``status`` field, field 1,
    encoded) and the encodings of its entries (field ENTRIES_FIELD, in order)."""
    tag = ENTRIES_FIELD << 3 | WIRE_LENGTH_DELIMITED
    parts = [top_status]
    for entry in entries:
        parts.append(field_header(tag, len(entry)))
        parts.append(entry)
    return b"".join(parts)


def timestamp_ms(ms: int) -> Timestamp:
    out = Timestamp()
    set_ms(out, ms)
    return out


def duration_ms(ms: int) -> Duration:
    out = Duration()
    set_ms(out, ms)
    return out


def set_ms(target: Timestamp | Duration, ms: int) -> None:
    """Fill a Timestamp or Duration (a message's own field, say) in place with ``ms`` milliseconds."""
    target.seconds = ms // 1000
    target.nanos = (ms % 1000) * 1_000_000


def to_ms(value: Timestamp | Duration) -> int:
    return value.seconds * 1000 + value.nanos // 1_000_000


# -- outcomes ------------------------------------------------------------------------------------------
PUT_STATUS_TO_CODE: dict[PutMessageStatus, int] = {
    PutMessageStatus.PUT_OK: Code.OK,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
    PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH: Code.HA_NOT_AVAILABLE,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: Code.INTERNAL_SERVER_ERROR,
    PutMessageStatus.OS_PAGE_CACHE_BUSY: Code.TOO_MANY_REQUESTS,
    PutMessageStatus.CREATE_MAPPED_FILE_FAILED: Code.INTERNAL_SERVER_ERROR,
    PutMessageStatus.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: Code.MESSAGE_PROPERTIES_TOO_LARGE,
    PutMessageStatus.UNKNOWN_ERROR: Code.INTERNAL_SERVER_ERROR,
}


# By class, as services._common.errors maps gRPC codes: the nearest class of an error wins.
_V2_CODES: dict[type[BaseException], int] = {
    E.AuthenticationError: Code.UNAUTHORIZED,
    E.PermissionDeniedError: Code.FORBIDDEN,
    E.InvalidArgumentError: Code.BAD_REQUEST,
    E.InvalidReceiptHandleError: Code.INVALID_RECEIPT_HANDLE,
    E.TopicNotFoundError: Code.TOPIC_NOT_FOUND,
    E.MessageIllegalError: Code.BAD_REQUEST,
    E.PropertiesSizeExceededError: Code.MESSAGE_PROPERTIES_TOO_LARGE,
    E.IllegalTopicError: Code.ILLEGAL_TOPIC,
    E.MessageNotFoundError: Code.MESSAGE_NOT_FOUND,
    E.NotMasterError: Code.HA_NOT_AVAILABLE,
    E.OSPageCacheBusyError: Code.TOO_MANY_REQUESTS,
    E.TooManyRequestsError: Code.TOO_MANY_REQUESTS,
    E.DiskFullError: Code.TOO_MANY_REQUESTS,
}


def code_of_error(exc: Exception) -> int:
    """The v2 code for a store error (spec sheet §6, the proxy's mapping; by the error's nearest
    mapped class, INTERNAL_SERVER_ERROR when none)."""
    if isinstance(exc, V2Error):
        return exc.code
    return E.nearest_entry(_V2_CODES, exc, Code.INTERNAL_SERVER_ERROR)


# -- producer -> store ---------------------------------------------------------------------------------
def message_type_of(props: Mapping[str, str]) -> int:
    """The v2 MessageType a stored message was sent as."""
    if props.get(MessageConst.TRAN_MSG) == "true":
        return definition.TRANSACTION
    if TIMER_DELIVER_MS in props or props.get(MessageConst.DELAY, "0") not in ("", "0"):
        return definition.DELAY
    if SHARDING_KEY in props:
        return definition.FIFO
    return definition.NORMAL


_CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f]")


def _check_text(what: str, value: str, code: int) -> None:
    if _CONTROL_CHARACTERS.search(value) is not None:
        raise V2Error(code, f"{what} holds control characters")


def store_message(m: definition.Message, *, peer_ip: str, now_ms: int) -> tuple[Message, int, str]:
    """The libstore Message for a v2 message, its v2 type, and its message group ("" if none).
    Raises V2Error with the proxy's code for what the proxy refuses."""
    # Each read of a protobuf field makes a new Python object (a body is copied each time):
    # every field is read once.
    sp = m.system_properties
    body = m.body
    if not body:
        raise V2Error(Code.MESSAGE_BODY_EMPTY, "message body is empty")
    if len(body) > MAX_BODY_SIZE:
        raise V2Error(Code.MESSAGE_BODY_TOO_LARGE, f"message body is larger than {MAX_BODY_SIZE} bytes")
    message_id = sp.message_id
    if not message_id:
        raise V2Error(Code.ILLEGAL_MESSAGE_ID, "message id is missing")
    _check_text("message id", message_id, Code.ILLEGAL_MESSAGE_ID)
    user_properties = m.user_properties
    if len(user_properties) > MAX_USER_PROPERTIES:
        raise V2Error(Code.MESSAGE_PROPERTIES_TOO_LARGE, f"more than {MAX_USER_PROPERTIES} user properties")
    props: dict[str, str] = dict(user_properties)
    size = 0
    for key, value in props.items():
        if not key or key in SYSTEM_PROPERTY_NAMES:
            raise V2Error(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property key {key!r} is reserved or empty")
        if _CONTROL_CHARACTERS.search(key) or _CONTROL_CHARACTERS.search(value):
            raise V2Error(Code.ILLEGAL_MESSAGE_PROPERTY_KEY, f"property {key!r} holds control characters")
        size += len(key.encode()) + len(value.encode())
    if size > MAX_USER_PROPERTIES_BYTES:
        raise V2Error(
            Code.MESSAGE_PROPERTIES_TOO_LARGE, f"user properties exceed {MAX_USER_PROPERTIES_BYTES} bytes"
        )
    if sp.HasField("tag"):
        tag = sp.tag
        if not tag.strip() or "|" in tag:
            raise V2Error(Code.ILLEGAL_MESSAGE_TAG, f"tag {tag!r} is blank or holds '|'")
        _check_text("tag", tag, Code.ILLEGAL_MESSAGE_TAG)
        props[MessageConst.TAGS] = tag
    keys = list(sp.keys)
    for key in keys:
        if not key.strip() or MessageConst.KEY_SEPARATOR in key:
            raise V2Error(Code.ILLEGAL_MESSAGE_KEY, f"key {key!r} is blank or holds a space")
        _check_text("key", key, Code.ILLEGAL_MESSAGE_KEY)
    if keys:
        props[MessageConst.KEYS] = MessageConst.KEY_SEPARATOR.join(keys)
    props[MessageConst.UNIQ_KEY] = message_id
    # The client's send (W3C traceparent text), kept only when it could be one: a tracing
    # field never fails a send.
    trace_context = sp.trace_context if sp.HasField("trace_context") else ""
    if trace_context and trace_context.isprintable() and len(trace_context) <= MAX_TRACE_CONTEXT:
        props[TRACEPARENT] = trace_context
    mtype = sp.message_type or definition.NORMAL
    group = ""
    if sp.HasField("message_group"):
        group = sp.message_group
        if not group.strip() or len(group.encode()) >= MAX_MESSAGE_GROUP_BYTES:
            raise V2Error(
                Code.ILLEGAL_MESSAGE_GROUP, f"message group must be 1-{MAX_MESSAGE_GROUP_BYTES - 1} bytes"
            )
        _check_text("message group", group, Code.ILLEGAL_MESSAGE_GROUP)
        props[SHARDING_KEY] = group
    if sp.HasField("delivery_timestamp"):
        deliver_ms = to_ms(sp.delivery_timestamp)
        if sp.delivery_timestamp.seconds > 100_000_000_000:  # the client's ms-in-seconds quirk (§5)
            deliver_ms = sp.delivery_timestamp.seconds
        if deliver_ms - now_ms > MAX_DELAY_MS:
            raise V2Error(
                Code.ILLEGAL_DELIVERY_TIME,
                f"delivery time is more than {MAX_DELAY_MS // 86_400_000} days ahead",
            )
        props[TIMER_DELIVER_MS] = str(max(deliver_ms, now_ms))
    if mtype == definition.TRANSACTION:
        if TIMER_DELIVER_MS in props:  # the proxy refuses it too: a half message has no delivery time
            raise V2Error(Code.BAD_REQUEST, "a transactional message cannot have a delivery timestamp")
        props[MessageConst.TRAN_MSG] = "true"
    born_ms = to_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else now_ms
    msg = Message(
        m.topic.name,
        body,
        -1,
        properties=props,
        born_timestamp=born_ms or now_ms,
        born_host=(_numeric_ip(sp.born_host) or _numeric_ip(peer_ip) or "127.0.0.1", 0),
    )
    return msg, int(mtype), group


@functools.lru_cache(maxsize=4096)  # a client sends from the same address again and again
def _numeric_ip(host: str) -> str:
    """``host`` when it is a numeric IPv4 or IPv6 address (what BORNHOST holds), else ""."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return ""


# -- store -> consumer ---------------------------------------------------------------------------------
_MAX_TIMESTAMP_MS = 253402300799999  # 9999-12-31T23:59:59.999Z, protobuf Timestamp's last instant


def _delivery_ms(text: str | None) -> int | None:
    """A stored TIMER_DELIVER_MS as ms since the epoch, or None when absent or not a time a
    Timestamp can hold (the put checks it; an older record may still carry anything)."""
    if not text:
        return None
    try:
        value = ascii_int(text)
    except ValueError:
        return None
    return value if 0 <= value <= _MAX_TIMESTAMP_MS else None


def consumer_message(
    rec: MessageRecord,
    *,
    namespace: str,
    receipt_handle: str,
    attempt: int,
    invisible_ms: int,
    into: definition.Message | None = None,
) -> definition.Message:
    """The v2 Message a consumer receives for a stored record (spec sheet §5 table). With
    ``into`` (an empty Message: a response's own field), that one is filled in place and
    returned: building a Message and copying it into a response copied the body and every
    field once more, for each message delivered."""
    msg = definition.Message() if into is None else into
    props = rec.properties
    topic = msg.topic
    topic.resource_namespace = namespace
    topic.name = rec.topic
    sp = msg.system_properties
    if rec.keys:
        sp.keys.extend(rec.keys)
    sp.message_id = rec.uniq_key or rec.msg_id
    body = rec.body
    digest = sp.body_digest
    digest.type = definition.MD5
    digest.checksum = hashlib.md5(body).hexdigest().upper()
    compressed = rec.sys_flag & MessageSysFlag.COMPRESSED_FLAG
    sp.body_encoding = definition.GZIP if compressed else definition.IDENTITY
    sp.message_type = message_type_of(props)  # type: ignore[assignment]
    set_ms(sp.born_timestamp, rec.born_timestamp)
    sp.born_host = rec.born_host[0]
    set_ms(sp.store_timestamp, rec.store_timestamp)
    sp.store_host = host_text(rec.store_host)
    sp.receipt_handle = receipt_handle
    sp.queue_id = rec.queue_id
    sp.queue_offset = rec.queue_offset
    set_ms(sp.invisible_duration, invisible_ms)
    sp.delivery_attempt = attempt
    if rec.tags is not None:
        sp.tag = rec.tags
    if SHARDING_KEY in props:
        sp.message_group = props[SHARDING_KEY]
    if TRACEPARENT in props:
        sp.trace_context = props[TRACEPARENT]
    deliver_at = _delivery_ms(props.get(TIMER_DELIVER_MS))
    if deliver_at is not None:
        set_ms(sp.delivery_timestamp, deliver_at)
    if MessageConst.DLQ_ORIGIN_TOPIC in props:
        dlq = sp.dead_letter_queue
        dlq.topic = props[MessageConst.DLQ_ORIGIN_TOPIC]
        dlq.message_id = props.get(MessageConst.DLQ_ORIGIN_MESSAGE_ID, "")
    user = {k: v for k, v in props.items() if k not in HIDDEN_ON_DELIVERY}
    if user:
        msg.user_properties.update(user)
    msg.body = body
    return msg
