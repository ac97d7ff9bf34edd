"""TopicConfig and TopicConfigManager: each topic's queue counts and permissions.

Kept by the store that owns the CommitLog (``config/topics.json``, replaced atomically). Puts
check a message's queue id against the topic's write queue count; an unknown topic is created
with ``defaultTopicQueueNums`` queues when ``autoCreateTopicEnable``, else TopicNotFoundError
(the store's system topics and the dead-letter topics ``%DLQ%<group>`` are created whatever the
setting, as RocketMQ creates them when it needs them). At most ``maxTopicCount`` topics, the
system topics aside, exist: creating one more raises TooManyTopicsError.
Permission bits are RocketMQ's ``PermName`` (READ 4, WRITE 2, INHERIT 1).

Durability: a topic's ``durability`` is ``persistent`` (the default) or ``transient`` (every
message of the topic is transient, libstore.durability); the store's system topics are always
persistent.

Retention: a topic may set ``retention_hours`` (0: the store's ``fileReservedTime``); deleting a
topic leaves a tombstone, the CommitLog offset it was deleted at, so everything the topic held
before it counts as expired (libstore.retention_policy) even when the name is created again.
Queue offsets go on where they were: a consumer's stale offset never meets a new message under
an old number.

Thread-safety: all methods may be called from any thread.
"""

from __future__ import annotations

import enum
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from libstore._files import atomic_write, read_json
from libstore.durability import Durability
from libstore.errors import InvalidArgumentError, StoreIOError, TooManyTopicsError, TopicNotFoundError
from libstore.record_codec import validate_topic
from libstore.subscription_group import DLQ_GROUP_TOPIC_PREFIX
from libstore.system_topics import is_system_topic

PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1
MAX_RETENTION_HOURS = 24.0 * 365 * 100  # a century


class TopicMessageType(enum.Enum):
    """Message type a topic accepts (RocketMQ 5 ``TopicMessageType``)."""

    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    MIXED = "MIXED"


@dataclass(frozen=True)
class TopicConfig:
    """One topic: queue counts, permission bits, message type, ``retention_hours`` (its
    messages older than that are expired; 0: the store's ``fileReservedTime`` decides) and
    ``durability`` (libstore.durability)."""

    topic_name: str
    read_queue_nums: int = 8
    write_queue_nums: int = 8
    perm: int = PERM_READ | PERM_WRITE
    message_type: TopicMessageType = TopicMessageType.NORMAL
    retention_hours: float = 0.0
    durability: Durability = Durability.PERSISTENT

    @property
    def retention_ms(self) -> int:
        """``retention_hours`` in ms (0: the store's fileReservedTime decides)."""
        return int(self.retention_hours * 3_600_000)

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writeable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    def to_json(self) -> dict[str, object]:
        out = asdict(self)
        out["message_type"] = self.message_type.value
        out["durability"] = self.durability.value
        return out

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> TopicConfig:
        return cls(
            topic_name=str(raw["topic_name"]),
            read_queue_nums=int(raw.get("read_queue_nums", 8)),  # type: ignore[call-overload]
            write_queue_nums=int(raw.get("write_queue_nums", 8)),  # type: ignore[call-overload]
            perm=int(raw.get("perm", PERM_READ | PERM_WRITE)),  # type: ignore[call-overload]
            message_type=TopicMessageType(str(raw.get("message_type", "NORMAL"))),
            retention_hours=float(raw.get("retention_hours", 0.0)),  # type: ignore[arg-type]
            durability=Durability(str(raw.get("durability", Durability.PERSISTENT.value))),
        )


class TopicConfigManager:
    """Topic table persisted at ``path``; ``auto_create`` with ``default_queue_nums`` queues;
    at most ``max_topic_count`` topics besides the system topics."""

    def __init__(
        self,
        path: Path,
        *,
        auto_create: bool = True,
        default_queue_nums: int = 8,
        max_queue_nums: int = 1024,
        max_topic_length: int = 127,
        max_topic_count: int = 1024,
    ) -> None:
        self.path = Path(path)
        self.auto_create = auto_create
        self.default_queue_nums = default_queue_nums
        self.max_queue_nums = max_queue_nums
        self.max_topic_length = max_topic_length
        self.max_topic_count = max_topic_count
        self._lock = threading.Lock()
        self._topics: dict[str, TopicConfig] = {}
        self._deleted: dict[str, int] = {}  # topic -> CommitLog offset it was deleted at
        self.version = 0  # bumped on every change (a master sends its table to slaves then)
        self.transient_topics: frozenset[str] = frozenset()  # topics whose durability is transient
        self._load()
        self._note_durability()

    def _note_durability(self) -> None:
        self.transient_topics = frozenset(
            name for name, t in self._topics.items() if t.durability is Durability.TRANSIENT
        )

    def _load(self) -> None:
        data = read_json(self.path, "topic table")  # StoreIOError when unreadable
        if data is None:
            return
        try:
            self._topics = {t["topic_name"]: TopicConfig.from_json(t) for t in data.get("topics", [])}
            self._deleted = {str(k): int(v) for k, v in data.get("deleted", {}).items()}
        except (AttributeError, ValueError, KeyError, TypeError) as exc:
            raise StoreIOError(f"cannot read topic table {self.path}: {exc}") from exc

    def _persist_locked(self) -> None:
        self.version += 1
        self._note_durability()
        data = {
            "topics": [t.to_json() for t in sorted(self._topics.values(), key=lambda t: t.topic_name)],
            "deleted": dict(sorted(self._deleted.items())),
        }
        atomic_write(self.path, json.dumps(data, indent=1).encode("utf-8"))

    def replace_all(self, configs: list[TopicConfig], deleted: dict[str, int] | None = None) -> None:
        """Take another store's whole table (a slave copying its master's) and, when given, its
        tombstones; persisted."""
        table = {c.topic_name: c for c in configs}
        with self._lock:
            tombstones = self._deleted if deleted is None else dict(deleted)
            if table != self._topics or tombstones != self._deleted:
                self._topics = table
                self._deleted = tombstones
                self._persist_locked()

    def _check_room_locked(self, topic: str) -> None:
        """Raise TooManyTopicsError when ``topic`` is new and the table is full."""
        if topic in self._topics or is_system_topic(topic):
            return
        count = sum(1 for name in self._topics if not is_system_topic(name))
        if count >= self.max_topic_count:
            raise TooManyTopicsError(
                f"cannot create topic {topic!r}: the store holds {count} topics, maxTopicCount is "
                f"{self.max_topic_count}"
            )

    def get(self, topic: str) -> TopicConfig | None:
        return self._topics.get(topic)

    def list(self) -> list[TopicConfig]:
        return sorted(self._topics.values(), key=lambda t: t.topic_name)

    def create_or_update(self, config: TopicConfig) -> TopicConfig:
        """Validate and store ``config``. Raises IllegalTopicError / InvalidArgumentError
        (TooManyTopicsError for a new topic past ``max_topic_count``)."""
        validate_topic(config.topic_name, self.max_topic_length)
        for name in ("read_queue_nums", "write_queue_nums"):
            value = getattr(config, name)
            if not 1 <= value <= self.max_queue_nums:
                raise InvalidArgumentError(f"{name} must be within 1..{self.max_queue_nums}, got {value}")
        if config.perm & ~(PERM_READ | PERM_WRITE | PERM_INHERIT):
            raise InvalidArgumentError(f"unknown permission bits in {config.perm:#x}")
        if config.durability is Durability.TRANSIENT and is_system_topic(config.topic_name):
            raise InvalidArgumentError(f"system topic {config.topic_name!r} is always persistent")
        if not 0.0 <= config.retention_hours <= MAX_RETENTION_HOURS:  # NaN fails too
            raise InvalidArgumentError(
                f"retention_hours must be within 0..{MAX_RETENTION_HOURS:.0f} (0: the store's "
                f"fileReservedTime), got {config.retention_hours}"
            )
        with self._lock:
            self._check_room_locked(config.topic_name)
            self._topics[config.topic_name] = config
            self._persist_locked()
        return config

    def delete(self, topic: str, at_offset: int = -1) -> bool:
        """Remove ``topic``; with ``at_offset`` >= 0 (the CommitLog's end when it was deleted)
        leave a tombstone that expires everything it stored before that offset. False when the
        topic did not exist."""
        with self._lock:
            if self._topics.pop(topic, None) is None:
                return False
            if at_offset >= 0:
                self._deleted[topic] = max(at_offset, self._deleted.get(topic, 0))
            self._persist_locked()
            return True

    def tombstones(self) -> dict[str, int]:
        """Deleted topics: name -> CommitLog offset before which their messages are expired."""
        return dict(self._deleted)

    def clamp_tombstones(self, end: int) -> None:
        """The log now ends at ``end`` (cut, or a master that holds less than the one that
        wrote a tombstone): a tombstone past it would expire messages appended from now on."""
        with self._lock:
            past = {name: end for name, at in self._deleted.items() if at > end}
            if past:
                self._deleted.update(past)
                self._persist_locked()

    def forget_tombstones_below(self, min_offset: int) -> None:
        """Drop tombstones the log no longer needs: every byte before them is gone."""
        with self._lock:
            stale = [name for name, at in self._deleted.items() if at <= min_offset]
            if stale:
                for name in stale:
                    del self._deleted[name]
                self._persist_locked()

    def write_queue_nums(self, topic: str) -> int:
        """Queue count a put may address; auto-creates the topic when allowed.

        Raises TopicNotFoundError (unknown topic, auto-create off), IllegalTopicError,
        TooManyTopicsError (``max_topic_count`` reached).
        """
        config = self._topics.get(topic)
        if config is None:
            system = is_system_topic(topic)  # the store's own topics exist whatever the setting
            needed = system or topic.startswith(DLQ_GROUP_TOPIC_PREFIX)
            if not self.auto_create and not needed:
                raise TopicNotFoundError(f"topic {topic!r} does not exist and auto-create is off")
            validate_topic(topic, self.max_topic_length)
            with self._lock:
                config = self._topics.get(topic)
                if config is None:
                    self._check_room_locked(topic)
                    nums = 1 if system else self.default_queue_nums
                    config = TopicConfig(topic, nums, nums)
                    self._topics[topic] = config
                    self._persist_locked()
        return config.write_queue_nums
