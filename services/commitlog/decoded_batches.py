"""DecodedBatches: the last client-encoded batches appended, as their validation decoded them.

In-process followers (dispatch, index) tail the CommitLog the producer just wrote. The records of
a batch adopted from a client were decoded once already, by the validation that placed them;
keeping those requests (with their final offsets) lets a follower take them instead of reading
and decoding the same bytes again.

A follower does not always stand at a batch's first record: one that fell behind reads the log in
chunks of a byte budget, which end wherever the budget runs out. So a lookup finds the batch that
*holds* an offset and answers from that record on, and :meth:`next_start` lets such a read stop at
the next kept batch, after which the follower is back on batch boundaries.

Not thread-safe: the owner (services.commitlog.local) uses it from its event loop only.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict

from libstore.dispatch_request import DispatchRequest


class DecodedBatches:
    """At most ``max_batches`` batches and ``max_records`` requests, oldest dropped first.

    Batches are kept in the order they were appended, which is CommitLog order: each one's
    requests are consecutive records from ``start`` to ``end`` (bytes, CommitLog offsets).
    """

    def __init__(self, max_batches: int, max_records: int) -> None:
        self.max_batches = max_batches
        self.max_records = max_records
        self._batches: OrderedDict[int, tuple[int, list[DispatchRequest]]] = OrderedDict()
        self._starts: list[int] = []  # the keys of _batches, ascending
        self._records = 0

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def records(self) -> int:
        """How many requests are kept, over all batches."""
        return self._records

    def keep(self, start: int, end: int, requests: list[DispatchRequest]) -> None:
        """Keep a batch: ``requests`` are the records from CommitLog offset ``start`` to ``end``,
        with their final offsets. A batch that does not come after the last one kept (the log
        was cut and written again) replaces everything kept."""
        if self._starts and start < self._batches[self._starts[-1]][0]:
            self.clear()
        self._batches[start] = (end, requests)
        self._starts.append(start)
        self._records += len(requests)
        while len(self._batches) > self.max_batches or self._records > self.max_records:
            _, (_, dropped) = self._batches.popitem(last=False)
            del self._starts[0]
            self._records -= len(dropped)

    def find(self, offset: int) -> tuple[int, list[DispatchRequest]] | None:
        """(end of the batch, its requests from the record at ``offset`` on), or None when no
        kept batch holds a record starting at ``offset``."""
        hit = self._batches.get(offset)
        if hit is not None:
            return hit
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        end, requests = self._batches[self._starts[i]]
        if offset >= end:
            return None
        j = bisect.bisect_left(requests, offset, key=_phy_offset)
        if j < len(requests) and requests[j].commit_log_offset == offset:
            return end, requests[j:]
        return None

    def take(self, offset: int, limit: int, max_bytes: int) -> tuple[int, list[DispatchRequest]] | None:
        """Like :meth:`find`, joined with the kept batches that follow it without a gap, as
        long as they end by ``limit`` and within ``max_bytes`` of ``offset`` (a follower behind
        takes many in one step). None when the batch holding ``offset`` ends past ``limit``."""
        hit = self.find(offset)
        if hit is None or hit[0] > limit:
            return None
        end, requests = hit
        following = self._batches.get(end)
        if following is None or following[0] > limit or following[0] - offset > max_bytes:
            return hit
        joined = list(requests)
        while following is not None and following[0] <= limit and following[0] - offset <= max_bytes:
            end, more = following
            joined += more
            following = self._batches.get(end)
        return end, joined

    def drop_before(self, offset: int) -> None:
        """Drop the batches that end at or before ``offset`` (every reader has taken them)."""
        batches, starts = self._batches, self._starts
        while starts:
            end, requests = batches[starts[0]]
            if end > offset:
                return
            batches.popitem(last=False)
            del starts[0]
            self._records -= len(requests)

    def next_start(self, offset: int) -> int | None:
        """The start of the first kept batch past ``offset``, or None."""
        i = bisect.bisect_right(self._starts, offset)
        return self._starts[i] if i < len(self._starts) else None

    def clear(self) -> None:
        self._batches.clear()
        self._starts.clear()
        self._records = 0


def _phy_offset(request: DispatchRequest) -> int:
    return request.commit_log_offset
