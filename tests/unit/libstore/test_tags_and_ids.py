"""Tags codes (Java String.hashCode, values printed by a JVM) and message ids (spec §2, §3)."""

from __future__ import annotations

import re

import pytest

from libstore.errors import InvalidArgumentError
from libstore.message_id import (
    UniqKeyGenerator,
    create_message_id,
    create_message_ids,
    decode_host,
    decode_message_id,
    encode_host,
)
from libstore.tags import java_string_hash, tags_code

# Printed by OpenJDK 17: System.out.println(s.hashCode())
JAVA_HASHES = [
    ("", 0),
    ("TagA", 2598919),
    ("hello", 99162322),
    ("TagA||TagB", 1789476431),
    ("中文标签", 622041809),
    ("\U0001f600", 1772899),  # one code point, two UTF-16 units
    ("a long tag value with spaces and symbols !@#$%^&*()", -1089967681),
    ("Topic#key-123", 1220872784),
]


@pytest.mark.parametrize("text, expected", JAVA_HASHES)
def test_java_string_hash_matches_the_jvm(text, expected):
    assert java_string_hash(text) == expected


def test_tags_code_is_zero_without_tags():
    assert tags_code(None) == 0 and tags_code("") == 0 and tags_code("TagA") == 2598919


def test_offset_message_id_round_trip_ipv4_and_ipv6():
    v4 = create_message_id(encode_host("10.1.2.3", 10911), 1 << 40)
    assert v4 == "0A010203" + "00002A9F" + "0000010000000000"
    assert decode_message_id(v4) == ("10.1.2.3", 10911, 1 << 40)
    v6 = create_message_id(encode_host("2001:db8::1", 8081), 77)
    assert len(v6) == 56 and decode_message_id(v6) == ("2001:db8::1", 8081, 77)
    assert decode_message_id(v4.lower()).phy_offset == 1 << 40


@pytest.mark.parametrize("native", [True, False], ids=["c", "python"])
def test_a_replys_message_ids_are_each_offsets_id(native, monkeypatch):
    from libstore import record_codec

    if not native:
        monkeypatch.setattr(record_codec, "_ext", None)
    elif record_codec.native() is None:
        pytest.fail("libstore._codec is not built: make install builds it")
    offsets = [0, 1, 255, 1 << 40, (1 << 63) - 1, 123_456_789]
    for host in (encode_host("10.1.2.3", 10911), encode_host("2001:db8::1", 8081)):
        assert create_message_ids(host, offsets) == [create_message_id(host, o) for o in offsets]
        assert create_message_ids(host, []) == []
    with pytest.raises(ValueError):
        create_message_ids(b"short", [1])


@pytest.mark.parametrize("bad", ["", "XYZ", "0A01020300002A9F000001000000000", "G" * 32])
def test_bad_message_ids_are_invalid_arguments(bad):
    with pytest.raises(InvalidArgumentError):
        decode_message_id(bad)


def test_host_encoding_rejects_names_and_bad_ports():
    assert decode_host(encode_host("127.0.0.1", 65535)) == ("127.0.0.1", 65535)
    with pytest.raises(InvalidArgumentError):
        encode_host("localhost", 1)
    with pytest.raises(InvalidArgumentError):
        encode_host("127.0.0.1", 70000)


def test_uniq_keys_have_rocketmq_layout_and_are_unique():
    gen = UniqKeyGenerator("192.168.0.10", pid=0x1234)
    keys = [gen.next() for _ in range(5000)]
    assert len(set(keys)) == len(keys)
    assert all(re.fullmatch(r"[0-9A-F]{32}", k) for k in keys)
    assert keys[0].startswith("C0A8000A" + "1234")  # IP then pid
    counters = [int(k[-4:], 16) for k in keys[:3]]
    assert counters[1] == (counters[0] + 1) & 0xFFFF
