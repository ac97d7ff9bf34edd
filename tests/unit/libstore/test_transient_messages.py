"""TransientMessageStore (libstore.transient_messages): records held in memory by key, paged
out oldest first to scratch files past the high-water mark, refused with SYSTEM_BUSY when
neither has room, released in key order with their scratch files, gone with a restart."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libstore.errors import InvalidArgumentError, SystemBusyError
from libstore.transient_messages import TransientMessageStore


def _record(key: int, size: int = 100) -> bytes:
    return (key.to_bytes(8, "big") * (size // 8 + 1))[:size]


def _store(tmp_path: Path, **kw: int) -> TransientMessageStore:
    kw.setdefault("scratch_max_bytes", 10_000)
    kw.setdefault("scratch_segment_bytes", 300)
    max_bytes = kw.pop("max_bytes", 1000)
    return TransientMessageStore(tmp_path / "scratch", max_bytes, **kw)  # type: ignore[arg-type]


def test_records_are_read_back_by_key_and_unknown_keys_read_as_removed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put_many([10, 250], [_record(10), _record(250, 37)])
    assert store.get(10) == _record(10)
    assert store.get_many([250, 11, 10, 9999]) == [_record(250, 37), None, _record(10), None]
    assert len(store) == 2 and store.memory_bytes == 137
    with pytest.raises(InvalidArgumentError):
        store.put(250, b"again")  # keys only grow: a stub's CommitLog offset
    with pytest.raises(InvalidArgumentError):
        store.put_many([300, 299], [b"a", b"b"])
    assert len(store) == 2, "a refused batch holds nothing"


def test_past_the_high_water_mark_the_oldest_are_paged_out_and_read_back(tmp_path: Path) -> None:
    store = _store(tmp_path)  # 1000 bytes: page out past 750, down to 500
    for key in range(8):
        store.put(key * 1000, _record(key))
    assert store.memory_bytes <= 500, store.memory_bytes
    assert store.paged_out == 3 and store.scratch_bytes == 300
    assert [p.name for p in sorted((tmp_path / "scratch").iterdir())] == ["00000000.scratch"]
    assert store.get_many(k * 1000 for k in range(8)) == [_record(k) for k in range(8)]


def test_with_no_room_left_a_put_is_refused_with_system_busy_and_holds_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path, scratch_max_bytes=300)
    key = 0
    with pytest.raises(SystemBusyError) as refused:
        while True:
            store.put(key, _record(key))
            key += 1
    assert refused.value.retry_after_ms > 0
    assert store.refused == 1 and len(store) == key
    assert store.memory_bytes + 100 > store.max_bytes and store.scratch_bytes <= 300
    assert store.get(key) is None
    assert store.get_many(range(key)) == [_record(k) for k in range(key)]
    store.release_below(key)  # the CommitLog's retention deleted their stubs' segment
    assert len(store) == 0 and store.memory_bytes == 0 and store.scratch_bytes == 0
    store.put(key + 1, _record(1))  # room again


def test_release_and_truncation_free_memory_and_delete_scratch_files(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for key in range(30):
        store.put(key, _record(key, 50))
    assert store.paged_out > 0
    files_before = set((tmp_path / "scratch").iterdir())
    assert len(files_before) >= 2
    assert store.release_below(7) == 7
    assert store.get_many(range(5, 9)) == [None, None, _record(7, 50), _record(8, 50)]
    assert len(set((tmp_path / "scratch").iterdir())) < len(files_before), "an emptied segment stays"
    assert store.truncate_from(25) == 5
    assert store.get_many([24, 25, 29]) == [_record(24, 50), None, None]
    store.put(25, b"after the cut")  # the key space continues where the log does
    assert store.get(25) == b"after the cut"
    store.close()
    assert list((tmp_path / "scratch").iterdir()) == []
    assert len(store) == 0 and store.memory_bytes == 0 and store.scratch_bytes == 0


def test_a_new_store_deletes_what_an_earlier_run_paged_out(tmp_path: Path) -> None:
    first = _store(tmp_path)
    for key in range(10):
        first.put(key, _record(key))
    assert list((tmp_path / "scratch").iterdir())
    second = _store(tmp_path)  # the process restarted: nothing transient survives it
    assert list((tmp_path / "scratch").iterdir()) == []
    assert second.get_many(range(10)) == [None] * 10


def test_a_failed_page_out_keeps_the_records_in_memory_and_the_counts_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scratch disk writes short, then fails (ENOSPC), in the middle of a page-out: what was
    wholly written counts as paged out, the rest stays in memory, a put that still fits is held
    and one that does not is refused; once the disk is back, paging goes on."""
    import errno

    import libstore.transient_messages as module

    store = _store(tmp_path)
    real_pwritev = module.os.pwritev
    writes = 0

    def failing_pwritev(fd: int, buffers: list[bytes], offset: int) -> int:
        nonlocal writes
        writes += 1
        if writes >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwritev(fd, buffers[:1], offset)  # a short write: the first record only

    monkeypatch.setattr(module.os, "pwritev", failing_pwritev)
    for key in range(8):  # the eighth crosses the high-water mark: one record gets out
        store.put(key, _record(key))
    assert store.paged_out == 1 and store.memory_bytes == 700 and store.scratch_bytes == 100
    store.put_many([8, 9], [_record(8), _record(9)])  # 900 + 100: still within 1000
    assert store.memory_bytes == 900
    with pytest.raises(SystemBusyError):
        store.put(10, _record(10, 200))
    assert store.get_many(range(11)) == [_record(k) for k in range(10)] + [None]
    monkeypatch.setattr(module.os, "pwritev", real_pwritev)
    store.put(10, _record(10))
    assert store.memory_bytes <= 500 and store.get_many(range(11)) == [_record(k) for k in range(11)]


def test_a_batch_fits_once_everything_older_is_paged_out(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put(1, _record(1, 400))
    store.put(2, _record(2, 650))  # 1050 > 1000: the 400 go to scratch first
    assert store.memory_bytes == 650 and store.scratch_bytes == 400
    assert store.get_many([1, 2]) == [_record(1, 400), _record(2, 650)]


def test_a_release_keeps_the_records_it_names_in_memory_and_in_scratch(tmp_path: Path) -> None:
    """Records named to keep (a queue nobody consumed: dead-letter copies) stay, wherever they
    are; the rest below the point go. A kept in-memory chunk is cut down to what it keeps; a
    kept paged-out one holds its scratch segment until its last record goes."""
    store = _store(tmp_path, scratch_segment_bytes=1000)
    for key in range(0, 30, 3):  # chunks of three records of 50 bytes
        store.put_many([key, key + 1, key + 2], [_record(k, 50) for k in (key, key + 1, key + 2)])
    assert store.paged_out > 0
    paged = store.paged_out
    assert store.release_below(27, keep=[1, 25]) == 25
    assert len(store) == 5 and store.get_many([0, 1, 2, 25, 26, 27, 28, 29]) == [
        None, _record(1, 50), None, _record(25, 50), None, _record(27, 50), _record(28, 50), _record(29, 50)
    ]  # fmt: skip
    assert store.paged_out == 1 + sum(1 for k in (25, 27, 28, 29) if k < paged)
    assert store.memory_bytes == 50 * (5 - store.paged_out), "memory counts only what is held"
    assert list((tmp_path / "scratch").iterdir()), "record 1 holds its segment"
    assert store.release_below(27, keep=[25]) == 1  # consumed since: named no more
    assert store.release_below(30) == 4
    assert len(store) == 0 and store.memory_bytes == 0 and store.scratch_bytes == 0
    assert list((tmp_path / "scratch").iterdir()) == []


def test_dead_chunks_behind_a_kept_record_are_compacted_away(tmp_path: Path) -> None:
    store = _store(tmp_path, max_bytes=10**6)
    store.put(0, b"dead letter")
    for key in range(1, 5001):
        store.put(key, b"x")
        if key % 100 == 0:
            store.release_below(key, keep=[0])
    assert len(store) == 2 and store.get_many([0, 1, 4999, 5000]) == [b"dead letter", None, None, b"x"]
    assert len(store._chunks) <= 2 * 1024 + 2, "dead chunks piled up behind the kept one"


def test_keys_never_go_back_except_after_a_cut(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put_many([10, 20], [b"a", b"b"])
    store.release_below(100)
    with pytest.raises(InvalidArgumentError):
        store.put(15, b"reused")  # released is not forgotten: a CommitLog offset comes once
    store.truncate_from(15)  # the log was cut at 15: its offsets are written again
    store.put(15, b"rewritten")
    assert store.get(15) == b"rewritten"


def test_bounds_that_cannot_work_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError):
        TransientMessageStore(tmp_path, 0, scratch_max_bytes=1)
    with pytest.raises(InvalidArgumentError):
        TransientMessageStore(tmp_path, 100, scratch_max_bytes=1, high_water=0.5, low_water=0.6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.integers(1, 5), st.integers(1, 180)),
            st.tuples(st.just("release"), st.integers(0, 40), st.integers(0, 3)),
            st.tuples(st.just("truncate"), st.integers(0, 40), st.just(0)),
        ),
        max_size=60,
    )
)
def test_the_store_reads_back_what_a_plain_dict_would(tmp_path_factory: pytest.TempPathFactory, ops) -> None:  # type: ignore[no-untyped-def]
    """Random puts (batches of 1..5 records), releases (some keeping every third key below the
    point) and truncations against a dict: every held record reads back byte for byte, whether
    in memory or paged out; refused batches leave nothing; memory never passes its bound."""
    root = tmp_path_factory.mktemp("model")
    store = TransientMessageStore(root / "scratch", 600, scratch_max_bytes=1500, scratch_segment_bytes=256)
    model: dict[int, bytes] = {}
    next_key = 0
    for op, a, b in ops:
        if op == "put":
            batch = []
            for _ in range(a):
                next_key += 1
                batch.append((next_key, _record(next_key, b)))
            try:
                store.put_many([k for k, _ in batch], [r for _, r in batch])
                model.update(batch)
            except SystemBusyError:
                pass
        elif op == "release":
            keep = {k for k in model if k % 3 == b} if b < 3 else set()
            store.release_below(a, keep | {a + 1, 10**9})  # keys at or past the point change nothing
            model = {k: v for k, v in model.items() if k >= a or k in keep}
        else:
            store.truncate_from(max(a, 1))
            model = {k: v for k, v in model.items() if k < max(a, 1)}
            next_key = max([next_key, *model]) if model else next_key
        assert store.memory_bytes <= store.max_bytes
        assert store.memory_bytes <= sum(map(len, model.values())), "memory counts only held records"
        assert len(store) == len(model)
        keys = range(0, next_key + 2)
        assert store.get_many(keys) == [model.get(k) for k in keys]
    store.close()


def test_a_background_pager_pages_out_to_the_low_water_mark_while_puts_go_on(tmp_path: Path) -> None:
    """With ``background``, a put past the high-water mark only wakes the pager; memory still
    never passes ``max_bytes``, and the pager brings it down to the low-water mark."""
    store = TransientMessageStore(tmp_path / "scratch", 1000, scratch_max_bytes=10_000, background=True)
    try:
        for key in range(30):
            store.put(key, _record(key))
            assert store.memory_bytes <= 1000
        deadline = time.monotonic() + 10
        while store.memory_bytes > 500 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.memory_bytes <= 500 and store.paged_out >= 25
        assert store.get_many(range(30)) == [_record(k) for k in range(30)]
    finally:
        store.close()
    assert not list((tmp_path / "scratch").iterdir())
