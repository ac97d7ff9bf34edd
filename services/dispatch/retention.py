"""QueueRetention: per-topic retention and topic deletion on the ConsumeQueues.

Every ``cleanResourceInterval`` (with the CommitLog-min-offset cleanup, services._common.
derived_app) one round, for each topic that sets ``retentionHours`` or was deleted
(libstore.retention_policy):

- retention: the first unit stored at or after ``now - retentionHours`` is found by binary
  search over store times (ConsumeQueue.search_by_time; one read when nothing expired);
- deletion: the first unit at or past the topic's tombstone;

and the queue's min offset moves there (pulls answer OFFSET_TOO_SMALL with it, pops start at
it), files wholly below go. The point is kept as a *floor*: a CommitLog offset below which the
queue's units are expired, saved in ``consumequeue/retentionFloors.json`` so a restart does not
show expired messages again before the next round (:meth:`QueueRetention.apply_saved`).

The messages stay in the CommitLog until their segment goes (libstore.commit_log_cleaner).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from libstore._files import atomic_write, read_json
from libstore.consume_queue import BoundaryType, ConsumeQueue
from libstore.consume_queue_store import ConsumeQueueStore
from libstore.errors import StoreIOError
from libstore.retention_policy import RetentionPolicy

log = logging.getLogger(__name__)

FLOORS_FILE = "retentionFloors.json"


class QueueRetention:
    """The retention rounds of one ConsumeQueueStore (module docstring). ``store_time_of(phy,
    size)`` reads a message's store time (ms; -1 when the CommitLog no longer holds it)."""

    def __init__(
        self, queues: ConsumeQueueStore, store_time_of: Callable[[int, int], Awaitable[int]]
    ) -> None:
        self.queues = queues
        self.path = Path(queues.store_path) / FLOORS_FILE
        self._store_time_of = store_time_of
        self.floors: dict[str, dict[int, int]] = {}  # topic -> queue id -> CommitLog offset
        self.units_expired = 0  # units the rounds moved min offsets past, since start

    def load(self) -> None:
        """Read the saved floors. Raises StoreIOError when the file is unreadable."""
        raw = read_json(self.path, "ConsumeQueue retention floors") or {}
        try:
            self.floors = {str(t): {int(q): int(o) for q, o in qs.items()} for t, qs in raw.items()}
        except (AttributeError, TypeError, ValueError) as exc:
            raise StoreIOError(f"cannot read {self.path}: {exc}") from exc

    def apply_saved(self) -> None:
        """After recovery: move each queue's min offset past its saved floor."""
        for topic, queues in self.floors.items():
            for queue_id, floor in queues.items():
                cq = self.queues.find(topic, queue_id)
                if cq is not None:
                    cq.correct_min_offset(floor)

    def clamp(self, log_end: int) -> None:
        """The CommitLog was cut at ``log_end``: units past it are gone and those appended from
        now on are new, so no floor may lie past it. Raises StoreIOError."""
        changed = False
        for queues in self.floors.values():
            for queue_id, floor in queues.items():
                if floor > log_end:
                    queues[queue_id] = log_end
                    changed = True
        if changed:
            self._save()

    def _save(self) -> None:
        data = json.dumps({t: {str(q): o for q, o in qs.items()} for t, qs in self.floors.items()})
        atomic_write(self.path, data.encode())

    async def run_once(self, policy: RetentionPolicy, now_ms: int) -> int:
        """One round (module docstring); returns how many ConsumeQueue files were deleted.
        Raises StoreIOError (files), or what ``store_time_of`` raises."""
        deleted = 0
        changed = False
        topics = self.queues.topics()
        for topic in [t for t in self.floors if t not in topics]:
            del self.floors[topic]
            changed = True
        for topic, queue_ids in topics.items():
            tombstone = policy.deleted_before.get(topic)
            cutoff_ms = policy.queue_cutoff_ms(topic, now_ms)
            if tombstone is None and cutoff_ms is None:
                continue
            for queue_id in queue_ids:
                cq = self.queues.find(topic, queue_id)
                if cq is None:
                    continue
                # The last round's floor too: a file that could not go then (not yet flushed)
                # goes now.
                floor = max(tombstone or 0, self.floors.get(topic, {}).get(queue_id, 0))
                if cutoff_ms is not None:
                    floor = max(floor, await self._first_kept(cq, cutoff_ms))
                if floor <= 0:
                    continue  # nothing expired in this queue
                before = cq.min_offset_in_queue
                deleted += await asyncio.to_thread(cq.delete_expired_files, floor)
                self.units_expired += cq.min_offset_in_queue - before
                kept = self.floors.setdefault(topic, {})
                if floor > kept.get(queue_id, 0):
                    kept[queue_id] = floor
                    changed = True
        if changed:
            await asyncio.to_thread(self._save)
        return deleted

    async def _first_kept(self, cq: ConsumeQueue, cutoff_ms: int) -> int:
        """The CommitLog offset of the first unit of ``cq`` stored at or after ``cutoff_ms``
        (past the last unit when every unit is older; 0 when the first one is not)."""
        lo, hi = cq.min_offset_in_queue, cq.max_offset_in_queue
        if lo >= hi:
            return 0
        first = cq.read_unit(lo)
        if first is not None and await self._store_time_of(first.phy_offset, first.size) >= cutoff_ms:
            return 0  # the oldest unit is young enough: nothing expired (the usual round)
        search = cq.search_by_time(cutoff_ms, BoundaryType.LOWER)
        try:
            probe = next(search)
            while True:
                probe = search.send(await self._store_time_of(*probe))
        except StopIteration as done:
            keep = int(done.value)
        if keep < hi:
            unit = cq.read_unit(keep)
            return unit.phy_offset if unit is not None else 0
        last = cq.last_unit()
        return last.phy_offset + 1 if last is not None else 0
