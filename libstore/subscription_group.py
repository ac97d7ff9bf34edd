"""SubscriptionGroupConfig and SubscriptionGroupManager: consumer groups' settings (RocketMQ's
``SubscriptionGroupConfig`` / ``SubscriptionGroupManager``).

A group consuming with the pop model gets ``retryMaxTimes`` redeliveries after the first delivery
(16 by default, so at most 17 deliveries) before its message goes to ``%DLQ%<group>``;
``consumeMessageOrderly`` makes it a FIFO group (one message group's messages in order, the next
only after the previous is acked). ``consume_from`` says where a group starts in a queue it has
no offset for (RocketMQ's ConsumeInitMode): ``latest`` (MAX, the default for pops, as RocketMQ's
proxy) or ``earliest`` (MIN: the queue's whole history). Unknown groups are created with the
defaults on first use (RocketMQ's autoCreateSubscriptionGroup). Persisted at
``config/subscriptionGroup.json``, replaced atomically.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from libstore._files import atomic_write, read_json
from libstore.errors import InvalidArgumentError, StoreIOError

DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
DEFAULT_RETRY_MAX_TIMES = 16
CONSUME_FROM_LATEST = "latest"  # RocketMQ's ConsumeInitMode.MAX
CONSUME_FROM_EARLIEST = "earliest"  # ConsumeInitMode.MIN
_MAX_GROUP_LENGTH = 255


def dlq_topic(group: str) -> str:
    """The dead-letter topic of a group (``%DLQ%<group>``)."""
    return DLQ_GROUP_TOPIC_PREFIX + group


def validate_group(group: str) -> None:
    """Raises InvalidArgumentError unless ``group`` is 1-255 characters of [A-Za-z0-9_%|-]."""
    if not group or len(group) > _MAX_GROUP_LENGTH:
        raise InvalidArgumentError(f"consumer group must be 1-{_MAX_GROUP_LENGTH} characters")
    if any(not (c.isascii() and (c.isalnum() or c in "_%|-")) for c in group):
        raise InvalidArgumentError(f"consumer group {group!r} holds characters outside [A-Za-z0-9_%|-]")


@dataclass(frozen=True)
class SubscriptionGroupConfig:
    """One consumer group's settings (see module docstring)."""

    group_name: str
    consume_enable: bool = True
    retry_max_times: int = DEFAULT_RETRY_MAX_TIMES
    consume_message_orderly: bool = False
    consume_from: str = CONSUME_FROM_LATEST

    @property
    def max_delivery_attempts(self) -> int:
        """Deliveries before the DLQ: the first one plus ``retry_max_times`` retries."""
        return self.retry_max_times + 1


class SubscriptionGroupManager:
    """Group table persisted at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._groups: dict[str, SubscriptionGroupConfig] = {}

    def load(self) -> None:
        """Read the file if present. Raises StoreIOError when it exists but does not parse."""
        data = read_json(self.path, "subscription groups")
        if data is None:
            return
        try:
            table = {
                name: SubscriptionGroupConfig(**cfg)
                for name, cfg in data.get("subscriptionGroupTable", {}).items()
            }
        except (ValueError, TypeError, AttributeError) as exc:
            raise StoreIOError(f"subscription groups {self.path} are not valid: {exc}") from exc
        with self._lock:
            self._groups = table

    def get(self, group: str) -> SubscriptionGroupConfig:
        """The group's config, created with the defaults when unknown (not persisted until
        changed). Raises InvalidArgumentError for a malformed name."""
        with self._lock:
            found = self._groups.get(group)
        if found is not None:
            return found
        validate_group(group)
        return SubscriptionGroupConfig(group)

    def upsert(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig:
        """Create or replace a group's config and persist the table. Raises InvalidArgumentError
        for a malformed name or a retry count outside 0-1000; StoreIOError when the write fails."""
        validate_group(config.group_name)
        if not 0 <= config.retry_max_times <= 1000:
            raise InvalidArgumentError(f"retryMaxTimes must be 0-1000, got {config.retry_max_times}")
        if config.consume_from not in (CONSUME_FROM_LATEST, CONSUME_FROM_EARLIEST):
            raise InvalidArgumentError(
                f"consume_from must be {CONSUME_FROM_LATEST!r} or {CONSUME_FROM_EARLIEST!r}, "
                f"got {config.consume_from!r}"
            )
        with self._lock:
            self._groups[config.group_name] = config
            data = {"subscriptionGroupTable": {n: asdict(c) for n, c in sorted(self._groups.items())}}
            atomic_write(self.path, json.dumps(data, indent=1).encode())
        return config
