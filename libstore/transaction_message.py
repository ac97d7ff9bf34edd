"""Transactional messages: the half message, its committed copy, the op record that resolves it,
and the transaction id handed to the producer.

RocketMQ's two-phase send (TransactionalMessageBridge): the producer's message is stored as a
*half message* in RMQ_SYS_TRANS_HALF_TOPIC (queue 0) with its destination in REAL_TOPIC/REAL_QID,
invisible to consumers. EndTransaction COMMIT appends the committed copy to the real topic
(SYSFLAG TRANSACTION_COMMIT_TYPE, TRAN_MSG kept so consumers see a transactional message) and
then an *op record* in RMQ_SYS_TRANS_OP_HALF_TOPIC; ROLLBACK appends only the op record. Op
records carry the half message's queue offset in TRAN_HALF_OFFSET (and as body, as RocketMQ's
op bodies do), which dispatch puts in the unit's tags code (libstore.system_topics), so the set of
resolved half messages is rebuilt from the op queue's units alone.

Transaction id (``TransactionId``): ``t1:<half queue offset>:<phy offset>:<size>`` in hex;
it locates the half message without an index. Errors: InvalidArgumentError for a malformed id.
"""

from __future__ import annotations

from typing import NamedTuple

from libstore.errors import InvalidArgumentError, MessageIllegalError
from libstore.message import Message, MessageConst, MessageRecord, MessageSysFlag
from libstore.system_topics import HALF_TOPIC, OP_TOPIC, TRAN_HALF_OFFSET, park, unpark

TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"  # RocketMQ's name; on a check-back's message
OP_COMMIT_TAG = "d"  # RocketMQ's op tag ("d": removed from the half queue)
OP_RESOLUTION = "TRAN_RESOLUTION"  # mqstore: COMMIT, ROLLBACK or DISCARD (check limit reached)


class TransactionId(NamedTuple):
    """Where a half message is: its queue offset in the half queue and its CommitLog
    offset and size (bytes)."""

    half_offset: int
    phy_offset: int
    size: int

    def encode(self) -> str:
        return f"t1:{self.half_offset:x}:{self.phy_offset:x}:{self.size:x}"

    @classmethod
    def decode(cls, text: str) -> TransactionId:
        """Raises InvalidArgumentError for text this module did not produce."""
        parts = text.split(":")
        if len(parts) != 4 or parts[0] != "t1":
            raise InvalidArgumentError(f"malformed transaction id {text!r}")
        try:
            half, phy, size = (int(p, 16) for p in parts[1:])
        except ValueError:
            raise InvalidArgumentError(f"malformed transaction id {text!r}") from None
        if half < 0 or phy < 0 or size <= 0:
            raise InvalidArgumentError(f"malformed transaction id {text!r}")
        return cls(half, phy, size)


def half_message(message: Message) -> Message:
    """The half message for ``message`` (its queue id -1 means: placed at commit)."""
    half = park(message, HALF_TOPIC, {MessageConst.TRAN_MSG: "true"})
    half.sys_flag &= ~MessageSysFlag.TRANSACTION_TYPE_MASK
    return half


def committed_copy(half: MessageRecord) -> Message:
    """The message a COMMIT appends for the stored ``half``: its real topic and queue, its
    properties without the routing ones. Raises MessageIllegalError for a record that is not
    a half message."""
    if half.topic != HALF_TOPIC:
        raise MessageIllegalError(f"record at {half.phy_offset} is not a half message")
    topic, queue_id, props = unpark(half)
    props.pop(TRANSACTION_CHECK_TIMES, None)
    return half.to_message(
        topic=topic,
        queue_id=queue_id,
        properties=props,
        sys_flag=(half.sys_flag & ~MessageSysFlag.TRANSACTION_TYPE_MASK)
        | MessageSysFlag.TRANSACTION_COMMIT_TYPE,
        prepared_transaction_offset=half.phy_offset,
    )


def op_message(half_offset: int, resolution: str, uniq_key: str = "") -> Message:
    """The op record resolving the half message at ``half_offset`` (COMMIT, ROLLBACK or
    DISCARD)."""
    props = {TRAN_HALF_OFFSET: str(half_offset), OP_RESOLUTION: resolution, MessageConst.TAGS: OP_COMMIT_TAG}
    if uniq_key:
        props["ORIGIN_MESSAGE_ID"] = uniq_key
    return Message(OP_TOPIC, str(half_offset).encode(), 0, properties=props)
