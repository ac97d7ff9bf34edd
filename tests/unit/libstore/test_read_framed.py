"""Reads framed for the wire (libstore.log_reads.read_records_framed): byte for byte the
pure-Python reference, ``frame_records(read_records(...))``, with the C runs and without them,
over segments, transient stubs, missing ranges, whole-record (size 0) ranges and the bounds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libstore import CommitLog, Message, PutMessageStatus, log_reads, record_framing
from libstore.errors import InvalidArgumentError
from libstore.record_codec import native
from libstore.record_framing import frame_records
from services.proto import commitlog_pb, gateway_pb
from tests.conftest import small_store_config

SEGMENT = 96 * 1024
TAG_READ = 0x0A  # ReadResponse.records = 1
TAG_PULL = 0x32  # PullResponse.records = 6
Ranges = list[tuple[int, int]]


@pytest.fixture(scope="module")
def log_and_ranges(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[CommitLog, list[tuple[int, int]]]]:
    """A log over several segments: persistent and transient messages (DURABILITY=1 leaves a
    stub in the log) with bodies from 10 bytes to 20 KiB, so framing lengths take one to three
    varint bytes; the (offset, size) of every record stored."""
    root = Path(tmp_path_factory.mktemp("framed"))
    cl = CommitLog.open(
        small_store_config(root / "store", mapped_file_size_commit_log=SEGMENT, max_message_size=32 * 1024)
    )
    ranges: list[tuple[int, int]] = []
    sizes = [10, 100, 130, 1000, 5000, 20_000]
    for i in range(90):
        props = {"DURABILITY": "1"} if i % 5 == 2 else {}
        msg = Message("T", bytes([i]) * sizes[i % len(sizes)], i % 4, tags=f"t{i % 3}", properties=props)
        results = cl.put_messages([msg])
        assert results[0].status is PutMessageStatus.PUT_OK
        ranges.append((results[0].phy_offset, results[0].size))
    assert len(cl.queue.mapped_files) >= 3
    yield cl, ranges
    cl.shutdown()


def _reference(cl: CommitLog, ranges: list[tuple[int, int]], tag: int, **bounds: int) -> bytes:
    return frame_records(log_reads.read_records(cl.queue, cl.transient, ranges, **bounds), tag)


def _framed(cl: CommitLog, ranges: list[tuple[int, int]], tag: int, **bounds: int) -> bytes:
    return log_reads.read_records_framed(cl.queue, cl.transient, ranges, tag, **bounds)


def _pick(ranges: list[tuple[int, int]], end: int) -> st.SearchStrategy[list[tuple[int, int]]]:
    stored = st.sampled_from(ranges)
    whole = stored.map(lambda r: (r[0], 0))  # size 0: as the record's TOTALSIZE says
    missing = st.tuples(st.integers(end, end + 10_000), st.integers(1, 500))  # past the log's end
    torn = stored.map(lambda r: (r[0], r[1] + 70_000))  # larger than any record
    # Offsets near the top of int64: offset + size must not wrap around in the bounds check.
    huge = st.tuples(st.integers(2**63 - 70_000, 2**63 - 1), st.integers(1, 70_000))
    return st.lists(st.one_of(stored, stored, stored, whole, missing, torn, huge), max_size=40)


def test_the_c_module_is_built() -> None:
    assert native() is not None, "make install builds libstore/_codec.c; these tests compare it"


@settings(max_examples=150, deadline=None)
@given(data=st.data(), tag=st.sampled_from([TAG_READ, TAG_PULL]))
def test_framed_reads_match_the_reference(log_and_ranges, data: st.DataObject, tag: int) -> None:
    cl, stored = log_and_ranges
    ranges = data.draw(_pick(stored, cl.max_offset))
    bounds = {"max_record_size": cl.config.max_record_size}
    want = _reference(cl, ranges, tag, **bounds)
    assert _framed(cl, ranges, tag, **bounds) == want
    with pytest.MonkeyPatch.context() as m:  # the fallback without the C module
        m.setattr(log_reads, "native", lambda: None)
        assert _framed(cl, ranges, tag, **bounds) == want


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_framed_read_past_max_bytes_is_refused_like_a_plain_one(
    log_and_ranges, data: st.DataObject
) -> None:
    cl, stored = log_and_ranges
    ranges = data.draw(st.lists(st.sampled_from(stored), min_size=1, max_size=20))
    max_bytes = data.draw(st.integers(1, 60_000))
    try:
        want: bytes | None = _reference(cl, ranges, TAG_READ, max_bytes=max_bytes)
    except InvalidArgumentError:
        want = None
    if want is None:
        with pytest.raises(InvalidArgumentError, match=f"at most {max_bytes} bytes"):
            _framed(cl, ranges, TAG_READ, max_bytes=max_bytes)
    else:
        assert _framed(cl, ranges, TAG_READ, max_bytes=max_bytes) == want


def test_framed_records_parse_as_the_replies_that_carry_them(log_and_ranges) -> None:
    cl, stored = log_and_ranges
    ranges = [*stored[:12], (cl.max_offset + 5, 100)]  # the last one missing
    records = log_reads.read_records(cl.queue, cl.transient, ranges)
    read = commitlog_pb.ReadResponse.FromString(_framed(cl, ranges, TAG_READ))
    assert list(read.records) == [r or b"" for r in records]
    pull = gateway_pb.PullResponse.FromString(
        gateway_pb.PullResponse(next_offset=9).SerializeToString() + _framed(cl, ranges[:12], TAG_PULL)
    )
    assert pull.next_offset == 9 and list(pull.records) == records[:12]


def test_a_range_whose_end_passes_int64_reads_as_missing(log_and_ranges: tuple[CommitLog, Ranges]) -> None:
    cl, stored = log_and_ranges
    ranges = [stored[0], (2**63 - 50, 100), stored[1]]
    assert _framed(cl, ranges, TAG_READ) == _reference(cl, ranges, TAG_READ)
    assert log_reads.read_records(cl.queue, cl.transient, ranges)[1] is None


_values = st.lists(st.binary(max_size=300) | st.just(b"x" * 20_000), max_size=12)


@settings(max_examples=300, deadline=None)
@given(values=_values, tag=st.integers(0, 0x7F), cut=st.integers(0, 40), junk=st.binary(max_size=3))
def test_walking_framed_values_in_c_matches_python(
    values: list[bytes], tag: int, cut: int, junk: bytes
) -> None:
    ok = frame_records(values, tag)
    for framed in (ok, ok[: max(0, len(ok) - cut)], ok + junk, junk + ok):
        for count in (len(values), len(values) + 1):
            want = _without_c(lambda f=framed, c=count: record_framing.value_starts(f, tag, c))
            assert record_framing.value_starts(framed, tag, count) == want
            if framed == ok and count == len(values):
                assert (want is None) == (b"" in values)
        for new_tag in (tag, 0x32):
            fast, slow = bytearray(framed), bytearray(framed)
            outcomes = []
            for buf, run in (
                (fast, record_framing.retag),
                (slow, lambda b, t: _without_c(lambda: record_framing.retag(b, t))),
            ):
                try:
                    outcomes.append(run(buf, new_tag))
                except ValueError:
                    outcomes.append("refused")
                    assert buf == bytearray(framed)  # unchanged when refused
            assert outcomes[0] == outcomes[1] and fast == slow


def _without_c(run):  # type: ignore[no-untyped-def]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(record_framing, "native", lambda: None)
        return run()
