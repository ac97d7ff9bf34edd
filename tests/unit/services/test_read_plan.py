"""Cutting a remote read into calls the Read RPC's bounds accept."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from libstore.record_framing import frame_records
from services._common.convert import ranges_to_columns, records_or_none
from services._common.wire import READ_RECORDS_TAG
from services.commitlog.read_plan import plan_reads
from services.proto import commitlog_pb


def test_reads_are_cut_by_range_count_and_bytes_in_order() -> None:
    ranges = [(i * 100, 100) for i in range(10)]
    chunks = plan_reads(ranges, max_ranges=4, max_bytes=10_000, record_size=1000)
    assert [len(c) for c in chunks] == [4, 4, 2]
    assert [r for c in chunks for r in c] == ranges
    by_bytes = plan_reads(ranges, max_ranges=100, max_bytes=250, record_size=1000)
    assert [len(c) for c in by_bytes] == [2, 2, 2, 2, 2]


def test_whole_record_ranges_count_as_the_largest_record() -> None:
    ranges = [(0, 0), (10, 0), (20, 0), (30, 5000)]
    chunks = plan_reads(ranges, max_ranges=100, max_bytes=2000, record_size=1000)
    assert [list(c) for c in chunks] == [[(0, 0), (10, 0)], [(20, 0)], [(30, 5000)]]
    assert plan_reads([], max_ranges=1, max_bytes=1, record_size=1) == []


def _plan_one_by_one(
    ranges: list[tuple[int, int]], max_ranges: int, max_bytes: int, record_size: int
) -> list[list[tuple[int, int]]]:
    """The rule, range by range: a chunk ends before the range that would break a bound."""
    chunks: list[list[tuple[int, int]]] = []
    current: list[tuple[int, int]] = []
    total = 0
    for offset, size in ranges:
        cost = size if size > 0 else record_size
        if current and (len(current) >= max_ranges or total + cost > max_bytes):
            chunks.append(current)
            current, total = [], 0
        current.append((offset, size))
        total += cost
    if current:
        chunks.append(current)
    return chunks


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=-1, max_value=3000), max_size=40),
    max_ranges=st.integers(min_value=1, max_value=50),
    max_bytes=st.integers(min_value=1, max_value=40_000),
    record_size=st.integers(min_value=1, max_value=4000),
)
def test_the_one_chunk_shortcut_cuts_as_the_rule_does(
    sizes: list[int], max_ranges: int, max_bytes: int, record_size: int
) -> None:
    ranges = [(i * 4096, size) for i, size in enumerate(sizes)]
    chunks = plan_reads(ranges, max_ranges=max_ranges, max_bytes=max_bytes, record_size=record_size)
    assert [list(c) for c in chunks] == _plan_one_by_one(ranges, max_ranges, max_bytes, record_size)


def test_missing_records_cross_the_wire_as_empty_bytes_and_back() -> None:
    records: list[bytes | None] = [b"a", None, b"bc", None]
    wire = list(commitlog_pb.ReadResponse.FromString(frame_records(records, READ_RECORDS_TAG)).records)
    assert wire == [b"a", b"", b"bc", b""]
    assert records_or_none(wire) == records
    whole = [b"x", b"yz"]
    assert records_or_none(whole) == whole
    assert ranges_to_columns([(1, 10), (5, 0)]) == ([1, 5], [10, 0])
