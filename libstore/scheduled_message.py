"""Scheduled (delay) messages: which messages are held, where, and the copy delivered when due.

A message is held when it asks for a later delivery in one of RocketMQ's ways:

* ``TIMER_DELIVER_MS`` (RocketMQ 5, what the gRPC protocol's ``delivery_timestamp`` becomes):
  an absolute time, ms since the epoch;
* ``TIMER_DELAY_MS`` / ``TIMER_DELAY_SEC``: a delay from the store time;
* ``DELAY`` (RocketMQ 4's delay level 1..18, ``messageDelayLevel`` =
  1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h; levels above 18 mean 18).

A held message is stored in the timer topic (libstore.system_topics.TIMER_TOPIC, queue 0) with its
destination in ``REAL_TOPIC``/``REAL_QID`` and its delivery time in ``TIMER_DELIVER_MS``, which
dispatch puts in the unit's tags code. When it is due, the timer service appends
:func:`due_copy` of it: the original topic, queue and properties, marked ``TIMER_OUT_MS`` so it is
not held again. A time not in the future is delivered at once (nothing is held). RocketMQ keeps
delay levels in SCHEDULE_TOPIC_XXXX; here every kind is one delivery time in one timer topic.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence

from libstore.errors import MessageIllegalError
from libstore.message import Message, MessageConst, MessageFields, MessageRecord, MessageSysFlag, ascii_int
from libstore.system_topics import (
    SYSTEM_TOPICS,
    TIMER_DELAY_MS,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TIMER_DONE_TOPIC,
    TIMER_OUT_MS,
    TIMER_TOPIC,
    TIMER_UNIT,
    park,
    unpark,
)

DELAY_LEVELS_MS = tuple(
    s * 1000 for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)
MAX_DELAY_MS = 40 * 24 * 3600 * 1000  # how far ahead a delivery may be (RocketMQ's timerMaxDelaySec: 3 days;
# mqstore allows 40 days, enough for a monthly job and still a bounded work list)


def _int(props: Mapping[str, str], name: str) -> int | None:
    text = props.get(name)
    if text is None or text == "":
        return None
    try:
        return ascii_int(text)
    except ValueError:
        raise MessageIllegalError(f"property {name} must be a decimal integer, got {text[:40]!r}") from None


def delivery_time(props: Mapping[str, str] | None, now_ms: int) -> int | None:
    """When a message with ``props`` is to be delivered (ms since the epoch), or None when it
    is not scheduled (no property, or already delivered by a timer). ``now_ms`` stands for
    the store time. Raises MessageIllegalError for a non-numeric value, a negative delay or
    level, or a time more than MAX_DELAY_MS ahead."""
    if not props or TIMER_OUT_MS in props:
        return None
    at = _int(props, TIMER_DELIVER_MS)
    if at is None:
        delay = _int(props, TIMER_DELAY_MS)
        if delay is None:
            sec = _int(props, TIMER_DELAY_SEC)
            delay = None if sec is None else sec * 1000
        if delay is None:
            level = _int(props, MessageConst.DELAY)
            if level is None or level == 0:
                return None
            if level < 0:
                raise MessageIllegalError(f"delay level must be 0..{len(DELAY_LEVELS_MS)}, got {level}")
            delay = DELAY_LEVELS_MS[min(level, len(DELAY_LEVELS_MS)) - 1]
        if delay < 0:
            raise MessageIllegalError(f"delay must not be negative, got {delay} ms")
        at = now_ms + delay
    if at - now_ms > MAX_DELAY_MS:
        raise MessageIllegalError(f"delivery time is more than {MAX_DELAY_MS // 86_400_000} days ahead")
    return at


# The properties that can schedule a message (delivery_time reads nothing else to decide).
SCHEDULING_PROPERTIES = frozenset({TIMER_DELIVER_MS, TIMER_DELAY_MS, TIMER_DELAY_SEC, MessageConst.DELAY})


def hold_if_scheduled(message: MessageFields, now_ms: int) -> MessageFields:
    """``message`` itself when it is due now or not scheduled; otherwise its copy for the timer
    topic (queue 0, REAL_TOPIC/REAL_QID, TIMER_DELIVER_MS). Half messages of transactions are
    never held (their delay, if any, starts at commit). Raises MessageIllegalError as
    :func:`delivery_time` does."""
    props = message.properties
    if not props or message.topic in SYSTEM_TOPICS:  # timer, half and op records stay where they are
        return message
    if SCHEDULING_PROPERTIES.isdisjoint(props):  # the common case, decided without parsing anything
        return message
    if MessageSysFlag.transaction_value(message.sys_flag) == MessageSysFlag.TRANSACTION_PREPARED_TYPE:
        return message
    at = delivery_time(props, now_ms)
    if at is None or at <= now_ms:
        return message
    return park(message, TIMER_TOPIC, {TIMER_DELIVER_MS: str(at)})


_PROPERTIES = operator.attrgetter("properties")


def hold_all_scheduled(messages: Sequence[MessageFields], now_ms: int) -> list[MessageFields]:
    """:func:`hold_if_scheduled` of each of ``messages``. A batch in which no message names a
    scheduling property (nearly every batch) is told apart in C loops (a Python call per
    message was a quarter of an in-process put of 256) and comes back as the same messages."""
    try:
        if all(map(SCHEDULING_PROPERTIES.isdisjoint, map(_PROPERTIES, messages))):
            return list(messages)
    except TypeError:  # a message whose properties are None: the per-message path decides
        pass
    return [hold_if_scheduled(m, now_ms) for m in messages]


def done_record(unit_offset: int) -> Message:
    """The record saying the timer unit at ``unit_offset`` was delivered (appended together
    with its due copy; libstore.system_topics.TIMER_DONE_TOPIC)."""
    return Message(TIMER_DONE_TOPIC, str(unit_offset).encode(), 0, properties={TIMER_UNIT: str(unit_offset)})


def due_copy(record: MessageRecord, now_ms: int) -> Message:
    """The message to append when the held ``record`` is due: its REAL_TOPIC and REAL_QID
    (-1: placed round robin), its properties without the routing ones, marked TIMER_OUT_MS.
    Raises MessageIllegalError for a record without REAL_TOPIC."""
    topic, queue_id, props = unpark(record)
    props[TIMER_OUT_MS] = str(now_ms)
    return record.to_message(
        topic=topic,
        queue_id=queue_id,
        properties=props,
        sys_flag=record.sys_flag & ~MessageSysFlag.TRANSACTION_TYPE_MASK,
    )
