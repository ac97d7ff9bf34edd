"""Record codec: byte vectors written out field by field from the spec sheet (§1, §2), plus
hypothesis round trips and the validation rules recovery relies on."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libstore.errors import (
    CorruptRecordError,
    IllegalTopicError,
    MessageIllegalError,
    PropertiesSizeExceededError,
    QueueIdOutOfRangeError,
)
from libstore.message import Message, MessageSysFlag, waits_for_store
from libstore.message_id import encode_host
from libstore.record_codec import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    bytes_to_properties,
    check_record,
    decode_record,
    encode_blank,
    properties_to_bytes,
    record_size_of,
)
from libstore.record_encoder import STORE_HOST_PLACEHOLDER, RecordEncoder

STORE_HOST = encode_host("192.168.1.2", 10911)
BORN_TS = 1_700_000_000_000
STORE_TS = 1_700_000_000_123


def i32(v: int) -> bytes:
    return v.to_bytes(4, "big", signed=True)


def i64(v: int) -> bytes:
    return v.to_bytes(8, "big", signed=True)


def encode_one(msg: Message, queue_offset: int, phy_offset: int, store_ts: int = STORE_TS, **kw) -> bytes:
    enc = RecordEncoder(kw.pop("store_host", STORE_HOST), 4 * 1024 * 1024)
    batch = enc.encode_batch([msg], BORN_TS, **kw)
    batch.patch(0, queue_offset, phy_offset, store_ts)
    return bytes(batch.buf)


def test_v1_ipv4_record_matches_hand_built_bytes():
    msg = Message(
        "TopicTest",
        b"hello world",
        3,
        flag=7,
        properties={"TAGS": "TagA", "KEYS": "k1 k2"},
        born_timestamp=BORN_TS,
        born_host=("10.0.0.1", 5555),
        reconsume_times=2,
    )
    props = b"TAGS\x01TagA\x02KEYS\x01k1 k2\x02"
    assert len(props) == 21
    total = 91 + 11 + 9 + 21
    expected = b"".join(
        [
            i32(total),  # TOTALSIZE
            bytes.fromhex("DAA320A7"),  # MAGICCODE v1
            i32(222957957),  # BODYCRC: java.util.zip.CRC32("hello world") & 0x7FFFFFFF
            i32(3),  # QUEUEID
            i32(7),  # FLAG
            i64(42),  # QUEUEOFFSET
            i64(4096),  # PHYSICALOFFSET
            i32(0),  # SYSFLAG
            i64(BORN_TS),  # BORNTIMESTAMP
            bytes([10, 0, 0, 1]) + i32(5555),  # BORNHOST
            i64(STORE_TS),  # STORETIMESTAMP
            bytes([192, 168, 1, 2]) + i32(10911),  # STOREHOST
            i32(2),  # RECONSUMETIMES
            i64(0),  # PREPARED_TX_OFFSET
            i32(11) + b"hello world",  # BODYLEN, BODY
            bytes([9]) + b"TopicTest",  # TOPICLEN (1 byte, v1), TOPIC
            (21).to_bytes(2, "big") + props,  # PROPLEN, PROPERTIES
        ]
    )
    assert encode_one(msg, 42, 4096) == expected
    # Field positions the spec sheet lists for IPv4 hosts.
    assert expected[20:28] == i64(42) and expected[28:36] == i64(4096)
    assert expected[36:40] == i32(0) and expected[40:48] == i64(BORN_TS)
    assert expected[56:64] == i64(STORE_TS) and expected[84:88] == i32(11)


def test_ipv6_born_host_sets_sysflag_and_shifts_fields():
    msg = Message("T", b"x", 0, born_timestamp=BORN_TS, born_host=("::1", 80))
    raw = encode_one(msg, 0, 0)
    assert len(raw) == 91 + 12 + 1 + 1
    assert int.from_bytes(raw[36:40], "big") == MessageSysFlag.BORNHOST_V6_FLAG
    assert raw[48:64] == bytes(15) + b"\x01" and raw[64:68] == i32(80)
    assert raw[68:76] == i64(STORE_TS)  # STORETIMESTAMP moved by 12 bytes
    rec = decode_record(raw)
    assert rec.born_host == ("::1", 80) and rec.store_timestamp == STORE_TS


def test_ipv6_store_host_sets_sysflag_and_message_id_length():
    store6 = encode_host("2001:db8::7", 10911)
    raw = encode_one(Message("T", b"x", 0), 0, 123, store_host=store6)
    assert int.from_bytes(raw[36:40], "big") & MessageSysFlag.STOREHOSTADDRESS_V6_FLAG
    rec = decode_record(raw)
    assert rec.store_host == ("2001:db8::7", 10911)
    assert len(rec.msg_id) == 56 and rec.msg_id.endswith("000000000000007B")


def test_v2_magic_and_two_byte_topic_length_for_long_retry_topic():
    topic = "%RETRY%" + "g" * 193  # 200 bytes: only allowed for system topics, needs v2
    raw = encode_one(Message(topic, b"b", 0), 0, 0)
    assert raw[4:8] == bytes.fromhex("DAA320AB")
    body_end = 88 + 4 + 1 - 4  # header (88) + body (1): BODYLEN is inside the 88
    assert raw[body_end + 0 : body_end + 2] == (200).to_bytes(2, "big")
    assert len(raw) == 91 + 1 + 1 + 200
    assert decode_record(raw).topic == topic


def test_blank_end_record_bytes():
    assert encode_blank(100) == bytes.fromhex("00000064CBD43194")
    assert BLANK_MAGIC_CODE == -875286124 and MESSAGE_MAGIC_CODE == -626843481
    req = check_record(encode_blank(100) + bytes(92), 0, 100)
    assert req.success and req.msg_size == 0 and req.is_blank
    assert record_size_of(encode_blank(100), 0) == 0


def test_message_id_is_store_host_and_offset_in_uppercase_hex():
    rec = decode_record(encode_one(Message("T", b"x", 0), 0, 4096))
    assert rec.msg_id == "C0A80102" + "00002A9F" + "0000000000001000"


def test_properties_serialization_and_parse_rules():
    assert properties_to_bytes({"a": "1", "bb": "22"}) == b"a\x011\x02bb\x0122\x02"
    assert properties_to_bytes({}) == b""
    # Parse: pieces shorter than 3 chars skipped; empty key or value dropped; split at the first \x01.
    assert bytes_to_properties(b"a\x011\x02\x02k\x01\x02\x01v\x02x\x01y\x01z\x02") == {
        "a": "1",
        "x": "y\x01z",
    }
    assert bytes_to_properties("ключ\x01значение\x02".encode()) == {"ключ": "значение"}


@pytest.mark.parametrize(
    "props, error",
    [
        ({"a\x01": "v"}, MessageIllegalError),
        ({"a": "v\x02"}, MessageIllegalError),
        ({"": "v"}, MessageIllegalError),
        ({"a": 1}, MessageIllegalError),
        ({"k": "v" * 32767}, PropertiesSizeExceededError),
    ],
)
def test_bad_properties_are_rejected(props, error):
    with pytest.raises(error):
        properties_to_bytes(props)


@pytest.mark.parametrize(
    "topic",
    ["", "has space", "semi;colon", "dot.ted", "x" * 128, "ünï"],
)
def test_bad_topics_are_rejected(topic):
    enc = RecordEncoder(STORE_HOST, 1024)
    with pytest.raises(IllegalTopicError):
        enc.encode_batch([Message(topic, b"x", 0)], BORN_TS)


def test_topic_charset_and_length_limits_accept_edge_cases():
    enc = RecordEncoder(STORE_HOST, 1024)
    ok = ["a", "A-b_c%d|e", "x" * 127, "%DLQ%" + "g" * 250]
    batch = enc.encode_batch([Message(t, b"x", 0) for t in ok], BORN_TS)
    assert len(batch) == 4
    with pytest.raises(IllegalTopicError):
        enc.encode_batch([Message("%RETRY%" + "g" * 249, b"x", 0)], BORN_TS)  # 256 bytes


def test_batch_validation_names_the_bad_message_and_encodes_nothing():
    enc = RecordEncoder(STORE_HOST, 100)
    msgs = [Message("T", b"x" * 10, 0), Message("T", b"x" * 101, 0)]
    with pytest.raises(MessageIllegalError, match="message 1: body is 101 bytes"):
        enc.encode_batch(msgs, BORN_TS)
    with pytest.raises(QueueIdOutOfRangeError, match="message 0"):
        enc.encode_batch([Message("T", b"x", 4)], BORN_TS, queue_nums=lambda t: 4)
    with pytest.raises(QueueIdOutOfRangeError):
        enc.encode_batch([Message("T", b"x", -1)], BORN_TS)
    with pytest.raises(MessageIllegalError):
        enc.encode_batch([Message("T", "not bytes", 0)], BORN_TS)  # type: ignore[arg-type]
    with pytest.raises(MessageIllegalError):
        enc.encode_batch([Message("T", b"x", 0, born_host=("not-an-ip", 1))], BORN_TS)


def test_zero_born_timestamp_takes_the_encoder_clock():
    enc = RecordEncoder(STORE_HOST, 1024)
    batch = enc.encode_batch([Message("T", b"x", 0)], 123456)
    assert int.from_bytes(batch.buf[40:48], "big") == 123456


@pytest.mark.parametrize(
    ("value", "waits"),
    [
        (None, True),
        ("true", True),
        ("TRUE", True),
        ("tRue", True),
        ("false", False),
        ("FALSE", False),
        ("no", False),
        ("0", False),
        ("", True),  # an empty property is dropped when the record is parsed: absent
        (" true", False),
        ("truE ", False),
    ],
)
def test_wait_property_reads_as_rocketmq_reads_a_boolean(value: str | None, waits: bool):
    """WAIT is Java's Boolean.parseBoolean: only "true" in any case waits; absent waits too.
    Both the message form (encode_batch) and client-encoded records (adopt_records) list the
    records that do not wait, by index, and a batch waits while any of its records does."""
    props = {} if value is None else {"WAIT": value}
    msgs = [
        Message("T", b"a", 0),
        Message("T", b"b", 0, properties={"TAGS": "t", **props}),
        Message("T", b"c", 0),
    ]
    expected = [] if waits else [1]
    assert waits_for_store(value) is waits
    batch = RecordEncoder(STORE_HOST, 1024).encode_batch(msgs, BORN_TS)
    assert batch.no_wait == expected and batch.wait_store
    raw = bytes(RecordEncoder(STORE_HOST_PLACEHOLDER, 1024).encode_batch(msgs, BORN_TS).buf)
    adopted = RecordEncoder(STORE_HOST, 1024).adopt_records(raw, BORN_TS, lambda t: 4)
    assert adopted.no_wait == expected
    assert adopted.subset([1, 2]).no_wait == ([] if waits else [0])
    assert adopted.subset([0, 2]).no_wait == []
    alone = RecordEncoder(STORE_HOST, 1024).encode_batch(msgs[1:2], BORN_TS)
    assert alone.wait_store is waits


def test_transaction_prepared_and_rollback_take_no_queue_key():
    enc = RecordEncoder(STORE_HOST, 1024)
    msgs = [
        Message("T", b"x", 0, sys_flag=MessageSysFlag.TRANSACTION_PREPARED_TYPE),
        Message("T", b"x", 0, sys_flag=MessageSysFlag.TRANSACTION_ROLLBACK_TYPE),
        Message("T", b"x", 0, sys_flag=MessageSysFlag.TRANSACTION_COMMIT_TYPE),
        Message("T", b"x", 1),
    ]
    assert enc.encode_batch(msgs, 1).queue_keys == [None, None, ("T", 0), ("T", 1)]


# -- validation (recovery and dispatch rely on it) --------------------------------------------
def _record(body: bytes = b"payload", **kw) -> bytearray:
    return bytearray(encode_one(Message("TopicA", body, 1, tags="TagA", keys=["k1", "k2"]), 5, 1000, **kw))


def test_check_record_reports_dispatch_fields():
    raw = _record()
    req = check_record(raw, 0, len(raw), expected_phy_offset=1000)
    assert req.success and req.msg_size == len(raw)
    assert (req.topic, req.queue_id, req.consume_queue_offset, req.commit_log_offset) == (
        "TopicA",
        1,
        5,
        1000,
    )
    assert req.tags_code == 2598919  # Java "TagA".hashCode()
    assert req.keys == ("k1", "k2") and req.store_timestamp == STORE_TS


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.__setitem__(slice(4, 8), b"\x00\x00\x00\x00"),  # bad magic
        lambda r: r.__setitem__(90, r[90] ^ 0x01),  # body bit flip → CRC mismatch
        lambda r: r.__setitem__(slice(84, 88), (8).to_bytes(4, "big")),  # BODYLEN disagrees with TOTALSIZE
        lambda r: r.__setitem__(slice(0, 4), (10_000).to_bytes(4, "big")),  # TOTALSIZE past the end
        lambda r: r.__setitem__(slice(0, 4), (0).to_bytes(4, "big")),  # torn: size written last
        lambda r: r.__setitem__(slice(28, 36), (999).to_bytes(8, "big")),  # PHYSICALOFFSET elsewhere
    ],
)
def test_check_record_rejects_damaged_bytes(mutate):
    raw = _record()
    mutate(raw)
    assert not check_record(raw, 0, len(raw), expected_phy_offset=1000).success


def test_crc_check_can_be_skipped():
    raw = _record()
    raw[90] ^= 0x01
    assert check_record(raw, 0, len(raw), check_crc=False).success
    with pytest.raises(CorruptRecordError):
        decode_record(raw)


@settings(max_examples=150, deadline=None)
@given(
    topic=st.from_regex(r"[A-Za-z0-9_%|-]{1,127}", fullmatch=True),
    body=st.binary(max_size=3000),
    queue_id=st.integers(0, 1023),
    flag=st.integers(-(2**31), 2**31 - 1),
    props=st.dictionaries(
        st.text(
            st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
            min_size=1,
            max_size=12,
        ),
        st.text(
            st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
            min_size=1,
            max_size=40,
        ),
        max_size=6,
    ),
    queue_offset=st.integers(0, 2**62),
    phy_offset=st.integers(0, 2**62),
    born_v6=st.booleans(),
    reconsume=st.integers(0, 1000),
)
def test_round_trip(topic, body, queue_id, flag, props, queue_offset, phy_offset, born_v6, reconsume):
    born_host = ("fe80::1", 1234) if born_v6 else ("172.16.0.9", 1234)
    msg = Message(
        topic, body, queue_id, flag=flag, properties=props, born_host=born_host, reconsume_times=reconsume
    )
    raw = encode_one(msg, queue_offset, phy_offset)
    rec = decode_record(raw)
    assert (rec.topic, rec.body, rec.queue_id, rec.flag) == (topic, body, queue_id, flag)
    assert rec.properties == props
    assert (rec.queue_offset, rec.phy_offset, rec.store_timestamp) == (queue_offset, phy_offset, STORE_TS)
    assert rec.born_host == born_host and rec.store_host == ("192.168.1.2", 10911)
    assert rec.body_crc == zlib.crc32(body) & 0x7FFFFFFF and rec.total_size == len(raw)
    assert rec.reconsume_times == reconsume


@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(min_size=1, max_size=400), cut=st.integers(0, 124))
def test_overwritten_bytes_never_change_what_a_valid_record_reports(garbage, cut):
    """RocketMQ's record check covers size, magic, body (CRC), the length fields and, here, the
    physical offset. Whatever bytes are overwritten, a record that still validates has exactly
    the original size, offset and body (properties and timestamps are not checksummed, as in
    RocketMQ without enabledAppendPropCRC)."""
    original = bytes(_record())
    raw = bytearray(original)
    n = min(len(garbage), len(raw) - cut)
    raw[cut : cut + n] = garbage[:n]
    req = check_record(bytes(raw), 0, len(raw), expected_phy_offset=1000)
    if req.success and not req.is_blank:  # garbage may also spell the blank magic: a clean "end"
        assert req.msg_size == len(original) and req.commit_log_offset == 1000
        assert decode_record(bytes(raw), check_crc=True).body == b"payload"


def test_unencodable_property_text_is_a_bad_message():
    enc = RecordEncoder(STORE_HOST, 1024)
    with pytest.raises(MessageIllegalError, match="message 1: properties are not encodable as UTF-8"):
        enc.encode_batch([Message("T", b"x", 0), Message("T", b"x", 0, properties={"k": "\ud800"})], BORN_TS)


# -- client-encoded records (the records form of Produce/Append) --------------------------------
def _client_batch(msgs):
    client = RecordEncoder(STORE_HOST_PLACEHOLDER, 4096, 255)
    return bytes(client.encode_batch(msgs, 0, unassigned_queue_ok=True).buf)


def test_adopted_records_are_placed_and_get_the_store_host_and_a_born_time():
    raw = _client_batch(
        [
            Message(
                "T", b"one", 1, tags="a", keys=["k1"], properties={"UNIQ_KEY": "U1"}, born_host=("0.0.0.0", 0)
            ),
            Message("T", b"two", -1, born_host=("10.0.0.5", 7)),
        ]
    )
    store = RecordEncoder(STORE_HOST, 4096)
    with pytest.raises(QueueIdOutOfRangeError, match="record 1"):
        store.adopt_records(raw, BORN_TS, lambda t: 4)  # QUEUEID -1 with nobody to place it
    caller = encode_host("172.16.5.5", 999)
    batch = store.adopt_records(raw, BORN_TS, lambda t: 4, choose_queue=lambda t: 3, born_host=caller)
    assert (
        batch.queue_keys == [("T", 1), ("T", 3)]
        and batch.uniq_keys == ["U1", None]
        and batch.topics == ["T", "T"]
    )
    assert [r.queue_id for r in batch.requests] == [1, 3] and batch.requests[0].keys == ("k1",)
    batch.patch(0, 7, 1000, STORE_TS)
    first = decode_record(batch.buf, 0, batch.positions[1])
    second = decode_record(batch.buf, batch.positions[1], batch.positions[2])
    assert (first.store_host, first.born_timestamp, first.body, first.keys) == (
        ("192.168.1.2", 10911),
        BORN_TS,
        b"one",
        ["k1"],
    )
    assert first.queue_offset == 7 and first.phy_offset == 1000 and first.born_host == ("172.16.5.5", 999)
    assert second.queue_id == 3 and second.born_host == ("10.0.0.5", 7), "a set born host is kept"


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda raw: raw.__setitem__(slice(100, 101), b"X"), "CRC"),  # body byte changed
        (lambda raw: raw.__setitem__(slice(28, 36), (64).to_bytes(8, "big")), "not a valid"),  # offset set
        (lambda raw: raw.__setitem__(slice(0, 4), (10**6).to_bytes(4, "big")), "not a valid"),  # size
    ],
)
def test_adopting_refuses_damaged_or_foreign_records(damage, match):
    raw = bytearray(_client_batch([Message("T", b"body" * 10, 0)]))
    damage(raw)
    with pytest.raises(MessageIllegalError, match=match):
        RecordEncoder(STORE_HOST, 4096).adopt_records(raw, BORN_TS)
    too_big = _client_batch([Message("T", b"x" * 2000, 0)])
    with pytest.raises(MessageIllegalError, match="body is 2000 bytes"):
        RecordEncoder(STORE_HOST, 1000).adopt_records(too_big, BORN_TS)
    with pytest.raises(MessageIllegalError, match="IPv4 store host"):
        RecordEncoder(encode_host("fd00::1", 1), 4096).adopt_records(too_big, BORN_TS)
    with pytest.raises(MessageIllegalError, match="not a valid"):
        RecordEncoder(STORE_HOST, 4096).adopt_records(b"\x00" * 120, BORN_TS)


@pytest.mark.parametrize(
    ("props", "match"),
    [
        (b"KEYS\x01\xff\xfeab\x02", "not valid UTF-8"),
        (b"KEYS\x01abcde", "entries"),  # no closing separator
        (b"KEYS\x01a\x01cd\x02", "entries"),  # two separators in one entry
        (b"KEYSxabcd\x02", "entries"),  # no name/value separator
        (b"\x01KEYSabcd\x02", "names must not be empty"),
    ],
)
def test_adopting_refuses_properties_the_encoder_would_not_write(props, match):
    """The body CRC does not cover the properties: adopted records get the checks the message
    form gets when its properties are encoded."""
    raw = bytearray(_client_batch([Message("T", b"body", 0, properties={"KEYS": "abcd"})]))
    at = raw.index(b"KEYS\x01abcd\x02")
    assert len(props) == 10
    raw[at : at + 10] = props
    with pytest.raises(MessageIllegalError, match=f"record 0: .*{match}"):
        RecordEncoder(STORE_HOST, 4096).adopt_records(raw, BORN_TS)
