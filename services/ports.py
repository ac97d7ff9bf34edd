"""Ports: what each service offers the others, as Python Protocols (DESIGN "Services").

Every port has two implementations with the same behaviour: a local one over libstore objects
(``services/<service>/local.py``) and a remote one over the gRPC stub, with deadlines and
retries (``services/<service>/client.py``). Servicers and the gateway hold a port and do not
know which. Failures are libstore's StoreError classes in both cases.

Offsets are CommitLog byte offsets (``phy_offset``) or ConsumeQueue unit indexes
(``queue_offset``); times are ms since the epoch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from libstore import PutMessageResults, TopicConfig
from libstore.consume_queue import BoundaryType
from libstore.consumer_offset_manager import QueueProgress
from libstore.dispatch_request import DispatchRequest
from libstore.errors import StoreError
from libstore.message import MessageFields
from libstore.results import GetMessageStatus
from libstore.subscription_group import SubscriptionGroupConfig

# A popped delivery that never reached its receiver (the receive was cancelled, the client went
# away) is made visible again this much later, ms, instead of after its whole invisible time:
# the NACK_INVISIBLE_TIME of RocketMQ's proxy.
NACK_INVISIBLE_MS = 1000


@dataclass(frozen=True)
class LogOffsets:
    """A CommitLog's watermarks (bytes) and policies."""

    min_offset: int
    max_offset: int
    confirm_offset: int
    flushed_offset: int
    flush_disk_type: str
    broker_role: str
    mapped_file_size: int
    disk_free_bytes: int = 0
    disk_total_bytes: int = 0
    log_id: str = ""
    generation: int = 0
    epoch: int = 0
    broker_name: str = ""
    broker_id: int = 0
    quarantine_dir: str = ""
    quarantined_files: int = 0
    quarantined_bytes: int = 0
    epoch_start: int = 0
    disk_used_ratio: float = 0.0  # retention (libstore.commit_log_cleaner): df's Use%, 0..1
    disk_full: str = ""  # why puts are refused for disk usage ("" when they are not)
    last_cleanup_ms: int = 0  # last cleanup round, ms since the epoch (0: none yet)
    cleanup_deleted_files: int = 0  # since the start
    cleanup_deleted_bytes: int = 0


@dataclass(frozen=True)
class TailChunk:
    """Raw log bytes from ``offset`` (whole records, maybe a final blank END record);
    ``next_offset`` is where the following chunk starts. Empty ``data`` and no ``records``: a
    heartbeat. ``records``: the same records already decoded (in-process tails only).
    ``log_id``/``generation``: the log's identity and truncation generation when it was read
    (a follower saves them with its checkpoint, see libstore.log_generation)."""

    offset: int
    data: bytes
    next_offset: int
    confirm_offset: int
    min_offset: int
    records: list[DispatchRequest] | None = None
    log_id: str = ""
    generation: int = 0


@dataclass
class Entries:
    """ConsumeQueue units selected for a pull (see libstore.get_message.select_units)."""

    status: GetMessageStatus
    next_offset: int
    min_offset: int
    max_offset: int
    queue_offsets: list[int] = field(default_factory=list)
    phy_offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class PoppedMessage:
    """One delivery of the pop model (libstore.pop_state): the unit, its delivery attempt (1 on
    the first), its receipt handle (text) and when it becomes visible again (ms)."""

    queue_id: int
    queue_offset: int
    phy_offset: int
    size: int
    attempt: int
    receipt_handle: str
    visible_at_ms: int


@dataclass(frozen=True)
class PopResult:
    """What a pop delivered; ``fifo``: the group consumes orderly."""

    messages: list[PoppedMessage]
    fifo: bool = False


@dataclass(frozen=True)
class TransactionCheck:
    """A half message due for a check-back: its transaction id, its CommitLog record (bytes)
    and which check this is (1 on the first)."""

    transaction_id: str
    record: bytes
    check_times: int


@dataclass(frozen=True)
class QueueInfo:
    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class DerivedStatus:
    """How far a derived store (ConsumeQueues or IndexFiles) has applied the log."""

    reput_offset: int
    confirm_offset: int
    records_dispatched: int
    files: int = 0


class CommitLogPort(Protocol):
    """The commitlog service: the single writer of the log."""

    async def append(
        self, messages: Sequence[MessageFields], *, expected_epoch: int = 0
    ) -> PutMessageResults:
        """Append a batch; a message with queue id -1 is placed round robin over its topic's
        write queues. ``expected_epoch`` > 0: only while the log's master is of that epoch, else
        NotMasterError (nothing written)."""
        ...

    async def append_records(self, raw: bytes, born_host: str = "") -> PutMessageResults:
        """Append client-encoded records (libstore.record_encoder.RecordEncoder.adopt_records);
        QUEUEID -1 is placed round robin, ``born_host`` ("ip:port") fills 0.0.0.0:0 BORNHOSTs."""
        ...

    async def read(self, ranges: Sequence[tuple[int, int]]) -> list[bytes | None]:
        """Raw records at (offset, size) ranges; size 0 reads the whole record at the offset;
        None where the log no longer holds it."""
        ...

    async def read_framed(self, ranges: Sequence[tuple[int, int]], tag: int) -> bytes | bytearray:
        """The records of :meth:`read` framed as a protobuf ``repeated bytes`` field with the
        one-byte ``tag`` (libstore.record_framing; a missing record framed empty), for a reply
        that carries them on (services._common.wire)."""
        ...

    def tail(
        self,
        from_offset: int,
        *,
        max_chunk_bytes: int = 0,
        heartbeat_ms: int = 0,
        decoded: bool = False,
        log_id: str = "",
        generation: int = 0,
        linger_ms: int = 0,
    ) -> AsyncIterator[TailChunk]:
        """Chunks of whole records from ``from_offset``; ``decoded`` asks for ``records`` where
        the port has them (a local CommitLog that validated them on append). With the
        ``(log_id, generation)`` the caller last read, raises LogDivergedError when the log was
        cut since (before or while streaming). ``linger_ms`` > 0: a chunk shorter than
        ``max_chunk_bytes`` is held up to that long for more records (fewer, larger chunks)."""
        ...

    async def offsets(self) -> LogOffsets: ...

    async def upsert_topic(self, config: TopicConfig) -> TopicConfig: ...

    async def get_topic(self, topic: str, *, create: bool = False) -> TopicConfig | None:
        """The topic's config; with ``create``, auto-created as a put would (TopicNotFoundError
        when auto-creation is off)."""
        ...

    async def list_topics(self) -> list[TopicConfig]: ...

    async def delete_topic(self, topic: str) -> bool:
        """Remove ``topic`` and expire what it stored (a tombstone at the log's end); False
        when it did not exist."""
        ...

    async def release_transient(
        self, below: int, log_id: str = "", generation: int = 0, keep: Sequence[int] = ()
    ) -> int:
        """Free the transient messages whose stubs lie before CommitLog offset ``below`` (the
        dispatch service found every consumer group that reads them past them), except those
        whose stubs are at the CommitLog offsets in ``keep`` (still wanted); returns how many
        were freed (0 on a store holding none, a slave's). With ``log_id``, nothing is freed
        unless the log is still that log in that generation (not cut since the caller read
        it)."""
        ...

    async def topic_tombstones(self) -> dict[str, int]:
        """Deleted topics: name -> the CommitLog offset before which their messages are expired."""
        ...


class DispatchPort(Protocol):
    """The dispatch service: ConsumeQueues, held pulls, consumer offsets."""

    async def get_entries(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        *,
        max_bytes: int = 0,
        tag_codes: Sequence[int] = (),
        wait_ms: int = 0,
    ) -> Entries: ...

    async def get_entries_many(
        self,
        topic: str,
        queries: Sequence[tuple[int, int, int]],
        *,
        max_bytes: int = 0,
        total_bytes: int = 0,
        tag_codes: Sequence[int] = (),
        wait_ms: int = 0,
    ) -> list[Entries]: ...

    async def queue_info(self, topic: str, queue_id: int = -1) -> list[QueueInfo]: ...

    async def offset_by_time(
        self, topic: str, queue_id: int, timestamp_ms: int, boundary: BoundaryType = BoundaryType.LOWER
    ) -> int: ...

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...

    async def query_offset(self, group: str, topic: str, queue_id: int) -> int: ...

    async def consumer_progress(self, group: str, topic: str, queue_nums: int) -> list[QueueProgress]: ...

    async def status(self) -> DerivedStatus: ...

    async def pop(
        self,
        group: str,
        topic: str,
        queue_id: int,
        *,
        tag_expression: str = "*",
        max_count: int = 32,
        invisible_ms: int = 60_000,
        wait_ms: int = 0,
    ) -> PopResult:
        """Deliver up to ``max_count`` messages of the topic (``queue_id`` -1: any queue) to the
        group, invisible to it for ``invisible_ms``; holds up to ``wait_ms`` when none is ready."""
        ...

    async def ack(self, group: str, topic: str, receipt_handles: Sequence[str]) -> list[StoreError | None]:
        """Ack each handle; None where acked, else the error (InvalidReceiptHandleError...)."""
        ...

    async def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        """New invisible time from now; returns the new receipt handle."""
        ...

    async def forward_to_dead_letter(self, group: str, topic: str, receipt_handle: str) -> None:
        """Copy the message to ``%DLQ%<group>`` and finish it for the group."""
        ...

    async def upsert_group(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig: ...

    async def get_group(self, group: str) -> SubscriptionGroupConfig: ...

    async def end_transaction(self, transaction_id: str, message_id: str, commit: bool, topic: str) -> None:
        """COMMIT (the half message becomes visible in its topic) or ROLLBACK; OK when
        already resolved. Raises InvalidArgumentError for an empty topic, an unknown
        transaction, or one of another message or another topic."""
        ...

    async def claim_transaction_checks(
        self, topics: Sequence[str], max_count: int = 64
    ) -> list[TransactionCheck]:
        """Half messages of ``topics`` due for a check-back (each claim counts one check); none
        for an empty ``topics``."""
        ...


class IndexPort(Protocol):
    """The index service: key lookups."""

    async def query_by_key(
        self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int
    ) -> list[int]:
        """CommitLog offsets of messages with ``key`` stored within [begin_ms, end_ms] (end 0:
        no upper bound), newest first."""
        ...

    async def status(self) -> DerivedStatus: ...
