"""Outcome values of store operations: statuses and per-message put results.

Statuses mirror Apache RocketMQ's ``PutMessageStatus`` and ``AppendMessageStatus``
(rocketmq-store-format spec sheet §7), spelled as in RocketMQ 5.
"""

from __future__ import annotations

import enum

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
