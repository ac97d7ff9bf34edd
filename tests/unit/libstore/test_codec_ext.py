"""The record codec's C module (libstore/_codec.c) against its pure-Python reference
(libstore/record_codec.py), byte for byte: the same DispatchRequest, header fields and
positions for every record and every damaged variant of one, and the same adopted batch (bytes,
positions, queue keys, requests) or the same error for client-encoded records."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator, Mapping
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libstore import durability, log_scanner, record_codec, record_encoder
from libstore.dispatch_request import DispatchRequest
from libstore.errors import CorruptRecordError, MessageIllegalError
from libstore.log_scanner import scan_buffer
from libstore.message import Message, MessageConst
from libstore.message_id import encode_host
from libstore.producer_input import STORE_PROPERTIES, check_producer_properties
from libstore.record_codec import _check_record, _check_record_py, decode_record, encode_blank
from libstore.record_encoder import STORE_HOST_PLACEHOLDER, EncodedBatch, RecordEncoder
from libstore.system_topics import SYSTEM_TOPICS, TIMER_TOPIC

STORE_HOST = encode_host("192.168.1.2", 10911)
BORN_TS = 1_700_000_000_000
EXT = record_codec._ext


def test_the_c_module_is_built_and_used():
    """`make install` builds it; without it every other test here would compare Python with
    itself, so a missing build fails here instead of passing quietly."""
    assert EXT is not None, "libstore._codec is not built (needs gcc, Python headers, zlib1g-dev)"
    raw = _encoded([Message("T", b"body", 0, tags="a")])
    out = EXT.check_record(raw, 0, len(raw), True, -1, True, True, True)
    assert out is not NotImplemented and out[0].tags == "a"


def test_pure_python_mode_ignores_the_c_module():
    code = "from libstore import record_codec; print(record_codec._ext is None)"
    env = {**os.environ, "MQSTORE_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def _crc32_functions() -> dict[str, int]:
    """Addresses of C functions with crc32's signature: zlib's own crc32, and adler32 (same
    signature, another checksum)."""
    libz = ctypes.CDLL(ctypes.util.find_library("z") or "libz.so.1")
    return {
        name: ctypes.cast(getattr(libz, name), ctypes.c_void_p).value or 0 for name in ("crc32", "adler32")
    }


def test_bodycrc_comes_from_isal_in_c_and_is_zlibs_crc32():
    """The C module calls ISA-L's CRC-32 itself (found in the isal wheel), and what it writes
    and checks is zlib's crc32 whichever function computes it: ISA-L's in C, isal_zlib through
    Python, or zlib's."""
    native = record_codec.native_crc32_address()
    assert native != 0, "isal (a dependency) no longer exports crc32_gzip_refl"
    bodies = [bytes(range(256)) * 5, b"", b"x" * 63, b"y" * 64, os.urandom(4097)]
    msgs = [Message("T", body, 0, tags="a") for body in bodies]
    try:
        encoded = {}
        ways = {"isal in C": native, "isal via Python": 0, "zlib in C": _crc32_functions()["crc32"]}
        for name, address in ways.items():
            assert EXT.use_crc32(address) is (address != 0)
            encoded[name] = _encoded(msgs)
            assert decode_record(encoded[name], 0).body_crc == zlib.crc32(bodies[0]) & 0x7FFFFFFF
        assert len(set(encoded.values())) == 1
    finally:
        assert EXT.use_crc32(native)


def test_a_function_that_is_not_crc32_is_refused():
    """A function that disagrees with zlib's crc32 is not used: the records stay the same."""
    native = record_codec.native_crc32_address()
    functions = _crc32_functions()
    msgs = [Message("T", os.urandom(1024), 0), Message("T", b"short", 0)]
    try:
        assert EXT.use_crc32(functions["crc32"])
        expected = _encoded(msgs)
        assert EXT.use_crc32(functions["adler32"]) is False
        assert _encoded(msgs) == expected
        assert decode_record(expected, 0).body_crc == zlib.crc32(msgs[0].body) & 0x7FFFFFFF
    finally:
        assert EXT.use_crc32(native)


@contextlib.contextmanager
def _implementation(pure: bool) -> Iterator[None]:
    """The C module in use, or (``pure``) the pure-Python reference alone."""
    with pytest.MonkeyPatch.context() as m:
        if pure:
            m.setattr(record_codec, "_ext", None)
        yield


def _round_robin(width: int, counters: dict[str, int]) -> Callable[[str], int]:
    """A queue chooser counting per topic in ``counters`` (so two runs can be compared)."""

    def choose(topic: str) -> int:
        counters[topic] = counters.get(topic, -1) + 1
        return counters[topic] % width

    return choose


def _slots(req: DispatchRequest) -> tuple:
    return tuple(getattr(req, name) for name in DispatchRequest.__slots__)


def _encoded(msgs: list[Message], phy_offset: int = 0) -> bytes:
    encoder = RecordEncoder(STORE_HOST, 4 * 1024 * 1024, 255)
    batch = encoder.encode_batch(msgs, BORN_TS, unassigned_queue_ok=True)
    for i in range(len(batch)):
        batch.patch(i, 10 + i, phy_offset + batch.positions[i], BORN_TS + 5)
    return bytes(batch.buf)


# Property values the scan must read as RocketMQ does: spaces in KEYS, non-ASCII and astral
# characters in TAGS (Java hashes UTF-16 units), scheduling names, store-only names.
_text = st.text(alphabet=st.sampled_from("ab Z9_-é中😀 "), max_size=12)
_props = st.dictionaries(
    st.sampled_from(
        [
            "TAGS",
            "KEYS",
            "UNIQ_KEY",
            "DELAY",
            "TIMER_DELIVER_MS",
            "TIMER_DELAY_SEC",
            "x",
            "TAG",
            "WAIT",
            "traceparent",
            MessageConst.REAL_TOPIC,
            "KEYSX",
            "DURABILITY",
            "DURABILITYX",
            # where system topics keep their units' tags codes (SYSTEM_CODE_PROPERTIES)
            "TRAN_HALF_OFFSET",
            "TIMER_UNIT",
            "POP_SEQ",
            "POP_SEQX",
        ]
    ),
    _text.filter(lambda v: "\x01" not in v and "\x02" not in v)
    | st.sampled_from(["true", "TRUE", "tRuE", "false", "", "0", "yes", "truee"])
    # numbers as system_topics._number reads them, and not: 19 digits past 2**63, 20 digits
    | st.sampled_from(["7", "0042", "9223372036854775808", "9999999999999999999", "1" * 20, "12a", "-3"]),
    max_size=5,
)
_message = st.builds(
    lambda topic, body, queue, props, v6, sys_flag: Message(
        topic,
        body,
        queue,
        properties=props,
        born_host=("fd00::7", 9) if v6 else ("10.1.2.3", 77),
        sys_flag=sys_flag,
    ),
    st.sampled_from(["T", "Topic_A", "x" * 200, *sorted(SYSTEM_TOPICS)]),
    st.binary(max_size=300),
    st.integers(-1, 7),
    _props,
    st.booleans(),
    st.sampled_from([0, 0x4, 0x8, 0xC, 0x1]),
)
_edit = st.tuples(st.integers(0, 10_000), st.integers(0, 255))


def _decoded(buf: bytes | bytearray, pos: int, limit: int, check_crc: bool, pure: bool) -> object:
    with _implementation(pure):
        try:
            return decode_record(buf, pos, limit, check_crc=check_crc)
        except CorruptRecordError as exc:
            return ("error", str(exc))


def _compare_at(buf: bytes | bytearray, pos: int, limit: int) -> None:
    for check_crc in (True, False):
        assert _decoded(buf, pos, limit, check_crc, False) == _decoded(buf, pos, limit, check_crc, True)
        for expected in (-1, pos, pos + 1):
            for decode in (True, False):
                args = (buf, pos, limit, check_crc, expected, decode, check_crc)
                want = _check_record_py(*args)
                got = _check_record(*args)
                assert _slots(got[0]) == _slots(want[0]), args[1:]
                assert got[1:] == want[1:], args[1:]
                quick = EXT.check_record(*args, False)
                if quick is not NotImplemented:
                    assert _slots(quick[0]) == _slots(want[0]) and quick[2:] == want[2:]
                elif decode and want[0].success and want[0].msg_size:
                    # The C path answers every good record, system topics' included.
                    raise AssertionError(f"C check_record left a {want[0].topic} record to Python")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_message, min_size=1, max_size=4), st.lists(_edit, max_size=4), st.integers(0, 40))
def test_check_record_matches_the_python_reference(msgs, edits, cut):
    raw = bytearray(_encoded(msgs))
    clean = bytes(raw)
    for at, value in edits:  # damage: any byte, header and properties included
        raw[at % len(raw)] = value
    for buf in (clean, raw, raw[: max(0, len(raw) - cut)]):
        pos = 0
        while pos < len(buf):
            _compare_at(buf, pos, len(buf))
            size = int.from_bytes(buf[pos : pos + 4], "big", signed=True)
            if size <= 0:
                break
            pos += size
        _compare_at(buf, 0, min(len(buf), 7))  # too short for a blank


def _scanned(buf: bytes | bytearray, base: int, decode: bool, pure: bool) -> object:
    with _implementation(pure):
        records, end, bad = scan_buffer(buf, base, decode_properties=decode)
    return [_slots(r) for r in records], end, None if bad is None else _slots(bad)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_message, min_size=1, max_size=6),
    st.lists(_edit, max_size=3),
    st.integers(0, 40),
    st.booleans(),
    st.integers(0, 1 << 40),
)
def test_scan_buffer_in_c_matches_the_python_reference(msgs, edits, cut, blank, base):
    """log_scanner.scan_buffer's C loop (_codec.scan_run) against its Python loop: the same
    records, end offset and invalid request, for clean, damaged and cut chunks, with a blank
    END record after the records or not, system topics (some only Python decodes) included."""
    raw = bytearray(_encoded(msgs, base) + (encode_blank(64) if blank else b""))
    clean = bytes(raw)
    for at, value in edits:
        raw[at % len(raw)] = value
    for buf in (clean, bytes(raw), bytes(raw[: max(0, len(raw) - cut)])):
        for decode in (True, False):
            assert _scanned(buf, base, decode, False) == _scanned(buf, base, decode, True)


def _decoded_all(raws: list[bytes], check_crc: bool, pure: bool) -> object:
    with _implementation(pure):
        try:
            return record_codec.decode_records(raws, check_crc=check_crc)
        except CorruptRecordError as exc:
            return ("error", str(exc))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_message, min_size=1, max_size=6), st.lists(_edit, max_size=2), st.integers(0, 5))
def test_decode_records_matches_the_python_reference(msgs, edits, damaged):
    """A pull's records decoded in one C loop: the same MessageRecords as decode_record one by
    one in pure Python, or the same error for the first record that is damaged."""
    raw = _encoded(msgs)
    raws, pos = [], 0
    while pos < len(raw):
        size = int.from_bytes(raw[pos : pos + 4], "big")
        raws.append(raw[pos : pos + size])
        pos += size
    hurt = bytearray(raws[damaged % len(raws)])
    for at, value in edits:
        hurt[at % len(hurt)] = value
    for batch in (raws, [*raws[:damaged], bytes(hurt), *raws[damaged:]], []):
        for check_crc in (True, False):
            got, want = _decoded_all(batch, check_crc, False), _decoded_all(batch, check_crc, True)
            assert got == want
            if not isinstance(want, tuple):
                assert got == [decode_record(r, check_crc=check_crc) for r in batch]


def _with_raw_properties(raw: bytes) -> bytes:
    """One record whose properties area is ``raw`` as it is (a producer could not have sent
    it: separators inside names and values, malformed UTF-8), the header's size fixed up."""
    record = bytearray(_encoded([Message("T", b"body", 0)]))
    assert record[-2:] == b"\x00\x00"  # no properties: the length is the last field
    record[-2:] = len(raw).to_bytes(2, "big")
    record += raw
    record[0:4] = len(record).to_bytes(4, "big")
    return bytes(record)


# Bytes a properties area is made of: separators, names the decoder keeps (the C one caches
# ASCII names of up to 32 bytes), a 33-byte name, truncated and invalid UTF-8, whole non-ASCII.
_property_bytes = st.lists(
    st.sampled_from(
        [
            b"\x01",
            b"\x02",
            b"\x01\x01",
            b"a",
            b"TAGS",
            b"UNIQ_KEY",
            b"K" * 32,
            b"K" * 33,
            b"\xe2\x82",
            b"\xff",
            "é中😀".encode(),
            b"\xed\xa0\x80",
            b"\xf0\x9f",
            b"v",
            b" ",
        ]
    ),
    max_size=24,
).map(b"".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_property_bytes, min_size=1, max_size=5))
def test_decoded_properties_match_the_python_reference_for_any_bytes(areas):
    """The C decoder splits the properties' bytes before decoding the names and values (and
    keeps the names it met last): the same dict as decoding the whole area with "replace" and
    splitting the text, for separators anywhere and malformed UTF-8 next to them."""
    raws = [_with_raw_properties(area) for area in areas]
    for check_crc in (True, False):
        got, want = _decoded_all(raws, check_crc, False), _decoded_all(raws, check_crc, True)
        assert got == want
        if not isinstance(want, tuple):
            assert [r.properties for r in got] == [record_codec.bytes_to_properties(a) for a in areas]


def test_decoded_property_names_stay_right_past_what_the_decoder_keeps():
    """More distinct names than the C decoder keeps, of equal lengths, in turn: every record
    still gets its own names and values."""
    areas = [b"".join(b"N%02d\x01v%d-%d\x02" % ((i * 7 + k) % 40, i, k) for k in range(5)) for i in range(60)]
    records = record_codec.decode_records([_with_raw_properties(a) for a in areas])
    assert [r.properties for r in records] == [record_codec.bytes_to_properties(a) for a in areas]
    assert records[0].properties == {f"N{(7 * 0 + k) % 40:02d}": f"v0-{k}" for k in range(5)}


def test_configure_record_refuses_fields_that_are_not_slots_of_their_own() -> None:
    """The C decoder stores a MessageRecord's fields where __slots__ keep them: a class where
    two fields lead to one slot, or a field is a property, is refused, and a refused call leaves
    the decoder building real MessageRecords as before."""
    import dataclasses

    from libstore.message import MessageRecord

    names = tuple(f.name for f in dataclasses.fields(MessageRecord))
    aliased = type("Aliased", (), {"__slots__": names[1:]})
    aliased.total_size = aliased.__dict__["magic_code"]  # type: ignore[attr-defined]
    computed = type("Computed", (), {"__slots__": names[:-1]})
    computed.msg_id = property(lambda self: "", lambda self, v: None)  # type: ignore[attr-defined]
    for bad in (aliased, computed):
        with pytest.raises(TypeError, match="slot of its own"):
            EXT.configure_record(bad, names, record_codec._decoded_host)
    raw = _encoded([Message("T", b"body", 0, tags="a")])
    record = record_codec.decode_records([raw])[0]
    assert type(record) is MessageRecord and record.tags == "a" and record.body == b"body"


def test_decoded_records_are_left_out_of_the_cycle_collector_and_freed_by_refcount():
    """A pull's records hold no object that could refer back to them, so the C decoder leaves
    them untracked (young collections used to walk and promote every record a consumer held);
    a record still goes as soon as its last reference does, and what it holds with it."""
    import gc
    import sys

    raw = _encoded([Message("T", os.urandom(512), 0, tags="t", keys=["k1"]) for _ in range(64)])
    raws, pos = [], 0
    while pos < len(raw):
        size = int.from_bytes(raw[pos : pos + 4], "big")
        raws.append(raw[pos : pos + size])
        pos += size
    records = record_codec.decode_records(raws)
    assert [gc.is_tracked(r) for r in records] == [False] * len(raws)
    assert record_codec.decode_record(raws[0]) == records[0]
    assert not gc.is_tracked(record_codec.decode_record(raws[0]))
    body = records[0].body
    assert sys.getrefcount(body) == 3  # the record, ``body``, getrefcount's argument
    del records
    assert sys.getrefcount(body) == 2  # the record went with the list, without a collection


def test_check_record_reads_blanks_mmaps_and_odd_positions_like_python(tmp_path):
    import mmap

    raw = _encoded([Message("T", b"x" * 100, 1, tags="t")]) + encode_blank(4000)
    path = tmp_path / "seg"
    path.write_bytes(raw + bytes(64))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        for pos in (0, len(raw) - 8, len(raw), -8):
            for buf in (raw, mm, memoryview(raw)):
                limit = min(len(buf), len(raw))
                args = (buf, pos, limit, True, -1, True, True)
                want, got = _check_record_py(*args), _check_record(*args)
                assert (_slots(got[0]), got[1:]) == (_slots(want[0]), want[1:])
        with pytest.raises(ValueError):  # as struct would: closed mapping
            mm.close()
            _check_record(mm, 0, 100, True, -1, True)


def _client_records(msgs: list[Message]) -> bytes:
    client = RecordEncoder(STORE_HOST_PLACEHOLDER, 4096, 255)
    return bytes(client.encode_batch(msgs, 0, unassigned_queue_ok=True).buf)


def _adopt(raw: bytes, pure: bool) -> tuple:
    with _implementation(pure):
        choose = _round_robin(3, {})

        def queue_nums(topic: str) -> int:
            if topic == "Unknown":
                raise MessageIllegalError("no such topic")
            return 4 if topic != "Narrow" else 1

        def check_topic(topic: str) -> None:
            if topic.startswith("SYS_"):
                raise MessageIllegalError("store only")

        try:
            batch: EncodedBatch = RecordEncoder(STORE_HOST, 600, 255).adopt_records(
                raw,
                BORN_TS,
                queue_nums,
                choose_queue=choose,
                born_host=encode_host("172.16.0.9", 5),
                check_topic=check_topic,
                check_properties=check_producer_properties,
                forbidden_properties=STORE_PROPERTIES,
                sys_flag_mask=0x1 | 0x8,
                max_records=6,
            )
        except MessageIllegalError as exc:
            return ("error", type(exc), str(exc))
    return (
        bytes(batch.buf),
        batch.positions,
        batch.sizes,
        batch.store_ts_positions,
        batch.queue_keys,
        batch.topics,
        batch.uniq_keys,
        [_slots(r) for r in batch.requests],
        batch.scheduled,
        batch.no_wait,
        batch.durability_marked,
    )


_client_message = st.builds(
    lambda topic, body, queue, props, v6, sys_flag: Message(
        topic,
        body,
        queue,
        properties=props,
        born_host=("fd00::7", 9) if v6 else ("0.0.0.0", 0),
        sys_flag=sys_flag,
    ),
    st.sampled_from(["T", "T", "T", "Other", "Narrow", "Unknown", "SYS_X", TIMER_TOPIC]),
    st.binary(max_size=700),
    st.integers(-1, 5),
    _props,
    st.booleans(),
    st.sampled_from([0, 0x1, 0x4, 0x8, 0xC]),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_client_message, min_size=1, max_size=8), st.lists(_edit, max_size=2))
def test_adopt_records_matches_the_python_reference(msgs, edits):
    raw = bytearray(_client_records(msgs))
    assert _adopt(bytes(raw), False) == _adopt(bytes(raw), True)
    for at, value in edits:
        raw[at % len(raw)] = value
    assert _adopt(bytes(raw), False) == _adopt(bytes(raw), True)


def test_adopt_records_in_c_takes_a_whole_common_batch(monkeypatch):
    """The fast path does the work: a plain batch never reaches the per-record Python code
    after the first record of each topic."""
    msgs = [Message("T", b"b" * 100, -1, tags="a", properties={"UNIQ_KEY": f"U{i}"}) for i in range(50)]
    calls = []
    real = RecordEncoder._adopt_one

    def counting(self, *args, **kw):
        calls.append(args[3])
        return real(self, *args, **kw)

    monkeypatch.setattr(RecordEncoder, "_adopt_one", counting)
    batch = RecordEncoder(STORE_HOST, 4096).adopt_records(
        _client_records(msgs), BORN_TS, lambda t: 4, choose_queue=lambda t: 2
    )
    assert calls == [0] and len(batch) == 50 and batch.uniq_keys[49] == "U49"
    assert {k for k in batch.queue_keys} == {("T", 2)}


class _Mapping(Mapping[str, str]):
    """Properties that are a mapping but not a dict (as protobuf's map fields are)."""

    def __init__(self, data: dict[str, str]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> str:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _encode(msgs: list, pure: bool, unassigned: bool) -> tuple:
    with _implementation(pure):
        counters: dict[str, int] = {}
        choose = _round_robin(5, counters)

        def queue_nums(topic: str) -> int:
            if topic == "Unknown":
                raise MessageIllegalError("no such topic")
            return 4

        encoder = RecordEncoder(STORE_HOST, 600, 127)
        try:
            batch = encoder.encode_batch(
                msgs,
                BORN_TS,
                queue_nums,
                unassigned_queue_ok=unassigned,
                choose_queue=None if unassigned else choose,
            )
        except MessageIllegalError as exc:
            return ("error", type(exc), str(exc))
    return (
        bytes(batch.buf),
        batch.positions,
        batch.sizes,
        batch.queue_keys,
        batch.store_ts_positions,
        batch.no_wait,
        batch.durability_marked,
        counters,
    )


# Mostly messages that encode (so the C run has work), some that each check refuses.
_prop_value = st.one_of(
    st.text(alphabet=st.sampled_from("ab é中😀"), max_size=6),
    st.text(alphabet=st.sampled_from("ab é中😀"), max_size=6),
    st.sampled_from(["false", "true", "True", "FALSE", "", "1"]),
    st.sampled_from(["a\x01b", "c\x02", "\ud800", "x" * 40_000, 3]),
)
_encode_props = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["WAIT", "TAGS", "KEYS", "DURABILITY"]), _prop_value, max_size=3),
    st.dictionaries(st.sampled_from(["WAIT", "TAGS", "", "a\x01"]), _prop_value, max_size=2),
)
_any_message = st.builds(
    lambda topic, body, queue, props, mapping, host, sys_flag, flag, born: Message(
        topic,
        body,
        queue,
        properties=_Mapping(props) if mapping and isinstance(props, dict) else props,
        born_host=host,
        sys_flag=sys_flag,
        flag=flag,
        born_timestamp=born,
    ),
    st.sampled_from(["T"] * 6 + ["Other", "Unknown", "bad topic", "x" * 130]),
    st.one_of(
        st.binary(max_size=700),
        st.binary(max_size=100),
        st.just("text"),
        st.builds(bytearray, st.binary(max_size=20)),
    ),
    st.sampled_from([-1, -1, 0, 1, 2, 3, 4, 5, -2]),
    _encode_props,
    st.booleans(),
    st.sampled_from([("10.1.2.3", 77)] * 3 + [("fd00::7", 9), "10.0.0.1:5", "", "nohost", ("x", 1)]),
    st.sampled_from([0, 0, 0, 0x4, 0x10, 0x20, 0xC]),
    st.sampled_from([0, 0, 0, -1, 2**31]),
    st.sampled_from([0, BORN_TS]),
)


_good_message = st.builds(
    lambda topic, body, queue, props, mapping, host, sys_flag: Message(
        topic,
        body,
        queue,
        properties=_Mapping(props) if mapping else props,
        born_host=host,
        sys_flag=sys_flag,
    ),
    st.sampled_from(["T", "Other"]),
    st.binary(max_size=300),
    st.integers(-1, 3),
    st.dictionaries(
        st.sampled_from(["WAIT", "TAGS", "KEYS", "UNIQ_KEY", "DURABILITY"]),
        st.text(alphabet=st.sampled_from("ab é中😀"), max_size=6)
        | st.sampled_from(["false", "true", "TRUE", "no", "", "1", "2"]),
        max_size=3,
    ),
    st.booleans(),
    st.sampled_from([("10.1.2.3", 77), ("fd00::7", 9), "10.0.0.1:5", ""]),
    st.sampled_from([0, 0x4, 0x10, 0x20, 0xC, 0x1]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_good_message, min_size=1, max_size=12),
    st.lists(_any_message, max_size=2),
    st.integers(0, 12),
    st.booleans(),
)
def test_encode_batch_matches_the_python_reference(good, other, at, unassigned):
    msgs = good[:at] + other + good[at:]
    assert _encode(msgs, False, unassigned) == _encode(msgs, True, unassigned)


def test_encode_batch_in_c_takes_a_whole_common_batch(monkeypatch):
    msgs = [Message("T", b"b" * 100, -1, tags="a", properties={"UNIQ_KEY": f"U{i}"}) for i in range(50)]
    calls = []
    real = RecordEncoder._encode_one

    def counting(self, *args, **kw):
        calls.append(args[2])
        return real(self, *args, **kw)

    monkeypatch.setattr(RecordEncoder, "_encode_one", counting)
    batch = RecordEncoder(STORE_HOST, 4096).encode_batch(msgs, BORN_TS, lambda t: 4, choose_queue=lambda t: 2)
    assert calls == [0] and len(batch) == 50 and set(batch.queue_keys) == {("T", 2)}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from([("T", 0), ("T", 1), ("U", 0), None]), min_size=1, max_size=30),
    st.dictionaries(st.sampled_from([("T", 0), ("U", 0)]), st.integers(0, 2**40), max_size=2),
    st.integers(0, 2**40),
)
def test_assign_offsets_matches_the_python_reference(keys, table, base):
    batch = RecordEncoder(STORE_HOST, 4096).encode_batch(
        [
            Message(
                k[0] if k else "T",
                b"x" * (i % 7),
                0,
                born_host=("fd00::1", 1) if i % 3 else ("1.2.3.4", 5),
                sys_flag=0 if k else 0x4,
            )
            for i, k in enumerate(keys)
        ],
        BORN_TS,
    )
    outs = []
    for impl in (record_encoder.assign_offsets, record_encoder._assign_offsets_py):
        buf, tab, qoffs = bytearray(batch.buf), dict(table), []
        impl(
            buf, batch.positions, batch.store_ts_positions, keys, tab, 1, len(keys), base, BORN_TS + 9, qoffs
        )
        outs.append((bytes(buf), tab, qoffs))
    assert outs[0] == outs[1]


_PAST_THE_END = """
import ctypes, mmap, struct
from libstore import record_codec as rc
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
c_int, c_size_t, c_void_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
libc.mmap.argtypes = [c_void_p, c_size_t, c_int, c_int, c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
page = mmap.PAGESIZE
addr = libc.mmap(None, 2 * page, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
assert libc.munmap(addr + page, page) == 0  # nothing mapped after the first page
record = bytearray(91)
struct.pack_into(">ii", record, 0, 91, rc.MESSAGE_MAGIC_CODE)
struct.pack_into(">i", record, 36, 0x30)  # both hosts IPv6: a 112-byte header in a 91-byte record
ctypes.memmove(addr + page - 91, bytes(record), 91)
view = memoryview((ctypes.c_char * page).from_address(addr))
want = rc._check_record_py(view, page - 91, page, True, -1, True)[0]
got = rc._check_record(view, page - 91, page, True, -1, True)[0]
assert (got.success, got.msg_size) == (want.success, want.msg_size) == (False, 91), (got, want)
print("ok")
"""


def test_a_header_wider_than_its_record_is_not_read_past_the_buffer():
    """A record whose SYSFLAG claims IPv6 hosts (a 112-byte header) in 91 bytes at the very end
    of mapped memory: refused like the Python code refuses it, without reading past the end (in
    a child process, so a read past the mapping fails this test instead of the test run)."""
    out = subprocess.run([sys.executable, "-c", _PAST_THE_END], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


class _Queue(int):
    """A queue id that is an int but not exactly one (numpy's integers are alike)."""


def test_a_chooser_is_asked_once_per_message_whatever_it_answers():
    calls: list[str] = []

    def choose(topic: str) -> int:
        calls.append(topic)
        if len(calls) == 3:
            raise MessageIllegalError("no queue for you")
        return _Queue(len(calls) % 2)

    msgs = [Message("T", b"x", -1), Message("T", b"y", -1)]
    batch = RecordEncoder(STORE_HOST, 4096).encode_batch(msgs, BORN_TS, lambda t: 4, choose_queue=choose)
    assert calls == ["T", "T"] and batch.queue_keys == [("T", 1), ("T", 0)] and batch.wait_store is True
    with pytest.raises(MessageIllegalError, match="message 0: no queue for you"):
        RecordEncoder(STORE_HOST, 4096).encode_batch(msgs, BORN_TS, lambda t: 4, choose_queue=choose)
    calls.clear()
    raw = _client_records([Message("T", b"x", -1), Message("T", b"y", -1)])
    adopted = RecordEncoder(STORE_HOST, 4096).adopt_records(raw, BORN_TS, lambda t: 4, choose_queue=choose)
    assert calls == ["T", "T"] and adopted.queue_keys == [("T", 1), ("T", 0)]


def _split(
    msgs: list,
    transient_topics: frozenset[str],
    adopted: bool,
    pure: bool,
    base: int,
    start: int,
    min_view: int,
) -> tuple:
    """A batch of ``msgs`` (encoded, or ``adopted`` from client records) split into stubs and
    whole records (libstore.durability.mark_transient) and held from record ``start`` on after
    its offsets are assigned (as a view of the request from ``min_view`` bytes on), by one
    implementation."""
    with _implementation(pure):
        if adopted:
            batch = RecordEncoder(STORE_HOST, 4096).adopt_records(
                _client_records(msgs), BORN_TS, lambda t: 4, choose_queue=lambda t: 1
            )
        else:
            batch = RecordEncoder(STORE_HOST, 4096).encode_batch(msgs, BORN_TS, choose_queue=lambda t: 0)
        before = bytes(batch.buf)
        try:
            durability.mark_transient(batch, transient_topics)
        except MessageIllegalError as exc:
            assert bytes(batch.buf) == before and not batch.transient, "a refused batch is unchanged"
            return ("refused", str(exc))
        qoffs: list[int] = []
        record_encoder.assign_offsets(
            batch.buf,
            batch.positions,
            batch.store_ts_positions,
            batch.queue_keys,
            {},
            0,
            len(msgs),
            base,
            7,
            qoffs,
        )
        held = durability.hold_entries(batch, start, len(msgs), base, min_view)
        keys, _, data = held
        # Every record of the request held, and enough bytes of them: a view of the request's
        # buffer, no copy; else a copy.
        whole = len(keys) == len(msgs) and len(data) >= min_view
        assert isinstance(data, memoryview) == whole and (data.readonly if whole else isinstance(data, bytes))
    return (
        bytes(batch.buf),
        batch.positions,
        batch.sizes,
        bytes(batch.whole_buf),
        batch.transient,
        batch.transient_bytes,
        batch.no_wait,
        batch.queue_keys,
        [_slots(r) for r in batch.requests],
        held,
    )


@pytest.mark.parametrize("adopted", [False, True])
def test_held_records_are_a_view_from_min_view_bytes_on(adopted: bool) -> None:
    """At the threshold itself, one byte below and one above: both implementations hold a view
    of the request when all of it is at least ``min_view`` bytes, else a copy, with the same
    bytes either way."""
    msgs = [Message("T", bytes([65 + i]) * (200 + 50 * i), 0) for i in range(5)]
    whole = len(_split(msgs, frozenset({"T"}), adopted, False, 4096, 0, 0)[3])
    for min_view, view in ((whole - 1, True), (whole, True), (whole + 1, False)):
        outs = [_split(msgs, frozenset({"T"}), adopted, pure, 4096, 0, min_view) for pure in (False, True)]
        assert outs[0] == outs[1]
        keys, ends, data = outs[0][-1]
        assert isinstance(data, memoryview) is view and len(data) == whole == ends[-1] and len(keys) == 5


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_good_message, min_size=1, max_size=10),
    st.sampled_from([frozenset(), frozenset({"T"}), frozenset({"Other", "T"})]),
    st.booleans(),
    st.integers(0, 2**40),
    st.sampled_from([0, 1]),
    st.sampled_from([0, durability.HOLD_VIEW_MIN_BYTES]),
)
def test_stubs_and_held_records_match_the_python_reference(
    msgs, transient_topics, adopted, base, start, min_view
):
    """Which messages are transient (topic, DURABILITY 1 or 2, any other value refused), their
    stubs, whole records, requests and held records (held in place or copied): the C pass and
    the Python reference agree."""
    c_out = _split(msgs, transient_topics, adopted, False, base, start, min_view)
    assert c_out == _split(msgs, transient_topics, adopted, True, base, start, min_view)
    if c_out[0] == "refused":
        assert "DURABILITY" in c_out[1]
        return
    buf, positions, sizes, whole, transient, _, no_wait, queue_keys, _, (keys, ends, data) = c_out
    found = sorted(transient)
    assert set(found) <= set(no_wait)
    for i, msg in enumerate(msgs):
        value = (msg.properties or {}).get("DURABILITY")
        expected = queue_keys[i] is not None and (msg.topic in transient_topics or value == "1")
        assert (i in transient) == expected, (i, msg.topic, value)  # tx PREPARED/ROLLBACK: no queue
    for i in found:
        stub = buf[positions[i] : positions[i] + sizes[i]]
        assert durability.is_stub(stub) and record_codec.check_record(stub, 0, len(stub)).success
        assert decode_record(whole, transient[i]).body == msgs[i].body
    records = [data[a:b] for a, b in zip([0, *ends], ends, strict=False)]
    assert list(ends[-1:]) == [len(data)] if keys else data == b""
    assert list(keys) == [positions[i] + base for i in found if i >= start]
    for key, record in zip(keys, records, strict=True):
        rec = decode_record(record)
        assert rec.phy_offset == key and rec.store_timestamp == 7 and not durability.is_stub(record)


def test_scan_buffer_takes_back_a_record_the_c_loop_leaves_to_python(monkeypatch):
    """A record only the Python code decodes (scan_run's state 3) is decoded there, and the C
    loop goes on after it."""
    msgs = [Message("T", b"%d" % i, 0, properties={"KEYS": f"k{i}"}) for i in range(4)]
    buf = _encoded(msgs, 1000)
    second = int.from_bytes(buf[:4], "big")
    calls = []

    class HandsBack:
        def __getattr__(self, name):
            return getattr(EXT, name)

        def scan_run(self, data, pos, base, decode):
            calls.append(pos)
            if pos < second:  # as if the second record were one only Python decodes
                records, _, _, _ = EXT.scan_run(data[:second], pos, base, decode)
                return records, second, 3, None
            return EXT.scan_run(data, pos, base, decode)

    expected = _scanned(buf, 1000, True, True)
    monkeypatch.setattr(record_codec, "_ext", HandsBack())
    monkeypatch.setattr(log_scanner, "native", lambda: record_codec._ext)
    records, end, bad = scan_buffer(buf, 1000)
    assert ([_slots(r) for r in records], end, bad) == expected
    third = second + int.from_bytes(buf[second : second + 4], "big")
    assert len(records) == 4 and calls == [0, third]  # the second one decoded in Python


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(0, 3000), min_size=1, max_size=40),
    st.integers(1, 20_000),
    st.one_of(st.none(), st.tuples(st.integers(0, 39), st.sampled_from(["phy", "size", "magic", "topic"]))),
    st.sampled_from(["zeros", "blank", "none"]),
)
def test_record_cuts_in_c_are_the_python_ones(
    sizes: list[int], every: int, damage: tuple[int, str] | None, tail: str
) -> None:
    """log_scanner.record_cuts (services.spark.commitlog_source's cut points): the C walk and the
    Python one
    agree on files with a record that is not where it says, too large, not a record or with a
    topic that is not UTF-8, and on each way a file ends; every cut is a record's start before
    any damage, the runs between cuts are at least ``every`` bytes, and a walk that finds no cut
    ends where the records end."""
    base = 1 << 30
    buf = bytearray(_encoded([Message("T", b"x" * n, 0) for n in sizes], base))
    positions = []
    pos = 0
    while pos < len(buf):
        positions.append(pos)
        pos += int.from_bytes(buf[pos : pos + 4], "big")
    bad_at = len(buf)
    if damage is not None:
        at = positions[damage[0] % len(positions)]
        bad_at = at
        if damage[1] == "phy":
            buf[at + 35] ^= 0x01
        elif damage[1] == "size":
            buf[at : at + 4] = (len(buf) - at + 1).to_bytes(4, "big")
        elif damage[1] == "magic":
            buf[at + 4] ^= 0xFF
        else:
            _, _, props_at, _ = record_codec.record_parts(bytes(buf), at)
            buf[props_at - 3] = 0xFF  # the topic's last byte
    if tail == "zeros":
        buf += bytes(500)
    elif tail == "blank":
        buf += encode_blank(64) + bytes(56)
    got = EXT.record_cuts(bytes(buf), base, every)
    assert got == log_scanner._record_cuts_py(bytes(buf), base, every)
    cuts, end = got
    assert all(c in positions and c < bad_at for c in cuts)
    assert all(b - a >= every for a, b in pairwise([0, *cuts]))
    assert end == (cuts[-1] if cuts and cuts[-1] + every >= len(buf) else bad_at)
    whole = EXT.record_cuts(bytes(buf), base, len(buf) + 1)  # no cut: where the records end
    assert whole == log_scanner._record_cuts_py(bytes(buf), base, len(buf) + 1) == ([], bad_at)


def test_record_cuts_refuses_runs_of_no_bytes() -> None:
    for cuts in (log_scanner.record_cuts, EXT.record_cuts):
        with pytest.raises(ValueError, match="every must be positive"):
            cuts(bytes(64), 0, 0)
    assert log_scanner.record_cuts(b"", 0, 10) == ([], 0)
