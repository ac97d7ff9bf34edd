"""IndexFile and IndexService (spec §4): hand-built bytes, a dict model under hypothesis with
forced hash collisions and file rolls, replay and crash handling."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import libstore.index_file as index_file
from libstore import record_codec
from libstore.dispatch_request import DispatchRequest
from libstore.index_file import IndexFile, index_file_size, index_key_hash_code
from libstore.index_service import IndexService, index_file_name, index_file_time
from libstore.message import MessageSysFlag
from libstore.tags import java_string_hash

T0 = 1_700_000_000_000  # ms, a whole second


def _req(offset: int, topic: str, keys: list[str], ts: int, uniq: str | None = None, sys_flag: int = 0):
    req = DispatchRequest(True, 100)
    req.commit_log_offset, req.topic, req.keys, req.store_timestamp = offset, topic, keys, ts
    req.uniq_key, req.sys_flag = uniq, sys_flag
    return req


def test_layout_matches_hand_built_bytes(tmp_path: Path):
    f = IndexFile.create(tmp_path / "f", hash_slot_num=4, index_num=4)
    assert f.file_size == index_file_size(4, 4) == 40 + 16 + 80
    assert f.put_key("T#a", 1000, T0)
    assert f.put_key("T#b", 2000, T0 + 2500)
    f.flush()
    raw = (tmp_path / "f").read_bytes()
    ha, hb = index_key_hash_code("T#a"), index_key_hash_code("T#b")
    header = struct.pack(">qqqqii", T0, T0 + 2500, 1000, 2000, 2 if ha % 4 != hb % 4 else 1, 3)
    assert raw[:40] == header
    slots = [0, 0, 0, 0]
    slots[ha % 4] = 1
    slots[hb % 4] = 2
    assert raw[40:56] == struct.pack(">4i", *slots)
    prev_b = 1 if ha % 4 == hb % 4 else 0
    assert raw[56 + 20 : 56 + 40] == struct.pack(">iqii", ha, 1000, 0, 0)  # entry 1
    assert raw[56 + 40 : 56 + 60] == struct.pack(">iqii", hb, 2000, 2, prev_b)  # entry 2: 2 s later
    assert raw[56:76] == bytes(20)  # entry 0 is never used
    f.close()


def test_key_hash_is_java_hash_made_non_negative():
    assert index_key_hash_code("Aa") == index_key_hash_code("BB") == java_string_hash("Aa") == 2112
    assert index_key_hash_code("polygenelubricants") == 0  # hashCode is Integer.MIN_VALUE
    assert index_key_hash_code("ab" * 20) == abs(java_string_hash("ab" * 20))


def test_file_full_and_names(tmp_path: Path):
    f = IndexFile.create(tmp_path / "f", hash_slot_num=2, index_num=3)
    assert f.put_key("k1", 1, T0) and f.put_key("k2", 2, T0)
    assert f.is_write_full() and not f.put_key("k3", 3, T0)
    f.close()
    name = index_file_name(T0 + 123)
    assert len(name) == 17 and name.endswith("123") and index_file_time(name) == T0 + 123


# -- IndexService against a model ----------------------------------------------------------------
KEYS = ["Aa", "BB", "k1", "k2", "order-7", "C#"]  # "Aa" and "BB" share a Java hash code


@st.composite
def _workload(draw):
    records = []
    ts = T0
    for offset in range(0, draw(st.integers(1, 60)) * 100, 100):
        ts += draw(st.sampled_from([0, 1000, 3000]))  # whole seconds: no rounding in the model
        topic = draw(st.sampled_from(["T", "U"]))
        keys = draw(st.lists(st.sampled_from(KEYS), max_size=3, unique=True))
        uniq = draw(st.none() | st.sampled_from(["Aa", "u1"]))
        rollback = draw(st.booleans()) and draw(st.booleans())
        records.append((offset, topic, keys, uniq, ts, rollback))
    queries = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["T", "U"]),
                st.sampled_from([*KEYS, "u1", "nope"]),
                st.integers(1, 10),
                st.integers(-2, 20),
                st.integers(0, 30),
            ),
            min_size=1,
            max_size=8,
        )
    )
    return records, queries


@settings(max_examples=120, deadline=None)
@given(_workload(), st.integers(1, 5), st.integers(2, 7), st.integers(1, 9))
def test_index_service_answers_like_a_dict_model(tmp_path_factory, workload, slots, index_num, chunk):
    records, queries = workload
    service = IndexService(tmp_path_factory.mktemp("index"), slots, index_num, max_msgs_num_batch=8)
    service.load()
    model: list[tuple[str, int, int]] = []  # (topic#key, offset, ts) in insertion order
    pending = []
    for n, (offset, topic, keys, uniq, ts, rollback) in enumerate(records, 1):
        flag = MessageSysFlag.TRANSACTION_ROLLBACK_TYPE if rollback else 0
        pending.append(_req(offset, topic, keys, ts, uniq, flag))
        if len(pending) == chunk or n == len(records):  # batches of any size, as dispatch sends
            service.dispatch_batch(pending)
            pending = []
        if not rollback:
            model += [(f"{topic}#{k}", offset, ts) for k in [*([uniq] if uniq else []), *keys]]
    if len(model) > index_num - 1:
        assert len(service.files) > 1, "the index must have rolled"
    for topic, key, max_num, begin_s, span_s in queries:
        begin = T0 + begin_s * 1000
        end = begin + span_s * 1000
        wanted = index_key_hash_code(f"{topic}#{key}")
        expect = [
            off
            for full, off, ts in reversed(model)
            if index_key_hash_code(full) == wanted and begin <= ts <= end
        ][: min(max_num, 8)]
        assert service.query_offsets(topic, key, max_num, begin, end) == expect
    service.shutdown()


def test_replayed_records_are_not_indexed_twice(tmp_path: Path):
    service = IndexService(tmp_path, 11, 100)
    service.load()
    for offset in (0, 100, 200):
        service.dispatch(_req(offset, "T", ["k"], T0))
    service.dispatch(_req(100, "T", ["k"], T0))  # replay after a restart
    service.dispatch(_req(200, "T", ["k"], T0))
    assert service.query_offsets("T", "k", 10, 0, T0 + 1) == [200, 100, 0]
    service.shutdown()
    reopened = IndexService(tmp_path, 11, 100)
    reopened.load()
    assert reopened.last_indexed_offset == 200
    reopened.dispatch(_req(200, "T", ["k"], T0))
    assert reopened.query_offsets("T", "k", 10, 0, T0 + 1) == [200, 100, 0]
    reopened.shutdown()


def test_discard_after_deletes_files_past_an_offset_and_says_where_to_rebuild(tmp_path: Path):
    service = IndexService(tmp_path, 3, 4)  # 3 entries per file
    service.load()
    for offset in range(0, 1000, 100):  # 10 entries: files [0,100,200] [300,400,500] [600,700,800] [900]
        service.dispatch(_req(offset, "T", ["k"], T0 + offset))
    assert len(service.files) == 4
    assert service.discard_after(1000) is None
    assert service.discard_after(450) == 300  # the file holding 300..500 and all after it go
    assert [f.begin_phy_offset for f in service.files] == [0]
    assert service.last_indexed_offset == 200
    for offset in range(300, 1000, 100):  # rebuild
        service.dispatch(_req(offset, "T", ["k"], T0 + offset))
    assert service.query_offsets("T", "k", 64, 0, T0 + 10_000) == list(range(900, -1, -100))
    assert service.discard_after(0) == 0 and service.files == [] and service.last_indexed_offset == -1
    service.shutdown()


def test_a_batch_interrupted_midway_leaves_a_header_that_claims_it(tmp_path: Path, monkeypatch):
    """put_many writes the header (with the batch's end offset) before the entries, so recovery,
    which drops files past the dispatch checkpoint, rebuilds a file whose batch was cut short."""
    service = IndexService(tmp_path, 7, 100)
    service.load()
    service.dispatch_batch([_req(o, "T", ["k"], T0) for o in (0, 100)])
    calls = {"n": 0}
    real = index_file._ENTRY

    class Dying:
        size = real.size

        @staticmethod
        def pack_into(*args):
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError("process killed here")
            real.pack_into(*args)

        unpack_from = real.unpack_from

    monkeypatch.setattr(index_file, "_ENTRY", Dying)
    # The kill is injected into the Python loop; the C loop (index_put_run) runs between the
    # same two header writes.
    monkeypatch.setattr(record_codec, "_ext", None)
    with pytest.raises(OSError, match="killed"):
        service.dispatch_batch([_req(o, "T", ["k"], T0) for o in (200, 300, 400)])
    monkeypatch.setattr(index_file, "_ENTRY", real)
    f = service.files[-1]
    f.close()
    on_disk = IndexFile.open(f.path, 7, 100)
    assert on_disk.end_phy_offset == 400 and on_disk.index_count == 6  # the whole batch is claimed
    on_disk.close()
    service.files = []
    reopened = IndexService(tmp_path, 7, 100)
    reopened.load()
    assert reopened.discard_after(200) == 0  # checkpoint at 200: the file is rebuilt from its start
    reopened.shutdown()


def test_a_failed_flush_is_retried_by_the_next_one(tmp_path: Path, monkeypatch):
    """flush_all marks a file clean only once its fdatasync succeeded: after a failure the next
    call flushes it again (otherwise the dispatch checkpoint would then claim unflushed entries)."""
    from libstore.errors import StoreIOError

    service = IndexService(tmp_path, 7, 100)
    service.load()
    service.dispatch_batch([_req(o, "T", ["k"], T0) for o in (0, 100)])
    flushed: list[str] = []
    failing = {"once": True}
    real_flush = IndexFile.flush

    def flush(self: IndexFile) -> None:
        if failing.pop("once", False):
            raise StoreIOError("fdatasync of index file failed: EIO")
        flushed.append(self.file_name)
        real_flush(self)

    monkeypatch.setattr(IndexFile, "flush", flush)
    with pytest.raises(StoreIOError):
        service.flush_all()
    service.flush_all()
    assert flushed == [service.files[0].file_name]
    service.shutdown()


def _built(root: Path, reqs, slots: int, index_num: int) -> IndexService:
    service = IndexService(root, slots, index_num)
    service.load()
    for start in range(0, len(reqs), 5):
        service.dispatch_batch(reqs[start : start + 5])
    return service


def _entries_and_slots(f: IndexFile) -> tuple[bytes, bytes]:
    at = index_file.INDEX_HEADER_SIZE + f.hash_slot_num * index_file.HASH_SLOT_SIZE
    mm = f._mmap
    return bytes(mm[index_file.INDEX_HEADER_SIZE : at]), bytes(mm[at : at + f.index_count * 20])


def test_roll_back_after_a_crash_keeps_the_flushed_prefix_and_equals_a_fresh_build(tmp_path: Path):
    """A crash after the checkpoint: the marked file keeps exactly its entries for records before
    the checkpoint (slots rebuilt, post-checkpoint entries zeroed, torn slots repaired), later
    files are deleted, and dispatch resumes at the checkpoint instead of the file's start."""
    reqs = [_req(o * 100, "T", [f"k{o % 13}", f"u{o}"], T0 + o * 10) for o in range(90)]
    slots, index_num = 11, 64  # 63 entries a file: two keys a record rolls files
    service = _built(tmp_path / "live", reqs[:60], slots, index_num)
    checkpoint_at = 60 * 100  # everything before record 60 was dispatched and flushed
    mark = service.applied_mark
    assert mark is not None
    service.flush_all()
    for start in range(60, 90, 5):  # after the checkpoint: entries, slots, a new file
        service.dispatch_batch(reqs[start : start + 5])
    assert len(service.files) == 3 and mark[0] == service.files[1].file_name
    marked = service.files[1]
    # A torn slot: pointing at an entry written after the flush, lost in the crash.
    struct.pack_into(">i", marked._mmap, index_file.INDEX_HEADER_SIZE + 3 * 4, marked.index_count - 1)
    service.shutdown()

    reopened = IndexService(tmp_path / "live", slots, index_num)
    reopened.load()
    assert reopened.roll_back(checkpoint_at, mark) is None  # nothing before the checkpoint lost
    assert [f.file_name for f in reopened.files] == [service.files[0].file_name, mark[0]]
    assert reopened.last_indexed_offset == 59 * 100
    fresh = _built(tmp_path / "fresh", reqs[:60], slots, index_num)
    for got, want in zip(reopened.files, fresh.files, strict=True):
        assert _entries_and_slots(got) == _entries_and_slots(want)
        assert (got.index_count, got.hash_slot_count, got.end_phy_offset) == (
            want.index_count,
            want.hash_slot_count,
            want.end_phy_offset,
        )
        assert want.end_timestamp <= got.end_timestamp < want.end_timestamp + 1000
    for start in range(60, 90, 5):  # dispatch resumes at the checkpoint
        reopened.dispatch_batch(reqs[start : start + 5])
        fresh.dispatch_batch(reqs[start : start + 5])
    for key in [f"k{i}" for i in range(13)] + ["u5", "u61", "u89"]:
        assert reopened.query_offsets("T", key, 64, 0, T0 + 10_000) == fresh.query_offsets(
            "T", key, 64, 0, T0 + 10_000
        )
    reopened.shutdown()
    fresh.shutdown()


def test_roll_back_of_a_live_index_cuts_inside_a_file(tmp_path: Path):
    """The log was cut under a running index (a returning master): entries for records past the
    cut go, the rest of their file stays."""
    reqs = [_req(o * 100, "T", ["k"], T0 + o) for o in range(10)]
    service = _built(tmp_path, reqs, 3, 4)  # 3 entries a file: [0..200] [300..500] [600..800] [900]
    assert service.roll_back(1000) is None and len(service.files) == 4
    assert service.roll_back(450) is None  # 300 and 400 stay in the second file
    assert [f.index_count - 1 for f in service.files] == [3, 2]
    assert service.last_indexed_offset == 400
    assert service.query_offsets("T", "k", 64, 0, T0 + 10_000) == [400, 300, 200, 100, 0]
    assert service.roll_back(300) is None and [f.index_count - 1 for f in service.files] == [3]
    service.shutdown()


def test_roll_back_without_the_marked_file_rebuilds_from_the_older_files_end(tmp_path: Path):
    reqs = [_req(o * 100, "T", ["k"], T0 + o) for o in range(7)]
    service = _built(tmp_path, reqs, 3, 4)  # files [0..200] [300..500] [600]
    mark = (service.files[1].file_name, service.files[1].index_count)
    service.files[1].destroy()
    service.files = [service.files[0], service.files[2]]
    assert service.roll_back(600, mark) == 200  # from where the older file ends
    assert [f.begin_phy_offset for f in service.files] == [0]
    service.shutdown()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(
        st.lists(
            st.tuples(
                st.lists(st.text(min_size=1, max_size=6), max_size=3),  # KEYS (any code points)
                st.one_of(st.none(), st.text(min_size=1, max_size=8)),  # UNIQ_KEY
                st.integers(-5_000, 10_000_000),  # ms after T0 (some before the file's begin)
            ),
            min_size=1,
            max_size=12,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_index_files_built_in_c_equal_the_python_reference_byte_for_byte(tmp_path: Path, batches):
    """libstore._codec's index_hashes and index_put_run against the Python loop they replace:
    same files, rolls (7 slots, 10 entries: collisions and full files) and headers included."""
    assert record_codec.native() is not None, "make install builds libstore._codec"
    built = {}
    for name, ext in (("c", record_codec.native()), ("pure", None)):
        root = tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}"
        with pytest.MonkeyPatch.context() as m:
            m.setattr(record_codec, "_ext", ext)
            service = IndexService(root, 7, 10)
            service.load()
            offset = 0
            for batch in batches:
                reqs = []
                for keys, uniq, dt_ms in batch:
                    reqs.append(_req(offset, "T", keys, T0 + dt_ms, uniq=uniq))
                    offset += 100
                service.dispatch_batch(reqs)
            for f in service.files:
                f.flush()
            built[name] = [f.path.read_bytes() for f in service.files]
            service.shutdown()
    assert built["c"] == built["pure"]


def test_index_hashes_in_c_match_java_string_hash():
    ext = record_codec.native()
    assert ext is not None
    keys = ["", "a", "T#k", "é", "日本", "😀", "x😀y", "\ud7ff", "polygenelubricants", "Aa" * 40]
    assert ext.index_hashes(keys) == [index_key_hash_code(k) for k in keys]


def test_index_put_run_refuses_arguments_outside_the_file():
    """The C loop checks its bounds (no write past the mapping, whatever the caller passes)."""
    ext = record_codec.native()
    assert ext is not None
    mm = bytearray(40 + 7 * 4 + 10 * 20)  # header, 7 slots, 10 entries
    ok = ([1, 2], [100, 200], [T0, T0])
    assert ext.index_put_run(mm, *ok, 0, 2, 1, 7, 68, T0) == 2
    for count, slot_num, entries_at in (
        (9, 7, 68),
        (2**62, 7, 68),
        (1, 2**62, 68),
        (1, 7, 10**9),
        (1, 7, 10),
    ):
        with pytest.raises(ValueError):
            ext.index_put_run(mm, *ok, 0, 2, count, slot_num, entries_at, T0)

    class Sneaky(int):
        pass

    with pytest.raises(TypeError):
        ext.index_put_run(mm, [Sneaky(1)], [100], [T0], 0, 1, 1, 7, 68, T0)
    with pytest.raises(ValueError):
        ext.index_put_run(mm, [-1], [100], [T0], 0, 1, 1, 7, 68, T0)
