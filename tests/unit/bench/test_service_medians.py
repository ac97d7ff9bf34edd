"""The services suite's rows are medians over runs (bench.service_bench.Medians)."""

from __future__ import annotations

import pytest

from bench.service_bench import LoadResult, Medians


def test_medians_of_three_runs() -> None:
    runs = [
        LoadResult(1000, 1.0, [1.0] * 98 + [50.0, 60.0]),  # 1,000 msgs/s, one slow run's tail
        LoadResult(1000, 0.5, [2.0] * 100),  # 2,000 msgs/s
        LoadResult(1000, 0.25, [3.0] * 98 + [9.0, 9.0], pushed_back=4),  # 4,000 msgs/s
    ]
    m = Medians.of(runs)
    assert (m.runs, m.msgs_per_s, m.p50, m.pushed_back) == (3, 2000.0, 2.0, 4)
    assert m.p99 == 9.0  # p99s are 50, 2 and 9: their median, not the worst


def test_medians_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError):
        Medians.of([])
