"""The services suite's rows are medians over runs (bench.service_bench.Medians)."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import pytest

from bench.__main__ import _ratio, _spread
from bench.harness import process_write_bytes
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


def test_server_cost_per_message_is_a_median_of_each_runs_own() -> None:
    runs = [
        LoadResult(1000, 1.0, [1.0], server_cpu_s=0.010, server_write_bytes=1_200_000),
        LoadResult(2000, 1.0, [1.0], server_cpu_s=0.036, server_write_bytes=600_000),
        LoadResult(1000, 1.0, [1.0], server_cpu_s=0.020, server_write_bytes=300_000),
    ]
    m = Medians.of(runs)
    assert m.server_us_per_msg == pytest.approx(18.0)  # 10, 18 and 20 µs a message (not 66 ms / 4,000)
    assert m.server_write_bytes_per_msg == pytest.approx(300.0)  # 1,200, 300 and 300 bytes
    assert math.isnan(Medians.of([LoadResult(10, 1.0, [1.0])]).server_write_bytes_per_msg)  # not measured


def test_write_bytes_count_what_this_process_dirtied_and_nothing_for_a_gone_pid() -> None:
    # /var/tmp, not pytest's tmp_path: /tmp may be a tmpfs, whose pages never go to storage
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        before = process_write_bytes(os.getpid())
        with open(Path(d) / "f", "wb") as f:
            f.write(os.urandom(1 << 20))  # into the page cache: counted as the pages are dirtied
        assert process_write_bytes(os.getpid()) - before >= 1 << 20
    assert process_write_bytes(2**22 + 1) == 0  # above pid_max's default: never a live pid


def test_round_ratios_say_not_measured_rather_than_divide_by_nothing() -> None:
    assert _spread([_ratio(1.2, 1.0), _ratio(0.9, 1.0), _ratio(1.0, 1.0)]) == "1.00x (0.90-1.20)"
    assert math.isnan(_ratio(300.0, 0.0))  # a data folder on tmpfs dirties nothing for storage
    assert math.isnan(_ratio(float("nan"), 1.0))
    assert _spread([1.0, _ratio(300.0, 0.0)]) == "not measured"
