"""Messages as producers hand them to the store, and as the store hands them back.

``Message`` is the input of :meth:`libstore.commit_log.CommitLog.put_messages` (RocketMQ's
``MessageExtBrokerInner`` before the store fills offsets and timestamps). ``MessageRecord`` is a
decoded CommitLog record (RocketMQ's ``MessageExt``). Property names and system flag bits are
RocketMQ's (spec sheet §1).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class MessageConst:
    """Property names RocketMQ and mqstore read (``MessageConst``)."""

    KEYS = "KEYS"
    TAGS = "TAGS"
    WAIT = "WAIT"
    DELAY = "DELAY"
    RETRY_TOPIC = "RETRY_TOPIC"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    TRAN_MSG = "TRAN_MSG"
    UNIQ_KEY = "UNIQ_KEY"  # RocketMQ's PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    TRANSACTION_ID = "__transactionId__"
    DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"  # RocketMQ 5: on a %DLQ% copy, the topic it came from
    DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
    KEY_SEPARATOR = " "
    # mqstore's (RabbitMQ's delivery mode): "1" transient, "2" persistent (libstore.durability).
    DURABILITY = "DURABILITY"


_DECIMAL = re.compile(r"-?[0-9]{1,19}")


def waits_for_store(wait: str | None) -> bool:
    """Whether a message whose WAIT property is ``wait`` (None: absent) waits for the store:
    its flush under SYNC_FLUSH, its slaves under SYNC_MASTER. Read as RocketMQ's broker reads it
    (``Message.isWaitStoreMsgOK``: absent means wait, else Java's ``Boolean.parseBoolean``): only
    "true" in any letter case waits; "false", "no" and "0" do not. An empty value waits: the
    broker parses properties from the record, which drops empty values (as
    ``bytes_to_properties`` does), so it reads as absent."""
    return not wait or (len(wait) == 4 and wait.lower() == "true")


def ascii_int(text: str) -> int:
    """``text`` as a base-10 integer: ASCII digits (at most 19) with an optional leading '-',
    nothing else. Python's int() also takes ' 12', '1_000' and other scripts' digits ('١٢');
    a property the store parses must mean the same number to every reader (Java's
    Long.parseLong takes none of those). Raises ValueError."""
    if not _DECIMAL.fullmatch(text):
        raise ValueError(f"not a decimal integer: {text[:40]!r}")
    return int(text)


class MessageSysFlag:
    """SYSFLAG bits of a CommitLog record (spec §1)."""

    COMPRESSED_FLAG = 0x1
    MULTI_TAGS_FLAG = 0x2
    TRANSACTION_NOT_TYPE = 0x0
    TRANSACTION_PREPARED_TYPE = 0x4
    TRANSACTION_COMMIT_TYPE = 0x8
    TRANSACTION_ROLLBACK_TYPE = 0xC
    TRANSACTION_TYPE_MASK = 0xC
    BORNHOST_V6_FLAG = 0x10
    STOREHOSTADDRESS_V6_FLAG = 0x20
    NEED_UNWRAP_FLAG = 0x40
    INNER_BATCH_FLAG = 0x80
    # mqstore's: the record is the stub of a transient message, whose whole record lives in the
    # store's memory (libstore.durability); producers cannot set it (libstore.producer_input).
    TRANSIENT_STUB_FLAG = 0x100000

    @staticmethod
    def transaction_value(sys_flag: int) -> int:
        """The transaction type bits (NOT, PREPARED, COMMIT or ROLLBACK)."""
        return sys_flag & MessageSysFlag.TRANSACTION_TYPE_MASK

    @staticmethod
    def gets_queue_offset(sys_flag: int) -> bool:
        """False for PREPARED and ROLLBACK records: they take queue offset 0 and no ConsumeQueue unit."""
        tx = sys_flag & MessageSysFlag.TRANSACTION_TYPE_MASK
        return (
            tx != MessageSysFlag.TRANSACTION_PREPARED_TYPE and tx != MessageSysFlag.TRANSACTION_ROLLBACK_TYPE
        )


class MessageFields(Protocol):
    """What putting a message reads of it (RecordEncoder.encode_batch and the put paths): a
    :class:`Message`, or any object with these attributes; the services put their mqstore.v1
    protobuf messages as they arrive, whose ``properties`` is a protobuf map and whose
    ``born_host`` is an ``"ip:port"`` string."""

    @property
    def topic(self) -> str: ...
    @property
    def body(self) -> bytes: ...
    @property
    def queue_id(self) -> int: ...
    @property
    def properties(self) -> Mapping[str, str]: ...
    @property
    def flag(self) -> int: ...
    @property
    def sys_flag(self) -> int: ...
    @property
    def born_timestamp(self) -> int: ...
    @property
    def born_host(self) -> tuple[str, int] | str: ...
    @property
    def reconsume_times(self) -> int: ...
    @property
    def prepared_transaction_offset(self) -> int: ...


class Message:
    """A message to put: topic, body, queue id and optional metadata (a :class:`MessageFields`).

    ``properties`` is a str→str mapping (serialized as RocketMQ does, spec §1); ``tags`` and
    ``keys`` are conveniences that set the TAGS and KEYS properties (keys joined by one space).
    ``born_timestamp`` is ms since the epoch (0: the store uses its own clock); ``born_host`` is
    (numeric ip, port), or ``"ip:port"`` (``"[v6]:port"``). Values are checked when the message
    is put, not here.
    """

    __slots__ = (
        "body",
        "born_host",
        "born_timestamp",
        "flag",
        "prepared_transaction_offset",
        "properties",
        "queue_id",
        "reconsume_times",
        "sys_flag",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        body: bytes,
        queue_id: int = 0,
        *,
        tags: str | None = None,
        keys: str | Iterable[str] | None = None,
        properties: Mapping[str, str] | None = None,
        flag: int = 0,
        sys_flag: int = 0,
        born_timestamp: int = 0,
        born_host: tuple[str, int] | str = ("127.0.0.1", 0),
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
    ) -> None:
        self.topic = topic
        self.body = body
        self.queue_id = queue_id
        props: dict[str, str] = dict(properties) if properties else {}
        if tags is not None:
            props[MessageConst.TAGS] = tags
        if keys is not None:
            props[MessageConst.KEYS] = (
                keys if isinstance(keys, str) else MessageConst.KEY_SEPARATOR.join(keys)
            )
        self.properties = props
        self.flag = flag
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.born_host = born_host
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset

    @property
    def tags(self) -> str | None:
        return self.properties.get(MessageConst.TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(MessageConst.KEYS)
        return [k for k in raw.split(MessageConst.KEY_SEPARATOR) if k] if raw else []

    def replace(self, **changes: Any) -> Message:
        """A copy with ``changes`` (any of the constructor's fields: topic, body, queue_id,
        properties, flag, sys_flag, born_timestamp, born_host, reconsume_times,
        prepared_transaction_offset)."""
        fields = {name: getattr(self, name) for name in Message.__slots__}
        fields.update(changes)
        return Message(fields.pop("topic"), fields.pop("body"), fields.pop("queue_id"), **fields)

    def __repr__(self) -> str:
        return f"Message(topic={self.topic!r}, queue_id={self.queue_id}, body={len(self.body)} bytes)"


@dataclass(slots=True)
class MessageRecord:
    """A decoded CommitLog record (all fields of spec §1; hosts as (ip, port)). Those the C
    decoder makes are not tracked by the cyclic garbage collector (record_codec.decode_records)."""

    total_size: int
    magic_code: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    phy_offset: int
    sys_flag: int
    born_timestamp: int
    born_host: tuple[str, int]
    store_timestamp: int
    store_host: tuple[str, int]
    reconsume_times: int
    prepared_transaction_offset: int
    body: bytes
    topic: str
    properties: dict[str, str] = field(default_factory=dict)
    msg_id: str = ""

    def to_message(self, **changes: Any) -> Message:
        """This record as a Message to put again (the same topic, queue, body, properties, flags,
        born time and host, reconsume times), with ``changes`` as :meth:`Message.replace` takes."""
        message = Message(
            self.topic,
            self.body,
            self.queue_id,
            properties=self.properties,
            flag=self.flag,
            sys_flag=self.sys_flag,
            born_timestamp=self.born_timestamp,
            born_host=self.born_host,
            reconsume_times=self.reconsume_times,
        )
        return message.replace(**changes) if changes else message

    @property
    def tags(self) -> str | None:
        return self.properties.get(MessageConst.TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(MessageConst.KEYS)
        return [k for k in raw.split(MessageConst.KEY_SEPARATOR) if k] if raw else []

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(MessageConst.UNIQ_KEY)
