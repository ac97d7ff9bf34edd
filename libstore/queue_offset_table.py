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
