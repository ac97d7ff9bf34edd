"""MappedFile: naming, creation through a temp file, watermarks, flush, truncation, pool buffers."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pytest

from libstore.errors import OffsetOutOfRangeError, StoreIOError
from libstore.mapped_file import MappedFile, file_name_to_offset, offset_to_file_name
from libstore.transient_store_pool import TransientStorePool

SIZE = 64 * 1024


def test_names_are_20_digit_offsets():
    assert offset_to_file_name(0) == "00000000000000000000"
    assert offset_to_file_name(1073741824) == "00000000001073741824"
    assert file_name_to_offset("00000000001073741824") == 1073741824
    with pytest.raises(ValueError):
        file_name_to_offset("123")


def test_create_allocates_the_full_size_and_leaves_no_temp_file(tmp_path: Path):
    mf = MappedFile.create(tmp_path / offset_to_file_name(SIZE), SIZE, preload=True)
    try:
        assert os.path.getsize(mf.path) == SIZE
        assert os.stat(mf.path).st_blocks * 512 >= SIZE  # blocks allocated, not a sparse file
        assert not list(tmp_path.glob("*.tmp"))
        assert mf.file_from_offset == SIZE and mf.wrote_position == 0 and mf.remaining == SIZE
    finally:
        mf.close()


def test_append_read_and_watermarks(tmp_path: Path):
    mf = MappedFile.create(tmp_path / offset_to_file_name(0), SIZE)
    try:
        assert mf.append_records(b"ABCDEFGH") == 0
        assert mf.append_raw(b"1234") == 8
        assert mf.read(0, 12) == b"ABCDEFGH1234"
        assert (mf.wrote_position, mf.committed_position, mf.flushed_position) == (12, 0, 0)
        assert mf.readable_position == 12  # no write buffer: readers see wrote bytes
        with pytest.raises(OffsetOutOfRangeError):
            mf.read(10, 4)
        assert mf.flush(4) == 0  # fewer than 4 dirty pages: no flush yet
        assert mf.flush(0) == 12
        mf.fill_to_end(b"\x00" * 8)
        assert mf.is_full() and mf.remaining == 0
        assert mf.flush(4) == SIZE  # a full file always flushes
    finally:
        mf.close()


def test_data_reaches_the_file_and_survives_reopen(tmp_path: Path):
    path = tmp_path / offset_to_file_name(0)
    mf = MappedFile.create(path, SIZE)
    mf.append_records(b"x" * 5000)
    mf.flush(0)
    mf.close()
    with open(path, "rb") as fh:
        assert fh.read(5001) == b"x" * 5000 + b"\x00"
    again = MappedFile.open(path, SIZE)
    try:
        assert again.wrote_position == SIZE  # loaded files start full until recovery
    finally:
        again.close()


def test_appends_through_the_mapping_or_with_pwrite_store_the_size_last_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """append_records writes with pwrite, or with through_mapping stores through the mapping (no
    pwrite); either way the first 4 bytes (the first record's TOTALSIZE) are written last, the
    bytes reach the file, and the durability observer hears of them."""
    from libstore import durability_hooks
    from libstore import mapped_file as module

    writes: list[tuple[int, int]] = []
    real = module.os.pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        writes.append((offset, len(data)))
        return real(fd, data, offset)

    monkeypatch.setattr(module.os, "pwrite", pwrite)

    class Seen:
        def __init__(self) -> None:
            self.ranges: list[tuple[int, int]] = []

        def written(self, path: Path, start: int, end: int) -> None:
            self.ranges.append((start, end))

        def __getattr__(self, name: str) -> object:  # the other hooks: nothing to note
            return lambda *args: None

    seen = Seen()
    monkeypatch.setattr(durability_hooks, "observer", seen)
    path = tmp_path / offset_to_file_name(0)
    mf = MappedFile.create(path, SIZE)
    mapped, written = os.urandom(5000), os.urandom(7000)
    try:
        assert mf.append_records(mapped, through_mapping=True) == 0
        assert writes == []
        assert mf.append_records(written) == len(mapped)
        assert writes == [(len(mapped) + 4, len(written) - 4), (len(mapped), 4)]  # size last
        assert seen.ranges == [(0, len(mapped)), (len(mapped), len(mapped) + len(written))]
        assert mf.read(0, len(mapped) + len(written)) == mapped + written
        mf.flush(0)
    finally:
        mf.close()
    with open(path, "rb") as fh:
        assert fh.read(len(mapped) + len(written)) == mapped + written


def test_a_sparse_segment_is_never_stored_through_its_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the filesystem cannot allocate a segment's blocks (posix_fallocate unsupported: the
    file is left sparse), or a segment found at start is sparse, an append asked to go through
    the mapping is written with pwrite: a full disk then fails the write (ENOSPC, a clean stop)
    instead of killing the process with SIGBUS."""
    import errno

    from libstore import mapped_file as module

    writes: list[int] = []
    real_pwrite = module.os.pwrite
    monkeypatch.setattr(
        module.os,
        "pwrite",
        lambda fd, data, offset: (writes.append(offset), real_pwrite(fd, data, offset))[1],
    )
    allocated = MappedFile.create(tmp_path / offset_to_file_name(0), SIZE)
    assert allocated.blocks_allocated
    allocated.append_records(b"A" * 100, through_mapping=True)
    assert writes == []
    allocated.close()
    reopened = MappedFile.open(tmp_path / offset_to_file_name(0), SIZE)
    assert reopened.blocks_allocated
    reopened.close()

    def unsupported(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(module._os.os, "posix_fallocate", unsupported)
    sparse = MappedFile.create(tmp_path / offset_to_file_name(SIZE), SIZE)
    assert not sparse.blocks_allocated
    sparse.append_records(b"B" * 100, through_mapping=True)
    assert writes == [4, 0]  # the record after its size, then the size: pwrite
    assert sparse.read(0, 100) == b"B" * 100
    sparse.close()
    found = MappedFile.open(tmp_path / offset_to_file_name(SIZE), SIZE)
    assert not found.blocks_allocated  # st_blocks: the holes are still there
    found.close()


def test_open_with_wrong_size_fails(tmp_path: Path):
    path = tmp_path / offset_to_file_name(0)
    path.write_bytes(b"short")
    with pytest.raises(StoreIOError, match="expected"):
        MappedFile.open(path, SIZE)


def test_truncate_zeroes_the_tail_and_keeps_blocks(tmp_path: Path):
    mf = MappedFile.create(tmp_path / offset_to_file_name(0), SIZE)
    try:
        mf.append_records(b"\xab" * (SIZE - 100))
        mf.truncate_to(5000)
        assert mf.wrote_position == mf.flushed_position == 5000
        assert mf.buffer[:5000] == b"\xab" * 5000
        assert not any(mf.buffer[5000:SIZE])
        assert os.stat(mf.path).st_blocks * 512 >= SIZE
    finally:
        mf.close()


def test_transient_pool_buffer_hides_uncommitted_bytes(tmp_path: Path):
    pool = TransientStorePool(2, SIZE)
    pool.init()
    mf = MappedFile.create(tmp_path / offset_to_file_name(0), SIZE, transient_store_pool=pool)
    try:
        assert mf.has_write_buffer and pool.available_buffer_nums == 1
        mf.append_records(b"y" * 100)
        assert mf.readable_position == 0 and mf.buffer[:100] == bytes(100)
        assert mf.commit(4) == 0  # below least pages
        assert mf.commit(0) == 100
        assert mf.buffer[:100] == b"y" * 100 and mf.readable_position == 100
        assert mf.flush(0) == 100
        mf.append_records(b"z" * (SIZE - 100))
        mf.commit(0)
        assert not mf.has_write_buffer and pool.available_buffer_nums == 2  # returned when full
    finally:
        mf.close()
        pool.destroy()


def test_a_reused_pool_buffer_leaves_zeros_after_the_end_blank(tmp_path: Path):
    """A pooled buffer goes from segment to segment; what an earlier segment wrote past this
    segment's END blank must not be committed into this file."""
    pool = TransientStorePool(1, SIZE)
    pool.init()
    first = MappedFile.create(tmp_path / offset_to_file_name(0), SIZE, transient_store_pool=pool)
    first.append_records(b"o" * (SIZE - 8))  # old records all over the buffer
    first.fill_to_end(bytes(8))
    first.commit(0)
    second = MappedFile.create(tmp_path / offset_to_file_name(SIZE), SIZE, transient_store_pool=pool)
    try:
        assert second.has_write_buffer  # the same buffer, back in the pool
        second.append_records(b"n" * 1000)
        second.fill_to_end(b"B" * 8)  # the next record did not fit: blank at 1000
        second.commit(0)
        on_disk = (tmp_path / offset_to_file_name(SIZE)).read_bytes()
        assert on_disk[:1008] == b"n" * 1000 + b"B" * 8
        assert on_disk[1008:] == bytes(SIZE - 1008)
    finally:
        first.close()
        second.close()
        pool.destroy()


def _resident_pages(path: Path) -> int:
    """How many of the file's pages sit in the page cache (mincore(2) over a private mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    vec = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as view:
        first = ctypes.c_char.from_buffer(view)
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(first)), ctypes.c_size_t(size), vec)
        del first  # the mapping cannot close while a ctypes object holds it
        if rc != 0:
            raise OSError(ctypes.get_errno(), "mincore")
    return sum(b & 1 for b in vec)


def test_warm_up_writes_every_page_syncing_every_n_pages_and_mlock_is_best_effort(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RocketMQ's warm-up: zeros through the page cache over the whole file, an fdatasync after
    every ``warm_flush_pages`` pages; the pages are then resident. Without it: no write at all."""
    import libstore.mapped_file as module

    calls: list[tuple[str, int, int]] = []
    real_zeros, real_sync = module._os.write_zeros, os.fdatasync
    monkeypatch.setattr(
        module._os, "write_zeros", lambda fd, at, n: (calls.append(("zeros", at, n)), real_zeros(fd, at, n))
    )
    monkeypatch.setattr(module.os, "fdatasync", lambda fd: (calls.append(("sync", 0, 0)), real_sync(fd)))
    cold = MappedFile.create(tmp_path / offset_to_file_name(0), SIZE)
    cold.close()
    assert calls == []
    step = 4 * mmap.PAGESIZE
    mf = MappedFile.create(tmp_path / offset_to_file_name(SIZE), SIZE, warm=True, warm_flush_pages=4)
    try:
        assert [c for c in calls if c[0] == "zeros"] == [("zeros", at, step) for at in range(0, SIZE, step)]
        assert [c[0] for c in calls][: 2 * SIZE // step] == ["zeros", "sync"] * (SIZE // step)
        assert _resident_pages(mf.path) == SIZE // mmap.PAGESIZE
        assert not any(mf.buffer[:SIZE])
        mf.munlock()
    finally:
        mf.close()


def test_destroy_deletes_the_file(tmp_path: Path):
    mf = MappedFile.create(tmp_path / offset_to_file_name(0), SIZE)
    mf.destroy()
    assert not mf.path.exists() and mf.closed


def test_create_refuses_to_replace_an_existing_segment(tmp_path: Path) -> None:
    path = tmp_path / offset_to_file_name(0)
    mf = MappedFile.create(path, 4096)
    mf.append_records(b"kept" * 16)
    mf.flush(0)
    with pytest.raises(StoreIOError, match="exists already"):
        MappedFile.create(path, 4096)
    assert path.read_bytes()[:64] == b"kept" * 16 and not path.with_name(path.name + ".tmp").exists()
    mf.close()
