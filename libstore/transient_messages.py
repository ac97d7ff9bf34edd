"""TransientMessageStore: the records of transient messages, held in memory, never flushed.

A transient message (RabbitMQ's delivery mode 1; issue "Durability classes") is acknowledged
once it is here. Its record, in the CommitLog's record layout, lives in this store under a *key*:
the CommitLog offset of the small stub record that gives it its place in the log (the stub is
what dispatch, the ConsumeQueue and the index see; keys only grow, and a key is never reused,
even after a restart, because CommitLog offsets are not). What this store holds is gone after a
restart or a failover: a key it does not know reads as removed.

Memory is bounded by ``max_bytes`` (``transientStoreMaxBytes``). Past ``high_water`` of it the
oldest records are paged out, oldest first, to scratch files under ``scratch_dir`` (segments of
``scratch_segment_bytes``, deleted when the store opens and when their last record is
released) until memory is back under ``low_water``. Past ``scratch_max_bytes`` of scratch too, a
put is refused with SystemBusyError (RocketMQ's SYSTEM_BUSY, RabbitMQ's memory alarm): the
store never queues without bound. Records are released below a key (:meth:`release_below`),
except the keys the caller names: once every consumer group reading them has consumed them (the
dispatch service decides, services.dispatch.transient_release; the records of a queue nobody
consumes, such as dead-letter copies, are named and stay), else when the CommitLog's retention
deletes the segment their stubs were in; and cut when the log is truncated under them
(:meth:`truncate_from`). A chunk that keeps some of its records is cut down to them: in memory
its buffer is rewritten to hold only those; paged out, its scratch segment stays until the
last of them is released.

With ``background`` (the CommitLog's store), the page-out down to ``low_water`` runs on a
thread of its own, about ``PAGE_OUT_STEP_BYTES`` at a time (whole chunks: the records of one
put, so at least one put's), so a put never waits for more than one step's write; a put itself
pages out only what it needs to stay within ``max_bytes``. Without it, the put that crosses the
high-water mark pages out down to ``low_water`` itself.

Thread-safety: every method may be called from any thread (one lock; page-out writes happen
under it, a step at a time).
"""

from __future__ import annotations

import bisect
import logging
import operator
import os
import threading
import time
from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate
from pathlib import Path

from libstore.errors import InvalidArgumentError, StoreIOError, SystemBusyError

log = logging.getLogger(__name__)

DEFAULT_SCRATCH_SEGMENT_BYTES = 64 * 1024 * 1024
PAGE_OUT_STEP_BYTES = 1024 * 1024  # the background page-out's step (the lock is let go between)
PAGE_OUT_PAUSE_S = 0.0005  # the pager's pause between steps: puts and reads get the lock
_MAX_RUN = 512  # chunks per pwritev (under IOV_MAX, 1024 on Linux)
_EMPTY: array[int] = array("q")


def _int64s(values: Sequence[int]) -> array[int]:
    """``values`` as array('q'): the array itself when it is one already (held, not copied)."""
    return values if isinstance(values, array) and values.typecode == "q" else array("q", values)


class _Chunk:
    """Records put together (one :meth:`TransientMessageStore.put_run`): ``keys`` ascending;
    record ``i`` is bytes ``ends[i-1]`` (0 for the first) up to ``ends[i]`` of ``data`` while the
    chunk is in memory, of scratch segment ``segment`` from ``position`` once it is paged out
    (``data`` None then). Records ``lo``..``hi``-1 are held; a chunk with none is dead. A
    paged-out chunk that kept only some of its records (a release that named keys to keep)
    has ``starts``: record ``i`` is bytes ``starts[i]`` up to ``ends[i]`` from ``position``."""

    __slots__ = ("data", "ends", "hi", "keys", "lo", "position", "segment", "starts")

    def __init__(self, keys: array[int], ends: array[int], data: bytes | memoryview) -> None:
        self.keys = keys
        self.ends = ends
        self.starts: array[int] | None = None
        self.lo = 0
        self.hi = len(keys)
        self.data: bytes | memoryview | None = data
        self.segment = -1
        self.position = 0

    def start_of(self, i: int) -> int:
        if self.starts is not None:
            return self.starts[i]
        return self.ends[i - 1] if i else 0

    def held(self) -> int:
        return self.hi - self.lo


class _Segment:
    """One scratch file, written append-only; deleted once none of its records is held."""

    def __init__(self, path: Path, number: int) -> None:
        self.number = number
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.written = 0
        self.live = 0  # chunks of this segment still held

    def close_and_delete(self) -> None:
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


class TransientMessageStore:
    """Transient records by key (module doc). Sizes in bytes; ``high_water`` and ``low_water``
    are fractions of ``max_bytes``; ``background`` pages out on a thread of its own (module
    doc; :meth:`close` stops it). Raises InvalidArgumentError for bounds that do not fit.

    Records are kept in *chunks*, the records of one put in one buffer, and paged out a chunk
    at a time: the cost of holding and paging is per put, not per record."""

    def __init__(
        self,
        scratch_dir: Path,
        max_bytes: int,
        *,
        scratch_max_bytes: int,
        high_water: float = 0.75,
        low_water: float = 0.5,
        scratch_segment_bytes: int = DEFAULT_SCRATCH_SEGMENT_BYTES,
        background: bool = False,
    ) -> None:
        if max_bytes <= 0 or scratch_max_bytes < 0 or scratch_segment_bytes <= 0:
            raise InvalidArgumentError("transient store sizes must be positive")
        if not 0 < low_water < high_water <= 1:
            raise InvalidArgumentError("transient store water marks must satisfy 0 < low < high <= 1")
        self.max_bytes = max_bytes
        self.scratch_max_bytes = scratch_max_bytes
        self.high_water_bytes = int(max_bytes * high_water)
        self.low_water_bytes = int(max_bytes * low_water)
        self.scratch_segment_bytes = scratch_segment_bytes
        self.scratch_dir = Path(scratch_dir)
        self._lock = threading.Lock()
        self._chunks: list[_Chunk] = []  # in key order; dead ones stay until compaction
        self._firsts: list[int] = []  # the first key of each chunk, for bisection
        self._first = 0  # index of the oldest chunk that holds records
        self._first_in_memory = 0  # index of the oldest chunk not paged out (or dead) from here on
        self._dead = 0  # chunks in the lists that hold no record (compacted away in bulk)
        self._last_key = -1  # keys put must be above it (it goes back only with truncate_from)
        self._segments: dict[int, _Segment] = {}
        self._writing: _Segment | None = None
        self._count = 0  # records held
        self._paged_count = 0  # of them, in scratch files
        self.memory_bytes = 0
        self.scratch_bytes = 0  # bytes of scratch files not deleted yet
        self.refused = 0  # puts refused with SystemBusyError
        self._open_scratch_dir()
        self._closed = False
        self._pager_wake = threading.Event()
        self._pager: threading.Thread | None = None
        if background:
            self._pager = threading.Thread(target=self._page_out_loop, name="TransientPager", daemon=True)
            self._pager.start()

    def _open_scratch_dir(self) -> None:
        """Start empty: what a previous run paged out is of no use (module doc)."""
        try:
            self.scratch_dir.mkdir(parents=True, exist_ok=True)
            for stale in self.scratch_dir.glob("*.scratch"):
                stale.unlink()
        except OSError as exc:
            raise StoreIOError(
                f"cannot prepare the transient scratch directory {self.scratch_dir}: {exc}"
            ) from exc

    # -- writing -------------------------------------------------------------------------------------
    def put(self, key: int, record: bytes) -> None:
        """Hold ``record`` under ``key``, which must be above every key put before (since the
        last :meth:`truncate_from` below it). Raises
        SystemBusyError when neither memory nor scratch has room (nothing is held then),
        InvalidArgumentError for a key out of order."""
        self.put_run([key], [len(record)], bytes(record))

    def put_many(self, keys: Sequence[int], records: Sequence[bytes]) -> None:
        """:meth:`put` of each key with its record (two lists of one length), all or none."""
        if len(keys) != len(records):
            raise InvalidArgumentError(f"{len(keys)} transient keys for {len(records)} records")
        ends = list(accumulate(map(len, records)))
        self.put_run(keys, ends, b"".join(records))

    def put_run(
        self, keys: Sequence[int], ends: Sequence[int], data: bytes | memoryview, *, ordered: bool = False
    ) -> None:
        """Hold the records of ``data`` (record ``i`` is bytes ``ends[i-1]``, 0 for the first,
        up to ``ends[i]``; the last end is ``len(data)``) under ``keys`` (ascending, above every
        key put before), all or none; ``data`` is held as it is, without a copy (bytes, or a
        read-only view of bytes its owner no longer changes), and so are ``keys`` and ``ends``
        when they are array('q'). ``ordered``: the caller built both to ascend (hold_entries
        does), and they are not walked to check it. Raises SystemBusyError when neither memory
        nor scratch has room, InvalidArgumentError for keys out of order or ends that do not
        cut ``data``."""
        if not keys:
            return
        n = len(keys)
        if (
            len(ends) != n
            or ends[-1] != len(data)
            or ends[0] < 0
            or (not ordered and any(map(operator.gt, ends, ends[1:])))
        ):
            raise InvalidArgumentError(f"{n} transient keys for records ending at {list(ends[:8])}")
        size = len(data)
        key_array, end_array = _int64s(keys), _int64s(ends)
        with self._lock:
            last = self._last_key
            if keys[0] <= last or (not ordered and any(map(operator.ge, keys, keys[1:]))):
                raise InvalidArgumentError(
                    f"transient keys must ascend, above the last one put ({last}): {list(keys[:8])}"
                )
            self._make_room_locked(size)
            self._chunks.append(_Chunk(key_array, end_array, data))
            self._firsts.append(keys[0])
            self._last_key = keys[-1]
            self._count += n
            self.memory_bytes += size
            if self.memory_bytes > self.high_water_bytes:
                if self._pager is not None:
                    self._pager_wake.set()
                else:
                    self._page_out_locked(self.memory_bytes - self.low_water_bytes)

    def make_room(self, size: int) -> None:
        """Page out until ``size`` more bytes of records fit in memory, so that puts of that
        many bytes that follow (with no other put in between) cannot be refused. Raises
        SystemBusyError when neither memory nor scratch has room."""
        if self.memory_bytes + size <= self.max_bytes:
            # Room already: only puts take room, and the caller's put comes next (the pager,
            # releases and truncations only free), so the lock is not needed to know it.
            return
        with self._lock:
            self._make_room_locked(size)

    def _make_room_locked(self, size: int) -> None:
        if self.memory_bytes + size > self.max_bytes:
            # Down to the low-water mark, or with a pager only what this put needs (the pager
            # goes on from there without holding puts up).
            floor = self.max_bytes if self._pager is not None else self.low_water_bytes
            self._page_out_locked(self.memory_bytes + size - floor)
        if self.memory_bytes + size > self.max_bytes:
            self.refused += 1
            raise SystemBusyError(
                f"the transient store is full ({self.memory_bytes} bytes in memory, "
                f"{self.scratch_bytes} paged out; transientStoreMaxBytes {self.max_bytes})",
                retry_after_ms=200,
            )

    def _page_out_loop(self) -> None:
        """The pager (``background``): page out a step at a time while memory is above the
        low-water mark; stop early when scratch is full or a write fails (a put wakes it again)."""
        while True:
            self._pager_wake.wait()
            self._pager_wake.clear()
            while True:
                with self._lock:
                    if self._closed:
                        return
                    excess = self.memory_bytes - self.low_water_bytes
                    if excess <= 0 or not self._page_out_locked(min(excess, PAGE_OUT_STEP_BYTES)):
                        break
                time.sleep(PAGE_OUT_PAUSE_S)  # a lock let go and taken straight back starves waiters

    def _page_out_locked(self, wanted: int) -> int:
        """Write the oldest in-memory chunks to scratch, a run of them per system call, until
        ``wanted`` bytes of memory are freed, the scratch bound would be passed, or a write
        fails (logged: the records stay in memory, and a put that still does not fit is
        refused). Returns the bytes freed; the bookkeeping is exact after each run, a short
        write included (the next run starts at the first chunk not wholly written)."""
        freed = 0
        i = max(self._first_in_memory, self._first)
        chunks = self._chunks
        while freed < wanted and i < len(chunks):
            first = chunks[i].data
            if first is None:  # dead: released with records kept in an older chunk
                i += 1
                self._first_in_memory = i
                continue
            if self.scratch_bytes + len(first) > self.scratch_max_bytes:
                break
            try:
                seg = self._segment_for(len(first))
            except OSError as exc:
                log.warning("cannot create a transient scratch file in %s: %s", self.scratch_dir, exc)
                break
            run: list[bytes | memoryview] = []
            size = 0
            j = i
            while j < len(chunks) and freed + size < wanted and len(run) < _MAX_RUN:
                data = chunks[j].data
                if data is None:  # a dead chunk ends the run (the loop above steps over it)
                    break
                room = self.scratch_segment_bytes - seg.written - size
                full = self.scratch_bytes + size + len(data) > self.scratch_max_bytes
                if (run and len(data) > room) or full:
                    break
                run.append(data)
                size += len(data)
                j += 1
            try:
                written = os.pwritev(seg.fd, run, seg.written)
            except OSError as exc:
                log.warning("cannot page transient records out to %s: %s", self.scratch_dir, exc)
                break
            done = 0
            for data in run:
                if done + len(data) > written:
                    break  # a short write: this chunk goes again, from its start
                chunk = chunks[i]
                chunk.data = None
                chunk.segment, chunk.position = seg.number, seg.written + done
                self._paged_count += chunk.held()
                done += len(data)
                seg.live += 1
                i += 1
            seg.written += done
            self._first_in_memory = i
            self.scratch_bytes += done
            self.memory_bytes -= done
            freed += done
            if not done:
                break
        return freed

    def _segment_for(self, size: int) -> _Segment:
        """The scratch segment to write next, with room for ``size`` more bytes (a new one
        when the current one is full; an empty one takes any size). Raises OSError."""
        seg = self._writing
        if seg is None or (seg.written + size > self.scratch_segment_bytes and seg.written):
            number = (max(self._segments) + 1) if self._segments else 0
            seg = _Segment(self.scratch_dir / f"{number:08d}.scratch", number)
            self._segments[number] = self._writing = seg
        return seg

    # -- reading -------------------------------------------------------------------------------------
    def get(self, key: int) -> bytes | None:
        """The record held under ``key``, or None (never held, released, or lost with a
        restart: a removed message)."""
        return self.get_many([key])[0]

    def get_many(self, keys: Iterable[int]) -> list[bytes | None]:
        """:meth:`get` of each key."""
        out: list[bytes | None] = []
        with self._lock:
            firsts, chunks, oldest = self._firsts, self._chunks, self._first
            for key in keys:
                c = bisect.bisect_right(firsts, key, oldest) - 1
                if c < oldest:
                    out.append(None)
                    continue
                chunk = chunks[c]
                i = bisect.bisect_left(chunk.keys, key, chunk.lo, chunk.hi)
                if i == chunk.hi or chunk.keys[i] != key:
                    out.append(None)
                    continue
                start, end = chunk.start_of(i), chunk.ends[i]
                data = chunk.data
                out.append(
                    bytes(data[start:end]) if data is not None else self._read_scratch(chunk, start, end)
                )
        return out

    def _read_scratch(self, chunk: _Chunk, start: int, end: int) -> bytes:
        seg = self._segments[chunk.segment]
        try:
            data = os.pread(seg.fd, end - start, chunk.position + start)
        except OSError as exc:
            raise StoreIOError(f"cannot read a paged-out transient record from {seg.path}: {exc}") from exc
        if len(data) != end - start:
            raise StoreIOError(f"{seg.path} ends inside a paged-out transient record")
        return data

    # -- releasing -----------------------------------------------------------------------------------
    def release_below(self, key: int, keep: Iterable[int] = ()) -> int:
        """Drop every record whose key is below ``key`` (consumed by every group, or their stubs'
        CommitLog segment was deleted) except those under a key in ``keep`` (wanted still: a
        queue nobody has consumed); returns how many were dropped. Scratch segments left without
        records are deleted."""
        kept = sorted({k for k in keep if k < key})
        with self._lock:
            released = 0
            end = bisect.bisect_left(self._firsts, key, self._first)  # chunks starting below key
            for c in range(self._first, end):
                chunk = self._chunks[c]
                if not chunk.held():
                    continue
                cut = bisect.bisect_left(chunk.keys, key, chunk.lo, chunk.hi)
                lo = bisect.bisect_left(kept, chunk.keys[chunk.lo])
                hi = bisect.bisect_left(kept, chunk.keys[cut - 1] + 1) if cut > chunk.lo else lo
                if lo == hi:
                    released += self._keep_locked(chunk, cut, chunk.hi)
                    continue
                wanted = set(kept[lo:hi])
                stay = [i for i in range(chunk.lo, cut) if chunk.keys[i] in wanted]
                released += self._sift_locked(chunk, [*stay, *range(cut, chunk.hi)])
            while self._first < len(self._chunks) and not self._chunks[self._first].held():
                self._first += 1
            self._first_in_memory = max(self._first_in_memory, self._first)
            self._close_emptied_segment_locked()
            self._compact_locked()
            return released

    def truncate_from(self, key: int) -> int:
        """Drop every record whose key is ``key`` or above (the CommitLog was cut there: a
        failover's truncation); returns how many."""
        with self._lock:
            released = 0
            start = max(self._first, bisect.bisect_left(self._firsts, key, self._first) - 1)
            for c in range(start, len(self._chunks)):
                chunk = self._chunks[c]
                cut = bisect.bisect_left(chunk.keys, key, chunk.lo, chunk.hi)
                released += self._keep_locked(chunk, chunk.lo, cut)
            keep = len(self._chunks)
            while keep > self._first and not self._chunks[keep - 1].held():
                keep -= 1
            self._dead -= len(self._chunks) - keep
            del self._chunks[keep:]
            del self._firsts[keep:]
            self._first_in_memory = min(self._first_in_memory, keep)
            self._last_key = min(self._last_key, key - 1)  # the log goes on from the cut
            self._close_emptied_segment_locked()
            return released

    def _keep_locked(self, chunk: _Chunk, lo: int, hi: int) -> int:
        """Keep only records ``lo``..``hi``-1 of ``chunk`` (within what it holds); returns how
        many were dropped. An in-memory chunk is cut to what it keeps, so that memory counts
        only held records; a paged-out one frees its scratch with its segment."""
        dropped = chunk.held() - max(0, hi - lo)
        if not dropped:
            return 0
        self._count -= dropped
        if hi <= lo:
            self._dead += 1
            chunk.lo = chunk.hi = 0
            chunk.keys = chunk.ends = _EMPTY  # a dead chunk may wait long for compaction
            chunk.starts = None
        if chunk.data is None:  # paged out
            self._paged_count -= dropped
            if hi <= lo:
                seg = self._segments[chunk.segment]
                seg.live -= 1
                if seg.live == 0 and seg is not self._writing:
                    self._delete_segment(seg)
            else:
                chunk.lo, chunk.hi = lo, hi
            return dropped
        before = len(chunk.data)
        if hi <= lo:
            chunk.data = None
            self.memory_bytes -= before
            return dropped
        base = chunk.start_of(lo)
        with memoryview(chunk.data) as view:
            chunk.data = bytes(view[base : chunk.ends[hi - 1]])
        chunk.keys = chunk.keys[lo:hi]
        chunk.ends = array("q", [end - base for end in chunk.ends[lo:hi]])
        chunk.lo, chunk.hi = 0, hi - lo
        self.memory_bytes -= before - len(chunk.data)
        return dropped

    def _sift_locked(self, chunk: _Chunk, stay: list[int]) -> int:
        """Keep only records ``stay`` (ascending indexes within what ``chunk`` holds, not one
        run: :meth:`_keep_locked` takes those); returns how many were dropped. In memory the
        buffer is rewritten to hold only those; paged out, they stay where they are in scratch
        (``starts``)."""
        dropped = chunk.held() - len(stay)
        if not dropped:
            return 0
        if not stay:
            return self._keep_locked(chunk, chunk.lo, chunk.lo)
        self._count -= dropped
        keys = array("q", (chunk.keys[i] for i in stay))
        starts = array("q", (chunk.start_of(i) for i in stay))
        ends = array("q", (chunk.ends[i] for i in stay))
        if chunk.data is None:  # paged out
            self._paged_count -= dropped
            chunk.keys, chunk.starts, chunk.ends = keys, starts, ends
        else:
            before = len(chunk.data)
            with memoryview(chunk.data) as view:
                chunk.data = b"".join(view[a:b] for a, b in zip(starts, ends, strict=True))
            chunk.keys = keys
            chunk.ends = array("q", accumulate(b - a for a, b in zip(starts, ends, strict=True)))
            self.memory_bytes -= before - len(chunk.data)
        chunk.lo, chunk.hi = 0, len(stay)
        return dropped

    def _close_emptied_segment_locked(self) -> None:
        if self._writing is not None and self._writing.live == 0:
            self._delete_segment(self._writing)
            self._writing = None

    def _delete_segment(self, seg: _Segment) -> None:
        del self._segments[seg.number]
        self.scratch_bytes -= seg.written
        seg.close_and_delete()

    def _compact_locked(self) -> None:
        """Forget dead chunks once they are half the lists (amortized O(1) per chunk); they
        need not be a prefix (a release that kept records in an older chunk)."""
        if self._dead <= 1024 or self._dead * 2 <= len(self._chunks):
            return
        held = [c.held() > 0 for c in self._chunks]
        self._first_in_memory = sum(held[: self._first_in_memory])
        self._chunks = [c for c, h in zip(self._chunks, held, strict=True) if h]
        self._firsts = [f for f, h in zip(self._firsts, held, strict=True) if h]
        self._first = 0
        self._dead = 0

    # -- state ---------------------------------------------------------------------------------------
    def __len__(self) -> int:
        with self._lock:
            return self._count

    @property
    def paged_out(self) -> int:
        """How many held records are in scratch files."""
        with self._lock:
            return self._paged_count

    def close(self) -> None:
        """Drop everything and delete the scratch files (a transient record never outlives
        its process)."""
        with self._lock:
            self._closed = True
            self._pager_wake.set()
            for seg in list(self._segments.values()):
                self._delete_segment(seg)
            self._writing = None
            self._chunks.clear()
            self._firsts.clear()
            self._first = self._first_in_memory = self._dead = 0
            self._last_key = -1
            self._count = self._paged_count = 0
            self.memory_bytes = 0
        if self._pager is not None and self._pager is not threading.current_thread():
            self._pager.join(10)
