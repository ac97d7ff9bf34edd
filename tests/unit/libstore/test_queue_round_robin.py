"""QueueRoundRobin: messages sent to queue -1 take their topic's queues in turn, whichever
encoder places them (the Python one calls it; the C one bumps its counters itself)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from libstore import Message, record_codec
from libstore.errors import TopicNotFoundError
from libstore.queue_round_robin import QueueRoundRobin
from libstore.record_encoder import STORE_HOST_PLACEHOLDER, RecordEncoder

STORE_HOST = b"\x7f\x00\x00\x01\x00\x00\x27\x1f"
NOW_MS = 1_700_000_000_000


def _widths(topic: str) -> int:
    if topic == "Missing":
        raise TopicNotFoundError("no such topic")
    return {"Three": 3, "Five": 5}[topic]


class _Counting(QueueRoundRobin):
    """A QueueRoundRobin that counts the calls made to it (the Python path)."""

    def __init__(self) -> None:
        super().__init__(_widths)
        self.calls = 0

    def __call__(self, topic: str) -> int:
        self.calls += 1
        return super().__call__(topic)


@contextmanager
def _pure_python(pure: bool) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as m:
        if pure:
            m.setattr(record_codec, "_ext", None)
        yield


def _client_records(topic: str, n: int) -> bytes:
    """``n`` records to ``topic`` with QUEUEID -1, as a client encodes them."""
    encoder = RecordEncoder(STORE_HOST_PLACEHOLDER, 4096)
    msgs = [Message(topic, b"m%d" % i, queue_id=-1) for i in range(n)]
    return bytes(encoder.encode_batch(msgs, NOW_MS, unassigned_queue_ok=True).buf)


def test_a_call_gives_each_topic_its_queues_in_turn_and_a_refusal_moves_nothing() -> None:
    rr = QueueRoundRobin(_widths)
    assert [rr("Three") for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [rr("Five") for _ in range(3)] == [0, 1, 2]
    with pytest.raises(TopicNotFoundError):
        rr("Missing")
    assert rr == {"Three": 7, "Five": 3} and "Missing" not in rr


@pytest.mark.parametrize("pure", [False, True], ids=["c", "python"])
def test_encoders_place_unassigned_messages_in_turn_sharing_the_counters(pure: bool) -> None:
    """Messages, then client records, then messages again: one sequence per topic, whichever
    path placed them; the C encoder calls the chooser at most for a topic's first record."""
    rr = _Counting()
    encoder = RecordEncoder(STORE_HOST, 4096)
    with _pure_python(pure):
        first = encoder.encode_batch(
            [Message("Three", b"a", -1) for _ in range(4)], NOW_MS, _widths, choose_queue=rr
        )
        adopted = encoder.adopt_records(_client_records("Three", 5), NOW_MS, _widths, choose_queue=rr)
        last = encoder.encode_batch(
            [Message("Three", b"b", -1), Message("Five", b"c", -1)], NOW_MS, _widths, choose_queue=rr
        )
    placed = [key for batch in (first, adopted, last) for key in batch.queue_keys]
    assert placed == [("Three", i % 3) for i in range(10)] + [("Five", 0)]
    assert rr == {"Three": 10, "Five": 1}
    if pure:
        assert rr.calls == 11
    else:
        # Each batch's first record of a topic in Python (the encoder meets the topic there);
        # the other seven in C, which called nothing.
        assert rr.calls == 4


def test_a_counter_that_is_not_a_plain_int_is_left_to_the_call() -> None:
    """What the C path cannot read it hands to the object's own __call__, which decides."""
    rr = _Counting()
    rr["Three"] = True  # a bool is an int subclass, not a plain int
    encoder = RecordEncoder(STORE_HOST, 4096)
    adopted = encoder.adopt_records(_client_records("Three", 3), NOW_MS, _widths, choose_queue=rr)
    assert [q for _, q in adopted.queue_keys] == [1, 2, 0] and rr["Three"] == 4 and rr.calls >= 1
