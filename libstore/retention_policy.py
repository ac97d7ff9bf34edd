"""RetentionPolicy: when a message, and a whole CommitLog segment, is expired.

RocketMQ expires whole segments by their last modification (``fileReservedTime``, spec §9). On
top of that each topic may set ``retentionHours`` and a deleted topic leaves a tombstone
(libstore.topic_config). A message is expired when:

- its topic was deleted after it was stored (its offset is below the topic's tombstone), or
- its topic sets ``retentionHours`` and it was stored longer ago than that.

Other topics' messages follow ``fileReservedTime`` as in RocketMQ, counted from their segment's
last modification: their segment goes during the ``deleteWhen`` hours or under disk pressure. A
segment (libstore.segment_summary) expires when its newest message of every topic has:
``segment_expiry`` gives that moment and whether it depends only on per-topic settings
(*explicit*: then the segment goes as soon as it passes, at any hour). A topic that wants longer
retention than the store's holds its segments; only the forcible disk ratio overrides that
(libstore.commit_log_cleaner).

Units: times in ms since the epoch, retention in ms, offsets in CommitLog bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from libstore.segment_summary import UNQUEUED, SegmentSummary
from libstore.topic_config import TopicConfig

HOUR_MS = 3_600_000
NEVER = -(1 << 62)  # "expired since forever": a deleted topic's messages


@dataclass(frozen=True)
class RetentionPolicy:
    """A snapshot of the store's retention settings: ``default_ms`` (``fileReservedTime``),
    ``topic_ms`` (topics with ``retentionHours``) and ``deleted_before`` (tombstones: topic ->
    the CommitLog offset below which its messages are expired)."""

    default_ms: int
    topic_ms: Mapping[str, int] = field(default_factory=dict)
    deleted_before: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls, topics: Iterable[TopicConfig], tombstones: Mapping[str, int], file_reserved_hours: float
    ) -> RetentionPolicy:
        """The policy of a topic table (``topics``, ``tombstones``) and ``fileReservedTime``
        (hours)."""
        return cls(
            default_ms=int(file_reserved_hours * HOUR_MS),
            topic_ms={t.topic_name: t.retention_ms for t in topics if t.retention_ms > 0},
            deleted_before=dict(tombstones),
        )

    def expires_at(self, topic: str, store_ms: int, offset: int) -> int | None:
        """When the message of ``topic`` stored at ``store_ms`` at ``offset`` expires (ms since
        the epoch), or None when ``fileReservedTime`` governs it (counted from its segment's
        last modification, :meth:`segment_expiry`)."""
        deleted = self.deleted_before.get(topic)
        if deleted is not None and offset < deleted:
            return NEVER
        ms = self.topic_ms.get(topic) if topic != UNQUEUED else None
        return None if ms is None else store_ms + ms

    def segment_expiry(self, summary: SegmentSummary | None, modified_ms: int) -> tuple[int, bool]:
        """When every message in a segment has expired, and whether that moment depends only on
        per-topic settings. Messages that ``fileReservedTime`` governs count as RocketMQ counts
        them, from the segment's last modification ``modified_ms`` (its mtime); so does a
        segment without a complete summary (then not explicit)."""
        by_mtime = modified_ms + self.default_ms
        if summary is None or not summary.complete:
            return by_mtime, False
        latest, explicit = NEVER, True
        for topic, (newest_ms, last_offset) in summary.topics.items():
            at = self.expires_at(topic, newest_ms, last_offset)
            if at is None:
                at, explicit = by_mtime, False
            latest = max(latest, at)
        return latest, explicit

    def queue_cutoff_ms(self, topic: str, now_ms: int) -> int | None:
        """Messages of ``topic`` stored before the returned time are expired by its
        ``retentionHours`` (None: the topic has none)."""
        ms = self.topic_ms.get(topic)
        return None if ms is None else now_ms - ms
