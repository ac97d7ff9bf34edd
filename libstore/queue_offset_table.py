"""The queue-offset table: next queue offset of every (topic, queue id) (RocketMQ ``topicQueueTable``).

The CommitLog assigns queue offsets under its put lock from this table. It is derived from the
log (each record stores its QUEUEOFFSET), so after a restart it is rebuilt as: the last saved
snapshot, valid for the log prefix ``[min, snapshot_phy_offset)``, plus a scan of the records
from ``snapshot_phy_offset`` to the recovered end. Snapshots are saved periodically, after
recovery and at shutdown (``config/queueOffsetTable.json``, replaced atomically), so a normal
restart scans nothing and a crash recovery scans only the tail written since the last snapshot.

Format: ``{"version": 1, "phyOffset": N, "offsets": [[topic, queueId, nextOffset], ...]}``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from libstore._files import atomic_write, read_json
from libstore.errors import StoreIOError

log = logging.getLogger(__name__)

QueueKey = tuple[str, int]


class QueueOffsetSnapshot:
    """A saved table and the log offset it is valid at."""

    __slots__ = ("offsets", "phy_offset")

    def __init__(self, phy_offset: int, offsets: dict[QueueKey, int]) -> None:
        self.phy_offset = phy_offset
        self.offsets = offsets


def save_snapshot(path: Path, phy_offset: int, offsets: dict[QueueKey, int]) -> None:
    """Persist ``offsets`` as valid for the log prefix ending at ``phy_offset``. Raises StoreIOError."""
    data = {
        "version": 1,
        "phyOffset": phy_offset,
        "offsets": [[topic, qid, nxt] for (topic, qid), nxt in sorted(offsets.items())],
    }
    atomic_write(path, json.dumps(data, separators=(",", ":")).encode("utf-8"))


def load_snapshot(path: Path) -> QueueOffsetSnapshot | None:
    """The saved snapshot, or None when missing or unreadable (the caller then rescans the log)."""
    try:
        data = read_json(Path(path), "queue offset snapshot")
        if data is None:
            return None
        if data.get("version") != 1:
            raise ValueError(f"unknown version {data.get('version')!r}")
        offsets = {(str(t), int(q)): int(n) for t, q, n in data["offsets"]}
        return QueueOffsetSnapshot(int(data["phyOffset"]), offsets)
    except (StoreIOError, AttributeError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable queue offset snapshot %s: %s", path, exc)
        return None


def delete_snapshot(path: Path) -> None:
    Path(path).unlink(missing_ok=True)
