"""Outcome values of store operations: statuses and per-message put results.

Statuses mirror Apache RocketMQ's ``PutMessageStatus`` and ``AppendMessageStatus``
(rocketmq-store-format spec sheet §7), spelled as in RocketMQ 5.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Sequence
from typing import overload

from libstore.message_id import create_message_id


class PutMessageStatus(enum.Enum):
    """Result of a put, after flush (and later replication) policy is applied.

    PUT_OK: stored and durable under the configured policy. FLUSH_DISK_TIMEOUT: appended, but the
    SYNC_FLUSH wait ran out (or the flush failed) before it was confirmed durable.
    """

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    IN_SYNC_REPLICAS_NOT_ENOUGH = "IN_SYNC_REPLICAS_NOT_ENOUGH"

    @property
    def appended(self) -> bool:
        """True when the message is in the log (durable or not yet confirmed)."""
        return self in _APPENDED


_APPENDED = frozenset(
    {
        PutMessageStatus.PUT_OK,
        PutMessageStatus.FLUSH_DISK_TIMEOUT,
        PutMessageStatus.FLUSH_SLAVE_TIMEOUT,
        PutMessageStatus.SLAVE_NOT_AVAILABLE,
    }
)


class AppendMessageStatus(enum.Enum):
    """Result of copying one record into a MappedFile (RocketMQ ``AppendMessageStatus``)."""

    PUT_OK = "PUT_OK"
    END_OF_FILE = "END_OF_FILE"
    MESSAGE_SIZE_EXCEEDED = "MESSAGE_SIZE_EXCEEDED"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


class PutMessageResult:
    """One message's put outcome.

    ``phy_offset`` is the record's CommitLog offset (bytes), ``size`` its length in bytes,
    ``queue_offset`` its index in its ConsumeQueue (0 for transaction PREPARED/ROLLBACK records),
    ``store_timestamp`` ms since the epoch. For a message that was not appended (status with
    ``appended`` false) the offsets are -1. ``msg_id`` is the offset message id (spec §2).
    """

    __slots__ = ("_store_host", "phy_offset", "queue_offset", "size", "status", "store_timestamp")

    def __init__(
        self,
        status: PutMessageStatus,
        phy_offset: int = -1,
        size: int = 0,
        queue_offset: int = -1,
        store_timestamp: int = 0,
        store_host: bytes = b"",
    ) -> None:
        self.status = status
        self.phy_offset = phy_offset
        self.size = size
        self.queue_offset = queue_offset
        self.store_timestamp = store_timestamp
        self._store_host = store_host

    @property
    def ok(self) -> bool:
        return self.status is PutMessageStatus.PUT_OK

    @property
    def next_offset(self) -> int:
        """CommitLog offset just past this record."""
        return self.phy_offset + self.size

    @property
    def msg_id(self) -> str:
        """Offset message id: uppercase hex of store ip, port and physical offset; "" if not appended."""
        if self.phy_offset < 0:
            return ""
        return create_message_id(self._store_host, self.phy_offset)

    def __repr__(self) -> str:
        return (
            f"PutMessageResult({self.status.name}, phy_offset={self.phy_offset}, size={self.size}, "
            f"queue_offset={self.queue_offset})"
        )


class PutMessageResults(Sequence[PutMessageResult]):
    """The results of one batch, one per message, in message order.

    Held as columns (DESIGN: no per-message objects on the hot path): the first ``appended``
    messages were written, at ``phy_offsets[i]`` with ``sizes[i]`` bytes and queue offset
    ``queue_offsets[i]``, all stored at ``store_timestamp`` (ms), with status ``status``
    (PUT_OK, or the flush/replication outcome that overrides it) unless their index is in
    ``unwaited`` (messages that said WAIT=false: PUT_OK once appended, whatever the waits of
    the others came to); the rest carry ``failed_status`` (e.g. CREATE_MAPPED_FILE_FAILED) and
    offsets -1. Indexing builds a :class:`PutMessageResult`; it compares equal to a list of
    equal results.
    """

    __slots__ = (
        "_count",
        "_store_host",
        "appended",
        "failed_status",
        "in_log_order",
        "phy_offsets",
        "queue_offsets",
        "sizes",
        "status",
        "store_timestamp",
        "unwaited",
    )

    def __init__(
        self,
        count: int,
        *,
        phy_offsets: list[int] | None = None,
        sizes: list[int] | None = None,
        queue_offsets: list[int] | None = None,
        store_timestamp: int = 0,
        store_host: bytes = b"",
        failed_status: PutMessageStatus = PutMessageStatus.UNKNOWN_ERROR,
        unwaited: frozenset[int] = frozenset(),
        in_log_order: bool = False,
    ) -> None:
        self.phy_offsets = phy_offsets if phy_offsets is not None else []
        self.sizes = sizes if sizes is not None else []
        self.queue_offsets = queue_offsets if queue_offsets is not None else []
        self.appended = len(self.phy_offsets)
        self._count = count
        self.status = PutMessageStatus.PUT_OK
        self.failed_status = failed_status
        self.store_timestamp = store_timestamp
        self._store_host = store_host
        self.unwaited = unwaited
        # True when ``phy_offsets`` ascend (one append under the lock): the last record ends furthest.
        self.in_log_order = in_log_order

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> PutMessageResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[PutMessageResult]: ...

    def __getitem__(self, index: int | slice) -> PutMessageResult | list[PutMessageResult]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError("result index out of range")
        if index >= self.appended:
            return PutMessageResult(self.failed_status)
        return PutMessageResult(
            self.status if index not in self.unwaited else PutMessageStatus.PUT_OK,
            self.phy_offsets[index],
            self.sizes[index],
            self.queue_offsets[index],
            self.store_timestamp,
            self._store_host,
        )

    @property
    def store_host(self) -> bytes:
        """The encoded store host (8 or 20 bytes) of the message ids."""
        return self._store_host

    @property
    def all_ok(self) -> bool:
        """True when every message was stored and answered PUT_OK: durable under the configured
        policy, or (those in ``unwaited``) not waited for."""
        if self.appended != self._count:
            return False
        return self.status is PutMessageStatus.PUT_OK or len(self.unwaited) == self._count

    @property
    def next_offset(self) -> int:
        """CommitLog offset just past the last appended record; -1 when none was appended."""
        if not self.appended:
            return -1
        return self.phy_offsets[-1] + self.sizes[self.appended - 1]

    def part(self, start: int, stop: int) -> PutMessageResults:
        """The results of messages ``start`` to ``stop`` (exclusive) as a batch of their own:
        a batch that several callers' messages were sent in, answered to each caller. Status,
        store timestamp and failure carry over; ``unwaited`` is renumbered from ``start``.
        Raises ValueError for a range outside ``0..len(self)``."""
        if not 0 <= start <= stop <= self._count:
            raise ValueError(f"part {start}..{stop} outside 0..{self._count}")
        end = max(start, min(stop, self.appended))
        out = PutMessageResults(
            stop - start,
            phy_offsets=self.phy_offsets[start:end],
            sizes=self.sizes[start:end],
            queue_offsets=self.queue_offsets[start:end],
            store_timestamp=self.store_timestamp,
            store_host=self._store_host,
            failed_status=self.failed_status,
            unwaited=frozenset(i - start for i in self.unwaited if start <= i < stop),
            in_log_order=self.in_log_order,
        )
        out.status = self.status
        return out

    def durable_end(self) -> int | None:
        """CommitLog offset (bytes) just past the furthest appended record whose message waits
        for the store (not in ``unwaited``): where a SYNC_FLUSH or SYNC_MASTER wait must reach
        for every waiting message to hold. None when no appended message waits. Records need
        not be in offset order (results merged with de-duplicated replays are not)."""
        n = self.appended
        if not n:
            return None
        phys, sizes, skip = self.phy_offsets, self.sizes, self.unwaited
        if not skip:
            if self.in_log_order:
                return phys[n - 1] + sizes[n - 1]
            furthest: int = max(map(operator.add, phys, sizes[:n]))
            return furthest
        if self.in_log_order:
            last = next((i for i in range(n - 1, -1, -1) if i not in skip), None)
            return None if last is None else phys[last] + sizes[last]
        ends = [phys[i] + sizes[i] for i in range(n) if i not in skip]
        return max(ends) if ends else None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(other) == self._count and all(_same(a, b) for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"PutMessageResults({self.appended}/{self._count} appended, {self.status.name}, "
            f"next_offset={self.next_offset})"
        )


def _same(a: object, b: object) -> bool:
    if isinstance(a, PutMessageResult) and isinstance(b, PutMessageResult):
        return (a.status, a.phy_offset, a.size, a.queue_offset) == (
            b.status,
            b.phy_offset,
            b.size,
            b.queue_offset,
        )
    return a == b


class GetMessageStatus(enum.Enum):
    """Result of a pull (RocketMQ ``GetMessageStatus``).

    FOUND: messages returned. NO_MATCHED_MESSAGE: units scanned, none passed the filter.
    MESSAGE_WAS_REMOVING: the units point at CommitLog bytes already deleted.
    OFFSET_FOUND_NULL: no units readable at the offset. OFFSET_OVERFLOW_ONE: the offset is the
    queue's max (nothing new yet; long polling waits here). OFFSET_OVERFLOW_BADLY: past the max.
    OFFSET_TOO_SMALL: below the min (deleted). NO_MATCHED_LOGIC_QUEUE: no such queue.
    NO_MESSAGE_IN_QUEUE: the queue is empty.
    """

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
