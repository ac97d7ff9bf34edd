"""The retry de-duplication window across restarts (services.commitlog.dedup_window): the window
last saved (periodically, or at a clean shutdown) is taken and caught up with what came after
it, unless the log lost bytes it points at; without one it is rebuilt from the newest segments
only, as far as it holds keys."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libstore import BrokerRole, CommitLog, Message, MessageConst, StoreConfig
from libstore.record_codec import native
from services.client import OutgoingMessage, Producer
from services.commitlog.dedup_window import (
    DedupWindow,
    Placed,
    persist_window,
    restore_window,
    window_keys,
    window_path,
)
from services.commitlog.local import LocalCommitLog
from tests.conftest import SEGMENT

RECORD_BODY = 2000  # about 125 records per 256 KiB segment


def _fill(log: CommitLog, n: int, prefix: str = "K") -> list[str]:
    keys = [f"{prefix}{i:06d}" for i in range(n)]
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


def test_a_saved_window_is_caught_up_with_what_came_after_it(open_log: Callable[..., CommitLog]) -> None:
    """Saved periodically, then the log moved on (a crash later): the next start takes the saved
    keys and scans only the records appended since."""
    log = open_log()
    window = DedupWindow(capacity=1000)
    first = _fill(log, 100)
    window.prefill(log)
    persist_window(window, log)
    saved_end = log.max_offset
    later = _fill(log, 10, prefix="L")
    fresh = DedupWindow(capacity=1000)
    assert restore_window(fresh, log) == (110, f"saved + {log.max_offset - saved_end} bytes scanned")
    assert fresh.get("T", first[0]) == window.get("T", first[0])
    assert fresh.get("T", later[-1]) is not None and window.get("T", later[-1]) is None
    window_path(log.root).write_bytes(b"MQDW1garbage")
    assert restore_window(DedupWindow(capacity=1000), log) == (110, "scanned")


def test_a_saved_window_is_not_trusted_past_a_cut(open_log: Callable[..., CommitLog]) -> None:
    """The log lost bytes the saved window points at (a SLAVE cut what a returning master wrote):
    the window is rebuilt from the log instead."""
    log = open_log()
    window = DedupWindow(capacity=1000)
    keys = _fill(log, 60)
    window.prefill(log)
    persist_window(window, log)
    cut_at = window.get("T", keys[40])
    assert cut_at is not None
    log.set_broker_role(BrokerRole.SLAVE)
    log.truncate_to(cut_at.phy_offset)
    fresh = DedupWindow(capacity=1000)
    assert fresh.catch_up(window_path(log.root), log) is None
    assert restore_window(fresh, log) == (40, "scanned")
    assert fresh.get("T", keys[40]) is None and fresh.get("T", keys[39]) is not None


def test_a_running_master_saves_its_window_for_a_start_after_a_crash(store_config: StoreConfig) -> None:
    """CommitLogNode saves the window while it runs; a node opened on the same files after a
    crash (nothing shut down cleanly) takes it and scans only the appends that followed."""
    from services.commitlog.dedup_window import SAVE_INTERVAL_S
    from services.embedded import CommitLogNode

    assert SAVE_INTERVAL_S <= 30  # a crash costs at most that much of the log to scan

    async def run() -> tuple[str, int, int]:
        node = await CommitLogNode.open(store_config)
        await node.stop_saving_window()
        messages = [Message("T", b"x" * 100, 0, properties={"UNIQ_KEY": f"K{i}"}) for i in range(50)]
        assert (await node.port.append(messages)).all_ok
        node.start_saving_window(interval_s=0.05)
        path = window_path(node.commit_log.root)
        for _ in range(200):
            if path.exists():
                break
            await asyncio.sleep(0.02)
        await node.stop_saving_window()
        saved_end = node.commit_log.max_offset
        more = [Message("T", b"y" * 100, 0, properties={"UNIQ_KEY": f"L{i}"}) for i in range(5)]
        assert (await node.port.append(more)).all_ok
        end = node.commit_log.max_offset
        await asyncio.to_thread(node.commit_log.abandon)  # a crash: no clean-shutdown save
        reopened = CommitLog.open(store_config)
        try:
            return restore_window(DedupWindow(), reopened), saved_end, end
        finally:
            reopened.shutdown()

    (held, how), saved_end, end = asyncio.run(run())
    assert (held, how) == (55, f"saved + {end - saved_end} bytes scanned")


def test_stopping_the_saves_waits_for_a_write_under_way(
    store_config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A periodic write runs on a thread, which a cancel of the saver does not stop: stopping
    the saves waits for it, so the save at close is never a second writer of the same file."""
    from services import embedded
    from services.embedded import CommitLogNode

    started, release = threading.Event(), threading.Event()
    real = embedded.write_window

    def held_write(*args: object, **kwargs: object) -> int:
        started.set()
        release.wait(30)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(embedded, "write_window", held_write)

    async def run() -> tuple[bool, bool]:
        node = await CommitLogNode.open(store_config)
        await node.stop_saving_window()
        assert (await node.port.append([Message("T", b"x", 0, properties={"UNIQ_KEY": "K"})])).all_ok
        node.start_saving_window(interval_s=0.02)
        assert await asyncio.to_thread(started.wait, 10)
        stopping = asyncio.ensure_future(node.stop_saving_window())
        await asyncio.sleep(0.3)
        waited = not stopping.done()  # the write still holds its file
        release.set()
        await asyncio.wait_for(stopping, 10)
        written = window_path(node.commit_log.root).exists()
        await node.close()
        return waited, written

    waited, written = asyncio.run(run())
    assert waited and written


def test_an_idle_master_does_not_rewrite_its_window(store_config: StoreConfig) -> None:
    """Rounds in which nothing was put write nothing (an idle broker rewrote a full window,
    about 14 MB, every round); the first put after them is saved at the next round."""
    from services.embedded import CommitLogNode

    async def run() -> tuple[int, int, int, bool]:
        node = await CommitLogNode.open(store_config)
        await node.stop_saving_window()
        messages = [Message("T", b"x" * 100, 0, properties={"UNIQ_KEY": f"K{i}"}) for i in range(20)]
        assert (await node.port.append(messages)).all_ok
        path = window_path(node.commit_log.root)
        node.start_saving_window(interval_s=0.02)
        for _ in range(250):
            if path.exists():
                break
            await asyncio.sleep(0.02)
        first = path.stat().st_mtime_ns, path.stat().st_ino
        await asyncio.sleep(0.3)  # about 15 rounds, nothing put
        idle = path.stat().st_mtime_ns, path.stat().st_ino
        assert (await node.port.append([Message("T", b"z", 0, properties={"UNIQ_KEY": "M"})])).all_ok
        for _ in range(250):
            if (path.stat().st_mtime_ns, path.stat().st_ino) != idle:
                break
            await asyncio.sleep(0.02)
        after = path.stat().st_mtime_ns, path.stat().st_ino
        await node.stop_saving_window()
        reopened = DedupWindow()
        scanned = reopened.catch_up(path, node.commit_log)  # 0: the file reaches the log's end
        restored = reopened.get("T", "M") is not None
        await node.close()
        return first == idle, idle != after, scanned, restored

    unchanged, saved_again, scanned, restored = asyncio.run(run())
    assert unchanged and saved_again  # same file through the idle rounds; a new one after the put
    assert scanned == 0 and restored  # ... which holds the put's key


def test_batch_lookups_and_puts_keep_the_newest_keys_within_capacity() -> None:
    window = DedupWindow(capacity=3, ttl_ms=60_000)
    now = time.time_ns() // 1_000_000
    window.put_many(["T", "T", "T"], ["a", None, "b"], [0, 100, 200], [100, 100, 100], [0, 1, 2], now)
    assert len(window) == 2 and window.get_many(["T", "U"], ["a", "a"]) == {0: Placed(0, 100, 0, now)}
    # a re-put key becomes the newest, so capacity drops "b" first, then the oldest new one
    window.put_many(["T", "T", "T"], ["a", "c", "d"], [300, 400, 500], [10, 10, 10], [3, 4, 5], now + 1)
    assert window.snapshot().columns()[0] == ["T#a", "T#c", "T#d"]
    assert window.get("T", "a") == Placed(300, 10, 3, now + 1) and window.get("T", "b") is None
    # only the appended records (the first len(phy_offsets)) go in; expired keys are not hits
    window.put_many(["T", "T"], ["e", "f"], [600], [10, 10], [6, 7], now - 120_000)
    assert window.get_many(["T", "T"], ["e", "f"]) == {} and window.snapshot().columns()[0][-1] == "T#e"
    assert len(window) == 3 and window.get("T", "a") is None  # its slot went to "e"


def test_a_wrapped_window_round_trips_through_its_file(open_log: Callable[..., CommitLog]) -> None:
    """The ring after it wrapped, with a re-put key, keys outside ASCII and expired slots: the
    saved file gives back the same hits; a damaged file is not taken."""
    log = open_log()
    _fill(log, 3)
    gen = log.generation
    assert gen is not None
    now = time.time_ns() // 1_000_000
    window = DedupWindow(capacity=5, ttl_ms=60_000)
    keys = ["k0", "k1", "ключ2", "k3", "k1", "鍵5", "k6"]  # k1 again: its newest slot counts
    for i, key in enumerate(keys):
        window.put("T", key, Placed(i * 100, 100, i, now - 90_000 if i == 3 else now))
    path = window_path(log.root)
    assert window.save(path, gen.log_id, gen.generation, log.max_offset) == 5
    loaded = DedupWindow(capacity=5, ttl_ms=60_000)
    assert loaded.catch_up(path, log) == 0
    for key in ["k1", "ключ2", "鍵5", "k6"]:
        assert loaded.get("T", key) == window.get("T", key) is not None
    assert loaded.get("T", "k1") == Placed(400, 100, 4, now)
    assert loaded.get("T", "k0") is None and loaded.get("T", "k3") is None  # dropped; expired
    assert len(loaded) == 4
    path.write_bytes(path.read_bytes()[:-3])  # the keys cut short
    assert DedupWindow(capacity=5).catch_up(path, log) is None


def test_a_saved_window_catches_up_from_the_first_record_kept_after_retention(
    open_log: Callable[..., CommitLog],
) -> None:
    """Saved, then the log grew by several segments and retention deleted its head past the
    saved end: the records still in the log are all keyed again after a restart."""
    log = open_log()
    window = DedupWindow(capacity=10_000)
    _fill(log, 100)
    window.prefill(log)
    persist_window(window, log)
    later = _fill(log, 1000, prefix="L")
    log.queue.flush_to(log.max_offset)
    log.delete_expired_segments(time.time() + 3600, force=True, batch_max=3)
    fresh = DedupWindow(capacity=10_000)
    held, how = restore_window(fresh, log)
    assert how.startswith("saved + ") and held == len(fresh)
    kept = [k for k in later if fresh.get("T", k) is not None]
    assert kept and kept == later[-len(kept) :]  # every record still in the log is keyed
    first_kept = next(r for r in log.scan_records(log.min_offset, log.max_offset) if r.msg_size)
    assert first_kept.uniq_key == kept[0]


_KEYS = list("abcdefghij")


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, 70),
    batches=st.lists(
        st.lists(
            st.tuples(st.sampled_from(["T", "U"]), st.sampled_from([*_KEYS * 6, None, ""])),
            max_size=40,
        ),
        max_size=8,
    ),
)
def test_batches_keep_what_record_by_record_puts_keep(capacity: int, batches) -> None:
    """put_many writes a batch of 16 records or more that all have keys column by column when
    its slots do not wrap around the ring, else record by record; either way the window holds
    what a model of the ring holds: a key is there while its newest put is among the last
    ``capacity``. So does the C index (a table of 2-256 slots here: home slots shared, probe
    runs wrapping past the table's end, deletions shifting entries back), and it answers every
    lookup as the dict does."""
    assert native() is not None, "make install builds libstore._codec"
    for use_native in (False, True):
        _holds_what_the_model_holds(capacity, batches, native=use_native)


def test_a_column_written_batch_evicts_the_slots_it_takes_over() -> None:
    # Capacity 32, batches of 16: the third batch is written column by column over the first
    # one's slots; it repeats keys of the second, which keep their newer slots.
    first = [("T", k) for k in _KEYS] + [("U", k) for k in _KEYS[:6]]
    second = [("U", k) for k in _KEYS[6:]] + [("T", k + k) for k in _KEYS] + [("U", "zz"), ("U", "yy")]
    third = [("U", k + k) for k in _KEYS] + [("U", "zz")] + [("T", k + k) for k in _KEYS[:5]]
    extra = [k + k for k in _KEYS] + ["zz", "yy"]
    for use_native in (False, True):
        _holds_what_the_model_holds(32, [first, second, third], extra_keys=extra, native=use_native)


@settings(max_examples=100, deadline=None)
@given(
    capacity=st.integers(1, 40),
    steps=st.lists(
        st.one_of(
            st.lists(st.sampled_from([*_KEYS, *(k.upper() for k in _KEYS), None]), max_size=90),
            st.just("clear"),
            st.just("reload"),
        ),
        max_size=12,
    ),
)
def test_the_c_index_answers_as_the_dict_does(capacity: int, steps) -> None:
    """Both indexes through the same puts (batches longer than the ring, keys repeated in a
    batch, records without keys), clears and reloads from a copy: after each step the same
    hits, the same count and the same ring."""
    assert native() is not None, "make install builds libstore._codec"
    now = time.time_ns() // 1_000_000
    windows = [DedupWindow(capacity=capacity, ttl_ms=60_000, native=flag) for flag in (False, True)]
    everything = [*_KEYS, *(k.upper() for k in _KEYS)]
    phy = 0
    for step in steps:
        for window in windows:
            if step == "clear":
                window.clear()
            elif step == "reload":
                window._load(*window.snapshot().columns())
            else:
                n = len(step)
                window.put_many(["T"] * n, step, list(range(phy, phy + n)), [1] * n, list(range(n)), now)
        if isinstance(step, list):
            phy += len(step)
        plain, fast = windows
        assert fast.get_many(["T"] * len(everything), everything) == plain.get_many(
            ["T"] * len(everything), everything
        )
        assert len(fast) == len(plain)
        assert fast.snapshot().columns() == plain.snapshot().columns()


def test_the_c_index_refuses_what_it_cannot_hold() -> None:
    ext = native()
    assert ext is not None, "make install builds libstore._codec"
    ring: list[str | None] = [None] * 4
    with pytest.raises(ValueError, match="power of two"):
        ext.dedup_find(bytearray(b"\xff" * 8 * 6), ["a"], ring)  # 6 slots
    with pytest.raises(ValueError, match="twice the ring"):
        ext.dedup_find(bytearray(b"\xff" * 8 * 4), ["a"], ring)  # 4 slots for 4 keys
    table, tags = bytearray(b"\xff" * 8 * 8), bytearray(16)
    with pytest.raises(TypeError, match="str"):
        ext.dedup_put(table, [None], 0, ring, tags)

    class Key(str):  # its hash or comparison could run Python code in the middle of a call
        pass

    with pytest.raises(TypeError, match="str"):
        ext.dedup_put(table, ["a", Key("b")], 0, ring, tags)
    assert ring == [None] * 4 and table == bytearray(b"\xff" * 8 * 8)  # nothing put
    with pytest.raises(TypeError, match="str or None"):
        ext.dedup_find(table, [Key("a")], ring)
    with pytest.raises(ValueError, match="start"):
        ext.dedup_put(table, ["a"], 4, ring, tags)
    assert ext.dedup_put(table, ["a", "b", "a"], 3, ring, tags) == 2
    assert ring == ["b", "a", None, "a"] and ext.dedup_find(table, ["a", "b", "c", None], ring) == [
        1,
        0,
        None,
        None,
    ]


def _holds_what_the_model_holds(
    capacity: int, batches, extra_keys: list[str] | tuple[str, ...] = (), *, native: bool = True
) -> None:
    window = DedupWindow(capacity=capacity, ttl_ms=60_000, native=native)
    now = time.time_ns() // 1_000_000
    slots: list[tuple[str, Placed]] = []  # every keyed put so far, oldest first
    phy = 0
    for n, batch in enumerate(batches):
        topics = [t for t, _ in batch]
        uniq = [u for _, u in batch]
        placed = [Placed(phy + 10 * i, 10, phy + i, now) for i in range(len(batch))]
        phy += 10 * len(batch)
        # Every other batch comes with its keys built by the caller (as the commitlog does).
        keys = window_keys(topics, uniq) if n % 2 else None
        window.put_many(
            topics, uniq, [p[0] for p in placed], [10] * len(batch), [p[2] for p in placed], now, keys
        )
        slots += [(f"{t}#{u}", p) for t, u, p in zip(topics, uniq, placed, strict=True) if u]
    kept = slots[-capacity:] if slots else []
    newest = {key: p for key, p in slots}
    expected = {key: p for key, p in newest.items() if (key, p) in kept}
    everything = [(t, u) for t in ("T", "U") for u in [*_KEYS, *extra_keys]]
    topics, uniq = [t for t, _ in everything], [u for _, u in everything]
    hits = window.get_many(topics, uniq)
    assert window.get_many(topics, uniq, window_keys(topics, uniq)) == hits
    assert {f"{everything[i][0]}#{everything[i][1]}": p for i, p in hits.items()} == expected
    assert len(window) == len(expected)


def test_a_sliced_copy_keeps_each_slot_whole_while_puts_go_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """snapshot_async copies a slice per turn of the loop while puts run between the turns:
    every copied slot's key goes with its own offsets, the keys of the records before the copy
    began are all there but the ones overwritten meanwhile (the oldest), and a clear() (a cut
    of the log) while copying discards the copy."""
    from services.commitlog import dedup_window

    monkeypatch.setattr(dedup_window, "_COPY_SLICE", 4)
    now = time.time_ns() // 1_000_000
    window = DedupWindow(capacity=20, ttl_ms=60_000)

    def put(i: int) -> None:  # record i's key, offset and queue offset all derive from i
        window.put("T", f"k{i}", Placed(i * 100, 100, i, now))

    for i in range(26):  # wrapped: slots hold k6 .. k25
        put(i)

    async def copy_with_puts(clear_at: int = -1) -> dedup_window.WindowCopy | None:
        copying = asyncio.ensure_future(window.snapshot_async())
        await asyncio.sleep(0)  # its first slice
        i = 26
        while not copying.done():
            put(i)  # between the copy's turns
            if i == clear_at:
                window.clear()
            i += 1
            await asyncio.sleep(0)
        return copying.result()

    copy = asyncio.run(copy_with_puts())
    assert copy is not None and copy.head == 26
    keys, phys, _, qoffs, _ = copy.columns()
    assert len(keys) == 20
    for key, phy, qoff in zip(keys, phys, qoffs, strict=True):
        assert key is not None and phy == int(key[3:]) * 100 and qoff == int(key[3:])  # each slot whole
    before = {f"T#k{i}" for i in range(6, 26)}
    overwritten = before - set(keys)
    assert overwritten and all(int(k[3:]) < 6 + len(overwritten) for k in overwritten)  # the oldest
    later = {k for k in keys if k not in before}
    assert later  # and some put meanwhile
    # Saved with the log's end when the copy began (record 26 starts there), the file leaves
    # out what was put meanwhile: a start that cuts the log back to that end must not take it.
    # Written in slices of 3 keys (the late slots left out slice by slice), and released after:
    # the copy's keys are freed by the writer's thread, not by whoever drops the copy.
    monkeypatch.setattr(dedup_window, "_SLICE", 3)
    path = tmp_path / "window.bin"
    written = dedup_window.write_window(path, copy, "log", 1, 26 * 100, release=True)
    assert copy.keys == []
    read = window._read(path)
    assert read is not None and read[2] == 2600
    saved = read[3]
    assert written == len(saved[0]) == 20 - len(later)
    assert set(saved[0]) == set(keys) - later
    assert saved[1] == [int(k[3:]) * 100 for k in saved[0]] and saved[1] == sorted(saved[1])  # oldest first
    assert asyncio.run(copy_with_puts(clear_at=27)) is None


@pytest.mark.parametrize("late", ["none", "first span", "second span", "both spans", "all"])
def test_a_wrapped_window_is_written_without_its_late_slots(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, late: str
) -> None:
    """A ring of 10 that wrapped (slots 4..9 then 0..3, oldest first), slots of records past the
    end offset anywhere in it: the file holds the others, in order, whatever the slice size;
    an empty window writes no slot."""
    from services.commitlog import dedup_window

    monkeypatch.setattr(dedup_window, "_SLICE", 3)
    now = time.time_ns() // 1_000_000
    window = DedupWindow(capacity=10, ttl_ms=60_000)
    path = tmp_path / "window.bin"
    assert dedup_window.write_window(path, window.snapshot(), "log", 1, 0, release=True) == 0
    read = window._read(path)
    assert read is not None and read[3][0] == []
    for i in range(14):  # k4 .. k13 held; ring slot i % 10
        window.put("T", f"k{i}", Placed(i * 100, 100, i, now))
    copy = window.snapshot()
    assert copy.spans() == [(4, 10), (0, 4)]
    # "Late": records past the end (as puts made during a copy are); their offsets moved up.
    late_keys = {
        "none": set(),
        "first span": {5, 6},
        "second span": {11, 13},
        "both spans": {4, 9, 10, 12},
        "all": set(range(4, 14)),
    }[late]
    for i in late_keys:
        copy.phy[i % 10] = 10_000 + i
    written = dedup_window.write_window(path, copy, "log", 1, 1400, release=True)
    assert copy.keys == []
    kept = [i for i in range(4, 14) if i not in late_keys]
    read = window._read(path)
    assert read is not None and written == len(kept)
    assert read[3][0] == [f"T#k{i}" for i in kept]
    assert read[3][1] == [i * 100 for i in kept]


def test_a_partly_retried_batch_gets_first_results_and_appends_only_the_rest(
    open_log: Callable[..., CommitLog],
) -> None:
    """A batch of 40 whose first 20 records went before (their keys looked up and the 20 new
    ones put with the keys built once): the 20 get their first results, the others are
    appended; the whole batch sent again then appends nothing."""
    log = open_log(default_topic_queue_nums=1)
    port = LocalCommitLog(log, DedupWindow())
    producer = Producer("127.0.0.1:1")
    msgs = [OutgoingMessage("T", b"%03d" % i, properties={MessageConst.UNIQ_KEY: f"K{i}"}) for i in range(40)]
    first = asyncio.run(port.append_records(producer._request(msgs[:20]).records))
    assert first.appended == 20
    end = log.max_offset
    both = asyncio.run(port.append_records(producer._request(msgs).records))
    assert both.phy_offsets[:20] == first.phy_offsets and min(both.phy_offsets[20:]) >= end
    assert both.queue_offsets == list(range(40))
    assert [log.read_message(phy).body for phy in both.phy_offsets] == [m.body for m in msgs]
    end = log.max_offset
    again = asyncio.run(port.append_records(producer._request(msgs[::-1]).records))
    assert again.phy_offsets == both.phy_offsets[::-1] and log.max_offset == end


def test_offsets_past_the_batch_are_not_written() -> None:
    """More offsets than records (outside the caller's contract): each record keeps its own
    offset, in the column path that wraps around the ring too, with either index."""
    now = time.time_ns() // 1_000_000
    for use_native in (False, True):
        window = DedupWindow(capacity=24, ttl_ms=60_000, native=use_native)
        window.put_many(["T"] * 10, [f"w{i}" for i in range(10)], list(range(10)), [1] * 10, [0] * 10, now)
        n = 20  # slots 10..23, then 0..5
        window.put_many(
            ["T"] * n,
            [f"a{i}" for i in range(n)],
            list(range(100, 100 + n + 7)),
            [1] * (n + 7),
            [0] * (n + 7),
            now,
        )
        assert [window.get("T", f"a{i}") for i in (0, 5, 13, 14, 19)] == [
            Placed(100 + i, 1, 0, now) for i in (0, 5, 13, 14, 19)
        ]
        assert window.get("T", "w6") == Placed(6, 1, 0, now) and window.get("T", "w5") is None
