"""Scheduled and transactional messages in libstore: delivery times, the timer topic's units,
the timer checkpoint, transaction ids and half/committed/op messages."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libstore import CommitLog, Message, MessageIllegalError, StoreConfig
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.errors import InvalidArgumentError, StoreIOError
from libstore.message import MessageConst, MessageSysFlag
from libstore.record_codec import check_record, decode_record
from libstore.scheduled_message import (
    DELAY_LEVELS_MS,
    MAX_DELAY_MS,
    delivery_time,
    due_copy,
    hold_all_scheduled,
    hold_if_scheduled,
)
from libstore.system_topics import HALF_TOPIC, OP_TOPIC, TIMER_DELIVER_MS, TIMER_OUT_MS, TIMER_TOPIC
from libstore.timer_checkpoint import TimerCheckpoint
from libstore.transaction_message import TransactionId, committed_copy, half_message, op_message

NOW = 1_700_000_000_000


def test_delivery_time_of_each_kind() -> None:
    assert delivery_time({}, NOW) is None
    assert delivery_time({"TAGS": "a"}, NOW) is None
    assert delivery_time({TIMER_DELIVER_MS: str(NOW + 5)}, NOW) == NOW + 5
    assert delivery_time({"TIMER_DELAY_MS": "250"}, NOW) == NOW + 250
    assert delivery_time({"TIMER_DELAY_SEC": "3"}, NOW) == NOW + 3000
    assert delivery_time({MessageConst.DELAY: "0"}, NOW) is None
    assert [delivery_time({MessageConst.DELAY: str(lv)}, NOW) for lv in (1, 3, 18, 40)] == [
        NOW + 1000,
        NOW + 10_000,
        NOW + 7_200_000,
        NOW + 7_200_000,  # above 18 means 18, as RocketMQ clamps
    ]
    assert len(DELAY_LEVELS_MS) == 18
    assert delivery_time({TIMER_DELIVER_MS: str(NOW + 5), TIMER_OUT_MS: str(NOW)}, NOW) is None  # delivered
    for bad in ({MessageConst.DELAY: "-1"}, {TIMER_DELIVER_MS: "soon"}, {"TIMER_DELAY_MS": "-5"}):
        with pytest.raises(MessageIllegalError):
            delivery_time(bad, NOW)
    with pytest.raises(MessageIllegalError):
        delivery_time({TIMER_DELIVER_MS: str(NOW + MAX_DELAY_MS + 1)}, NOW)


@given(
    st.lists(
        st.sampled_from(
            [
                {"TAGS": "t"},
                {},
                {TIMER_DELIVER_MS: str(NOW + 5_000)},
                {MessageConst.DELAY: "3"},
                {TIMER_DELIVER_MS: str(NOW - 1)},
                None,
            ]
        ),
        max_size=8,
    )
)
def test_a_batch_is_held_as_its_messages_are_one_by_one(props: list[dict[str, str] | None]) -> None:
    messages = []
    for p in props:
        m = Message("Orders", b"b", 0, properties=p)
        if p is None:
            m.properties = None  # type: ignore[assignment]  # what an odd caller may hand in
        messages.append(m)
    held = hold_all_scheduled(messages, NOW)
    singly = [hold_if_scheduled(m, NOW) for m in messages]
    assert [(h.topic, h.properties, h.body) for h in held] == [
        (s.topic, s.properties, s.body) for s in singly
    ]
    assert all(h is m for h, m, s in zip(held, messages, singly, strict=True) if s is m)


def test_hold_and_due_copy_round_trip(tmp_path: Path) -> None:
    m = Message(
        "Orders", b"body", -1, tags="t", keys=["k"], properties={TIMER_DELIVER_MS: str(NOW + 9), "x": "1"}
    )
    held = hold_if_scheduled(m, NOW)
    assert (held.topic, held.queue_id) == (TIMER_TOPIC, 0)
    assert (
        held.properties[MessageConst.REAL_TOPIC] == "Orders"
        and held.properties[MessageConst.REAL_QID] == "-1"
    )
    assert hold_if_scheduled(held, NOW) is held  # already in the timer topic
    past = Message("Orders", b"b", 0, properties={TIMER_DELIVER_MS: str(NOW - 1)})
    assert hold_if_scheduled(past, NOW) is past  # due: stored as it is
    prepared = Message(
        "O", b"b", 0, properties={MessageConst.DELAY: "2"}, sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE
    )
    assert hold_if_scheduled(prepared, NOW) is prepared

    log = _log_with([held], tmp_path)
    rec = log.read_message(0)
    copy = due_copy(rec, NOW + 10)
    assert (copy.topic, copy.queue_id, copy.body) == ("Orders", -1, b"body")
    assert copy.properties["x"] == "1" and copy.properties[MessageConst.TAGS] == "t"
    assert MessageConst.REAL_TOPIC not in copy.properties and copy.properties[TIMER_OUT_MS] == str(NOW + 10)
    assert hold_if_scheduled(copy, NOW) is copy  # not held twice
    log.shutdown()


def _log_with(messages: list[Message], root: Path) -> CommitLog:
    config = StoreConfig(
        store_path_root_dir=str(root), mapped_file_size_commit_log=1 << 20, max_message_size=64 * 1024
    )
    log = CommitLog.open(config)
    assert log.put_messages(messages).all_ok
    return log


def test_system_topic_units_carry_time_or_offset(tmp_path: Path) -> None:
    """Dispatch's tags code for the timer, half and op topics (libstore.system_topics)."""
    later = time.time_ns() // 1_000_000 + 3_600_000
    log = _log_with(
        [
            Message("Orders", b"now", 0, tags="a"),
            Message("Orders", b"later", 0, properties={TIMER_DELIVER_MS: str(later)}),
            half_message(Message("Orders", b"half", -1, properties={MessageConst.UNIQ_KEY: "U1"})),
            op_message(7, "COMMIT", "U1"),
        ],
        tmp_path,
    )
    raw, _ = log.read_chunk(0, log.max_offset, log.max_offset)
    pos, reqs = 0, []
    while pos < len(raw):
        req = check_record(raw, pos, len(raw))
        reqs.append(req)
        pos += req.msg_size
    orders, timer, half, op = reqs
    assert timer.topic == TIMER_TOPIC and timer.tags_code == later
    assert half.topic == HALF_TOPIC and half.tags_code == half.store_timestamp
    assert op.topic == OP_TOPIC and op.tags_code == 7
    assert orders.tags_code != 0  # the tag's hash, as before
    cqs = ConsumeQueueStore(tmp_path / "cq", 6000)
    cqs.dispatch_batch(reqs)
    assert cqs.find(TIMER_TOPIC, 0).read_units(0, 1)[0].tags_code == later  # type: ignore[union-attr]
    log.shutdown()


def test_half_committed_and_op_messages(tmp_path: Path) -> None:
    m = Message("Pay", b"p", -1, tags="t", properties={MessageConst.UNIQ_KEY: "U9"})
    half = half_message(m)
    assert (half.topic, half.queue_id) == (HALF_TOPIC, 0) and half.properties[MessageConst.TRAN_MSG] == "true"
    log = _log_with([half], tmp_path)
    rec = log.read_message(0)
    copy = committed_copy(rec)
    assert (copy.topic, copy.queue_id, copy.body) == ("Pay", -1, b"p")
    assert MessageSysFlag.transaction_value(copy.sys_flag) == MessageSysFlag.TRANSACTION_COMMIT_TYPE
    assert copy.properties[MessageConst.UNIQ_KEY] == "U9" and MessageConst.REAL_TOPIC not in copy.properties
    other = _log_with([m.replace(queue_id=0)], tmp_path / "other")  # a plain message: no half
    with pytest.raises(MessageIllegalError, match="not a half"):
        committed_copy(decode_record(other.read_chunk(0, 10**6, 10**6)[0]))
    other.shutdown()
    log.shutdown()


@given(st.integers(0, 2**40), st.integers(0, 2**50), st.integers(1, 2**31 - 1))
def test_transaction_id_round_trips(half: int, phy: int, size: int) -> None:
    tid = TransactionId(half, phy, size)
    assert TransactionId.decode(tid.encode()) == tid


@pytest.mark.parametrize("text", ["", "t1:1:2", "t2:1:2:3", "t1:x:2:3", "t1:1:2:0", "t1:-1:2:3"])
def test_malformed_transaction_ids_are_refused(text: str) -> None:
    with pytest.raises(InvalidArgumentError):
        TransactionId.decode(text)


def test_timer_checkpoint_watermark_and_persistence(tmp_path: Path) -> None:
    path = tmp_path / "timer" / "cp.json"
    cp = TimerCheckpoint(path)
    cp.load()
    cp.mark([2, 0, 5])
    assert cp.watermark == 1 and cp.is_done(0) and cp.is_done(2) and not cp.is_done(1)
    cp.mark([1])
    assert cp.watermark == 3 and cp.done == {5}
    cp.save()
    again = TimerCheckpoint(path)
    again.load()
    assert (again.watermark, again.done) == (3, {5})
    again.skip_below(6)
    assert (again.watermark, again.done) == (6, set())
    path.write_text("{not json")
    with pytest.raises(StoreIOError):
        TimerCheckpoint(path).load()
