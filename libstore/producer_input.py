"""What a producer may put: never into the store's own topics, never the properties the store
sets and acts on, and only the SYSFLAG bits that describe its own message.

The store writes its system topics itself (libstore.system_topics: timer, timer-done, half,
op, pop journal, and RocketMQ's other reserved names) and reads routing and bookkeeping from
properties it sets on the way (REAL_TOPIC/REAL_QID on parked messages, TRAN_HALF_OFFSET on op
records, TIMER_UNIT, POP_SEQ, TIMER_OUT_MS on a delivered timer copy...). A client that could
write either could cancel other users' delayed messages, make a committed transaction vanish or
corrupt the consumer groups' pop state. Every client-facing produce path (both forms of the
own API's Produce, RocketMQ 5's SendMessage) applies these rules before anything is written.

Producers may still schedule their own messages (DELAY, TIMER_DELIVER_MS, TIMER_DELAY_SEC,
TIMER_DELAY_MS) and set KEYS, TAGS, WAIT and UNIQ_KEY: those are the message's own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from libstore.errors import IllegalTopicError, MessageIllegalError
from libstore.message import MessageConst, MessageSysFlag
from libstore.system_topics import (
    POP_SEQ,
    TIMER_OUT_MS,
    TIMER_UNIT,
    TRAN_HALF_OFFSET,
    group_of_topic,
    is_reserved_topic,
)
from libstore.transaction_message import OP_RESOLUTION, TRANSACTION_CHECK_TIMES

# Set by the store (or by the gateway on the producer's behalf, from the protocol's own fields)
# and acted on by it; RocketMQ's names where it has them.
STORE_PROPERTIES: Final = frozenset(
    {
        MessageConst.REAL_TOPIC,
        MessageConst.REAL_QID,
        MessageConst.TRAN_MSG,
        MessageConst.TRANSACTION_ID,
        MessageConst.RETRY_TOPIC,
        MessageConst.DLQ_ORIGIN_TOPIC,
        MessageConst.DLQ_ORIGIN_MESSAGE_ID,
        TRAN_HALF_OFFSET,
        TIMER_UNIT,
        TIMER_OUT_MS,
        POP_SEQ,
        OP_RESOLUTION,
        TRANSACTION_CHECK_TIMES,
        "CHECK_IMMUNITY_TIME_IN_SECONDS",
        "ORIGIN_MESSAGE_ID",
        "TIMER_ENQUEUE_MS",
        "TIMER_DEQUEUE_MS",
        "TIMER_ROLL_TIMES",
        "TIMER_DEL_UNIQKEY",
        "INNER_NUM",
        "INNER_BASE",
        "MIN_OFFSET",
        "MAX_OFFSET",
    }
)

# SYSFLAG bits a producer's record may carry: its body's compression, multiple tags, and the
# address layout of its born host. The transaction bits (PREPARED/COMMIT/ROLLBACK), inner
# batches and the store host's layout are the store's.
PRODUCER_SYS_FLAGS: Final = (
    MessageSysFlag.COMPRESSED_FLAG | MessageSysFlag.MULTI_TAGS_FLAG | MessageSysFlag.BORNHOST_V6_FLAG
)


def check_producer_topic(topic: str) -> None:
    """Refuse a producer's message to a system topic or to a group's ``%RETRY%``/``%DLQ%``
    topic (the store writes those). Raises IllegalTopicError."""
    if is_reserved_topic(topic) or group_of_topic(topic) is not None:
        raise IllegalTopicError(f"topic {topic!r} is written by the store only; producers may not send to it")


def check_producer_properties(names: Iterable[str]) -> None:
    """Refuse property ``names`` the store sets itself (:data:`STORE_PROPERTIES`). Raises
    MessageIllegalError naming the first one."""
    for name in names:
        if name in STORE_PROPERTIES:
            raise MessageIllegalError(f"property {name!r} is set by the store only; producers may not set it")


def producer_sys_flag(sys_flag: int) -> int:
    """``sys_flag`` masked to the bits a producer may set (:data:`PRODUCER_SYS_FLAGS`)."""
    return sys_flag & PRODUCER_SYS_FLAGS
