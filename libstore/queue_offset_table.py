"""The queue-offset table: next queue offset of every (topic, queue id) (RocketMQ ``topicQueueTable``).

The CommitLog assigns queue offsets under its put lock from this table. It is derived from the
log (each record stores its QUEUEOFFSET), so after a restart it is rebuilt as: the last saved
snapshot, valid for the log prefix ``[min, snapshot_phy_offset)``, plus a scan of the records
from ``snapshot_phy_offset`` to the recovered end. Snapshots are saved periodically, after
recovery and at shutdown (``config/queueOffsetTable.json``, replaced atomically), so a normal
restart scans nothing and a crash recovery scans only the tail written since the last snapshot.

A snapshot names the log generation it was taken in (libstore.log_generation): a table taken
before the log was cut below its offset describes records that are gone, even when the log has
grown past that offset again since, and is not used (:meth:`QueueOffsetSnapshot.valid_in`).

Format: ``{"version": 2, "phyOffset": N, "logId": "...", "generation": G, "offsets": [[topic,
queueId, nextOffset], ...]}``; version 1 (no generation) is still read and trusted as before.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

from libstore._files import atomic_write, read_json
from libstore.errors import StoreIOError
from libstore.log_generation import LogGeneration

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


class QueueOffsetSnapshot:
    """A table and the log offset it is valid at, taken in generation ``generation`` of log
    ``log_id`` (0 / "": unknown, a version 1 file)."""

    __slots__ = ("generation", "log_id", "offsets", "phy_offset")

    def __init__(
        self, phy_offset: int, offsets: dict[QueueKey, int], log_id: str = "", generation: int = 0
    ) -> None:
        self.phy_offset = phy_offset
        self.offsets = offsets
        self.log_id = log_id
        self.generation = generation

    def valid_in(self, generation: LogGeneration) -> bool:
        """False when the log was cut below this snapshot's offset after it was taken (or it
        belongs to another log): its table counts records the log no longer holds."""
        cut = generation.divergence_point(self.log_id, self.generation)
        return cut is None or cut >= self.phy_offset


def save_snapshot(path: Path, snapshot: QueueOffsetSnapshot) -> None:
    """Persist ``snapshot``. Raises StoreIOError."""
    data = {
        "version": 2,
        "phyOffset": snapshot.phy_offset,
        "logId": snapshot.log_id,
        "generation": snapshot.generation,
        "offsets": [[topic, qid, nxt] for (topic, qid), nxt in sorted(snapshot.offsets.items())],
    }
    atomic_write(path, json.dumps(data, separators=(",", ":")).encode("utf-8"))


def load_snapshot(path: Path) -> QueueOffsetSnapshot | None:
    """The saved snapshot, or None when missing or unreadable (the caller then rescans the log)."""
    try:
        data = read_json(Path(path), "queue offset snapshot")
        if data is None:
            return None
        version = data.get("version")
        if version not in (1, 2):
            raise ValueError(f"unknown version {version!r}")
        offsets = {(str(t), int(q)): int(n) for t, q, n in data["offsets"]}
        if version == 1:
            return QueueOffsetSnapshot(int(data["phyOffset"]), offsets)
        return QueueOffsetSnapshot(
            int(data["phyOffset"]), offsets, str(data["logId"]), int(data["generation"])
        )
    except (StoreIOError, AttributeError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable queue offset snapshot %s: %s", path, exc)
        return None


def delete_snapshot(path: Path) -> None:
    Path(path).unlink(missing_ok=True)


class QueueOffsetTable:
    """The live queue-offset table of one CommitLog (RocketMQ 5's QueueOffsetOperator; module
    docstring). ``offsets`` is read and changed under the CommitLog's put lock (the put path
    assigns from the dict itself); ``covered_to`` is the CommitLog offset (bytes) up to which
    it accounts for the records (a SLAVE's lags the replicated end until it is extended).
    Snapshots go to ``path``, one writer at a time: the periodic service and a cut of the log
    may race (the snapshot lock is taken after the put lock, never before it)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offsets: dict[QueueKey, int] = {}
        self.covered_to = 0
        self._snapshot_lock = threading.Lock()
        # What ``path`` holds, as this table wrote it: (log offset, log id, generation, table).
        self._saved: tuple[int, str, int, dict[QueueKey, int]] | None = None

    def next_offset(self, topic: str, queue_id: int) -> int:
        """The queue offset the next record of (``topic``, ``queue_id``) takes."""
        return self.offsets.get((topic, queue_id), 0)

    def replace(self, offsets: dict[QueueKey, int], covered_to: int) -> None:
        """Take ``offsets`` as the table, valid for the log up to ``covered_to``."""
        self.offsets = offsets
        self.covered_to = covered_to

    def roll_back(
        self, queue_offsets: Sequence[int], keys: Sequence[QueueKey | None], start: int, stop: int
    ) -> None:
        """Give back the queue offsets records ``start``..``stop``-1 took (``queue_offsets[i]``
        for the record with key ``keys[i]``; None: took none): their append failed."""
        table = self.offsets
        for i in range(stop - 1, start - 1, -1):
            key = keys[i]
            if key is not None:
                table[key] = queue_offsets[i]

    def snapshot_at(
        self, phy_offset: int, generation: LogGeneration, offsets: dict[QueueKey, int] | None = None
    ) -> QueueOffsetSnapshot:
        """``offsets`` (by default a copy of the table) as valid at ``phy_offset`` in the log's
        current generation."""
        table = dict(self.offsets) if offsets is None else offsets
        return QueueOffsetSnapshot(phy_offset, table, generation.log_id, generation.generation)

    def save(self, snapshot: QueueOffsetSnapshot, generation: LogGeneration) -> None:
        """Write ``snapshot`` unless the log's generation moved on since it was taken, or the
        file already holds the same one (an idle store: the periodic snapshot writes nothing).
        Raises StoreIOError."""
        with self._snapshot_lock:
            if snapshot.generation != generation.generation:
                return
            said = (snapshot.phy_offset, snapshot.log_id, snapshot.generation, snapshot.offsets)
            if said == self._saved:  # the table, the largest part, is compared last
                return
            save_snapshot(self.path, snapshot)
            # A copy: the snapshot of a cut holds the live table, which appends go on changing.
            self._saved = (*said[:3], dict(snapshot.offsets))

    def load(self, end_offset: int, generation: LogGeneration) -> QueueOffsetSnapshot | None:
        """The saved snapshot when it can be trusted for a log ending at ``end_offset``: taken
        at or before that end, in a generation whose log was not cut below it since."""
        snapshot = load_snapshot(self.path)
        if snapshot is None or snapshot.phy_offset > end_offset:
            return None
        if not snapshot.valid_in(generation):
            log.warning(
                "queue offset snapshot at %d predates a cut of the log below it (generation %d): rescanning",
                snapshot.phy_offset,
                snapshot.generation,
            )
            return None
        return snapshot
