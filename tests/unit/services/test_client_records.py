"""The Python client's record encoding: what a Producer puts on the wire is what the store's
encoder makes of the same messages (properties, TAGS, KEYS, UNIQ_KEY, the caller's born host)."""

from __future__ import annotations

from libstore import MessageConst
from libstore.message_id import UniqKeyGenerator
from libstore.record_codec import STORE_HOST_PLACEHOLDER, RecordEncoder, decode_record
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


def test_wire_records_equal_the_store_encoders_records_of_the_same_messages():
    """Byte for byte, but for the born timestamp the encoder fills in: the client's lean message
    objects and libstore's Message make the same records."""
    m = OutgoingMessage("T", b"body", tags="x", keys=["a"], properties={"p": "v"}, queue_id=1)
    producer = Producer("127.0.0.1:1")
    try:
        wire = producer._request([m]).records
    finally:
        producer.close()
    (rec,) = _decoded(gateway_pb.ProduceRequest(records=wire))
    reference = RecordEncoder(STORE_HOST_PLACEHOLDER, 4096, 255).encode_batch(
        [m.to_message(rec.to_message().properties[MessageConst.UNIQ_KEY])],
        rec.born_timestamp,
        unassigned_queue_ok=True,
    )
    assert bytes(reference.buf) == wire


def test_next_many_continues_the_counter_as_next_does():
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
    gen = UniqKeyGenerator("10.0.0.1", pid=7)
    gen._counter = 0xFFFE
    keys = gen.next_many(4)
    assert [int(k[-4:], 16) for k in keys] == [0xFFFF, 0x0000, 0x0001, 0x0002]
    assert len(set(keys)) == 4
