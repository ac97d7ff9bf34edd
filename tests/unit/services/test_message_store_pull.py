"""Pulls through MessageStore: RocketMQ's GetMessageStatus values, tag filtering by code then
exact tag, transfer limits, bad input."""

from __future__ import annotations

import pytest

from libstore import (
    InvalidArgumentError,
    Message,
    OffsetOutOfRangeError,
    QueueIdOutOfRangeError,
    StoreConfig,
    TopicConfig,
    TopicNotFoundError,
)
from libstore.message_filter import TagFilter
from libstore.results import GetMessageStatus
from libstore.tags import tags_code
from services.message_store import MessageStore


@pytest.fixture
def store(store_config: StoreConfig):
    s = MessageStore.open(store_config.replace(default_topic_queue_nums=2))
    yield s
    s.shutdown()


def _put(store: MessageStore, n: int, queue_id: int = 0, tags=lambda i: "A", size: int = 100) -> None:
    msgs = [Message("T", bytes([i % 256]) * size, queue_id, tags=tags(i), keys=[f"m{i}"]) for i in range(n)]
    assert store.put_messages(msgs).all_ok
    assert store.wait_dispatched(10)


def test_found_returns_records_in_queue_order_and_the_next_offset(store: MessageStore):
    _put(store, 10)
    r = store.get_messages("g", "T", 0, 3, 4)
    assert r.status is GetMessageStatus.FOUND
    assert (r.next_begin_offset, r.min_offset, r.max_offset) == (7, 0, 10)
    assert r.queue_offsets == [3, 4, 5, 6]
    assert [m.keys for m in r.decode()] == [["m3"], ["m4"], ["m5"], ["m6"]]


def test_offset_statuses(store: MessageStore):
    store.commit_log.topic_config.create_or_update(TopicConfig("T", 2, 2))
    assert store.get_messages("g", "T", 0, 0, 1).status is GetMessageStatus.NO_MESSAGE_IN_QUEUE
    _put(store, 5)
    one = store.get_messages("g", "T", 0, 5, 1)
    assert (one.status, one.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_ONE, 5)
    badly = store.get_messages("g", "T", 0, 9, 1)
    assert (badly.status, badly.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_BADLY, 0)
    cq = store.consume_queue_store.find("T", 0)
    cq.min_logic_offset = 2 * 20  # as if the log's first messages were deleted
    small = store.get_messages("g", "T", 0, 1, 1)
    assert (small.status, small.next_begin_offset) == (GetMessageStatus.OFFSET_TOO_SMALL, 2)
    badly = store.get_messages("g", "T", 0, 9, 1)
    assert (badly.status, badly.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_BADLY, 5)


def test_tag_filter_uses_the_code_then_the_exact_tag(store: MessageStore):
    assert tags_code("Aa") == tags_code("BB")  # a Java hash collision reaches the exact check
    _put(store, 9, tags=lambda i: ["Aa", "BB", "C"][i % 3])
    r = store.get_messages("g", "T", 0, 0, 32, "Aa")
    assert r.status is GetMessageStatus.FOUND
    assert r.queue_offsets == [0, 3, 6] and r.next_begin_offset == 9
    both = store.get_messages("g", "T", 0, 0, 32, TagFilter("Aa || C"))
    assert both.queue_offsets == [0, 2, 3, 5, 6, 8]
    none = store.get_messages("g", "T", 0, 0, 32, "Z")
    assert (none.status, none.next_begin_offset) == (GetMessageStatus.NO_MATCHED_MESSAGE, 9)
    assert store.get_messages("g", "T", 0, 0, 32, "*").queue_offsets == list(range(9))


def test_count_and_byte_limits(store_config: StoreConfig):
    store = MessageStore.open(
        store_config.replace(default_topic_queue_nums=1, max_transfer_bytes_on_message_in_memory=1000)
    )
    try:
        _put(store, 20, size=300)
        r = store.get_messages("g", "T", 0, 0, 32)
        assert len(r.records) == r.next_begin_offset == 2  # 2 x ~400 bytes fit in 1000
        assert sum(map(len, r.records)) <= 1000
        store.put_messages([Message("T", b"x" * 5000, 0)])
        assert store.wait_dispatched(10)
        r = store.get_messages("g", "T", 0, 20, 32)
        assert len(r.records) == 1, "one message is returned even when it alone is over the limit"
    finally:
        store.shutdown()


def test_bad_pulls_raise(store: MessageStore):
    _put(store, 1)
    with pytest.raises(TopicNotFoundError):
        store.get_messages("g", "Nope", 0, 0, 1)
    with pytest.raises(QueueIdOutOfRangeError):
        store.get_messages("g", "T", 2, 0, 1)
    with pytest.raises(InvalidArgumentError, match="non-negative"):
        store.get_messages("g", "T", 0, -1, 1)
    with pytest.raises(InvalidArgumentError, match="max_count"):
        store.get_messages("g", "T", 0, 0, 0)
    with pytest.raises(InvalidArgumentError, match="max_count"):
        store.get_messages("g", "T", 0, 0, 100_000)
    with pytest.raises(InvalidArgumentError, match="group"):
        store.get_messages("", "T", 0, 0, 1)


def test_query_by_key_and_by_id(store: MessageStore):
    _put(store, 30)
    (hit,) = store.query_message("T", "m17")
    assert hit.keys == ["m17"] and hit.queue_offset == 17
    assert store.look_message_by_id(hit.msg_id).body == hit.body
    assert store.query_message("T", "missing") == []
    with pytest.raises(InvalidArgumentError):
        store.look_message_by_id("XYZ")


def test_consumer_offsets_and_progress(store: MessageStore):
    _put(store, 6, queue_id=1)
    assert store.query_offset("g", "T", 1) == -1
    store.commit_offset("g", "T", 1, 4)
    assert store.query_offset("g", "T", 1) == 4
    progress = {p.queue_id: p for p in store.consumer_progress("g", "T")}
    assert (progress[1].committed_offset, progress[1].max_offset, progress[1].lag) == (4, 6, 2)
    assert (progress[0].committed_offset, progress[0].lag) == (-1, 0)
    with pytest.raises(OffsetOutOfRangeError):
        store.commit_offset("g", "T", 1, 7)
