"""Splitting a read into calls the commitlog's Read RPC accepts.

The Read RPC refuses more than ``maxReadRangesPerCall`` ranges or more than
``maxReadBytesPerCall`` bytes in one call (client-controlled reads are bounded there). Internal
callers of a remote commitlog (timer deliveries, pop journal replays, a gateway's reads) may ask
for more at once, so the remote port sends one call per chunk made here. A range of size 0 (the
whole record at its offset) counts as the largest record.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

from libstore.config import RECORD_OVERHEAD_BOUND, StoreConfig

_DEFAULTS = StoreConfig()
DEFAULT_MAX_RANGES = _DEFAULTS.max_read_ranges_per_call
DEFAULT_MAX_BYTES = _DEFAULTS.max_read_bytes_per_call
DEFAULT_RECORD_SIZE = _DEFAULTS.max_message_size + RECORD_OVERHEAD_BOUND
_SIZE = itemgetter(1)


def plan_reads(
    ranges: Sequence[tuple[int, int]],
    *,
    max_ranges: int = DEFAULT_MAX_RANGES,
    max_bytes: int = DEFAULT_MAX_BYTES,
    record_size: int = DEFAULT_RECORD_SIZE,
) -> list[Sequence[tuple[int, int]]]:
    """``ranges`` ((offset, size) pairs, in order) cut into consecutive chunks of at most
    ``max_ranges`` ranges whose sizes (``record_size`` for size 0) add up to at most
    ``max_bytes``; a single range larger than ``max_bytes`` gets a chunk of its own. Empty
    input gives no chunk."""
    if 0 < len(ranges) <= max_ranges:  # the common case, told by C loops: one chunk
        sizes = list(map(_SIZE, ranges))
        if min(sizes) >= 0 and sum(sizes) + sizes.count(0) * record_size <= max_bytes:
            return [ranges]
    chunks: list[Sequence[tuple[int, int]]] = []
    start = 0
    total = 0
    for i, (_, size) in enumerate(ranges):
        cost = size if size > 0 else record_size
        if i > start and (i - start >= max_ranges or total + cost > max_bytes):
            chunks.append(ranges[start:i])
            start, total = i, 0
        total += cost
    if start < len(ranges):
        chunks.append(ranges[start:])
    return chunks
