"""System topics the store writes for scheduled and transactional messages, and what their
ConsumeQueue units' tags codes hold.

As RocketMQ does for ``SCHEDULE_TOPIC_XXXX`` (whose units carry the delivery time instead of a
tag hash), the units of these topics carry the one number their service needs, so the service
rebuilds its work list from 20-byte units without reading the CommitLog:

* ``rmq_sys_wheel_timer`` (TIMER_TOPIC): messages held until a delivery time (RocketMQ 5's
  timer topic name). Tags code: the delivery time, ms since the epoch (TIMER_DELIVER_MS).
* ``RMQ_SYS_TRANS_HALF_TOPIC`` (HALF_TOPIC): half messages of open transactions. Tags code: the
  store time (ms), from which the check-back schedule runs.
* ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` (OP_TOPIC): one record per resolved half message (commit,
  rollback or given up). Tags code: the half message's queue offset (TRAN_HALF_OFFSET).
* ``rmq_sys_timer_done`` (TIMER_DONE_TOPIC, mqstore's): one record per delivered timer unit,
  appended with the delivered copy, so every replica's dispatch knows what was delivered (a
  promoted slave does not deliver again). Tags code: the timer unit's queue offset (TIMER_UNIT).
* ``rmq_sys_pop_journal`` (POP_JOURNAL_TOPIC, mqstore's; RocketMQ writes PopCheckPoint and AckMsg
  records into its revive topic for the same purpose): the consumer groups' pop state changes,
  one record per receive, ack or change of invisible time (libstore.pop_state), so every
  replica's dispatch holds the same pop state and a promoted slave does not deliver acked
  messages again. Tags code: the record's sequence number (POP_SEQ).
* ``rmq_sys_quarantine`` (QUARANTINE_TOPIC, mqstore's): messages a consumer group could neither
  be delivered nor dead-lettered (a dead-letter copy the store refuses, a record a protocol
  cannot convert), moved aside with the reason so they stop blocking the group; readable by
  admins. Tags code: the tags hash, as any topic.

Names are RocketMQ's (TopicValidator, TimerMessageStore); the tags-code contents of the timer
and op topics are mqstore's (RocketMQ keeps those in its own timer log and in op bodies).
"""

from __future__ import annotations

from collections.abc import Mapping

from libstore.errors import MessageIllegalError
from libstore.message import Message, MessageConst, MessageFields, MessageRecord
from libstore.subscription_group import DLQ_GROUP_TOPIC_PREFIX

TIMER_TOPIC = "rmq_sys_wheel_timer"
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TIMER_DONE_TOPIC = "rmq_sys_timer_done"
POP_JOURNAL_TOPIC = "rmq_sys_pop_journal"
QUARANTINE_TOPIC = "rmq_sys_quarantine"

TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # RocketMQ 5: absolute delivery time, ms
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"  # RocketMQ 5: delay from the store time, s
TIMER_DELAY_MS = "TIMER_DELAY_MS"  # RocketMQ 5: delay from the store time, ms
TIMER_OUT_MS = "TIMER_OUT_MS"  # set on the copy a timer delivers: it is due, not to be held again
TRAN_HALF_OFFSET = "TRAN_HALF_OFFSET"  # on an op record: the half message's queue offset
TIMER_UNIT = "TIMER_UNIT"  # on a timer-done record: the delivered unit's queue offset
POP_SEQ = "POP_SEQ"  # on a pop journal record: its sequence number


def park(message: MessageFields, topic: str, properties: Mapping[str, str]) -> Message:
    """``message`` (a Message, or a protobuf mqstore.v1.Message of the same fields) moved to
    the system ``topic`` (queue 0) with its destination in REAL_TOPIC and REAL_QID (RocketMQ's
    routing of held records) and ``properties`` added."""
    props = dict(message.properties)
    props[MessageConst.REAL_TOPIC] = message.topic
    props[MessageConst.REAL_QID] = str(message.queue_id)
    props.update(properties)
    return Message(  # fields one by one: the services also put protobuf messages of this shape
        topic,
        message.body,
        0,
        properties=props,
        flag=message.flag,
        sys_flag=message.sys_flag,
        born_timestamp=message.born_timestamp,
        born_host=message.born_host,
        reconsume_times=message.reconsume_times,
    )


def unpark(record: MessageRecord) -> tuple[str, int, dict[str, str]]:
    """The destination of a parked ``record``: (REAL_TOPIC, REAL_QID (-1 when missing or bad:
    placed round robin), its properties without those two). Raises MessageIllegalError when it
    has no REAL_TOPIC."""
    props = dict(record.properties)
    topic = props.pop(MessageConst.REAL_TOPIC, "")
    if not topic:
        raise MessageIllegalError(f"record at {record.phy_offset} has no {MessageConst.REAL_TOPIC}")
    try:
        queue_id = int(props.pop(MessageConst.REAL_QID, "-1"))
    except ValueError:
        queue_id = -1
    return topic, queue_id, props


SYSTEM_TOPICS = frozenset(
    {TIMER_TOPIC, HALF_TOPIC, OP_TOPIC, TIMER_DONE_TOPIC, POP_JOURNAL_TOPIC, QUARANTINE_TOPIC}
)

_MAX_CODE = (1 << 63) - 1
# Where a unit of each system topic keeps its tags code (see the module text), for dispatch's
# one-pass parse (libstore.record_codec, in Python and in C alike): the name of the property
# holding the number, None for the record's store time, b"" for none (the code is 0).
SYSTEM_CODE_PROPERTIES: dict[str, bytes | None] = {
    TIMER_TOPIC: b"TIMER_DELIVER_MS",
    HALF_TOPIC: None,
    OP_TOPIC: b"TRAN_HALF_OFFSET",
    TIMER_DONE_TOPIC: b"TIMER_UNIT",
    POP_JOURNAL_TOPIC: b"POP_SEQ",
    QUARANTINE_TOPIC: b"",
}


def is_system_topic(topic: str) -> bool:
    """Whether ``topic`` is one of the :data:`SYSTEM_TOPICS` this store writes."""
    return topic in SYSTEM_TOPICS


def system_tags_code(topic: str, properties: Mapping[bytes, bytes], store_timestamp: int) -> int | None:
    """The tags code of a unit of ``topic`` when it is a system topic (see the module text and
    :data:`SYSTEM_CODE_PROPERTIES`), from the record's properties as dispatch's one-pass parse
    found them (raw name -> raw value) and its store time (ms); None for other topics. A missing
    or malformed number gives 0 (a timer due at once, an op for offset 0): at most 19 ASCII
    digits, capped at 2**63 - 1."""
    if topic not in SYSTEM_CODE_PROPERTIES:
        return None
    name = SYSTEM_CODE_PROPERTIES[topic]
    if name is None:
        return store_timestamp
    return _number(properties.get(name)) if name else 0


def _number(raw: bytes | None) -> int:
    return min(int(raw), _MAX_CODE) if raw and raw.isdigit() and len(raw) <= 19 else 0


# Topics only the store writes (RocketMQ's TopicValidator system topics and every rmq_sys_ /
# RMQ_SYS_ name): a client may neither produce to them nor read them except as an admin.
_RESERVED_TOPICS = frozenset(
    {"SCHEDULE_TOPIC_XXXX", "TBW102", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT"}
)
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"


def is_reserved_topic(topic: str) -> bool:
    """Whether ``topic`` is one the store keeps for itself (wider than :data:`SYSTEM_TOPICS`,
    the ones it writes today): any ``rmq_sys_`` name (either case:
    RocketMQ's ``RMQ_SYS_TRANS_HALF_TOPIC`` and mqstore's ``rmq_sys_pop_journal`` alike) and
    RocketMQ's other reserved names (TopicValidator: ``SCHEDULE_TOPIC_XXXX``, ``TBW102``...)."""
    return topic[:8].lower() == "rmq_sys_" or topic in _RESERVED_TOPICS


def group_of_topic(topic: str) -> str | None:
    """The consumer group a ``%RETRY%<group>`` or ``%DLQ%<group>`` topic belongs to (None for
    any other topic): the store writes these for the group, and only the group reads them."""
    for prefix in (RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX):
        if topic.startswith(prefix):
            return topic[len(prefix) :]
    return None
