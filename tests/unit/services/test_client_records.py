"""The Python client's record encoding: what a Producer puts on the wire is what the store's
encoder makes of the same messages (properties, TAGS, KEYS, UNIQ_KEY, the caller's born host)."""

from __future__ import annotations

import pytest

from libstore import Message, MessageConst
from libstore.message_id import UniqKeyGenerator
from libstore.record_codec import decode_record
from libstore.record_encoder import STORE_HOST_PLACEHOLDER, RecordEncoder
from services.client import OutgoingMessage, Producer
from services.proto import gateway_pb


def _decoded(request: gateway_pb.ProduceRequest) -> list:
    raw = request.records
    out, pos = [], 0
    while pos < len(raw):
        rec = decode_record(raw, pos, len(raw), check_crc=True)
        out.append(rec)
        pos += rec.total_size
    return out


def test_records_carry_what_the_messages_say():
    producer = Producer("127.0.0.1:1")
    try:
        outgoing = [
            OutgoingMessage("T", b"plain"),
            OutgoingMessage("T", b"tagged", tags="TagA", keys=["k1", "k2"], queue_id=3),
            OutgoingMessage("U", b"props", properties={"a": "1", MessageConst.UNIQ_KEY: "MINE"}),
        ]
        records = _decoded(producer._request(outgoing))
    finally:
        producer.close()
    assert [(r.topic, r.body, r.queue_id) for r in records] == [
        ("T", b"plain", -1),
        ("T", b"tagged", 3),
        ("U", b"props", -1),
    ]
    plain, tagged, props = (r.to_message().properties for r in records)
    assert set(plain) == {MessageConst.UNIQ_KEY}
    assert tagged[MessageConst.TAGS] == "TagA" and tagged[MessageConst.KEYS] == "k1 k2"
    assert props["a"] == "1" and props[MessageConst.UNIQ_KEY] == "MINE"  # the user's key stays
    assert plain[MessageConst.UNIQ_KEY] != tagged[MessageConst.UNIQ_KEY]
    assert all(r.born_host == ("0.0.0.0", 0) and r.born_timestamp > 0 for r in records)


@pytest.mark.parametrize("tags", [None, "", "TagA"])
@pytest.mark.parametrize("keys", [(), ["k1"], ("k1", "k2")])
@pytest.mark.parametrize("props", [{}, {"p": "v"}, {MessageConst.UNIQ_KEY: "MINE", "p": "v"}])
def test_wire_records_equal_libstore_messages_byte_for_byte(tags, keys, props):
    """The client's lean message objects make the records a libstore Message of the same
    fields makes (built here as callers of libstore build them), born time aside."""
    m = OutgoingMessage("T", b"body", tags=tags, keys=keys, properties=props, queue_id=1)
    producer = Producer("127.0.0.1:1")
    try:
        wire = producer._request([m]).records
    finally:
        producer.close()
    (rec,) = _decoded(gateway_pb.ProduceRequest(records=wire))
    uniq = rec.to_message().properties[MessageConst.UNIQ_KEY]
    reference = Message(
        "T",
        b"body",
        1,
        tags=tags,
        keys=list(keys) or None,
        properties={**props, MessageConst.UNIQ_KEY: props.get(MessageConst.UNIQ_KEY, uniq)},
        born_host=("0.0.0.0", 0),
    )
    encoded = RecordEncoder(STORE_HOST_PLACEHOLDER, 4096, 255).encode_batch(
        [reference], rec.born_timestamp, unassigned_queue_ok=True
    )
    assert bytes(encoded.buf) == wire


def test_next_many_continues_the_counter_as_next_does():
    """A batch of keys is what as many calls of next() at one instant would give."""
    gen = UniqKeyGenerator("10.0.0.1", pid=7)
    first = gen.next()
    many = gen.next_many(5)
    after = gen.next()
    counters = [int(k[-4:], 16) for k in [first, *many, after]]
    start = counters[0]
    assert counters == [(start + i) & 0xFFFF for i in range(7)]
    assert all(k[:-4] == many[0][:-4] for k in many)  # one instant: one time part
    assert gen.next_many(0) == []


def test_next_many_wraps_the_16_bit_counter():
    """The counter wraps at 16 bits within a batch as it does across calls."""
    gen = UniqKeyGenerator("10.0.0.1", pid=7)
    gen._counter = 0xFFFE
    keys = gen.next_many(4)
    assert [int(k[-4:], 16) for k in keys] == [0xFFFF, 0x0000, 0x0001, 0x0002]
    assert len(set(keys)) == 4
