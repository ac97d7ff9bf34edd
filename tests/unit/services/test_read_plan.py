"""Cutting a remote read into calls the Read RPC's bounds accept."""

from __future__ import annotations

from services.commitlog.read_plan import plan_reads


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
