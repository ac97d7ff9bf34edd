"""A PullMany reply read in place by the C module (services.pull_reply over libstore/_codec.c)
against the protobuf runtime reading the same bytes: the same queue ids, offsets, skipped
counts and records, or the same error, for replies with unknown fields, repeated scalars,
fields of unexpected wire types, the non-raw form, negative numbers and damaged records."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from libstore import record_codec
from libstore.errors import CorruptRecordError
from libstore.message import Message
from libstore.message_id import encode_host
from libstore.record_encoder import RecordEncoder
from services import pull_reply
from services.proto import gateway_pb

EXT = record_codec.native()


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = v & 0x7F
        v >>= 7
        out.append(byte | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _field(number: int, wire_type: int, value: bytes | int) -> bytes:
    key = _varint(number << 3 | wire_type)
    if wire_type == 0:
        assert isinstance(value, int)
        return key + _varint(value)
    assert isinstance(value, bytes)
    return key + (_varint(len(value)) + value if wire_type == 2 else value)


def _records(count: int, seed: int) -> list[bytes]:
    encoder = RecordEncoder(encode_host("127.0.0.1", 10911), 1 << 20)
    out = []
    for i in range(count):
        msg = Message("T", os.urandom(seed % 50 + i), i % 4, tags=f"t{i}", keys=[f"k{seed}"])
        batch = encoder.encode_batch([msg], 1_700_000_000_000)
        batch.patch(0, i, 1000 * i + seed, 1_700_000_000_001)
        out.append(bytes(batch.buf))
    return out


# What may follow a result's own fields inside it: unknown fields of every wire type, a scalar
# repeated (protobuf keeps the last), a known field with another wire type, the non-raw form's
# messages field, queue offsets packed or not.
_extra = st.sampled_from(
    [
        b"",
        _field(15, 0, 7),
        _field(16, 2, b"xyz"),
        _field(17, 1, b"\x01" * 8),
        _field(18, 5, b"\x02" * 4),
        _field(2, 0, 12345),
        _field(9, 0, -3),
        _field(8, 0, 9),
        _field(2, 2, b"ab"),
        _field(6, 0, 1),
        _field(9, 2, b"ab"),
        _field(5, 2, b""),
        _field(7, 0, 4),
        _field(7, 2, _varint(1) + _varint(2)),
        _field(1, 0, 3),
    ]
)
_result = st.tuples(
    st.integers(-(2**31), 2**31 - 1),  # queue_id
    st.integers(-(2**63), 2**63 - 1),  # next_offset
    st.integers(0, 2**40),  # skipped
    st.integers(0, 5),  # records
    st.integers(0, 3),  # status
    _extra,
)


def _reply(results: list[tuple[int, int, int, int, int, bytes]], outer: bytes, seed: int) -> bytes:
    raw = b""
    for queue_id, next_offset, skipped, count, status, extra in results:
        response = gateway_pb.PullResponse(
            status=status,  # type: ignore[arg-type]
            queue_id=queue_id,
            next_offset=next_offset,
            skipped=skipped,
            records=_records(count, seed),
            queue_offsets=list(range(count)),
            min_offset=-1,
            max_offset=next_offset,
        )
        raw += _field(1, 2, response.SerializeToString() + extra)
    return raw + outer


def _read(raw: bytes, pure: bool) -> object:
    with pytest.MonkeyPatch.context() as m:
        if pure:
            m.setattr(pull_reply, "native", lambda: None)
        out = []
        for result in pull_reply.pull_many_results(raw):
            try:
                records: object = result.records()
            except CorruptRecordError as exc:
                records = ("error", str(exc))
            out.append((result.queue_id, result.next_offset, result.skipped, result.has_records, records))
        return out


def test_the_c_module_reads_pull_many_replies() -> None:
    assert EXT is not None, "libstore._codec is not built"
    raw = _reply([(3, 10, 0, 2, 0, b"")], b"", 1)
    heads = EXT.pull_many_results(raw)
    assert heads is not NotImplemented and [h[:4] for h in heads] == [(3, 10, 0, 2)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_result, max_size=4),
    st.sampled_from([b"", _field(2, 0, 5), _field(3, 2, b"q"), _field(4, 5, b"\x00" * 4)]),
    st.integers(0, 1000),
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=2),
)
# A packed queue_offsets whose last varint the damage leaves unfinished: protobuf refuses it.
@example(results=[(-1, 1, 128, 2, 0, b"")], outer=b"%\x00\x00\x00\x00", seed=1, edits=[(16612, 128)])
def test_a_reply_read_in_place_matches_the_protobuf_runtime(results, outer, seed, edits) -> None:
    raw = bytearray(_reply(results, outer, seed))
    clean = bytes(raw)
    assert _read(clean, pure=False) == _read(clean, pure=True)
    for at, value in edits:  # damage anywhere: framing, numbers, records
        if raw:
            raw[at % len(raw)] = value
    damaged = bytes(raw)
    try:
        want = _read(damaged, pure=True)
    except Exception as exc:  # not a PullManyResponse any more: the C walk must not accept it either
        with pytest.raises(type(exc)):
            _read(damaged, pure=False)
        return
    assert _read(damaged, pure=False) == want


def test_records_are_decoded_only_when_asked_for() -> None:
    raw = _reply([(0, 4, 0, 3, 0, b""), (1, 0, 2, 0, 0, b"")], b"", 7)
    first, second = pull_reply.pull_many_results(raw)
    assert (first.queue_id, first.has_records, second.has_records, second.skipped) == (0, True, False, 2)
    assert [r.tags for r in first.records()] == ["t0", "t1", "t2"] and second.records() == []
    # A damaged record does not stop the positions from being read; asking for it raises.
    record = gateway_pb.PullManyResponse.FromString(raw).results[0].records[0]
    magic_at = raw.index(record) + 4  # the first record's magic code
    damaged = raw[:magic_at] + bytes([raw[magic_at] ^ 0xFF]) + raw[magic_at + 1 :]
    first, _ = pull_reply.pull_many_results(damaged)
    assert (first.queue_id, first.next_offset, first.has_records) == (0, 4, True)
    with pytest.raises(CorruptRecordError):
        first.records()
