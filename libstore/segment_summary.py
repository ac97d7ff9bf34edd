"""SegmentSummary: which topics a CommitLog segment holds, so retention decides without a scan.

Per segment: each topic present, with the store time (ms) of its newest record there and the
physical offset of its last record. Records that take no queue offset (transaction PREPARED and
ROLLBACK) are summarised under :data:`UNQUEUED`, which always follows the store-wide
``fileReservedTime`` (libstore.retention_policy).

Maintenance:

- A master notes every run of records it appends (:meth:`SegmentSummaries.note`, under the put
  lock: the run's distinct topics; nothing else per record).
- What was not noted is a *gap* to scan: a slave's replicated bytes (:meth:`note_replicated`),
  and after a restart what was appended since the summary was last saved. The cleanup service
  scans gaps in its own thread (:meth:`fill_gaps`) before it decides; a segment whose gap
  cannot be read stays incomplete and falls back to its mtime, as RocketMQ decides.
- Saved as JSON, one file per segment under ``<root>/segmentsummary/<20-digit start>.json``,
  whenever changed, by the cleanup service (every ``cleanResourceInterval``) and at shutdown;
  :meth:`reconcile` after recovery turns whatever the files miss into gaps.
- A cut of the log keeps the summary of the cut segment as it was (a superset: retention can
  only keep it longer); segments deleted or dropped lose theirs.

Thread-safety: every method may be called from any thread (one lock per instance).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from libstore._files import atomic_write, read_json
from libstore.errors import StoreIOError

log = logging.getLogger(__name__)

UNQUEUED = ""  # the summary's name for records without a queue offset (tx PREPARED/ROLLBACK)
_NAME_WIDTH = 20


class SegmentSummary:
    """One segment's summary. ``topics`` maps a topic to ``[newest store ms, last record's
    offset]``; ``noted_to`` is the absolute offset up to which appends were noted; ``gap`` an
    absolute range [from, to) not summarised yet (None: complete)."""

    __slots__ = ("dirty", "epoch", "gap", "noted_to", "start", "topics")

    def __init__(self, start: int, noted_to: int | None = None) -> None:
        self.start = start
        self.topics: dict[str, list[int]] = {}
        self.noted_to = start if noted_to is None else noted_to
        self.gap: tuple[int, int] | None = None
        self.dirty = True
        self.epoch = 0  # bumped by a cut: a scan that started before it is thrown away

    @property
    def complete(self) -> bool:
        return self.gap is None

    def merge(self, topic: str, store_ms: int, offset: int) -> None:
        entry = self.topics.get(topic)
        if entry is None:
            self.topics[topic] = [store_ms, offset]
            return
        if store_ms > entry[0]:
            entry[0] = store_ms
        if offset > entry[1]:
            entry[1] = offset

    def widen_gap(self, start: int, end: int) -> None:
        """Add [start, end) to the gap (one range covering both when they are apart: scanning
        a noted stretch twice changes nothing)."""
        if end <= start:
            return
        self.gap = (start, end) if self.gap is None else (min(self.gap[0], start), max(self.gap[1], end))

    def to_json(self) -> dict[str, object]:
        return {"start": self.start, "noted_to": self.noted_to, "gap": self.gap, "topics": self.topics}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SegmentSummary:
        """Raises KeyError, TypeError or ValueError for a summary not written by :meth:`to_json`."""
        out = cls(int(raw["start"]), int(raw["noted_to"]))
        gap = raw.get("gap")
        if gap is not None:
            a, b = gap
            out.gap = (int(a), int(b))
        topics = raw.get("topics") or {}
        out.topics = {str(k): [int(v[0]), int(v[1])] for k, v in topics.items()}
        out.dirty = False
        return out


class SegmentSummaries:
    """The summaries of one CommitLog's segments, saved under ``directory`` (module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._lock = threading.Lock()
        # Held while a file is written or removed, so a save racing a cut or a drop never
        # brings back the file of a summary that is gone (taken before _lock, never after).
        self._file_lock = threading.Lock()
        self._by_start: dict[int, SegmentSummary] = {}
        self._loaded: dict[int, SegmentSummary] = {}

    # -- load and save -----------------------------------------------------------------------------
    def load(self) -> None:
        """Read the saved summaries (unreadable ones are rebuilt by a scan, with a warning)."""
        self._loaded = {}
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob("*.json")):
            try:
                raw = read_json(path, "segment summary")
                summary = SegmentSummary.from_json(raw)
            except (StoreIOError, KeyError, TypeError, ValueError) as exc:
                log.warning("segment summary %s unreadable, the segment is scanned again: %s", path, exc)
                continue
            self._loaded[summary.start] = summary

    def reconcile(self, segments: Sequence[tuple[int, int]]) -> None:
        """Match the summaries to the recovered log: ``segments`` gives (start, readable end) of
        each segment, oldest first. What the saved summaries do not cover becomes a gap; files of
        segments that are gone are removed."""
        with self._lock:
            kept: dict[int, SegmentSummary] = {}
            for start, end in segments:
                summary = self._loaded.pop(start, None) or SegmentSummary(start)
                if summary.gap is not None:
                    a, b = summary.gap
                    summary.gap = (a, min(b, end)) if a < end else None
                if summary.noted_to > end:
                    summary.noted_to = end
                summary.widen_gap(summary.noted_to, end)
                summary.noted_to = end
                summary.dirty = True
                kept[start] = summary
            stale, self._loaded = list(self._loaded), {}
            self._by_start = kept
        for start in stale:
            self._remove_file(start)

    def save_dirty(self) -> int:
        """Write every summary changed since it was last written; returns how many. Raises
        StoreIOError."""
        with self._lock:
            pending = [
                (s.start, json.dumps(s.to_json()).encode()) for s in self._by_start.values() if s.dirty
            ]
            for summary in self._by_start.values():
                summary.dirty = False
        for start, data in pending:
            try:
                with self._file_lock:
                    with self._lock:
                        gone = start not in self._by_start
                    if not gone:
                        atomic_write(self._path(start), data)
            except StoreIOError:
                with self._lock:
                    unsaved = self._by_start.get(start)
                    if unsaved is not None:
                        unsaved.dirty = True
                raise
        return len(pending)

    # -- maintenance ---------------------------------------------------------------------------
    def note(self, start: int, topics: Iterable[str], store_ms: int, last: int, end: int) -> None:
        """A master appended a run of records to the segment at ``start``: ``topics`` holds the
        run's topics (:data:`UNQUEUED` for records without a queue offset), all stored at
        ``store_ms``; ``last`` is the offset of the run's last record, noted as every topic's
        last offset (an upper bound: a topic deleted later has its tombstone past the whole
        run, as deletion and appends take the same lock); the run ends at ``end``."""
        with self._lock:
            summary = self._by_start.get(start)
            if summary is None:
                summary = self._by_start[start] = SegmentSummary(start)
            noted = summary.topics
            for topic in topics:
                entry = noted.get(topic)
                if entry is None:
                    noted[topic] = [store_ms, last]
                else:
                    if store_ms > entry[0]:
                        entry[0] = store_ms
                    entry[1] = last
            summary.noted_to = end
            summary.dirty = True

    def seal(self, start: int, end: int) -> None:
        """The segment at ``start`` was closed with its blank END record (it ends at ``end``):
        nothing past what was noted is left to scan."""
        with self._lock:
            summary = self._by_start.get(start)
            if summary is not None and summary.noted_to < end:
                summary.noted_to = end
                summary.dirty = True

    def note_replicated(self, start: int, begin: int, end: int) -> None:
        """A slave took the bytes [begin, end) of the segment at ``start``: a gap to scan."""
        with self._lock:
            summary = self._by_start.get(start)
            if summary is None:
                summary = self._by_start[start] = SegmentSummary(start, begin)
            summary.widen_gap(begin, end)
            summary.noted_to = max(summary.noted_to, end)
            summary.dirty = True

    def fill_gaps(
        self, scan: Callable[[int, int], Iterator[tuple[str, int, int]]], budget_bytes: int = 1 << 62
    ) -> int:
        """Scan gaps, oldest segment first, with ``scan(from, to)``, which yields (topic, store
        ms, offset) per record and raises StoreIOError when the bytes are not records (the gap
        stays); stop once ``budget_bytes`` were scanned (the rest waits for the next call). A
        scan that a cut or reset overtook is thrown away. Returns how many gaps were closed."""
        with self._lock:
            todo = sorted((s.start, s.gap, s, s.epoch) for s in self._by_start.values() if s.gap is not None)
        closed = 0
        for start, gap, original, epoch in todo:
            assert gap is not None
            if budget_bytes <= 0:
                break
            budget_bytes -= gap[1] - gap[0]
            found = SegmentSummary(start)
            try:
                for topic, store_ms, offset in scan(*gap):
                    found.merge(topic, store_ms, offset)
            except StoreIOError as exc:
                log.warning("cannot summarise CommitLog bytes %d..%d: %s", gap[0], gap[1], exc)
                continue
            with self._lock:
                summary = self._by_start.get(start)
                if summary is not original or summary.epoch != epoch or summary.gap is None:
                    continue  # cut, reset or dropped while it was read: what it found may be gone
                for topic, (store_ms, offset) in found.topics.items():
                    summary.merge(topic, store_ms, offset)
                a, b = summary.gap
                summary.gap = (gap[1], b) if b > gap[1] else None
                if a < gap[0]:  # widened below what was scanned meanwhile: keep that part too
                    summary.widen_gap(a, gap[0])
                summary.dirty = True
                closed += summary.gap is None
        return closed

    def cut(self, offset: int) -> None:
        """The log now ends at ``offset``: summaries of segments starting at or past it go; the
        one holding it keeps what it noted (a superset) with its gap clipped."""
        with self._lock:
            gone = [start for start in self._by_start if start >= offset]
            for start in gone:
                del self._by_start[start]
            for summary in self._by_start.values():
                summary.epoch += 1
                if summary.noted_to > offset:
                    summary.noted_to = offset
                    summary.dirty = True
                if summary.gap is not None and summary.gap[1] > offset:
                    a, _ = summary.gap
                    summary.gap = (a, offset) if a < offset else None
                    summary.dirty = True
        for start in gone:
            self._remove_file(start)

    def reset(self) -> None:
        """The log was dropped whole: forget every summary."""
        with self._lock:
            gone, self._by_start = list(self._by_start), {}
        for start in gone:
            self._remove_file(start)

    def drop(self, starts: Iterable[int]) -> None:
        """Segments deleted from the head: forget their summaries."""
        starts = list(starts)
        with self._lock:
            for start in starts:
                self._by_start.pop(start, None)
        for start in starts:
            self._remove_file(start)

    # -- queries -------------------------------------------------------------------------------
    def get(self, start: int) -> SegmentSummary | None:
        """A copy of the summary of the segment at ``start`` (None when there is none)."""
        with self._lock:
            summary = self._by_start.get(start)
            if summary is None:
                return None
            out = SegmentSummary(summary.start, summary.noted_to)
            out.topics = {k: list(v) for k, v in summary.topics.items()}
            out.gap = summary.gap
            return out

    def __len__(self) -> int:
        return len(self._by_start)

    def _path(self, start: int) -> Path:
        return self.directory / f"{start:0{_NAME_WIDTH}d}.json"

    def _remove_file(self, start: int) -> None:
        with self._file_lock, contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(start))
