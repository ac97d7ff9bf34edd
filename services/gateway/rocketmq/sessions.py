"""ClientSessions: the RocketMQ 5 clients connected to this gateway over Telemetry streams.

A client (``x-mq-client-id``, spec sheet rocketmq-grpc-v2 §2) opens one Telemetry stream per
endpoint and sends its settings there; the stream is the only way the server can reach it
(transaction check-backs). A session is that stream's outbox plus the last settings; it ends
with the stream. Sessions are connection state, so each gateway keeps its own; nothing about
messages or deliveries is kept here.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class ClientSession:
    """One open Telemetry stream. ``outbox`` holds server-to-client commands (None ends it)."""

    client_id: str
    outbox: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    settings: Any = None
    opened_at: float = field(default_factory=time.monotonic)

    @property
    def producer_topics(self) -> set[str]:
        """Topics the client declared it publishes to (empty for consumers)."""
        if self.settings is None or self.settings.WhichOneof("pub_sub") != "publishing":
            return set()
        return {t.name for t in self.settings.publishing.topics}

    @property
    def is_producer(self) -> bool:
        return self.settings is not None and self.settings.WhichOneof("pub_sub") == "publishing"


class ClientSessions:
    """Open sessions by client id (a client may hold several streams)."""

    def __init__(self) -> None:
        self._by_client: dict[str, list[ClientSession]] = {}
        self._last_seen: dict[str, float] = {}

    def open(self, client_id: str) -> ClientSession:
        session = ClientSession(client_id)
        self._by_client.setdefault(client_id, []).append(session)
        self.touch(client_id)
        return session

    def close(self, session: ClientSession) -> None:
        streams = self._by_client.get(session.client_id, [])
        if session in streams:
            streams.remove(session)
        if not streams:
            self._by_client.pop(session.client_id, None)

    def touch(self, client_id: str) -> None:
        if client_id:
            self._last_seen[client_id] = time.monotonic()

    def drop(self, client_id: str) -> None:
        """The client said it terminates: end its streams."""
        for session in self._by_client.pop(client_id, []):
            session.outbox.put_nowait(None)
        self._last_seen.pop(client_id, None)

    def producers(self, topic: str) -> list[ClientSession]:
        """Producer sessions, those that declared ``topic`` first (check-back candidates)."""
        all_producers = [s for streams in self._by_client.values() for s in streams if s.is_producer]
        return sorted(all_producers, key=lambda s: topic not in s.producer_topics)

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_client.values())
