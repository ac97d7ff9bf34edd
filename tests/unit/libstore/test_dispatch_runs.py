"""Dispatch's per-chunk grouping in C (libstore._codec.queue_runs, index_entries) against the
pure-Python reference (libstore.queue_runs, libstore.index_service): the same runs, units,
IndexFile entries and hashes for any chunk, and the ConsumeQueues and IndexFiles a chunk
builds are the same files either way."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libstore import record_codec
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.dispatch import apply_chunk
from libstore.dispatch_request import DispatchRequest
from libstore.index_service import IndexService, index_entries
from libstore.message import MessageSysFlag
from libstore.queue_runs import queue_runs
from libstore.tags import java_string_hash

EXT = record_codec._ext
pytestmark = pytest.mark.skipif(EXT is None, reason="needs libstore._codec (make install builds it)")


@contextlib.contextmanager
def _pure_python() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as m:
        m.setattr(record_codec, "_ext", None)
        yield


_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_TYPES = [0, MessageSysFlag.TRANSACTION_PREPARED_TYPE, MessageSysFlag.TRANSACTION_COMMIT_TYPE,
          MessageSysFlag.TRANSACTION_ROLLBACK_TYPE]  # fmt: skip


@st.composite
def _chunks(draw: st.DrawFn) -> list[DispatchRequest]:
    """Records in log order over a few queues (topics with non-ASCII and non-BMP names too),
    queue offsets mostly consecutive per queue, now and then a hole or a replay."""
    topics = draw(
        st.lists(st.sampled_from(["T", "Tópico", "話題\U0001f600", "bench-1kb"]), min_size=1, max_size=3)
    )
    next_offset: dict[tuple[str, int], int] = {}
    phy = draw(st.integers(0, 1 << 40))
    out = []
    for _ in range(draw(st.integers(0, 40))):
        topic = draw(st.sampled_from(topics))
        topic = topic[:1] + topic[1:]  # an equal string, mostly another object (as decoding makes)
        queue_id = draw(st.integers(0, 3))
        key = (topic, queue_id)
        qoff = next_offset.get(key, draw(st.integers(0, 100)))
        qoff += draw(st.sampled_from([0, 0, 0, 0, 1, -1]))  # a hole or a replay, sometimes
        next_offset[key] = max(qoff, 0) + 1
        size = draw(st.integers(100, 5000))
        keys = tuple(draw(st.lists(_TEXT.filter(bool), max_size=3)))
        out.append(
            DispatchRequest(
                True,
                size,
                topic,
                queue_id,
                phy,
                max(qoff, 0),
                draw(st.sampled_from(_TYPES)) | draw(st.sampled_from([0, 0x100, 0x10, 0x100000])),
                0,
                draw(st.integers(0, 1 << 42)),
                0,
                None,
                draw(st.integers(-(1 << 63), (1 << 63) - 1)),
                keys,
                draw(st.one_of(st.none(), st.just(""), _TEXT)),
            )
        )
        phy += size
    return out


@settings(max_examples=300, deadline=None)
@given(_chunks(), st.booleans())
def test_queue_runs_in_c_equal_the_python_reference(chunk: list[DispatchRequest], with_units: bool) -> None:
    fast = queue_runs(chunk, with_units=with_units)
    with _pure_python():
        reference = queue_runs(chunk, with_units=with_units)
    assert fast == reference
    assert EXT.queue_runs(chunk, with_units) is not NotImplemented  # the C path answered


@settings(max_examples=300, deadline=None)
@given(_chunks(), st.integers(-1, 1 << 41))
def test_index_entries_in_c_equal_the_python_reference(chunk: list[DispatchRequest], last: int) -> None:
    fast = index_entries(chunk, last)
    with _pure_python():
        reference = index_entries(chunk, last)
    assert fast == reference
    assert EXT.index_entries(chunk, last) is not NotImplemented


def test_index_hashes_are_of_the_whole_key() -> None:
    """The C code hashes ``topic#key`` by folding the key on from the topic's hash: the same as
    Java's hash of the joined string (here with a surrogate pair and an overflow to abs)."""
    req = DispatchRequest(True, 100, "話題\U0001f600", 0, 10, 0, 0, 0, 5, 0, None, 0, ("k1", "κλειδί"), "U1")
    hashes, offsets, timestamps, last = index_entries([req], -1)
    expected = [abs(java_string_hash(f"話題\U0001f600#{k}")) for k in ("U1", "k1", "κλειδί")]
    assert hashes == [h if h <= 0x7FFFFFFF else 0 for h in expected]
    assert (offsets, timestamps, last) == ([10, 10, 10], [5, 5, 5], 10)


def test_anything_but_dispatch_requests_is_left_to_python() -> None:
    class Other:
        sys_flag = 0
        topic = "T"
        queue_id = 0
        consume_queue_offset = 0
        commit_log_offset = 0
        msg_size = 10
        tags_code = 0

    assert EXT.queue_runs([Other()], True) is NotImplemented
    assert EXT.index_entries([Other()], -1) is NotImplemented
    # The Python code answers for it all the same.
    assert [r[:4] for r in queue_runs([Other()])] == [("T", 0, 0, 0)]  # type: ignore[list-item]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_chunks(), min_size=1, max_size=4))
def test_a_chunk_builds_the_same_files_either_way(tmp_path_factory: pytest.TempPathFactory, chunks) -> None:  # type: ignore[no-untyped-def]
    """ConsumeQueues and IndexFiles dispatched with the C grouping equal those of the Python
    one, and so do the arrivals reported to held pulls."""
    built = []
    for pure in (False, True):
        root = tmp_path_factory.mktemp("pure" if pure else "c")
        (root / "cq").mkdir()
        (root / "index").mkdir()
        with _pure_python() if pure else contextlib.nullcontext():
            queues = ConsumeQueueStore(root / "cq", 64 * 20)  # small segments: runs cross rolls
            index = IndexService(root / "index", 16, 64)
            arrived = [apply_chunk([queues, index], chunk) for chunk in chunks]
            queues.flush_all()
            index.flush_all()
            queues.shutdown()
            index.shutdown()
        built.append((arrived, _files(root / "cq"), {k[-4:]: v for k, v in _files(root / "index").items()}))
    c_way, python_way = built
    assert c_way[0] == python_way[0]
    assert c_way[1] == python_way[1]
    assert sorted(c_way[2].values()) == sorted(python_way[2].values())


def test_configure_refuses_a_class_whose_slots_are_not_its_own() -> None:
    """The C code reads a DispatchRequest's slots where __slots__ keep them: a class whose slot
    names lead elsewhere (a slot of another class, a property) is refused, and a refused call
    leaves the module reading the real class as before."""
    names = DispatchRequest.__slots__

    class Big:
        __slots__ = tuple(f"z{i}" for i in range(400))

    borrowed = type("Borrowed", (), {name: Big.__dict__["z399"] for name in names})
    shifted = type("Shifted", (), {"__slots__": ("pad", *(n for n in names if n != "trace_context"))})
    shifted.trace_context = property(lambda self: None)  # type: ignore[attr-defined]
    for bad in (borrowed, shifted):
        with pytest.raises(TypeError):
            EXT.configure(bad, {}, None)
    req = DispatchRequest(True, 100, "T", 3, 1000, 7, 0, 0, 5, 0, None, 0, ("k",), "U", False, "Z")
    assert [r[:4] for r in queue_runs([req])] == [("T", 3, 7, 7)]
    with _pure_python():
        assert index_entries([req], -1) == EXT.index_entries([req], -1)
    assert EXT.index_entries([req], 1 << 70) is NotImplemented  # past 64 bits: Python answers
