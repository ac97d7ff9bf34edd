"""ConsumerOffsetManager: each consumer group's committed queue offsets (RocketMQ's broker-side
``ConsumerOffsetManager``).

Keyed ``topic@group`` → {queue id → next queue offset to consume}. A queue never committed
reads as -1 (the caller then starts from the queue's min offset). Persisted to
``config/consumerOffset.json`` as ``{"offsetTable": {"topic@group": {"0": 12, ...}}}`` (RocketMQ's
shape, with string queue ids as JSON requires), replaced atomically (temp file, fsync, rename)
every ``flushConsumerOffsetInterval`` ms by :class:`ConsumerOffsetPersistService` and at
shutdown. A commit that moves an offset backwards is allowed (a reset) and logged.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from libstore._files import atomic_write, read_json
from libstore.errors import IllegalTopicError, InvalidArgumentError, StoreIOError
from libstore.group_name import MAX_GROUP_NAME_LENGTH, validate_group
from libstore.record_codec import MAX_TOPIC_LENGTH_V2, validate_topic
from libstore.service_thread import ServiceThread

log = logging.getLogger(__name__)

TOPIC_GROUP_SEPARATOR = "@"


@dataclass(frozen=True)
class QueueProgress:
    """A consumer group's position in one queue: committed offset (-1: never), min and max queue
    offsets; the lag (messages still to consume: from the committed offset, or the min when none
    or when retention moved the min past it, to the max) and ``expired`` (messages retention
    removed before the group consumed them: it skips them)."""

    queue_id: int
    committed_offset: int
    min_offset: int
    max_offset: int

    @property
    def lag(self) -> int:
        start = max(self.committed_offset, self.min_offset)
        return max(0, self.max_offset - start)

    @property
    def expired(self) -> int:
        if self.committed_offset < 0:
            return 0
        return max(0, min(self.min_offset, self.max_offset) - self.committed_offset)


class ConsumerOffsetManager:
    """Committed offsets, persisted at ``path`` (see module docstring). Group names longer than
    ``max_group_length`` or outside ``[A-Za-z0-9_%|-]``, and invalid topic names, are refused."""

    def __init__(self, path: Path, *, max_group_length: int = MAX_GROUP_NAME_LENGTH) -> None:
        self.path = Path(path)
        self.max_group_length = max_group_length
        self._lock = threading.Lock()
        self._table: dict[str, dict[int, int]] = {}
        self._version = 0
        self._persisted_version = 0

    def load(self) -> None:
        """Read the file if present. Raises StoreIOError when it exists but does not parse."""
        data = read_json(self.path, "consumer offsets")
        if data is None:
            return
        try:
            table = {
                str(key): {int(qid): int(offset) for qid, offset in queues.items()}
                for key, queues in data.get("offsetTable", {}).items()
            }
        except (ValueError, AttributeError, TypeError) as exc:
            raise StoreIOError(f"consumer offsets {self.path} are not valid: {exc}") from exc
        with self._lock:
            self._table = table

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record that ``group`` has consumed ``topic``/``queue_id`` up to ``offset`` (exclusive).

        Raises InvalidArgumentError for a bad group or topic name (module doc), a negative
        queue id or offset.
        """
        _check(group, topic, queue_id, self.max_group_length)
        if offset < 0:
            raise InvalidArgumentError(f"a committed offset must be >= 0, got {offset}")
        key = topic + TOPIC_GROUP_SEPARATOR + group
        with self._lock:
            queues = self._table.setdefault(key, {})
            previous = queues.get(queue_id)
            if previous is not None and offset < previous:
                log.warning(
                    "group %s moves %s-%d back from %d to %d", group, topic, queue_id, previous, offset
                )
            if previous != offset:
                queues[queue_id] = offset
                self._version += 1

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when ``group`` never committed one for this queue."""
        _check(group, topic, queue_id, self.max_group_length)
        queues = self._table.get(topic + TOPIC_GROUP_SEPARATOR + group)
        if queues is None:
            return -1
        return queues.get(queue_id, -1)

    def offsets_of(self, group: str, topic: str) -> dict[int, int]:
        """Every committed offset of ``group`` in ``topic`` (queue id → offset)."""
        with self._lock:
            return dict(self._table.get(topic + TOPIC_GROUP_SEPARATOR + group, {}))

    def groups(self) -> list[tuple[str, str]]:
        """(group, topic) pairs that have committed offsets."""
        with self._lock:
            keys = list(self._table)
        out = []
        for key in keys:
            topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
            out.append((group, topic))
        return sorted(out)

    def remove(self, group: str, topic: str) -> bool:
        with self._lock:
            removed = self._table.pop(topic + TOPIC_GROUP_SEPARATOR + group, None) is not None
            if removed:
                self._version += 1
            return removed

    def persist(self) -> None:
        """Write the table if it changed since the last write. Raises StoreIOError."""
        with self._lock:
            if self._version == self._persisted_version and self.path.exists():
                return
            version = self._version
            data = {
                "offsetTable": {
                    key: {str(qid): off for qid, off in sorted(queues.items())}
                    for key, queues in sorted(self._table.items())
                }
            }
        atomic_write(self.path, json.dumps(data, indent=1).encode("utf-8"))
        with self._lock:
            self._persisted_version = max(self._persisted_version, version)


def _check(group: str, topic: str, queue_id: int, max_group_length: int = MAX_GROUP_NAME_LENGTH) -> None:
    validate_group(group, max_group_length)  # its characters exclude the '@' separator
    try:
        validate_topic(topic, MAX_TOPIC_LENGTH_V2)  # retry and dead-letter topics included
    except IllegalTopicError as exc:
        raise InvalidArgumentError(str(exc)) from None
    if queue_id < 0:
        raise InvalidArgumentError(f"queue id must be >= 0, got {queue_id}")


class ConsumerOffsetPersistService(ServiceThread):
    """Persists the offsets every ``interval_ms`` and once more at shutdown."""

    def __init__(
        self, manager: ConsumerOffsetManager, interval_ms: int, on_io_error: Callable[[StoreIOError], None]
    ) -> None:
        super().__init__("ConsumerOffsetPersistService")
        self.manager = manager
        self.interval_ms = interval_ms
        self._on_io_error = on_io_error

    def run_loop(self) -> None:
        self._stopped.wait(self.interval_ms / 1000.0)
        self._persist()

    def _persist(self) -> None:
        try:
            self.manager.persist()
        except StoreIOError as exc:
            self._on_io_error(exc)

    def on_shutdown(self) -> None:
        self._persist()
