"""DedupWindow: recent UNIQ_KEYs and where their messages went, so a retried Append (the reply
was lost, the client sent the batch again) returns the first result instead of storing twice.

Bounded by count (oldest dropped first) and age. It survives a restart, so a retry that
straddles a commitlog restart is still caught; beyond the window the guarantee is at-least-once,
and consumers can de-duplicate on UNIQ_KEY:

* a running master saves it every SAVE_INTERVAL_S seconds and a clean shutdown once more
  (:func:`write_window`, ``config/dedupWindow.bin``, tagged with the log's id, generation and
  the end offset it covers); the next start takes it (:meth:`catch_up`) when the log still holds
  everything it describes (nothing at or before that end cut since, by the log's generation
  history) and scans only what was appended after it: nothing after a clean shutdown, about
  ten seconds of appends after a crash, whatever the log's size;
* otherwise (no usable file; a slave, which saves none) :meth:`prefill` reads the newest
  segments back to front, one at a time, and stops once it holds ``capacity`` keys or meets
  records older than the window: at most the window's worth of records plus one segment.

Thread-safety: used from the commitlog service's event loop only.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import os
import struct
import time
from array import array
from pathlib import Path
from typing import NamedTuple

import numpy as np

from libstore import BrokerRole, CommitLog
from libstore.dispatch_request import DispatchRequest
from libstore.mapped_file import MappedFile
from libstore.record_codec import check_record, native
from libstore.store_paths import config_dir

log = logging.getLogger(__name__)

_MAGIC = b"MQDW2"
# Keys serialised per step by write_window (~0.5 ms of CPU). After each step the writer releases
# the GIL (time.sleep(0)), so an event loop waiting for it can take it then, not only when the
# interpreter's 5 ms switch interval forces a hand-over. With 8,192-key steps and no release, a
# save (~45 ms of CPU for 200,000 keys) halved the loop's pace for ~100 ms every
# SAVE_INTERVAL_S: the produce latency spikes of 40-100 ms at 20,000 msgs/s offered.
_SLICE = 2048
# Slots copied per event-loop turn by DedupWindow.snapshot_async (~0.3 ms of the loop's time;
# copying all 200,000 keys at once held the loop for ~5 ms every SAVE_INTERVAL_S).
_COPY_SLICE = 8192
_TAG = struct.Struct(">H32sqqI")  # id length, log id (padded), generation, log end offset, slots
MAX_CATCH_UP_BYTES = 256 * 1024 * 1024  # past a saved window, at most this much log is scanned
SAVE_INTERVAL_S = 10.0  # how often a running master saves its window (services.embedded)
# put_many writes a batch column by column from this many records on; a smaller one (a message
# of the message path: 1) is cheaper record by record than building the columns (2.3 us vs 4.7).
_COLUMN_RUN_MIN = 16
_EXT = native()
_EMPTY_SLOT = b"\xff" * 8  # a free slot of _NativeIndex's table (ring slot 0xFFFFFFFF)


def window_keys(topics: list[str], uniq_keys: list[str | None]) -> list[str | None]:
    """The window's keys (``topic#UNIQ_KEY``) of a batch's records, None where a record has
    no UNIQ_KEY; built in C loops when every record has one (one topic: one concatenation each)."""
    if topics and all(uniq_keys):
        if topics.count(topics[0]) == len(topics):
            return list(map((topics[0] + "#").__add__, uniq_keys))  # type: ignore[arg-type]
        return list(map(operator.add, map(operator.add, topics, itertools.repeat("#")), uniq_keys))
    return [topic + "#" + uniq if uniq else None for topic, uniq in zip(topics, uniq_keys, strict=True)]


def window_path(root: Path) -> Path:
    """Where a clean shutdown leaves the window of the CommitLog rooted at ``root``."""
    return config_dir(root) / "dedupWindow.bin"


class Placed(NamedTuple):
    """Where a message went: CommitLog offset and size (bytes), queue offset, store time (ms)."""

    phy_offset: int
    size: int
    queue_offset: int
    store_timestamp: int

    @classmethod
    def of(cls, req: DispatchRequest) -> Placed:
        """Where the record ``req`` describes went."""
        return cls(req.commit_log_offset, req.msg_size, req.consume_queue_offset, req.store_timestamp)


class _DictIndex:
    """Which ring slot holds each key's newest put, as a dict (the reference for _NativeIndex,
    and the index where the C extension is not built)."""

    def __init__(self) -> None:
        # None (a record without a key) is never put in, and is looked up as any key is (found
        # nowhere), so that lookups stay C loops.
        self._slot: dict[str | None, int] = {}

    def __len__(self) -> int:
        return len(self._slot)

    def find(self, keys: list[str | None], ring_keys: list[str | None]) -> list[int | None]:
        """The ring slot of each of ``keys``' newest put, None where it has none."""
        return list(map(self._slot.get, keys))

    def put(self, keys: list[str], start: int, ring_keys: list[str | None]) -> None:
        """Write ``keys`` into ring slots ``start``, ``start + 1``, ... (wrapping around): each
        slot's old key leaves the index unless its newest put is elsewhere, and each new key
        points at its slot (a key put again moves to its newest)."""
        index = self._slot
        cap, n = len(ring_keys), len(keys)
        if n >= _COLUMN_RUN_MIN and start + n <= cap:  # the same outcome, in C loops
            olds = ring_keys[start : start + n]
            evicted = map(operator.eq, map(index.get, olds), range(start, start + n))
            for old in itertools.compress(olds, evicted):
                del index[old]
            ring_keys[start : start + n] = keys
            index.update(zip(keys, range(start, start + n), strict=True))
            return
        for j, key in enumerate(keys):
            slot = (start + j) % cap
            old = ring_keys[slot]
            if old is not None and index.get(old) == slot:
                del index[old]
            ring_keys[slot] = key
            index[key] = slot

    def clear(self) -> None:
        self._slot.clear()


class _NativeIndex:
    """_DictIndex in C (libstore._codec's dedup_find and dedup_put): an open-addressing table
    of (hash tag, ring slot) pairs at most half full, where a lookup that misses, as nearly every
    lookup does, reads one or two adjacent slots instead of probing a dict of the window's keys
    and the dummies its deletions leave. Batches of 256 fresh keys against a full window of
    200,000: to find 0.26 us a key against the dict's 0.68, to put 0.47 against 0.81 (columns
    included); the embedded suite's produce, 2 clients x 4 batches of 256 in flight, 6
    interleaved rounds: 78,838 -> 90,944 msgs/s, 13.8 -> 12.0 server us a message. The ring's
    key column stays the truth: a tag that matches is confirmed against the key there."""

    def __init__(self, capacity: int) -> None:
        slots = 2
        while slots < 2 * capacity:
            slots *= 2
        self._table = bytearray(_EMPTY_SLOT * slots)
        self._tags = bytearray(4 * capacity)  # each ring slot's key's tag, for its eviction
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def find(self, keys: list[str | None], ring_keys: list[str | None]) -> list[int | None]:
        return _EXT.dedup_find(self._table, keys, ring_keys)

    def put(self, keys: list[str], start: int, ring_keys: list[str | None]) -> None:
        self._count += _EXT.dedup_put(self._table, keys, start, ring_keys, self._tags)

    def clear(self) -> None:
        self._table[:] = _EMPTY_SLOT * (len(self._table) // len(_EMPTY_SLOT))
        self._count = 0


class DedupWindow:
    """``capacity`` keys at most, each kept ``ttl_ms``.

    Held as a ring of ``capacity`` slots (parallel columns: keys in a list, CommitLog offset,
    size, queue offset and store time in int64 arrays) and an index from key to the slot of its
    newest put (:class:`_NativeIndex`, or :class:`_DictIndex` without the C extension); writing
    a slot drops the key that slot held unless that key has a newer slot. Two reasons over an
    ordered dict of tuples: the copy taken for saving is one list copy and four memcpys (about
    a millisecond on the event loop, not tens), and nothing in it is an object the garbage
    collector tracks, so a full window adds nothing to each full collection. ``native``: use
    the C index (default: when the extension is built)."""

    def __init__(self, capacity: int = 200_000, ttl_ms: int = 120_000, *, native: bool | None = None) -> None:
        self.capacity = capacity
        self.ttl_ms = ttl_ms
        use_native = _EXT is not None if native is None else native
        if use_native and _EXT is None:
            raise RuntimeError("the C extension (libstore._codec) is not built")
        self._index: _DictIndex | _NativeIndex = _NativeIndex(capacity) if use_native else _DictIndex()
        self._head = 0  # sequence number of the next slot written (slot: head % capacity)
        self._keys: list[str | None] = [None] * capacity
        self._phy, self._size, self._qoff, self._ts = (array("q", bytes(8 * capacity)) for _ in range(4))
        self._clears = 0  # how many times clear() ran (a copy spanning one is discarded)

    def __len__(self) -> int:
        return len(self._index)

    @property
    def version(self) -> tuple[int, int]:
        """Changes whenever the window does (a put, a clear): equal versions, equal windows."""
        return self._head, self._clears

    def _placed(self, slot: int) -> Placed:
        return Placed(self._phy[slot], self._size[slot], self._qoff[slot], self._ts[slot])

    def get(self, topic: str, uniq_key: str) -> Placed | None:
        slot = self._index.find([topic + "#" + uniq_key], self._keys)[0]
        if slot is None or self._ts[slot] < time.time_ns() // 1_000_000 - self.ttl_ms:
            return None
        return self._placed(slot)

    def get_many(
        self, topics: list[str], uniq_keys: list[str | None], keys: list[str | None] | None = None
    ) -> dict[int, Placed]:
        """The hits of a batch: {index: where record ``index``'s key went}, for the records
        whose UNIQ_KEY (``uniq_keys[i]``, None for none) is in the window. ``keys``: the
        batch's :func:`window_keys` when the caller has them already (they are not built again;
        :meth:`put_many` takes them too)."""
        if not len(self._index):
            return {}
        since = time.time_ns() // 1_000_000 - self.ttl_ms
        # A batch that is no retry (nearly all) ends here.
        slots = self._index.find(window_keys(topics, uniq_keys) if keys is None else keys, self._keys)
        if slots.count(None) == len(slots):
            return {}
        ts = self._ts
        return {
            i: self._placed(slot) for i, slot in enumerate(slots) if slot is not None and ts[slot] >= since
        }

    def put_many(
        self,
        topics: list[str],
        uniq_keys: list[str | None],
        phy_offsets: list[int],
        sizes: list[int],
        queue_offsets: list[int],
        store_timestamp: int,
        keys: list[str | None] | None = None,
    ) -> None:
        """:meth:`put` for the first ``len(phy_offsets)`` records of a batch (those without a
        UNIQ_KEY are skipped), all stored at ``store_timestamp`` (ms). ``keys``: the batch's
        :func:`window_keys`, when the caller has them (as for :meth:`get_many`)."""
        cap = self.capacity
        if cap <= 0:
            return
        n = len(phy_offsets)
        batch_keys = window_keys(topics[:n], uniq_keys[:n]) if keys is None else keys[:n]
        n = len(batch_keys)  # (never more offsets than records)
        phy_offsets, sizes, queue_offsets = phy_offsets[:n], sizes[:n], queue_offsets[:n]
        if not all(batch_keys):
            rows = [i for i, key in enumerate(batch_keys) if key]
            batch_keys = [batch_keys[i] for i in rows]
            phy_offsets = [phy_offsets[i] for i in rows]
            sizes = [sizes[i] for i in rows]
            queue_offsets = [queue_offsets[i] for i in rows]
        m = len(batch_keys)
        if m > cap:  # only the last ``capacity`` stay: the rest would be overwritten here
            skip = m - cap
            batch_keys, phy_offsets = batch_keys[skip:], phy_offsets[skip:]
            sizes, queue_offsets = sizes[skip:], queue_offsets[skip:]
            self._head += skip
            m = cap
        if not m:
            return
        start = self._head % cap
        self._index.put(batch_keys, start, self._keys)  # type: ignore[arg-type]
        if m < _COLUMN_RUN_MIN:
            phys, size_col, qoffs, ts = self._phy, self._size, self._qoff, self._ts
            for j in range(m):
                slot = (start + j) % cap
                phys[slot] = phy_offsets[j]
                size_col[slot] = sizes[j]
                qoffs[slot] = queue_offsets[j]
                ts[slot] = store_timestamp
        else:
            first = min(m, cap - start)
            self._write_columns(
                start, phy_offsets[:first], sizes[:first], queue_offsets[:first], store_timestamp
            )
            if first < m:
                self._write_columns(
                    0, phy_offsets[first:], sizes[first:], queue_offsets[first:], store_timestamp
                )
        self._head += m

    def _write_columns(self, at: int, phys: list[int], sizes: list[int], qoffs: list[int], ts: int) -> None:
        n = len(phys)
        self._phy[at : at + n] = array("q", phys)
        self._size[at : at + n] = array("q", sizes)
        self._qoff[at : at + n] = array("q", qoffs)
        self._ts[at : at + n] = array("q", (ts,)) * n

    def clear(self) -> None:
        self._index.clear()
        self._head = 0
        self._keys = [None] * self.capacity
        self._clears += 1

    def put(self, topic: str, uniq_key: str, placed: Placed) -> None:
        self.put_many([topic], [uniq_key], [placed[0]], [placed[1]], [placed[2]], placed[3])

    def prefill(self, log: CommitLog) -> int:
        """Load the keys of records stored within the window from the log's newest segments,
        newest segment first, until ``capacity`` keys are held or a segment starts with a record
        older than the window (module doc). Returns how many were loaded."""
        queue = log.queue
        if queue is None or not queue.mapped_files or self.capacity <= 0:
            return 0
        since = time.time_ns() // 1_000_000 - self.ttl_ms
        files = queue.mapped_files
        end = log.max_offset
        per_segment: list[list[tuple[str, str, Placed]]] = []
        held = 0
        for mf in reversed(files):
            start = mf.file_from_offset
            if start >= end:
                continue
            found = []
            for req in log.scan_records(start, min(end, start + mf.file_size), decode_properties=True):
                if req.success and req.msg_size and req.uniq_key and req.store_timestamp >= since:
                    found.append((req.topic, req.uniq_key, Placed.of(req)))
            per_segment.append(found)
            held += len(found)
            if held >= self.capacity or _first_store_timestamp(mf) < since:
                break
        self.clear()
        for found in reversed(per_segment):  # oldest first: the newest stay when capacity bites
            for topic, uniq, placed in found:
                self.put(topic, uniq, placed)
        return min(held, self.capacity)

    def snapshot(self) -> WindowCopy:
        """A copy of the slots, to be written out on another thread (see :func:`write_window`):
        cheap enough for the event loop."""
        return WindowCopy(self._head, self._keys[:], self._phy[:], self._size[:], self._qoff[:], self._ts[:])

    async def snapshot_async(self) -> WindowCopy | None:
        """:meth:`snapshot` taken _COPY_SLICE slots per turn of the event loop (this method's
        caller's), so puts go on meanwhile. Each slot is copied whole (key and columns in one
        step); slots overwritten before their turn hold records put after the call began,
        replacing the oldest keys as they do in the window itself. So the copy holds the keys
        of every record before the log's end at the call (read it before awaiting this) as far
        as the window held them then, plus possibly some later ones, which
        :func:`write_window` leaves out. None when :meth:`clear` ran meanwhile (the log was
        cut: the copy would mix what it held before and after)."""
        clears, head, cap = self._clears, self._head, self.capacity
        keys: list[str | None] = [None] * cap
        phy, size, qoff, ts = (array("q", bytes(8 * cap)) for _ in range(4))
        for lo in range(0, cap, _COPY_SLICE):
            if lo:
                await asyncio.sleep(0)
                if self._clears != clears:
                    return None
            hi = min(cap, lo + _COPY_SLICE)
            keys[lo:hi] = self._keys[lo:hi]
            phy[lo:hi] = self._phy[lo:hi]
            size[lo:hi] = self._size[lo:hi]
            qoff[lo:hi] = self._qoff[lo:hi]
            ts[lo:hi] = self._ts[lo:hi]
        return WindowCopy(head, keys, phy, size, qoff, ts)

    def save(self, path: Path, log_id: str, generation: int, end_offset: int) -> int:
        """Write the window to ``path`` (see :func:`write_window`). Returns how many slots were
        written. Raises OSError."""
        return write_window(path, self.snapshot(), log_id, generation, end_offset)

    def catch_up(self, path: Path, log: CommitLog, max_scan_bytes: int = MAX_CATCH_UP_BYTES) -> int | None:
        """Take the window last saved at ``path`` (periodically or at a clean shutdown) when the
        log still holds everything it describes, then add the keys of the records appended since
        (a scan of at most ``max_scan_bytes``). Returns the bytes scanned, or None when the file
        is missing, unreadable, of another log, describes bytes a cut has since removed, or is
        too far behind (the caller then falls back to :meth:`prefill`)."""
        gen = log.generation
        if gen is None:
            return None
        saved = self._read(path)
        if saved is None:
            return None
        saved_id, saved_generation, saved_end, columns = saved
        end = log.max_offset
        if saved_id != gen.log_id.encode()[:32] or saved_end > end or end - saved_end > max_scan_bytes:
            return None
        cut = (
            gen.divergence_point(gen.log_id, saved_generation) if saved_generation != gen.generation else None
        )
        if cut is not None and cut < saved_end:
            return None  # the log lost bytes the window points at
        self._load(*columns)
        since = time.time_ns() // 1_000_000 - self.ttl_ms
        # Retention may have deleted the head of the log past the saved end since: what it
        # deleted needs no keys; the scan starts at the first record kept.
        for req in log.scan_records(max(saved_end, log.min_offset), end, decode_properties=True):
            if req.success and req.msg_size and req.uniq_key and req.store_timestamp >= since:
                self.put(req.topic, req.uniq_key, Placed.of(req))
        return end - saved_end

    def _load(self, keys: list[str], phy: list[int], size: list[int], qoff: list[int], ts: list[int]) -> None:
        """Hold exactly these slots (oldest first; the newest ``capacity`` when there are more)."""
        self.clear()
        n = min(len(keys), self.capacity)
        if n <= 0:
            return
        self._index.put(keys[-n:], 0, self._keys)  # a repeated key: its newest slot
        self._phy[:n] = array("q", phy[-n:])
        self._size[:n] = array("q", size[-n:])
        self._qoff[:n] = array("q", qoff[-n:])
        self._ts[:n] = array("q", ts[-n:])
        self._head = n

    def _read(self, path: Path) -> tuple[bytes, int, int, _Columns] | None:
        """(log id, generation, end offset, the slots younger than ``ttl_ms``, oldest first)
        from a saved window."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("dedup window %s unreadable (%s): rebuilding it from the log", path, exc)
            return None
        if not data.startswith(_MAGIC):
            log.info("dedup window %s is not in this version's format: rebuilding it from the log", path)
            return None
        try:
            pos = len(_MAGIC)
            id_len, ident, saved_generation, saved_end, n = _TAG.unpack_from(data, pos)
            pos += _TAG.size
            lengths = np.frombuffer(data, "<i4", n, pos)
            pos += 4 * n
            phy, size, qoff, ts = (np.frombuffer(data, "<i8", n, pos + 8 * n * c) for c in range(4))
            pos += 32 * n
            text = data[pos:].decode("utf-8", "surrogatepass")
            if n and (int(lengths.min()) < 0 or int(lengths.sum()) != len(text)):
                raise ValueError("key lengths do not match the keys")
        except (ValueError, struct.error, UnicodeDecodeError) as exc:
            log.warning("dedup window %s is damaged (%s): rebuilding it from the log", path, exc)
            return None
        ends = np.cumsum(lengths).tolist()
        starts = [0, *ends[:-1]]
        since = time.time_ns() // 1_000_000 - self.ttl_ms
        young = np.flatnonzero(ts >= since).tolist()
        keys = [text[starts[i] : ends[i]] for i in young]
        columns = (keys, *(col[young].tolist() for col in (phy, size, qoff, ts)))
        return ident[:id_len], saved_generation, saved_end, columns


_Columns = tuple[list[str], list[int], list[int], list[int], list[int]]


class WindowCopy(NamedTuple):
    """A copy of a DedupWindow's slots (:meth:`DedupWindow.snapshot`): the next sequence number
    and the five ring columns as they were."""

    head: int
    keys: list[str | None]
    phy: array[int]
    size: array[int]
    qoff: array[int]
    ts: array[int]

    def spans(self) -> list[tuple[int, int]]:
        """The written slots as index ranges [start, end) of the ring, oldest first."""
        cap = len(self.keys)
        n = min(self.head, cap)
        if n < cap:
            return [(0, n)] if n else []
        start = self.head % cap
        return [(start, cap), (0, start)] if start else [(0, cap)]

    def columns(self) -> _Columns:
        """The written slots, oldest first: (keys, offsets, sizes, queue offsets, store times)."""
        spans = self.spans()
        keys = [k for a, b in spans for k in self.keys[a:b]]
        nums = ([v for a, b in spans for v in col[a:b]] for col in (self.phy, self.size, self.qoff, self.ts))
        return (keys, *nums)  # type: ignore[return-value]


def write_window(
    path: Path, window: WindowCopy, log_id: str, generation: int, end_offset: int, *, release: bool = False
) -> int:
    """Write ``window`` to ``path`` (atomically: a temporary file, fsynced, then renamed), tagged
    with the log it describes: its id, generation and end offset (every record before that end
    has its key in the window, as far as the window holds keys). Layout: ``MQDW2``, the tag
    (id length, id padded to 32 bytes, generation, end offset, slot count n; big-endian), the
    key lengths in characters (n little-endian int32), the CommitLog offsets, sizes, queue
    offsets and store times (4 x n little-endian int64), then the keys, UTF-8, back to back.
    Slots of records that end past ``end_offset`` are left out (a copy taken while puts went
    on can hold some: a start that cuts the log back to that end must not take their keys).
    With ``release``, ``window.keys`` is emptied afterwards. Returns how many slots were
    written. Raises OSError.

    Meant for a thread beside the event loop (the periodic save): every step that holds the GIL
    is a slice of at most _SLICE keys, with the GIL released after each. Copying or freeing
    the 200,000 keys in one go holds it for ~5 ms each, which the loop then waits out in 5 ms
    switch intervals (produce latency spikes of 10-15 ms at every save, 20,000 msgs/s offered);
    so the keys are not copied to leave out late slots, and ``release`` frees them here, a
    slice at a time, not when the loop drops its reference."""
    spans = window.spans()
    kept = [_kept_mask(window, a, b, end_offset) for a, b in spans]
    n = sum(b - a if mask is None else int(mask.sum()) for (a, b), mask in zip(spans, kept, strict=True))
    ident = log_id.encode()[:32]
    parts = [_MAGIC, _TAG.pack(len(ident), ident, generation, end_offset, n)]
    lengths: list[bytes] = []
    text: list[bytes] = []
    for (a, b), mask in zip(spans, kept, strict=True):
        for lo in range(a, b, _SLICE):
            hi = min(b, lo + _SLICE)
            chunk = window.keys[lo:hi]
            picked = None if mask is None else mask[lo - a : hi - a]
            if picked is not None and not picked.all():
                chunk = list(itertools.compress(chunk, picked.tolist()))
            lengths.append(np.fromiter(map(len, chunk), "<i4", len(chunk)).tobytes())  # type: ignore[arg-type]
            text.append("".join(chunk).encode("utf-8", "surrogatepass"))  # type: ignore[arg-type]
            time.sleep(0)
    parts.extend(lengths)
    for col in (window.phy, window.size, window.qoff, window.ts):
        for (a, b), mask in zip(spans, kept, strict=True):
            values = np.frombuffer(col, "=i8", b - a, 8 * a)
            parts.append((values if mask is None else values[mask]).astype("<i8").tobytes())
    parts.extend(text)
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as fh:
        for part in parts:  # not joined first: one more copy of ~10 MB under the GIL
            fh.write(part)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    if release:
        keys = window.keys
        while keys:
            del keys[-_SLICE:]
            time.sleep(0)
    return n


def _kept_mask(window: WindowCopy, a: int, b: int, end_offset: int) -> np.ndarray | None:
    """Which of ring slots ``a``..``b``-1 hold records ending by ``end_offset`` (a boolean
    array); None when all of them do."""
    ends = np.frombuffer(window.phy, "=i8", b - a, 8 * a) + np.frombuffer(window.size, "=i8", b - a, 8 * a)
    mask = ends <= end_offset
    return None if mask.all() else mask


def _first_store_timestamp(mf: MappedFile) -> int:
    req = check_record(mf.buffer, 0, mf.readable_position, check_crc=False, decode_properties=False)
    return req.store_timestamp if req.success and req.msg_size else -1


def restore_window(window: DedupWindow, commit_log: CommitLog) -> tuple[int, str]:
    """Fill ``window`` for a starting ``commit_log``: the window last saved (at a clean shutdown,
    or periodically while running) caught up with what was appended since, when the log still
    holds what it describes; else a :meth:`DedupWindow.prefill` scan. Returns (keys held, how:
    "saved", "saved + N bytes scanned" or "scanned")."""
    scanned = window.catch_up(window_path(commit_log.root), commit_log)
    if scanned is None:
        return window.prefill(commit_log), "scanned"
    return len(window), "saved" if scanned == 0 else f"saved + {scanned} bytes scanned"


def persist_window(window: DedupWindow, commit_log: CommitLog) -> int:
    """Save ``window`` beside ``commit_log`` at a clean shutdown (call it once puts have
    stopped, before the log closes). A SLAVE saves nothing: records it replicated never passed
    through its window, so a later start scans. Returns how many keys were saved."""
    gen = commit_log.generation
    if gen is None or commit_log.broker_role is BrokerRole.SLAVE:
        return 0
    return window.save(window_path(commit_log.root), gen.log_id, gen.generation, commit_log.max_offset)
