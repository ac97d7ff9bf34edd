"""DedupWindow: recent UNIQ_KEYs and where their messages went, so a retried Append (the reply
was lost, the client sent the batch again) returns the first result instead of storing twice.

Bounded by count (oldest dropped first) and age. After a restart it is refilled from the tail
of the log, so a retry that straddles a commitlog restart is still caught; beyond the window
the guarantee is at-least-once, and consumers can de-duplicate on UNIQ_KEY.

Thread-safety: used from the commitlog service's event loop only.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import NamedTuple

from libstore import CommitLog
from libstore.mapped_file import MappedFile
from libstore.record_codec import check_record


class Placed(NamedTuple):
    """Where a message went: CommitLog offset and size (bytes), queue offset, store time (ms)."""

    phy_offset: int
    size: int
    queue_offset: int
    store_timestamp: int


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
        """Load the keys of records stored within the window from the log's last segments.

        Returns how many were loaded.
        """
        queue = log.queue
        if queue is None or not queue.mapped_files or self.capacity <= 0:
            return 0
        since = time.time_ns() // 1_000_000 - self.ttl_ms
        files = queue.mapped_files
        start_index = len(files) - 1
        # Step back while a segment's first record is still young enough.
        while start_index > 0 and _first_store_timestamp(files[start_index]) >= since:
            start_index -= 1
        loaded = 0
        for req in log.scan_records(files[start_index].file_from_offset, log.max_offset):
            if req.success and req.msg_size and req.uniq_key and req.store_timestamp >= since:
                self.put(
                    req.topic,
                    req.uniq_key,
                    Placed(
                        req.commit_log_offset, req.msg_size, req.consume_queue_offset, req.store_timestamp
                    ),
                )
                loaded += 1
        return loaded


def _first_store_timestamp(mf: MappedFile) -> int:
    req = check_record(mf.buffer, 0, mf.readable_position, check_crc=False, decode_properties=False)
    return req.store_timestamp if req.success and req.msg_size else -1
