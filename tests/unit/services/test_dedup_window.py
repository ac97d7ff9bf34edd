"""The retry de-duplication window across restarts (services.commitlog.dedup_window): after a
crash it is rebuilt from the newest segments only, as far as it holds keys; after a clean
shutdown it is loaded as saved, with no scan, when the log is still where it was saved."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from libstore import CommitLog, Message
from services.commitlog.dedup_window import DedupWindow, persist_window, restore_window, window_path
from tests.conftest import SEGMENT

RECORD_BODY = 2000  # about 125 records per 256 KiB segment


def _fill(log: CommitLog, n: int) -> list[str]:
    keys = [f"K{i:06d}" for i in range(n)]
    for start in range(0, n, 100):
        batch = [
            Message("T", b"x" * RECORD_BODY, 0, properties={"UNIQ_KEY": k}) for k in keys[start : start + 100]
        ]
        assert log.put_messages(batch).all_ok
    return keys


def test_a_rebuild_reads_the_newest_segments_only_as_far_as_the_window_holds(
    open_log: Callable[..., CommitLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log()
    keys = _fill(log, 3000)  # ~24 segments
    assert len(log.queue.mapped_files) > 10  # type: ignore[union-attr]
    scanned = 0
    real_scan = log.scan_records

    def counting(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        nonlocal scanned
        for req in real_scan(*args, **kwargs):  # type: ignore[arg-type]
            scanned += 1
            yield req

    monkeypatch.setattr(log, "scan_records", counting)
    window = DedupWindow(capacity=200)
    assert window.prefill(log) == 200
    assert all(window.get("T", k) is not None for k in keys[-200:])  # the newest 200
    assert window.get("T", keys[-201]) is None
    per_segment = SEGMENT // (RECORD_BODY + 100)
    assert scanned <= 200 + 2 * per_segment  # not the 3,000 a scan of the whole window's age reads


def test_a_clean_shutdown_keeps_the_window_for_the_next_start(open_log: Callable[..., CommitLog]) -> None:
    log = open_log()
    window = DedupWindow(capacity=1000)
    keys = _fill(log, 300)
    assert window.prefill(log) == 300
    assert persist_window(window, log) == 300
    path = window_path(log.root)
    assert path.exists()
    again = DedupWindow(capacity=1000)
    assert restore_window(again, log) == (300, "saved")
    assert again.get("T", keys[0]) == window.get("T", keys[0])
    assert not path.exists()  # taken once: a later crash never brings it back


def test_a_saved_window_that_no_longer_describes_the_log_is_not_trusted(
    open_log: Callable[..., CommitLog], tmp_path: Path
) -> None:
    log = open_log()
    window = DedupWindow(capacity=1000)
    _fill(log, 100)
    window.prefill(log)
    persist_window(window, log)
    _fill(log, 10)  # the log moved on after the save (say, a crash later)
    fresh = DedupWindow(capacity=1000)
    assert restore_window(fresh, log) == (110, "scanned")
    path = window_path(log.root)
    path.write_bytes(b"MQDW1garbage")
    assert not DedupWindow().load(path, "id", 1, 0) and not path.exists()
