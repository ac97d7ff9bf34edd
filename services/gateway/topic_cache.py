"""TopicCache: the gateway's topic configs from the commitlog service, kept a few seconds so that
a call does not ask the commitlog for its topic's config every time (both protocols' servicers
share one)."""

from __future__ import annotations

import time

from libstore.topic_config import TopicConfig
from services.ports import CommitLogPort


class TopicCache:
    """Topic configs from the commitlog service, kept ``ttl_s`` seconds."""

    def __init__(self, commitlog: CommitLogPort, ttl_s: float = 3.0) -> None:
        self.commitlog = commitlog
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, TopicConfig]] = {}

    async def get(self, topic: str, *, create: bool = False) -> TopicConfig | None:
        """The topic's config (cached); with ``create``, auto-created as a put would."""
        now = time.monotonic()
        hit = self._entries.get(topic)
        if hit is not None and hit[0] > now:
            return hit[1]
        config = await self.commitlog.get_topic(topic, create=create)
        if config is not None:  # absent topics are not cached: they may appear any moment
            self._entries[topic] = (now + self.ttl_s, config)
        return config

    def forget(self, topic: str) -> None:
        self._entries.pop(topic, None)
