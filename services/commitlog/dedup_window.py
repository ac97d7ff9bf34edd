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

import logging
import os
import struct
import time
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

from libstore import BrokerRole, CommitLog
from libstore.mapped_file import MappedFile
from libstore.record_codec import DispatchRequest, check_record
from libstore.store_paths import config_dir

log = logging.getLogger(__name__)

_MAGIC = b"MQDW1"
_TAG = struct.Struct(">H32sqq")  # id length, log id (padded), generation, log end offset
_ENTRY = struct.Struct(">Hqiqq")  # key length, phy offset, size, queue offset, store time
MAX_CATCH_UP_BYTES = 256 * 1024 * 1024  # past a saved window, at most this much log is scanned
SAVE_INTERVAL_S = 10.0  # how often a running master saves its window (services.embedded)


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


class DedupWindow:
    """``capacity`` keys at most, each kept ``ttl_ms``."""

    def __init__(self, capacity: int = 200_000, ttl_ms: int = 120_000) -> None:
        self.capacity = capacity
        self.ttl_ms = ttl_ms
        self._entries: OrderedDict[str, Placed] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, topic: str, uniq_key: str) -> Placed | None:
        placed = self._entries.get(topic + "#" + uniq_key)
        if placed is None:
            return None
        if placed.store_timestamp < time.time_ns() // 1_000_000 - self.ttl_ms:
            return None
        return placed

    def get_many(self, topics: list[str], uniq_keys: list[str | None]) -> dict[int, Placed]:
        """The hits of a batch: {index: where record ``index``'s key went}, for the records
        whose UNIQ_KEY (``uniq_keys[i]``, None for none) is in the window."""
        entries = self._entries
        if not entries:
            return {}
        since = time.time_ns() // 1_000_000 - self.ttl_ms
        hits: dict[int, Placed] = {}
        for i, (topic, uniq) in enumerate(zip(topics, uniq_keys, strict=True)):
            if uniq:
                placed = entries.get(topic + "#" + uniq)
                if placed is not None and placed.store_timestamp >= since:
                    hits[i] = placed
        return hits

    def put_many(
        self,
        topics: list[str],
        uniq_keys: list[str | None],
        phy_offsets: list[int],
        sizes: list[int],
        queue_offsets: list[int],
        store_timestamp: int,
    ) -> None:
        """:meth:`put` for the first ``len(phy_offsets)`` records of a batch (those without a
        UNIQ_KEY are skipped), all stored at ``store_timestamp`` (ms)."""
        entries = self._entries
        make = tuple.__new__  # Placed(...) without its Python-level __new__, once per record
        # strict=False: the batch's lists may be longer than the records appended (phy_offsets)
        rows = zip(topics, uniq_keys, phy_offsets, sizes, queue_offsets, strict=False)
        for topic, uniq, phy, size, queue_offset in rows:
            if uniq:
                key = topic + "#" + uniq
                held = len(entries)
                entries[key] = make(Placed, (phy, size, queue_offset, store_timestamp))
                if len(entries) == held:  # a re-put (rare: fresh records missed the window)
                    entries.move_to_end(key)
        for _ in range(len(entries) - self.capacity):
            entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def put(self, topic: str, uniq_key: str, placed: Placed) -> None:
        entries = self._entries
        key = topic + "#" + uniq_key
        entries[key] = placed
        entries.move_to_end(key)
        while len(entries) > self.capacity:
            entries.popitem(last=False)

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

    def snapshot(self) -> list[tuple[str, Placed]]:
        """The entries, oldest first (a copy: written out on another thread, see :func:`write_window`)."""
        return list(self._entries.items())

    def save(self, path: Path, log_id: str, generation: int, end_offset: int) -> int:
        """Write the window to ``path`` (see :func:`write_window`). Returns how many keys were
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
        tag = self._read(path)
        if tag is None:
            return None
        saved_id, saved_generation, saved_end, entries = tag
        end = log.max_offset
        if saved_id != gen.log_id.encode()[:32] or saved_end > end or end - saved_end > max_scan_bytes:
            return None
        cut = (
            gen.divergence_point(gen.log_id, saved_generation) if saved_generation != gen.generation else None
        )
        if cut is not None and cut < saved_end:
            return None  # the log lost bytes the window points at
        self.clear()
        for key, placed in entries[-self.capacity :]:
            self._entries[key] = placed
        since = time.time_ns() // 1_000_000 - self.ttl_ms
        for req in log.scan_records(saved_end, end, decode_properties=True):
            if req.success and req.msg_size and req.uniq_key and req.store_timestamp >= since:
                self.put(req.topic, req.uniq_key, Placed.of(req))
        return end - saved_end

    def _read(self, path: Path) -> tuple[bytes, int, int, list[tuple[str, Placed]]] | None:
        """(log id, generation, end offset, entries younger than ``ttl_ms``) from a saved window."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("dedup window %s unreadable (%s): rebuilding it from the log", path, exc)
            return None
        try:
            if not data.startswith(_MAGIC):
                raise ValueError("not a saved window")
            pos = len(_MAGIC)
            id_len, ident, saved_generation, saved_end = _TAG.unpack_from(data, pos)
            pos += _TAG.size
            since = time.time_ns() // 1_000_000 - self.ttl_ms
            entries: list[tuple[str, Placed]] = []
            while pos < len(data):
                key_len, phy, size, queue_offset, stored = _ENTRY.unpack_from(data, pos)
                pos += _ENTRY.size
                key = data[pos : pos + key_len].decode()
                pos += key_len
                if stored >= since:
                    entries.append((key, Placed(phy, size, queue_offset, stored)))
        except (ValueError, struct.error, UnicodeDecodeError) as exc:
            log.warning("dedup window %s is damaged (%s): rebuilding it from the log", path, exc)
            return None
        return ident[:id_len], saved_generation, saved_end, entries


def write_window(
    path: Path, entries: list[tuple[str, Placed]], log_id: str, generation: int, end_offset: int
) -> int:
    """Write ``entries`` to ``path`` (atomically: a temporary file, fsynced, then renamed), tagged
    with the log they describe: its id, generation and end offset (every record before that end
    has its key in the window, as far as the window holds keys). Returns how many keys were
    written. Raises OSError."""
    ident = log_id.encode()[:32]
    parts = [_MAGIC, _TAG.pack(len(ident), ident, generation, end_offset)]
    for key, placed in entries:
        raw = key.encode()
        parts.append(
            _ENTRY.pack(len(raw), placed.phy_offset, placed.size, placed.queue_offset, placed.store_timestamp)
        )
        parts.append(raw)
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as fh:
        fh.write(b"".join(parts))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return len(entries)


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
