"""MappedFileQueue: loading rules (spec §0), lookup by offset, rolling, truncation, watermarks."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from libstore.allocate_mapped_file import AllocateMappedFileService
from libstore.errors import StoreIOError
from libstore.mapped_file import MappedFile, offset_to_file_name
from libstore.mapped_file_queue import MappedFileQueue

SIZE = 64 * 1024


def _fill(q: MappedFileQueue, files: int) -> None:
    for _ in range(files):
        mf = q.get_last_mapped_file_or_create(0)
        assert mf is not None
        mf.append_records(b"r" * (SIZE - 8))
        mf.fill_to_end(b"\x00" * 8)


def test_roll_lookup_and_offsets(tmp_path: Path):
    q = MappedFileQueue(tmp_path, SIZE)
    _fill(q, 3)
    assert [mf.file_name for mf in q.mapped_files] == [offset_to_file_name(i * SIZE) for i in range(3)]
    assert q.mapped_files[0].first_create_in_queue and not q.mapped_files[1].first_create_in_queue
    mf = q.get_last_mapped_file_or_create(0)
    assert mf is not None and mf.file_from_offset == 3 * SIZE
    assert q.find_mapped_file_by_offset(SIZE + 5) is q.mapped_files[1]
    assert q.find_mapped_file_by_offset(10 * SIZE) is None
    assert q.find_mapped_file_by_offset(10 * SIZE, return_first_on_not_found=True) is q.mapped_files[0]
    assert q.get_min_offset() == 0 and q.get_max_offset() == 3 * SIZE
    assert q.roll_next_file(SIZE + 5) == 2 * SIZE
    q.shutdown()


def test_flush_moves_one_segment_at_a_time_and_flush_to_crosses(tmp_path: Path):
    q = MappedFileQueue(tmp_path, SIZE)
    _fill(q, 2)
    last = q.get_last_mapped_file_or_create(0)
    assert last is not None
    last.append_records(b"t" * 100)
    assert q.flush(0) and q.flushed_where == SIZE
    assert q.flush_to(q.get_max_offset()) == 2 * SIZE + 100
    assert not q.flush(0)  # nothing left
    q.shutdown()


def test_load_cleans_crash_leftovers_and_checks_sizes(tmp_path: Path):
    q = MappedFileQueue(tmp_path, SIZE)
    _fill(q, 2)
    q.shutdown()
    (tmp_path / (offset_to_file_name(2 * SIZE) + ".tmp")).write_bytes(b"half")
    (tmp_path / offset_to_file_name(2 * SIZE)).write_bytes(b"")  # empty last file
    (tmp_path / "not-a-segment.txt").write_text("ignored")
    q2 = MappedFileQueue(tmp_path, SIZE)
    q2.load()
    assert [mf.file_from_offset for mf in q2.mapped_files] == [0, SIZE]
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / offset_to_file_name(2 * SIZE)).exists()
    q2.shutdown()
    with pytest.raises(StoreIOError, match="another mapped file size"):
        MappedFileQueue(tmp_path, SIZE * 2).load()


def test_load_refuses_a_gap_between_segments(tmp_path: Path):
    q = MappedFileQueue(tmp_path, SIZE)
    _fill(q, 3)
    q.shutdown()
    (tmp_path / offset_to_file_name(SIZE)).unlink()
    with pytest.raises(StoreIOError, match="gap"):
        MappedFileQueue(tmp_path, SIZE).load()


def test_load_deletes_empty_segments_after_a_gap(tmp_path: Path):
    """Segments created ahead and never written, left after a gap by a cut before a crash, are
    not data: the load deletes them instead of refusing the store."""
    q = MappedFileQueue(tmp_path, SIZE)
    _fill(q, 2)
    q.shutdown()
    for i in (5, 6):
        (tmp_path / offset_to_file_name(i * SIZE)).write_bytes(bytes(SIZE))
    again = MappedFileQueue(tmp_path, SIZE)
    again.load()
    assert [mf.file_from_offset for mf in again.mapped_files] == [0, SIZE]
    assert sorted(p.name for p in tmp_path.iterdir()) == [offset_to_file_name(i * SIZE) for i in (0, 1)]
    again.shutdown()


def test_truncate_dirty_files_deletes_later_segments(tmp_path: Path):
    q = MappedFileQueue(tmp_path, SIZE)
    _fill(q, 3)
    q.flush_to(q.get_max_offset())
    q.truncate_dirty_files(SIZE + 1000)
    assert [mf.file_from_offset for mf in q.mapped_files] == [0, SIZE]
    assert q.mapped_files[1].wrote_position == 1000 and q.get_max_offset() == SIZE + 1000
    assert q.flushed_where == SIZE + 1000
    assert not (tmp_path / offset_to_file_name(2 * SIZE)).exists()
    q.shutdown()


def test_allocator_pre_creates_the_next_segment_and_cleans_up(tmp_path: Path):
    alloc = AllocateMappedFileService()
    alloc.start()
    q = MappedFileQueue(tmp_path, SIZE, alloc)
    mf = q.get_last_mapped_file_or_create(0)
    assert mf is not None and mf.file_from_offset == 0
    nxt = tmp_path / offset_to_file_name(SIZE)
    for _ in range(500):
        if nxt.exists():
            break
        import time

        time.sleep(0.01)
    assert nxt.exists(), "the next segment should be pre-allocated"
    mf.append_records(b"a" * (SIZE - 8))
    mf.fill_to_end(b"\x00" * 8)
    second = q.get_last_mapped_file_or_create(0)
    assert second is not None and second.file_from_offset == SIZE
    alloc.shutdown()
    assert not (tmp_path / offset_to_file_name(2 * SIZE)).exists(), "unused pre-allocated segment deleted"
    q.shutdown()


def test_a_segment_the_writer_adds_while_the_head_is_deleted_stays_in_the_list(tmp_path: Path):
    """The cleaner (head) and the writer (tail) both replace the list: a segment the writer adds
    while the cleaner decides about the head must survive the cleaner's replacement, or the
    writer would create it again at the same offset and overwrite what it appended there."""
    q = MappedFileQueue(tmp_path, SIZE)
    _fill(q, 3)
    q.flush_to(3 * SIZE)
    added: list[MappedFile] = []

    def writer() -> None:
        mf = q.get_last_mapped_file_or_create(0)
        assert mf is not None
        mf.append_records(b"w" * 100)
        added.append(mf)

    def doomed(mf: MappedFile) -> str:
        if not added:  # the writer rolls between the cleaner's look at the head and its deletion
            t = threading.Thread(target=writer)
            t.start()
            t.join()
        return "expired"

    deleted = q.delete_head_files(doomed, batch_max=1)
    assert [name for name, _ in deleted] == [offset_to_file_name(0)]
    assert [mf.file_name for mf in q.mapped_files] == [offset_to_file_name(i * SIZE) for i in (1, 2, 3)]
    assert q.get_last_mapped_file_or_create(0) is added[0]  # appended to again, not created anew
    assert q.get_max_wrote_position() == 3 * SIZE + 100
    q.shutdown()
